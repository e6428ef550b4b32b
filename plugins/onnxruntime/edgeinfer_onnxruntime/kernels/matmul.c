/* edgeinfer's CPU matmuls for decoders on onnxruntime: y = x @ W, fp32 activations, the weights as deployed.
 *
 *   MatMulF16  fp16 weights (the host fp16 class), converted to fp32 in registers (F16C vcvtph2ps), fp32
 *              multiply-adds;
 *   MatMulW8   int8 weights with an fp32 scale per block of `block` rows and column (the host w8a16 class), the
 *              activations as two int8 digits per block, on integer dot products;
 *   MatMulW4   the same for int4 weights u in 0..15 with a scale d and a minimum m per block (w = d u + m, as
 *              llama.cpp's Q4_1 holds them), two to a byte, widened to 8 bits in registers: with digits = 2 the host
 *              w4a16 class; with digits = 1 the high digit alone, the activations int8 per block as llama.cpp's
 *              Q4_1 takes them (the host w4a8 class). sum w x = d sum u x + m sum x, both over x as its digits
 *              hold it (as Q4_1 x Q8_1 takes the activations' sum from their int8): the block's sum once a row.
 * Three builds of this one file (custom_ops.py picks the best the CPU runs): AVX-512 F, BW and VNNI (MatMulW8 on
 * vpdpbusd), AVX2 with FMA and F16C (MatMulW8 on vpmaddwd), and portable C (AArch64, x86-64 without AVX2).
 * All read the same packed weights, so a bundle deployed on one CPU loads on another, and all compute the same
 * integer sums.
 * onnxruntime 1.26's CPU provider has neither for x86 CPUs without AVX-512 FP16: it held fp16 weights as fp32, and
 * its 8-bit MatMulNBits dequantizes the whole weight at every call for fp32 activations (custom_ops.py says what
 * the plugin does where these cannot be built).
 *
 * Inputs:  x [..., K] float; w: W ([K, N]) in panels of 32 output columns, the last panel's padding never stored:
 *          MatMulF16 fp16 [P, K, 32]; MatMulW8 uint8 q + 128 [P, K4, 32] (K4 = K rounded up to 4), MatMulW4 uint8
 *          [P, K4 / 2, 32] (u: column c of a quad row in the low nibble of byte 4 c + r, column c + 16 in its
 *          high nibble, c < 16), and their scales: MatMulW8 fp32 [P, ceil(K / block), 32]; MatMulW4 fp16
 *          [P, ceil(K / block), 2, 32], each block's 32 scales then its 32 minimums, side by side (5 bits a weight,
 *          as Q4_1; as a third array apart the minimums cost single-row products 30 %) (custom_ops.py packs them).
 * Attributes: n, the real N (<= 32 P); MatMulW8 and W4: block (a multiple of 4); MatMulW4: digits (1 or 2).
 * Output: y [..., n] float.
 *
 * Built by custom_ops.py with the system C compiler, with attention.c (edgeinfer.GroupQueryAttention) and
 * embedding.c (edgeinfer.EmbedF16, EmbedW8) into one library; the few onnxruntime C API functions they call are
 * declared in ort.h. The library asks for API 17; plugins/onnxruntime/tests/test_custom_ops.py runs every op on
 * the installed onnxruntime.
 */
#if defined(__AVX2__)
#include <immintrin.h>
#endif
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>

#include "half.h"
#include "ort.h"

const void *const *api;

#define NR 32 /* output columns a panel */

typedef struct { /* one MatMulW8 or MatMulW4 call */
  const float *x;
  const uint8_t *w;
  const void *ws; /* fp32 scales (MatMulW8) or fp16 scales and minimums (MatMulW4) */
  float *y;
  int64_t M, K, K4, KB, n, block, P, bits, digits;
} W8Args;

typedef struct Digits Digits; /* the activations' digits, as each build holds them */

typedef struct { /* one MatMulW8 or W4 call, split over the panels */
  const Digits *d;
  const uint8_t *w;
  const void *ws;
  float *y;
  int64_t M, K4, KB, n, block;
} JobW8;

#if defined(__AVX512F__)
#define MR 12 /* activation rows a pass over an fp16 panel: 24 accumulators of the 32 registers */

/* row k of an fp16 panel ([K][32]) as fp32, columns 0-15 and 16-31 */
static inline __attribute__((always_inline)) void load_row(const uint16_t *wp, int64_t k, __m512 *w0, __m512 *w1) {
  *w0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wp + k * NR)));
  *w1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wp + k * NR + 16)));
}

static inline __attribute__((always_inline)) void store(float *y, int cols, __m512 a0, __m512 a1) {
  __mmask16 m0 = cols >= 16 ? 0xffff : (__mmask16)((1u << cols) - 1);
  __mmask16 m1 = cols >= 32 ? 0xffff : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1);
  _mm512_mask_storeu_ps(y, m0, a0);
  _mm512_mask_storeu_ps(y + 16, m1, a1);
}

/* rows x[0..mr) (stride K) times one panel, into y (stride ldy): outer products, no horizontal sums */
static inline __attribute__((always_inline)) void panel_rows(const float *x, const uint16_t *wp, float *y,
                                                             int64_t K, int64_t ldy, int mr, int cols) {
  __m512 a0[MR], a1[MR], w0, w1;
  for (int i = 0; i < mr; i++) a0[i] = a1[i] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k++) {
    load_row(wp, k, &w0, &w1);
    for (int i = 0; i < mr; i++) {
      __m512 xb = _mm512_set1_ps(x[i * K + k]);
      a0[i] = _mm512_fmadd_ps(xb, w0, a0[i]);
      a1[i] = _mm512_fmadd_ps(xb, w1, a1[i]);
    }
  }
  for (int i = 0; i < mr; i++) store(y + i * ldy, cols, a0[i], a1[i]);
}

