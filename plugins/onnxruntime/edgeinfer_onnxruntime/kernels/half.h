/* fp16 <-> fp32 one value at a time, rounding to nearest even: F16C's instructions where the build has them (the
 * AVX2 and AVX-512 builds); in the portable build AArch64's own conversions (through _Float16), and elsewhere (an
 * x86-64 CPU without F16C) fp16 -> fp32 in integer steps the compiler vectorizes, where _Float16 would be a library
 * call a value (58 times slower in MatMulF16 here); fp32 -> fp16 (a new token's KV rows) stays _Float16's. */
#ifndef EDGEINFER_HALF_H
#define EDGEINFER_HALF_H
#include <stdint.h>
#include <string.h>

#if defined(__F16C__)
#include <immintrin.h>
static inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }
static inline uint16_t float_to_half(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
#elif defined(__FLT16_MAX__)
#if defined(__aarch64__)
static inline float half_to_float(uint16_t h) {
  _Float16 x;
  memcpy(&x, &h, sizeof x);
  return (float)x;
}
#else
/* exact for every fp16 value: its exponent and mantissa bits moved to fp32's places, scaled by 2^112 (the exponent
 * biases' difference; a subnormal comes out normal), infinities and NaNs given fp32's top exponent */
static inline float half_to_float(uint16_t h) {
  uint32_t bits = (uint32_t)(h & 0x7fff) << 13, sign = (uint32_t)(h & 0x8000) << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  f *= 0x1p112f;
  memcpy(&bits, &f, sizeof f);
  bits |= (h & 0x7c00) == 0x7c00 ? 0x7f800000u : 0u;
  bits |= sign;
  memcpy(&f, &bits, sizeof f);
  return f;
}
#endif
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
