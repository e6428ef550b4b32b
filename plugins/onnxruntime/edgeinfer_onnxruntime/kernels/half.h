/* fp16 <-> fp32 one value at a time, rounding to nearest even: F16C's instructions where the build has them (the
 * AVX2 and AVX-512 builds), else the compiler's _Float16 (GCC 12+ and Clang 15+ on x86-64 and AArch64: the
 * portable build). */
#ifndef EDGEINFER_HALF_H
#define EDGEINFER_HALF_H
#include <stdint.h>
#include <string.h>

#if defined(__F16C__)
#include <immintrin.h>
static inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }
static inline uint16_t float_to_half(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
#elif defined(__FLT16_MAX__)
static inline float half_to_float(uint16_t h) {
  _Float16 x;
  memcpy(&x, &h, sizeof x);
  return (float)x;
}
static inline uint16_t float_to_half(float f) {
  _Float16 x = (_Float16)f;
  uint16_t h;
  memcpy(&h, &x, sizeof h);
  return h;
}
#else
#error "edgeinfer's portable ops need a compiler with _Float16 (GCC 12 or later, Clang 15 or later)"
#endif
#endif