/* one row: two k chains so that the FMA latency does not bound the stream of weights */
static void panel_row(const float *x, const uint16_t *wp, float *y, int64_t K, int cols) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, w0, w1, w2, w3;
  int64_t k = 0;
  for (; k + 1 < K; k += 2) {
    load_row(wp, k, &w0, &w1);
    load_row(wp, k + 1, &w2, &w3);
    __m512 x0 = _mm512_set1_ps(x[k]), x1 = _mm512_set1_ps(x[k + 1]);
    a0 = _mm512_fmadd_ps(x0, w0, a0);
    a1 = _mm512_fmadd_ps(x0, w1, a1);
    a2 = _mm512_fmadd_ps(x1, w2, a2);
    a3 = _mm512_fmadd_ps(x1, w3, a3);
  }
  if (k < K) {
    load_row(wp, k, &w0, &w1);
    __m512 x0 = _mm512_set1_ps(x[k]);
    a0 = _mm512_fmadd_ps(x0, w0, a0);
    a1 = _mm512_fmadd_ps(x0, w1, a1);
  }
  store(y, cols, _mm512_add_ps(a0, a2), _mm512_add_ps(a1, a3));
}

static void panel_block(const float *x, const uint16_t *wp, float *y, int64_t K, int64_t ldy, int mr, int cols) {
  switch (mr) { /* a constant row count: accumulators in registers */
#define ROWS(R) case R: panel_rows(x, wp, y, K, ldy, R, cols); break;
    ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8) ROWS(9) ROWS(10) ROWS(11) ROWS(12)
#undef ROWS
  }
}

/* MatMulW8 on int8 dot products (AVX-512 VNNI vpdpbusd: 64 byte products a call, four times an FMA's 16).
 * Weights: u8 = q + 128 in panels [P][K4 / 4][32][4] (four consecutive rows of a column side by side, K4 = K
 * rounded up to 4), fp32 scales [P][KB][32]. Each activation row is split per block into two int8 digits,
 * x = s (h + l / 254) with s = max|x| / 127, h = round(x / s), l = round(254 (x / s - h)): the error is at most
 * s / 508, 1/64516 of the block's largest activation (fp16 activations round each value to 1/2048 of itself).
 * Then sum (q + 128) h = sum q h + 128 sum h, and the block's sum of h is subtracted. */
#define WR 6 /* activation rows a pass over a panel: 4 int32 accumulators a row, 24 of the 32 registers */

struct Digits {
  int8_t *h, *l;   /* [M][K4] */
  float *s;        /* [M][KB] */
  int32_t *hs, *ls; /* [M][KB] sums of h and l */
  float *sum;       /* [M][KB] sums of x as the digits hold it (MatMulW4's minimums) */
};

static void digits_of(const float *x, int64_t M, int64_t K, int64_t K4, int64_t block, int64_t KB, int digits,
                      Digits *d) {
  const __m512 lim = _mm512_set1_ps(127.0f), nlim = _mm512_set1_ps(-127.0f), f254 = _mm512_set1_ps(254.0f);
  for (int64_t m = 0; m < M; m++) {
    const float *xm = x + m * K;
    int8_t *h = d->h + m * K4, *l = d->l + m * K4;
    for (int64_t b = 0; b < KB; b++) {
      int64_t k0 = b * block, k1 = k0 + block < K ? k0 + block : K;
      __m512 top = _mm512_setzero_ps();
      for (int64_t k = k0; k < k1; k += 16) {
        __mmask16 in = k1 - k >= 16 ? 0xffff : (__mmask16)((1u << (k1 - k)) - 1);
        top = _mm512_max_ps(top, _mm512_abs_ps(_mm512_maskz_loadu_ps(in, xm + k)));
      }
      float t = _mm512_reduce_max_ps(top), s = t > 0.0f ? t / 127.0f : 1.0f;
      __m512 inv = _mm512_set1_ps(1.0f / s);
      __m512i hs = _mm512_setzero_si512(), ls = hs;
      for (int64_t k = k0; k < k1; k += 16) {
        __mmask16 in = k1 - k >= 16 ? 0xffff : (__mmask16)((1u << (k1 - k)) - 1);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(in, xm + k), inv);
        __m512 hv = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512 lv = digits == 1 ? _mm512_setzero_ps() /* the high digit alone: int8 activations */
                                : _mm512_roundscale_ps(_mm512_mul_ps(_mm512_sub_ps(v, hv), f254),
                                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512i hi = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(hv, nlim), lim));
        __m512i li = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(lv, nlim), lim));
        _mm512_mask_cvtepi32_storeu_epi8(h + k, in, hi);
        _mm512_mask_cvtepi32_storeu_epi8(l + k, in, li);
        hs = _mm512_add_epi32(hs, hi), ls = _mm512_add_epi32(ls, li); /* masked-off lanes loaded as 0 */
      }
      d->s[m * KB + b] = s, d->hs[m * KB + b] = _mm512_reduce_add_epi32(hs);
      d->ls[m * KB + b] = _mm512_reduce_add_epi32(ls);
      d->sum[m * KB + b] = s * ((float)d->hs[m * KB + b] + (float)d->ls[m * KB + b] / 254.0f);
    }
    for (int64_t k = K; k < K4; k++) h[k] = l[k] = 0;
  }
}

/* bits 8: a quad row is 128 bytes, q + 128; bits 4: 64 bytes, u, columns 16-31 in the high nibbles; digits 1:
 * the low digit's products skipped (it is 0) */
static inline __attribute__((always_inline)) void w8_rows(const JobW8 *j, size_t p, int64_t m0, int mr, int bits,
                                                          int digits) {
  const int64_t K4 = j->K4, block = j->block;
  const uint8_t *wp = j->w + (int64_t)p * K4 * NR * bits / 8;
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  const float *ws32 = (const float *)j->ws + (int64_t)p * j->KB * NR;
  const uint16_t *ws16 = (const uint16_t *)j->ws + (int64_t)p * j->KB * 2 * NR; /* a block: scales, minimums */
  int64_t col = (int64_t)p * NR;
  int cols = j->n - col < NR ? (int)(j->n - col) : NR;
  __m512 f0[WR], f1[WR], g0[2], g1[2]; /* g: one or two rows' minimums' part, a chain apart from f's */
  const int8_t *hr[WR], *lr[WR];
  for (int i = 0; i < mr; i++) {
    f0[i] = f1[i] = _mm512_setzero_ps();
    if (i < 2) g0[i] = g1[i] = f0[i];
    hr[i] = j->d->h + (m0 + i) * K4, lr[i] = j->d->l + (m0 + i) * K4;
  }
  /* one or two rows: two sets of accumulators, even and odd quad rows, so that each chain of dot products is half
   * as long (8 and 4 accumulators: the chains, not the weights' bandwidth, bounded one row) */
  enum { SETS = 2 };
  const int sets = mr <= 2 ? 2 : 1;
  for (int64_t b = 0; b < j->KB; b++) {
    int64_t k0 = b * block, k1 = k0 + block < K4 ? k0 + block : K4;
    __m512i h0[SETS][WR], h1[SETS][WR], l0[SETS][WR], l1[SETS][WR];
    for (int t = 0; t < sets; t++)
      for (int i = 0; i < mr; i++) h0[t][i] = h1[t][i] = l0[t][i] = l1[t][i] = _mm512_setzero_si512();
    for (int64_t k = k0; k < k1; k += 4 * sets) {
      for (int t = 0; t < sets; t++) {
        int64_t kt = k + 4 * t;
        if (t && kt >= k1) break;
        __m512i w0, w1;
        if (bits == 8) {
          w0 = _mm512_loadu_si512((const void *)(wp + kt * NR));
          w1 = _mm512_loadu_si512((const void *)(wp + kt * NR + 64));
        } else {
          __m512i both = _mm512_loadu_si512((const void *)(wp + kt * NR / 2));
          w0 = _mm512_and_si512(both, nibble);
          w1 = _mm512_and_si512(_mm512_srli_epi16(both, 4), nibble);
        }
        for (int i = 0; i < mr; i++) {
          int32_t hv, lv;
          __builtin_memcpy(&hv, hr[i] + kt, 4);
          __builtin_memcpy(&lv, lr[i] + kt, 4);
          __m512i bh = _mm512_set1_epi32(hv), bl = _mm512_set1_epi32(lv);
          h0[t][i] = _mm512_dpbusd_epi32(h0[t][i], w0, bh);
          h1[t][i] = _mm512_dpbusd_epi32(h1[t][i], w1, bh);
          if (digits == 2) {
            l0[t][i] = _mm512_dpbusd_epi32(l0[t][i], w0, bl);
            l1[t][i] = _mm512_dpbusd_epi32(l1[t][i], w1, bl);
          }
        }
      }
    }
    __m512 s0 = bits == 8 ? _mm512_loadu_ps(ws32 + b * NR)
                          : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(ws16 + b * 2 * NR)));
    __m512 s1 = bits == 8 ? _mm512_loadu_ps(ws32 + b * NR + 16)
                          : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(ws16 + b * 2 * NR + 16)));
    const __m512 low = _mm512_set1_ps(1.0f / 254.0f);
    __m512 mn0 = _mm512_setzero_ps(), mn1 = mn0; /* MatMulW4's minimums */
    if (bits == 4) {
      mn0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(ws16 + b * 2 * NR + NR)));
      mn1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(ws16 + b * 2 * NR + NR + 16)));
    }
    for (int i = 0; i < mr; i++) {
      int64_t at = (m0 + i) * j->KB + b;
      if (sets == 2) {
        h0[0][i] = _mm512_add_epi32(h0[0][i], h0[1][i]), h1[0][i] = _mm512_add_epi32(h1[0][i], h1[1][i]);
        l0[0][i] = _mm512_add_epi32(l0[0][i], l0[1][i]), l1[0][i] = _mm512_add_epi32(l1[0][i], l1[1][i]);
      }
      __m512 xs = _mm512_set1_ps(j->d->s[at]);
      __m512 v0 = _mm512_cvtepi32_ps(h0[0][i]), v1 = _mm512_cvtepi32_ps(h1[0][i]);
      if (digits == 2) {
        v0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(l0[0][i]), low, v0);
        v1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(l1[0][i]), low, v1);
      }
      if (bits == 8) { /* sum (u - 128) x = s (sum u h + sum u l / 254) - 128 s (sum h + sum l / 254) */
        __m512 c = _mm512_set1_ps(j->d->s[at] * 128.0f * ((float)j->d->hs[at] + (float)j->d->ls[at] / 254.0f));
        f0[i] = _mm512_fmadd_ps(_mm512_fmsub_ps(v0, xs, c), s0, f0[i]);
        f1[i] = _mm512_fmadd_ps(_mm512_fmsub_ps(v1, xs, c), s1, f1[i]);
      } else { /* sum (d u + m) x = d s (sum u h + sum u l / 254) + m sum x */
        __m512 sum = _mm512_set1_ps(j->d->sum[at]);
        f0[i] = _mm512_fmadd_ps(_mm512_mul_ps(v0, xs), s0, f0[i]);
        f1[i] = _mm512_fmadd_ps(_mm512_mul_ps(v1, xs), s1, f1[i]);
        if (mr <= 2) { /* few rows: f's chain of one FMA a block bounds the loop, so m sum x goes to g */
          g0[i] = _mm512_fmadd_ps(sum, mn0, g0[i]), g1[i] = _mm512_fmadd_ps(sum, mn1, g1[i]);
        } else {
          f0[i] = _mm512_fmadd_ps(sum, mn0, f0[i]), f1[i] = _mm512_fmadd_ps(sum, mn1, f1[i]);
        }
      }
    }
  }
  if (bits == 4 && mr <= 2)
    for (int i = 0; i < mr; i++) f0[i] = _mm512_add_ps(f0[i], g0[i]), f1[i] = _mm512_add_ps(f1[i], g1[i]);
  for (int i = 0; i < mr; i++) store(j->y + (m0 + i) * j->n + col, cols, f0[i], f1[i]);
}

#define RUN(NAME, BITS, DIGITS)                                                                                  \
  static void NAME(void *job, size_t p) {                                                                        \
    const JobW8 *j = job;                                                                                        \
    for (int64_t m = 0; m < j->M; m += WR) {                                                                     \
      switch (j->M - m < WR ? (int)(j->M - m) : WR) { /* a constant row count: accumulators in registers */     \
        case 1: w8_rows(j, p, m, 1, BITS, DIGITS); break;                                                        \
        case 2: w8_rows(j, p, m, 2, BITS, DIGITS); break;                                                        \
        case 3: w8_rows(j, p, m, 3, BITS, DIGITS); break;                                                        \
        case 4: w8_rows(j, p, m, 4, BITS, DIGITS); break;                                                        \
        case 5: w8_rows(j, p, m, 5, BITS, DIGITS); break;                                                        \
        case 6: w8_rows(j, p, m, 6, BITS, DIGITS); break;                                                        \
      }                                                                                                          \
    }                                                                                                            \
  }
RUN(run_w8, 8, 2)
RUN(run_w4, 4, 2)
RUN(run_w4_int8, 4, 1)
#undef RUN

static OrtStatus *matmul_w8(void *context, const W8Args *a) {
  int64_t M = a->M, K4 = a->K4, KB = a->KB;
  char *scratch = malloc((size_t)(M * K4 * 2 + M * KB * 16));
  if (!scratch) return error("MatMulW8: out of memory");
  char *f = scratch + M * K4 * 2;
  Digits d = {(int8_t *)scratch, (int8_t *)scratch + M * K4, (float *)f, (int32_t *)(f + M * KB * 4),
              (int32_t *)(f + M * KB * 8), (float *)(f + M * KB * 12)};
  digits_of(a->x, M, a->K, K4, a->block, KB, (int)a->digits, &d);
  JobW8 job = {&d, a->w, a->ws, a->y, M, K4, KB, a->n, a->block};
  OrtStatus *s = CALL(KernelContext_ParallelFor, context, a->bits == 8 ? run_w8 : a->digits == 2 ? run_w4 : run_w4_int8,
                      (size_t)a->P, (size_t)0, &job);
  free(scratch);
  return s;
}

#elif defined(__AVX2__) /* with FMA and F16C: 8 lanes a register, so a panel row is 4 registers, 16 in all */
#define MR 6 /* activation rows a pass over half an fp16 panel (16 columns): 12 accumulators */

/* row k of an fp16 panel as fp32, columns 8c .. 8c + 7 in w[c] */
static inline __attribute__((always_inline)) void load_row(const uint16_t *wp, int64_t k, __m256 w[4]) {
  for (int c = 0; c < 4; c++) w[c] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wp + k * NR + 8 * c)));
}

static inline __attribute__((always_inline)) void store(float *y, int cols, const __m256 a[4]) {
  if (cols == NR) {
    for (int c = 0; c < 4; c++) _mm256_storeu_ps(y + 8 * c, a[c]);
    return;
  }
  float full[NR];
  for (int c = 0; c < 4; c++) _mm256_storeu_ps(full + 8 * c, a[c]);
  for (int c = 0; c < cols; c++) y[c] = full[c];
}

/* rows x[0..mr) times one panel in two passes of 16 columns: 2 accumulators a row, so 6 rows share each weight
 * converted (a whole panel row a pass leaves room for 3) */
static inline __attribute__((always_inline)) void panel_rows(const float *x, const uint16_t *wp, float *y,
                                                             int64_t K, int64_t ldy, int mr, int cols) {
  __m256 out[MR][4];
  for (int half = 0; half < 2; half++) {
    __m256 a[MR][2];
    for (int i = 0; i < mr; i++) a[i][0] = a[i][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
      const uint16_t *at = wp + k * NR + 16 * half;
      __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)at));
      __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(at + 8)));
      for (int i = 0; i < mr; i++) {
        __m256 xb = _mm256_set1_ps(x[i * K + k]);
        a[i][0] = _mm256_fmadd_ps(xb, w0, a[i][0]);
        a[i][1] = _mm256_fmadd_ps(xb, w1, a[i][1]);
      }
    }
    for (int i = 0; i < mr; i++) out[i][2 * half] = a[i][0], out[i][2 * half + 1] = a[i][1];
  }
  for (int i = 0; i < mr; i++) store(y + i * ldy, cols, out[i]);
}

/* one row: two k chains so that the FMA latency does not bound the stream of weights */
static void panel_row(const float *x, const uint16_t *wp, float *y, int64_t K, int cols) {
  __m256 a[4], b[4], w[4];
  for (int c = 0; c < 4; c++) a[c] = b[c] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 1 < K; k += 2) {
    __m256 x0 = _mm256_set1_ps(x[k]), x1 = _mm256_set1_ps(x[k + 1]);
    load_row(wp, k, w);
    for (int c = 0; c < 4; c++) a[c] = _mm256_fmadd_ps(x0, w[c], a[c]);
    load_row(wp, k + 1, w);
    for (int c = 0; c < 4; c++) b[c] = _mm256_fmadd_ps(x1, w[c], b[c]);
  }
  if (k < K) {
    __m256 x0 = _mm256_set1_ps(x[k]);
    load_row(wp, k, w);
    for (int c = 0; c < 4; c++) a[c] = _mm256_fmadd_ps(x0, w[c], a[c]);
  }
  for (int c = 0; c < 4; c++) a[c] = _mm256_add_ps(a[c], b[c]);
  store(y, cols, a);
}

static void panel_block(const float *x, const uint16_t *wp, float *y, int64_t K, int64_t ldy, int mr, int cols) {
  switch (mr) { /* a constant row count: accumulators in registers */
#define ROWS(R) case R: panel_rows(x, wp, y, K, ldy, R, cols); break;
    ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6)
#undef ROWS
  }
}

/* MatMulW8 without VNNI: the two digits of an activation as one int16, D = 254 h + l (|D| <= 32385, the digits
 * above: x = s D / 254), the weights q (q + 128 with its top bit flipped) widened to int16; vpmaddwd multiplies
 * two pairs a lane and sums them in int32. A block's sum is flushed to fp32 every 256 rows at most: |sum| <= 256 *
 * 127 * 32385 < 2^31. The same products as the AVX-512 build's, so both give the same result but for fp32
 * rounding. One row takes a panel's 32 columns in one pass (8 accumulators, two partial sums a column); two or
 * three rows take 16 a pass (the 64 bytes of a quad row that are one cache line), 4 accumulators a row. */
#define WR 3 /* activation rows a pass */

struct Digits {
  int16_t *d; /* [M][K4] (+ 8: a row's digits are stored 8 at a time) */
  float *s;   /* [M][KB] */
  float *sum; /* [M][KB] sums of x as the digits hold it (MatMulW4's minimums) */
};

static void digits_of(const float *x, int64_t M, int64_t K, int64_t K4, int64_t block, int64_t KB, int digits,
                      Digits *dg) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 lim = _mm256_set1_ps(127.0f), nlim = _mm256_set1_ps(-127.0f), f254 = _mm256_set1_ps(254.0f);
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t m = 0; m < M; m++) {
    const float *xm = x + m * K;
    int16_t *d = dg->d + m * K4;
    for (int64_t b = 0; b < KB; b++) {
      int64_t k0 = b * block, k1 = k0 + block < K ? k0 + block : K;
      __m256 top = _mm256_setzero_ps();
      for (int64_t k = k0; k < k1; k += 8) {
        __m256i in = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(k1 - k)), lanes);
        top = _mm256_max_ps(top, _mm256_and_ps(_mm256_maskload_ps(xm + k, in), absmask));
      }
      __m128 t4 = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
      t4 = _mm_max_ps(t4, _mm_movehl_ps(t4, t4));
      float t = _mm_cvtss_f32(_mm_max_ss(t4, _mm_movehdup_ps(t4))), s = t > 0.0f ? t / 127.0f : 1.0f;
      __m256 inv = _mm256_set1_ps(1.0f / s);
      __m256i dsum = _mm256_setzero_si256();
      for (int64_t k = k0; k < k1; k += 8) { /* lanes past k1 load 0: their D is 0, or the next block's overwrites */
        __m256i in = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(k1 - k)), lanes);
        __m256 v = _mm256_mul_ps(_mm256_maskload_ps(xm + k, in), inv);
        __m256 hv = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256 lv = _mm256_round_ps(_mm256_mul_ps(_mm256_sub_ps(v, hv), f254),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        hv = _mm256_min_ps(_mm256_max_ps(hv, nlim), lim);
        lv = digits == 1 ? _mm256_setzero_ps() : _mm256_min_ps(_mm256_max_ps(lv, nlim), lim); /* 1: int8 */
        __m256i di = _mm256_cvtps_epi32(_mm256_fmadd_ps(hv, f254, lv)); /* exact: |D| < 2^24 */
        dsum = _mm256_add_epi32(dsum, di);
        _mm_storeu_si128((__m128i *)(d + k), _mm_packs_epi32(_mm256_castsi256_si128(di),
                                                              _mm256_extracti128_si256(di, 1)));
      }
      dg->s[m * KB + b] = s / 254.0f;
      __m128i d4 = _mm_add_epi32(_mm256_castsi256_si128(dsum), _mm256_extracti128_si256(dsum, 1));
      d4 = _mm_add_epi32(d4, _mm_shuffle_epi32(d4, 0x4E));
      d4 = _mm_add_epi32(d4, _mm_shuffle_epi32(d4, 0xB1));
      dg->sum[m * KB + b] = s / 254.0f * (float)_mm_cvtsi128_si32(d4);
    }
    for (int64_t k = K; k < K4; k++) d[k] = 0;
  }
}

/* columns 0-3 (a: two partial sums each) and 4-7 (b) as the 8 int32 sums, in column order */
static inline __attribute__((always_inline)) __m256i pair_sums(__m256i a, __m256i b) {
  return _mm256_permute4x64_epi64(_mm256_hadd_epi32(a, b), 0xD8);
}

/* rows m0 .. m0 + mr of one panel, its columns in passes of 8 g (the passes' 32 g bytes of a quad row; bits 4:
 * columns 8 c .. 8 c + 7 in the low (c < 2) or high nibbles of the quad row's 32 bytes at 32 (c % 2)) */
static inline __attribute__((always_inline)) void w8_rows(const JobW8 *j, size_t p, int64_t m0, int mr, int g,
                                                          int bits) {
  const int64_t K4 = j->K4, block = j->block;
  const uint8_t *wp = j->w + (int64_t)p * K4 * NR * bits / 8;
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  const float *ws32 = (const float *)j->ws + (int64_t)p * j->KB * NR;
  const uint16_t *ws16 = (const uint16_t *)j->ws + (int64_t)p * j->KB * 2 * NR; /* a block: scales, minimums */
  int64_t col = (int64_t)p * NR;
  int cols = j->n - col < NR ? (int)(j->n - col) : NR;
  const __m256i flip = _mm256_set1_epi8((char)0x80); /* q + 128 -> q, as int8 */
  const int16_t *dr[WR];
  for (int i = 0; i < mr; i++) dr[i] = j->d->d + (m0 + i) * K4;
  float out[WR][NR];
  for (int first = 0; first < 4; first += g) { /* groups of 8 columns first .. first + g */
    __m256 f[WR][4];
    for (int i = 0; i < mr; i++)
      for (int c = 0; c < g; c++) f[i][c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < j->KB; b++) {
      int64_t k1 = (b + 1) * block < K4 ? (b + 1) * block : K4;
      for (int64_t kk = b * block; kk < k1; kk += 256) {
        int64_t kend = kk + 256 < k1 ? kk + 256 : k1;
        __m256i a[WR][8];
        for (int i = 0; i < mr; i++)
          for (int c = 0; c < 2 * g; c++) a[i][c] = _mm256_setzero_si256();
        for (int64_t k = kk; k < kend; k += 4) {
          __m256i dq[WR];
          for (int i = 0; i < mr; i++) {
            int64_t dv;
            __builtin_memcpy(&dv, dr[i] + k, 8);
            dq[i] = _mm256_set1_epi64x(dv);
          }
          for (int c = 0; c < g; c++) { /* 8 columns: 32 bytes, four rows of each */
            __m256i q;
            if (bits == 8) {
              q = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(wp + k * NR + 32 * (first + c))), flip);
            } else {
              __m256i both = _mm256_loadu_si256((const __m256i *)(wp + k * NR / 2 + 32 * ((first + c) % 2)));
              if (first + c >= 2) both = _mm256_srli_epi16(both, 4);
              q = _mm256_and_si256(both, nibble); /* u: 0 .. 15 */
            }
            __m256i lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q));
            __m256i hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1));
            for (int i = 0; i < mr; i++) {
              a[i][2 * c] = _mm256_add_epi32(a[i][2 * c], _mm256_madd_epi16(lo, dq[i]));
              a[i][2 * c + 1] = _mm256_add_epi32(a[i][2 * c + 1], _mm256_madd_epi16(hi, dq[i]));
            }
          }
        }
        for (int c = 0; c < g; c++) {
          int64_t at = b * NR + 8 * (first + c), at16 = b * 2 * NR + 8 * (first + c);
          __m256 ws = bits == 8 ? _mm256_loadu_ps(ws32 + at)
                                : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(ws16 + at16)));
          for (int i = 0; i < mr; i++) {
            __m256 v = _mm256_cvtepi32_ps(pair_sums(a[i][2 * c], a[i][2 * c + 1]));
            f[i][c] = _mm256_fmadd_ps(_mm256_mul_ps(v, _mm256_set1_ps(j->d->s[(m0 + i) * j->KB + b])), ws, f[i][c]);
          }
          if (bits == 4 && kk == b * block) { /* the block's minimums, once: + m sum x */
            __m256 wm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(ws16 + at16 + NR)));
            for (int i = 0; i < mr; i++)
              f[i][c] = _mm256_fmadd_ps(_mm256_set1_ps(j->d->sum[(m0 + i) * j->KB + b]), wm, f[i][c]);
          }
        }
      }
    }
    for (int i = 0; i < mr; i++)
      for (int c = 0; c < g; c++) _mm256_storeu_ps(out[i] + 8 * (first + c), f[i][c]);
  }
  for (int i = 0; i < mr; i++)
    for (int c = 0; c < cols; c++) j->y[(m0 + i) * j->n + col + c] = out[i][c];
}

/* one row: the whole panel row a pass, 8 accumulators; more: half of it, 4 accumulators a row */
#define RUN(BITS)                                                                                                \
  static void run_w##BITS(void *job, size_t p) {                                                                 \
    const JobW8 *j = job;                                                                                        \
    for (int64_t m = 0; m < j->M; m += WR) {                                                                     \
      switch (j->M - m < WR ? (int)(j->M - m) : WR) { /* a constant row count: accumulators in registers */     \
        case 1: w8_rows(j, p, m, 1, 4, BITS); break;                                                             \
        case 2: w8_rows(j, p, m, 2, 2, BITS); break;                                                             \
        case 3: w8_rows(j, p, m, 3, 2, BITS); break;                                                             \
      }                                                                                                          \
    }                                                                                                            \
  }
RUN(8)
RUN(4)
#undef RUN

#else /* portable C, no machine flags (AArch64, or an x86-64 CPU without AVX2): the AVX2 build's layout, digits and
       * integer sums written as loops over a panel's 32 columns, which the compiler vectorizes (NEON on AArch64) */
#define MR 4 /* activation rows a pass over an fp16 panel */

static void panel_block(const float *x, const uint16_t *wp, float *y, int64_t K, int64_t ldy, int mr, int cols) {
  float a[MR][NR] = {{0}}, w[NR];
  for (int64_t k = 0; k < K; k++) {
    for (int c = 0; c < NR; c++) w[c] = half_to_float(wp[k * NR + c]);
    for (int i = 0; i < mr; i++)
      for (int c = 0; c < NR; c++) a[i][c] += x[i * K + k] * w[c];
  }
  for (int i = 0; i < mr; i++)
    for (int c = 0; c < cols; c++) y[i * ldy + c] = a[i][c];
}

static void panel_row(const float *x, const uint16_t *wp, float *y, int64_t K, int cols) {
  panel_block(x, wp, y, K, 0, 1, cols);
}

#define WR 4 /* activation rows a pass over a panel */

struct Digits { /* as the AVX2 build's: D = 254 h + l as one int16 */
  int16_t *d; /* [M][K4] (+ 8) */
  float *s;   /* [M][KB] */
  float *sum; /* [M][KB] */
};

static void digits_of(const float *x, int64_t M, int64_t K, int64_t K4, int64_t block, int64_t KB, int digits,
                      Digits *dg) {
  for (int64_t m = 0; m < M; m++) {
    const float *xm = x + m * K;
    int16_t *d = dg->d + m * K4;
    for (int64_t b = 0; b < KB; b++) {
      int64_t k0 = b * block, k1 = k0 + block < K ? k0 + block : K;
      float t = 0.0f;
      for (int64_t k = k0; k < k1; k++) t = fabsf(xm[k]) > t ? fabsf(xm[k]) : t;
      float s = t > 0.0f ? t / 127.0f : 1.0f, inv = 1.0f / s;
      int32_t dsum = 0;
      for (int64_t k = k0; k < k1; k++) {
        float v = xm[k] * inv, hv = nearbyintf(v), lv = nearbyintf((v - hv) * 254.0f);
        hv = fminf(fmaxf(hv, -127.0f), 127.0f);
        lv = digits == 1 ? 0.0f : fminf(fmaxf(lv, -127.0f), 127.0f);
        d[k] = (int16_t)(hv * 254.0f + lv);
        dsum += d[k];
      }
      dg->s[m * KB + b] = s / 254.0f;
      dg->sum[m * KB + b] = s / 254.0f * (float)dsum;
    }
    for (int64_t k = K; k < K4; k++) d[k] = 0;
  }
}

/* rows m0 .. m0 + mr of one panel: a quad row's int32 sums flushed to fp32 every 256 rows, as the AVX2 build */
static void w8_rows(const JobW8 *j, size_t p, int64_t m0, int mr, int bits) {
  const int64_t K4 = j->K4, block = j->block;
  const uint8_t *wp = j->w + (int64_t)p * K4 * NR * bits / 8;
  const float *ws32 = (const float *)j->ws + (int64_t)p * j->KB * NR;
  const uint16_t *ws16 = (const uint16_t *)j->ws + (int64_t)p * j->KB * 2 * NR; /* a block: scales, minimums */
  int64_t col = (int64_t)p * NR;
  int cols = j->n - col < NR ? (int)(j->n - col) : NR;
  float f[WR][NR] = {{0}};
  for (int64_t b = 0; b < j->KB; b++) {
    int64_t k1 = (b + 1) * block < K4 ? (b + 1) * block : K4;
    float ws[NR], wm[NR];
    for (int c = 0; c < NR; c++) {
      ws[c] = bits == 8 ? ws32[b * NR + c] : half_to_float(ws16[b * 2 * NR + c]);
      wm[c] = bits == 8 ? 0.0f : half_to_float(ws16[b * 2 * NR + NR + c]);
    }
    for (int64_t kk = b * block; kk < k1; kk += 256) {
      int64_t kend = kk + 256 < k1 ? kk + 256 : k1;
      int32_t a[WR][NR] = {{0}};
      for (int64_t k = kk; k < kend; k += 4) {
        int16_t q[4][NR]; /* the quad row's weights, row by row: the column loops below run over contiguous lanes */
        if (bits == 8) {
          for (int r = 0; r < 4; r++)
            for (int c = 0; c < NR; c++) q[r][c] = (int16_t)(wp[k * NR + 4 * c + r] - 128);
        } else {
          for (int r = 0; r < 4; r++)
            for (int c = 0; c < NR / 2; c++) {
              uint8_t both = wp[k * NR / 2 + 4 * c + r];
              q[r][c] = both & 15, q[r][c + NR / 2] = both >> 4;
            }
        }
        for (int i = 0; i < mr; i++) {
          const int16_t *d = j->d->d + (m0 + i) * K4 + k;
          for (int r = 0; r < 4; r++)
            for (int c = 0; c < NR; c++) a[i][c] += q[r][c] * d[r];
        }
      }
      for (int i = 0; i < mr; i++) {
        float sx = j->d->s[(m0 + i) * j->KB + b], mx = j->d->sum[(m0 + i) * j->KB + b];
        for (int c = 0; c < NR; c++) f[i][c] += (float)a[i][c] * sx * ws[c];
        if (bits == 4 && kk == b * block) /* the block's minimums, once: + m sum x */
          for (int c = 0; c < NR; c++) f[i][c] += mx * wm[c];
      }
    }
  }
  for (int i = 0; i < mr; i++)
    for (int c = 0; c < cols; c++) j->y[(m0 + i) * j->n + col + c] = f[i][c];
}

#define RUN(BITS)                                                                                                \
  static void run_w##BITS(void *job, size_t p) {                                                                 \
    const JobW8 *j = job;                                                                                        \
    for (int64_t m = 0; m < j->M; m += WR) w8_rows(j, p, m, j->M - m < WR ? (int)(j->M - m) : WR, BITS);         \
  }
RUN(8)
RUN(4)
#undef RUN
#endif

#if !defined(__AVX512F__) /* the AVX2 and portable builds: one int16 D a value */
#define run_w4_int8 run_w4 /* the low digit is 0 in D: the same products */

static OrtStatus *matmul_w8(void *context, const W8Args *a) {
  int64_t M = a->M, K4 = a->K4, KB = a->KB;
  char *scratch = malloc((size_t)((M * K4 + 8) * 2 + M * KB * 8));
  if (!scratch) return error("MatMulW8: out of memory");
  float *f = (float *)(scratch + (M * K4 + 8) * 2);
  Digits d = {(int16_t *)scratch, f, f + M * KB};
  digits_of(a->x, M, a->K, K4, a->block, KB, (int)a->digits, &d);
  JobW8 job = {&d, a->w, a->ws, a->y, M, K4, KB, a->n, a->block};
  OrtStatus *s = CALL(KernelContext_ParallelFor, context, a->bits == 8 ? run_w8 : a->digits == 2 ? run_w4 : run_w4_int8,
                      (size_t)a->P, (size_t)0, &job);
  free(scratch);
  return s;
}
#endif

typedef struct {
  const float *x;
  const uint16_t *w;
  float *y;
  int64_t M, K, n;
} JobF16;

static void run_f16(void *job, size_t p) {
  const JobF16 *j = job;
  const uint16_t *wp = j->w + (int64_t)p * j->K * NR;
  int64_t col = (int64_t)p * NR;
  int cols = j->n - col < NR ? (int)(j->n - col) : NR;
  if (j->M == 1) {
    panel_row(j->x, wp, j->y + col, j->K, cols);
    return;
  }
  for (int64_t m = 0; m < j->M; m += MR)
    panel_block(j->x + m * j->K, wp, j->y + m * j->n + col, j->K, j->n, j->M - m < MR ? (int)(j->M - m) : MR,
                cols);
}

typedef struct {
  int64_t n, block, bits, digits; /* MatMulF16: block 0, bits 16; MatMulW8: digits 2 */
} Kernel;

OrtStatus *shape_of(const void *value, int64_t *dims, size_t *rank) {
  void *info;
  OrtStatus *s = CALL(GetTensorTypeAndShape, value, &info);
  if (s) return s;
  s = CALL(GetDimensionsCount, info, rank);
  if (!s && *rank <= 8) s = CALL(GetDimensions, info, dims, *rank);
  ((void (*)(void *))api[ReleaseTensorTypeAndShapeInfo])(info);
  if (!s && *rank > 8) s = error("edgeinfer op: an input of more than 8 dimensions");
  return s;
}

static OrtStatus *compute(void *kernel, void *context) {
  const Kernel *kn = kernel;
  int w8 = kn->bits < 16; /* MatMulW8 or W4: weights and scales */
  const void *xv, *wv, *sv = NULL;
  void *yv, *x, *w, *sc = NULL, *y;
  int64_t xd[8], wd[8], sd[8], yd[8];
  size_t xr, wr, sr = 3;
  OrtStatus *s;
  if ((s = CALL(KernelContext_GetInput, context, (size_t)0, &xv)) || (s = CALL(KernelContext_GetInput, context,
      (size_t)1, &wv)) || (s = shape_of(xv, xd, &xr)) || (s = shape_of(wv, wd, &wr)))
    return s;
  if (w8 && ((s = CALL(KernelContext_GetInput, context, (size_t)2, &sv)) || (s = shape_of(sv, sd, &sr))))
    return s;
  int64_t K = xr ? xd[xr - 1] : 0, KB = w8 ? (K + kn->block - 1) / kn->block : 0;
  if (xr < 1 || wr != 3 || wd[2] != NR || kn->n < 1 || kn->n > wd[0] * NR ||
      wd[1] != (w8 ? (K + 3) / 4 * 4 * kn->bits / 8 : K))
    return error(kn->bits == 16 ? "MatMulF16: x must be [..., K], w [P, K, 32] with 0 < n <= 32 P"
                 : kn->bits == 8 ? "MatMulW8: x must be [..., K], w [P, K rounded up to 4, 32] with 0 < n <= 32 P"
                 : "MatMulW4: x must be [..., K], w [P, (K rounded up to 4) / 2, 32] with 0 < n <= 32 P");
  if (w8 && (sd[0] != wd[0] || sd[1] != KB || (kn->bits == 8 ? sr != 3 || sd[2] != NR
                                                                 : sr != 4 || sd[2] != 2 || sd[3] != NR)))
    return error(kn->bits == 8 ? "MatMulW8: scales must be [P, ceil(K / block), 32]"
                               : "MatMulW4: scales must be [P, ceil(K / block), 2, 32] (scales, then minimums)");
  int64_t M = 1;
  for (size_t i = 0; i + 1 < xr; i++) M *= (yd[i] = xd[i]);
  yd[xr - 1] = kn->n;
  if ((s = CALL(KernelContext_GetOutput, context, (size_t)0, yd, xr, &yv)) ||
      (s = CALL(GetTensorMutableData, (void *)xv, &x)) || (s = CALL(GetTensorMutableData, (void *)wv, &w)) ||
      (w8 && (s = CALL(GetTensorMutableData, (void *)sv, &sc))) || (s = CALL(GetTensorMutableData, yv, &y)))
    return s;
  if (M == 0) return NULL;
  if (!w8) {
    JobF16 job = {x, w, y, M, K, kn->n};
    return CALL(KernelContext_ParallelFor, context, run_f16, (size_t)wd[0], (size_t)0, &job);
  }
  W8Args args = {x, w, sc, y, M, K, (K + 3) / 4 * 4, KB, kn->n, kn->block, wd[0], kn->bits, kn->digits};
  return matmul_w8(context, &args);
}

static OrtStatus *create(const void *info, void **out, int bits) {
  Kernel *k = malloc(sizeof *k);
  if (!k) return error("MatMulF16/W8/W4: out of memory");
  k->block = 0, k->bits = bits, k->digits = 2;
  OrtStatus *s = CALL(KernelInfoGetAttribute_int64, info, "n", &k->n);
  if (!s && bits < 16) s = CALL(KernelInfoGetAttribute_int64, info, "block", &k->block);
  if (!s && bits < 16 && (k->block < 4 || k->block % 4)) s = error("MatMulW8/W4: block must be a multiple of 4");
  if (!s && bits == 4) s = CALL(KernelInfoGetAttribute_int64, info, "digits", &k->digits);
  if (!s && (k->digits < 1 || k->digits > 2)) s = error("MatMulW4: digits must be 1 or 2");
  if (s) free(k);
  else *out = k;
  return s;
}
static OrtStatus *create_f16(const OrtCustomOp *op, const void *a, const void *info, void **out) {
  (void)op, (void)a;
  return create(info, out, 16);
}
static OrtStatus *create_w8(const OrtCustomOp *op, const void *a, const void *info, void **out) {
  (void)op, (void)a;
  return create(info, out, 8);
}
static OrtStatus *create_w4(const OrtCustomOp *op, const void *a, const void *info, void **out) {
  (void)op, (void)a;
  return create(info, out, 4);
}
static const char *name_f16(const OrtCustomOp *op) { (void)op; return "MatMulF16"; }
static const char *name_w8(const OrtCustomOp *op) { (void)op; return "MatMulW8"; }
static const char *name_w4(const OrtCustomOp *op) { (void)op; return "MatMulW4"; }
static int type_f16(const OrtCustomOp *op, size_t i) { (void)op; return i == 0 ? TYPE_FLOAT : TYPE_FLOAT16; }
static int type_w8(const OrtCustomOp *op, size_t i) { (void)op; return i == 1 ? TYPE_UINT8 : TYPE_FLOAT; }
static int type_w4(const OrtCustomOp *op, size_t i) {
  (void)op;
  return i == 1 ? TYPE_UINT8 : i >= 2 ? TYPE_FLOAT16 : TYPE_FLOAT;
}

static const OrtCustomOp f16 = {16, NULL, name_f16, provider, type_f16, two, float_output, one, NULL, destroy,
                                required, required, memory_default, min_arity, homogeneous, min_arity, homogeneous,
                                create_f16, compute};
static const OrtCustomOp w8 = {16, NULL, name_w8, provider, type_w8, three, float_output, one, NULL, destroy,
                               required, required, memory_default, min_arity, homogeneous, min_arity, homogeneous,
                               create_w8, compute};
static const OrtCustomOp w4 = {16, NULL, name_w4, provider, type_w4, three, float_output, one, NULL, destroy,
                               required, required, memory_default, min_arity, homogeneous, min_arity, homogeneous,
                               create_w4, compute};

__attribute__((visibility("default"))) OrtStatus *RegisterCustomOps(void *options, const OrtApiBase *base) {
  api = base->GetApi(API_VERSION);
  if (!api) return NULL; /* an onnxruntime older than 1.17: the ops stay unknown and the graph is refused */
  void *domain;
  OrtStatus *s = CALL(CreateCustomOpDomain, "edgeinfer", &domain);
  if (!s) s = CALL(CustomOpDomain_Add, domain, &f16);
  if (!s) s = CALL(CustomOpDomain_Add, domain, &w8);
  if (!s) s = CALL(CustomOpDomain_Add, domain, &w4);
  if (!s) s = CALL(CustomOpDomain_Add, domain, &attention_op);
  if (!s) s = CALL(CustomOpDomain_Add, domain, &attention_q8_op);
  if (!s) s = CALL(CustomOpDomain_Add, domain, &embed_f16_op);
  if (!s) s = CALL(CustomOpDomain_Add, domain, &embed_w8_op);
  if (!s) s = CALL(AddCustomOpDomain, options, domain);
  return s;
}
