/* edgeinfer.GroupQueryAttention: the decoder's attention over an fp16 KV cache that past and present share, with
 * fp32 queries and output, for the host decoder schemes on edgeinfer's own ops (custom_ops.py).
 *
 * It computes what com.microsoft.GroupQueryAttention computes for the graphs onnxruntime-genai's builder writes
 * (https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md): packed QKV or separate Q, K, V,
 * do_rotary 1, rotary_interleaved 0, no local window, no softcap, past and present one buffer; without the Casts
 * an fp16 cache puts around it, and the query, scores and softmax in fp32. onnxruntime 1.26's fp16 kernel spent
 * ~50 us a layer on a one-token step of SmolLM2-135M where the arithmetic is a few microseconds (bench/README.md,
 * "An attention op of our own").
 *
 * Per row b, with T = seqlens_k[b] + 1 and S the new tokens: they sit at positions p0 = T - S ... T - 1. Each new
 * key is rotated at its position (rotate-half: x1 cos - x2 sin, x2 cos + x1 sin, cos/sin [positions, D / 2]) and
 * written with its value into the cache at [b, kv head, p0 + s]; the query of token s, rotated alike, attends to
 * positions 0 ... p0 + s (causal) of its KV head (query head h reads KV head h / (num_heads / kv_num_heads)).
 *
 * Inputs:  query float [B, S, H D] with key and value float [B, S, KVH D], or query alone as the packed QKV
 *          [B, S, (H + 2 KVH) D] (key and value empty); past_key, past_value fp16 [B, KVH, L, D]; seqlens_k int32
 *          [B]; total_sequence_length int32 (a scalar); cos_cache, sin_cache fp16 [P, D / 2].
 * Outputs: output float [B, S, H D]; present_key, present_value fp16 [B, KVH, L, D]: bound to the past buffers
 *          (written in place); other buffers get the past copied first.
 * Attributes: num_heads, kv_num_heads; scale (float; 0: 1 / sqrt(D)).
 * F16C and FMA on 8 lanes in the AVX2 and AVX-512 builds of the library; the portable build (any other CPU) computes
 * the same sums in loops the compiler vectorizes.
 *
 * edgeinfer.GroupQueryAttentionQ8 is the same over a q8_0 cache (llama.cpp's --cache-type-k q8_0 layout, a row at
 * a time): past/present uint8 [B, KVH, L, D + D / 16], each position's row D int8 digits and then D / 32 fp16
 * scales, one a block of 32 (D a multiple of 32), quantized as ggml's quantize_row_q8_0_ref does (scale = the
 * block's largest magnitude / 127, each digit rounded to nearest): 34 bytes a block, 1.0625 a value.
 */
#if defined(__AVX2__)
#include <immintrin.h>
#endif
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "ort.h"

typedef struct {
  int64_t heads, kv_heads;
  float scale;
  int q8; /* the q8_0 cache (GroupQueryAttentionQ8) */
} Attention;

typedef struct { /* one call, split over (row, KV head) */
  const float *q, *kn, *vn; /* the new tokens' query, key and value, rows of qs, ks, vs floats */
  int64_t qs, ks, vs;
  void *k, *v; /* fp16, or q8_0 rows of W bytes */
  const uint16_t *cos, *sin;
  const int32_t *seqlens;
  float *out;
  int64_t S, L, D, H, G; /* G: query heads a KV head */
  float scale;
  float *scratch; /* MAXG (D + N) floats a (row, KV head): rotated queries and rows of scores */
  int q8;
  int64_t W; /* a cache row's elements: D (fp16), D + D / 16 (q8_0 bytes) */
  int64_t N; /* the longest row's length after the step: a row of scores */
} Job;

static inline void rotate(const float *x, float *y, const uint16_t *cos, const uint16_t *sin, int64_t D) {
  int64_t h = D / 2;
  for (int64_t i = 0; i < h; i++) {
    float c = half_to_float(cos[i]), s = half_to_float(sin[i]);
    y[i] = x[i] * c - x[i + h] * s;
    y[i + h] = x[i + h] * c + x[i] * s;
  }
}

/* the fp16 scale of block b of a q8_0 row (D int8 digits, then D / 32 fp16 scales) */
static inline float q8_scale(const uint8_t *row, int64_t D, int64_t b) {
  return half_to_float(((const uint16_t *)(row + D))[b]);
}

/* A pass of the scores and the weighted sum serves c (<= MAXG) query heads of one KV head at once: each cache row
 * is read and converted to fp32 once for all of them, where a head at a time converted it c times (the query heads
 * sharing a KV head: 2 in Qwen3-0.6B, 3 in SmolLM2-135M, 7 in Qwen2.5-0.5B). Each head's sums run in the same
 * order as one head's alone. */
enum { MAXG = 4 };

#if defined(__AVX2__)
static inline float hsum(__m256 a) {
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  return _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)));
}

static inline float dot(const float *q, const uint16_t *k, int64_t D) {
  __m256 a = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + 8 <= D; d += 8)
    a = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + d))), a);
  float sum = hsum(a);
  for (; d < D; d++) sum += q[d] * half_to_float(k[d]);
  return sum;
}

static inline __m256 f16x8(const uint16_t *x) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x)); }

/* q8_0 rows: D int8 digits, then D / 32 fp16 scales */
static inline __m256 i8x8(const int8_t *x) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)x)));
}


/* the sums of a0..a7's lanes, in lanes 0..7 */
static inline __m256 sum8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6, __m256 a7) {
  __m256 s0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  __m256 s1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
  return _mm256_add_ps(_mm256_permute2f128_ps(s0, s1, 0x20), _mm256_permute2f128_ps(s0, s1, 0x31));
}

/* The tiles below take R rows and c heads as constants (always inlined at each call). */
#define TILE static inline __attribute__((always_inline))

/* w[h * ws + t + r] = scale q_h . row r, from the R x c accumulators a[r * c + h] (R c <= 12), eight at a time */
TILE void store_scores(const __m256 *a, int R, int c, float *w, int64_t ws, int64_t t, float scale) {
  __m256 z = _mm256_setzero_ps();
  for (int i0 = 0; i0 < R * c; i0 += 8) {
    __m256 x[8];
    for (int i = 0; i < 8; i++) x[i] = i0 + i < R * c ? a[i0 + i] : z;
    float lanes[8];
    __m256 sums = sum8(x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7]);
    _mm256_storeu_ps(lanes, _mm256_mul_ps(sums, _mm256_set1_ps(scale)));
    for (int i = i0; i < i0 + 8 && i < R * c; i++) w[(i % c) * ws + t + i / c] = lanes[i - i0];
  }
}

/* rows t .. t + R - 1 of an fp16 K (D a multiple of 8) against the c queries q_h = q + h D */
TILE void tile_f16(const float *q, const uint16_t *K, float *w, int64_t ws, int64_t t, int64_t D, float scale, int R,
                   int c) {
  __m256 a[12];
  for (int i = 0; i < R * c; i++) a[i] = _mm256_setzero_ps();
  for (int64_t d = 0; d < D; d += 8) {
    __m256 x[MAXG];
    for (int h = 0; h < c; h++) x[h] = _mm256_loadu_ps(q + h * D + d);
    for (int r = 0; r < R; r++) {
      __m256 k = f16x8(K + (t + r) * D + d);
      for (int h = 0; h < c; h++) a[r * c + h] = _mm256_fmadd_ps(x[h], k, a[r * c + h]);
    }
  }
  store_scores(a, R, c, w, ws, t, scale);
}

/* the same over q8_0 rows of W bytes: a block's partial sums in one register, scaled into the row's accumulator */
TILE void tile_q8(const float *q, const uint8_t *K, int64_t W, float *w, int64_t ws, int64_t t, int64_t D,
                  float scale, int R, int c) {
  __m256 a[12];
  for (int i = 0; i < R * c; i++) a[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < D / 32; b++)
    for (int r = 0; r < R; r++) {
      const uint8_t *row = K + (t + r) * W;
      const int8_t *y = (const int8_t *)row + b * 32;
      __m256 k0 = i8x8(y), k1 = i8x8(y + 8), k2 = i8x8(y + 16), k3 = i8x8(y + 24);
      __m256 sc = _mm256_set1_ps(q8_scale(row, D, b));
      for (int h = 0; h < c; h++) {
        const float *x = q + h * D + b * 32;
        __m256 s = _mm256_mul_ps(_mm256_loadu_ps(x), k0);
        s = _mm256_fmadd_ps(_mm256_loadu_ps(x + 8), k1, s);
        s = _mm256_fmadd_ps(_mm256_loadu_ps(x + 16), k2, s);
        s = _mm256_fmadd_ps(_mm256_loadu_ps(x + 24), k3, s);
        a[r * c + h] = _mm256_fmadd_ps(sc, s, a[r * c + h]);
      }
    }
  store_scores(a, R, c, w, ws, t, scale);
}

/* every row t < n: 8 / c rows a tile (2 for 3 heads), then one at a time */
TILE void scores_c(const float *q, const void *K, int64_t W, int q8, float *w, int64_t ws, int64_t n, int64_t D,
                   float scale, int c) {
  int R = c == 1 ? 8 : c == 2 ? 4 : c == 3 ? 4 : 3;
  int64_t t = 0;
  for (; t + R <= n; t += R)
    if (q8) tile_q8(q, K, W, w, ws, t, D, scale, R, c);
    else tile_f16(q, K, w, ws, t, D, scale, R, c);
  for (; t < n; t++)
    if (q8) tile_q8(q, K, W, w, ws, t, D, scale, 1, c);
    else tile_f16(q, K, w, ws, t, D, scale, 1, c);
}

/* w[h * ws + t] = scale q_h . K[t] for t < n and the c heads q_h = q + h D */
static void scores(const float *q, const void *K, int64_t W, int q8, float *w, int64_t ws, int64_t n, int64_t D,
                   float scale, int c) {
  if (!q8 && D % 8) {
    for (int h = 0; h < c; h++)
      for (int64_t t = 0; t < n; t++) w[h * ws + t] = dot(q + h * D, (const uint16_t *)K + t * D, D) * scale;
    return;
  }
  switch (c) {
  case 1: scores_c(q, K, W, q8, w, ws, n, D, scale, 1); break;
  case 2: scores_c(q, K, W, q8, w, ws, n, D, scale, 2); break;
  case 3: scores_c(q, K, W, q8, w, ws, n, D, scale, 3); break;
  default: scores_c(q, K, W, q8, w, ws, n, D, scale, 4); break;
  }
}

/* e^x for x <= 0 (the scores less their maximum): Cephes' expf, as avx_mathfun writes it for 8 lanes */
static inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* w[0..n) = e^(w[t] - max w), in place; returns 1 / their sum (the weighted sum scales by it once, at the end) */
static float softmax(float *w, int64_t n) {
  int64_t t = 0;
  __m256 m = _mm256_set1_ps(-INFINITY);
  for (; t + 8 <= n; t += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(w + t));
  float lanes[8], top = -INFINITY, sum = 0.f;
  _mm256_storeu_ps(lanes, m);
  for (int i = 0; i < 8; i++) top = lanes[i] > top ? lanes[i] : top;
  for (; t < n; t++) top = w[t] > top ? w[t] : top;
  __m256 acc = _mm256_setzero_ps();
  m = _mm256_set1_ps(top);
  for (t = 0; t + 8 <= n; t += 8) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(w + t), m));
    _mm256_storeu_ps(w + t, e);
    acc = _mm256_add_ps(acc, e);
  }
  _mm256_storeu_ps(lanes, acc);
  for (int i = 0; i < 8; i++) sum += lanes[i];
  for (; t < n; t++) sum += (w[t] = expf(w[t] - top));
  return 1.f / sum;
}

/* y_h[d .. d + 8 V) = sum over t < n of w[h * ws + t] V[t][d ...] for the c heads y_h = y + h D: V 8-column vectors
 * of each row converted once, then weighed for every head */
TILE void cols_f16(const float *w, int64_t ws, const float *inv, const uint16_t *Vc, float *y, int64_t n, int64_t D,
                   int64_t d, int V, int c) {
  __m256 a[16];
  for (int i = 0; i < V * c; i++) a[i] = _mm256_setzero_ps();
  for (int64_t t = 0; t < n; t++) {
    __m256 v[8];
    for (int i = 0; i < V; i++) v[i] = f16x8(Vc + t * D + d + 8 * i);
    for (int h = 0; h < c; h++) {
      __m256 p = _mm256_broadcast_ss(w + h * ws + t);
      for (int i = 0; i < V; i++) a[h * V + i] = _mm256_fmadd_ps(p, v[i], a[h * V + i]);
    }
  }
  for (int h = 0; h < c; h++)
    for (int i = 0; i < V; i++)
      _mm256_storeu_ps(y + h * D + d + 8 * i, _mm256_mul_ps(a[h * V + i], _mm256_set1_ps(inv[h])));
}

/* the same over the q8_0 rows of W bytes: columns d .. d + 8 V (d a multiple of 32, or the V vectors within one
 * block), vector i in block d / 32 + i / 4 */
TILE void cols_q8(const float *w, int64_t ws, const float *inv, const uint8_t *Vc, int64_t W, float *y, int64_t n,
                  int64_t D, int64_t d, int V, int c) {
  __m256 a[16];
  for (int i = 0; i < V * c; i++) a[i] = _mm256_setzero_ps();
  for (int64_t t = 0; t < n; t++) {
    const uint8_t *row = Vc + t * W;
    float sc[2];
    for (int k = 0; k < (V + 3) / 4; k++) sc[k] = q8_scale(row, D, d / 32 + k);
    __m256 v[8];
    for (int i = 0; i < V; i++) v[i] = i8x8((const int8_t *)row + d + 8 * i);
    for (int h = 0; h < c; h++) {
      __m256 p[2];
      for (int k = 0; k < (V + 3) / 4; k++) p[k] = _mm256_set1_ps(w[h * ws + t] * sc[k]);
      for (int i = 0; i < V; i++) a[h * V + i] = _mm256_fmadd_ps(p[i / 4], v[i], a[h * V + i]);
    }
  }
  for (int h = 0; h < c; h++)
    for (int i = 0; i < V; i++)
      _mm256_storeu_ps(y + h * D + d + 8 * i, _mm256_mul_ps(a[h * V + i], _mm256_set1_ps(inv[h])));
}

/* 8 V columns a pass, V * c accumulators (8 or 12: each takes one FMA a row, and an FMA's latency is four of its
 * issue slots), then 32, then 8 */
TILE void weigh_c(const float *w, int64_t ws, const float *inv, const void *Vc, int64_t W, int q8, float *y,
                  int64_t n, int64_t D, int c) {
  int V = c == 1 ? 8 : c <= 3 ? 4 : 2;
  int64_t d = 0;
  for (; d + 8 * V <= D; d += 8 * V)
    if (q8) cols_q8(w, ws, inv, Vc, W, y, n, D, d, V, c);
    else cols_f16(w, ws, inv, Vc, y, n, D, d, V, c);
  for (; V > 4 && d + 32 <= D; d += 32)
    if (q8) cols_q8(w, ws, inv, Vc, W, y, n, D, d, 4, c);
    else cols_f16(w, ws, inv, Vc, y, n, D, d, 4, c);
  for (; d < D; d += 8)
    if (q8) cols_q8(w, ws, inv, Vc, W, y, n, D, d, 1, c);
    else cols_f16(w, ws, inv, Vc, y, n, D, d, 1, c);
}

/* y_h[0..D) = inv[h] sum over t < n of w[h * ws + t] V[t] for the c heads y_h = y + h D (D a multiple of 8, else a
 * row at a time through y) */
static void weigh(const float *w, int64_t ws, const float *inv, const void *Vc, int64_t W, int q8, float *y,
                  int64_t n, int64_t D, int c) {
  if (!q8 && D % 8) {
    const uint16_t *V = Vc;
    for (int h = 0; h < c; h++) {
      float *yh = y + h * D;
      memset(yh, 0, sizeof(float) * (size_t)D);
      for (int64_t t = 0; t < n; t++)
        for (int64_t d = 0; d < D; d++) yh[d] += w[h * ws + t] * half_to_float(V[t * D + d]);
      for (int64_t d = 0; d < D; d++) yh[d] *= inv[h];
    }
    return;
  }
  switch (c) {
  case 1: weigh_c(w, ws, inv, Vc, W, q8, y, n, D, 1); break;
  case 2: weigh_c(w, ws, inv, Vc, W, q8, y, n, D, 2); break;
  case 3: weigh_c(w, ws, inv, Vc, W, q8, y, n, D, 3); break;
  default: weigh_c(w, ws, inv, Vc, W, q8, y, n, D, 4); break;
  }
}

static inline void store_f16(const float *x, uint16_t *y, int64_t D) {
  int64_t d = 0;
  for (; d + 8 <= D; d += 8)
    _mm_storeu_si128((__m128i *)(y + d), _mm256_cvtps_ph(_mm256_loadu_ps(x + d), _MM_FROUND_TO_NEAREST_INT));
  for (; d < D; d++) y[d] = float_to_half(x[d]);
}

#else /* portable C: a cache row converted to fp32 once for the c heads, sums in 8 independent lanes (vectorized
       * without reassociating), e^x from the C library */
/* row t of the cache as fp32 */
static inline void row_f32(const void *C, int64_t W, int q8, int64_t t, int64_t D, float *r) {
  if (q8) {
    const uint8_t *row = (const uint8_t *)C + t * W;
    for (int64_t b = 0; b < D / 32; b++) {
      float sc = q8_scale(row, D, b);
      for (int i = 0; i < 32; i++) r[b * 32 + i] = sc * (float)((const int8_t *)row)[b * 32 + i];
    }
  } else {
    for (int64_t d = 0; d < D; d++) r[d] = half_to_float(((const uint16_t *)C)[t * D + d]);
  }
}

static inline float dot_f32(const float *x, const float *y, int64_t D) {
  float a[8] = {0};
  int64_t d = 0;
  for (; d + 8 <= D; d += 8)
    for (int i = 0; i < 8; i++) a[i] += x[d + i] * y[d + i];
  float sum = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
  for (; d < D; d++) sum += x[d] * y[d];
  return sum;
}

/* w[h * ws + t] = scale q_h . K[t] for t < n and the c heads q_h = q + h D */
static void scores(const float *q, const void *K, int64_t W, int q8, float *w, int64_t ws, int64_t n, int64_t D,
                   float scale, int c) {
  float r[D];
  for (int64_t t = 0; t < n; t++) {
    row_f32(K, W, q8, t, D, r);
    for (int h = 0; h < c; h++) w[h * ws + t] = dot_f32(q + h * D, r, D) * scale;
  }
}

/* w[0..n) = e^(w[t] - max w), in place; returns 1 / their sum */
static float softmax(float *w, int64_t n) {
  float top = -INFINITY, sum = 0.f;
  for (int64_t t = 0; t < n; t++) top = w[t] > top ? w[t] : top;
  for (int64_t t = 0; t < n; t++) sum += (w[t] = expf(w[t] - top));
  return 1.f / sum;
}

/* y_h[0..D) = inv[h] sum over t < n of w[h * ws + t] V[t] for the c heads y_h = y + h D */
static void weigh(const float *w, int64_t ws, const float *inv, const void *Vc, int64_t W, int q8, float *y,
                  int64_t n, int64_t D, int c) {
  float r[D];
  memset(y, 0, sizeof(float) * (size_t)(c * D));
  for (int64_t t = 0; t < n; t++) {
    row_f32(Vc, W, q8, t, D, r);
    for (int h = 0; h < c; h++)
      for (int64_t d = 0; d < D; d++) y[h * D + d] += w[h * ws + t] * r[d];
  }
  for (int h = 0; h < c; h++)
    for (int64_t d = 0; d < D; d++) y[h * D + d] *= inv[h];
}

static inline void store_f16(const float *x, uint16_t *y, int64_t D) {
  for (int64_t d = 0; d < D; d++) y[d] = float_to_half(x[d]);
}
#endif

static void store_q8(const float *x, uint8_t *row, int64_t D) {
  int8_t *q = (int8_t *)row;
  uint16_t *scales = (uint16_t *)(row + D);
  for (int64_t b = 0; b < D / 32; b++) {
    const float *v = x + b * 32;
    float amax = 0.f;
    for (int i = 0; i < 32; i++) amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
    float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
    for (int i = 0; i < 32; i++) q[b * 32 + i] = (int8_t)roundf(v[i] * id);
    scales[b] = float_to_half(d);
  }
}

/* the new tokens' keys (rotated) and values into the cache rows of row b, KV head g */
static void write_kv(const Job *j, int64_t b, int64_t g, int64_t p0, float *tmp) {
  int64_t kvh = j->H / j->G;
  for (int64_t s = 0; s < j->S; s++) {
    int64_t at = ((b * kvh + g) * j->L + p0 + s) * j->W, pos = p0 + s, row = b * j->S + s;
    const float *v = j->vn + row * j->vs + g * j->D;
    rotate(j->kn + row * j->ks + g * j->D, tmp, j->cos + pos * (j->D / 2), j->sin + pos * (j->D / 2), j->D);
    if (j->q8) {
      store_q8(tmp, (uint8_t *)j->k + at, j->D);
      store_q8(v, (uint8_t *)j->v + at, j->D);
    } else {
      store_f16(tmp, (uint16_t *)j->k + at, j->D);
      store_f16(v, (uint16_t *)j->v + at, j->D);
    }
  }
}

/* row b, KV head g: its new rows written, then each new token's query heads on g, up to MAXG a pass */
static void run(void *job, size_t p) {
  const Job *j = job;
  int64_t kvh = j->H / j->G, b = (int64_t)p / kvh, g = (int64_t)p % kvh, D = j->D, L = j->L;
  int64_t T = (int64_t)j->seqlens[b] + 1, p0 = T - j->S, bytes = j->q8 ? 1 : (int64_t)sizeof(uint16_t);
  float *q = j->scratch + (int64_t)p * MAXG * (D + j->N), *w = q + MAXG * D;
  write_kv(j, b, g, p0, q);
  const char *K = (const char *)j->k + (b * kvh + g) * L * j->W * bytes;
  const char *V = (const char *)j->v + (b * kvh + g) * L * j->W * bytes;
  int64_t passes = (j->G + MAXG - 1) / MAXG;
  for (int64_t s = 0; s < j->S; s++) {
    int64_t pos = p0 + s, n = pos + 1;
    for (int64_t i = 0, h0 = g * j->G; i < passes; i++) {
      int c = (int)((j->G - (h0 - g * j->G) + (passes - i) - 1) / (passes - i)); /* the heads left, spread evenly */
      for (int h = 0; h < c; h++)
        rotate(j->q + (b * j->S + s) * j->qs + (h0 + h) * D, q + h * D, j->cos + pos * (D / 2),
               j->sin + pos * (D / 2), D);
      scores(q, K, j->W, j->q8, w, j->N, n, D, j->scale, c);
      float inv[MAXG];
      for (int h = 0; h < c; h++) inv[h] = softmax(w + h * j->N, n);
      weigh(w, j->N, inv, V, j->W, j->q8, j->out + (b * j->S + s) * j->H * D + h0 * D, n, D, c);
      h0 += c;
    }
  }
}

static OrtStatus *compute(void *kernel, void *context) {
  const Attention *a = kernel;
  const void *in[9];
  void *out[3], *data[12] = {0};
  int64_t qd[8], kd[8], sd[8], cd[8], nd[8];
  size_t qr, kr, sr, cr, nr;
  OrtStatus *s;
  for (size_t i = 0; i < 9; i++)
    if ((s = CALL(KernelContext_GetInput, context, i, &in[i]))) return s;
  if (!in[0] || !in[3] || !in[4] || !in[5] || !in[7] || !in[8] || !in[1] != !in[2])
    return error("GroupQueryAttention: query, the past caches, seqlens_k and cos/sin are required; key and value "
                 "both or neither");
  if ((s = shape_of(in[0], qd, &qr)) || (s = shape_of(in[3], kd, &kr)) || (s = shape_of(in[5], sd, &sr)) ||
      (s = shape_of(in[7], cd, &cr)))
    return s;
  int64_t H = a->heads, KVH = a->kv_heads, packed = !in[1];
  int64_t W = kr == 4 ? kd[3] : 0, D = a->q8 ? W / 17 * 16 : W, B = qr == 3 ? qd[0] : 0, S = qr == 3 ? qd[1] : 0;
  int bad = qr != 3 || kr != 4 || kd[0] != B || kd[1] != KVH || qd[2] != (packed ? H + 2 * KVH : H) * D ||
            sr != 1 || sd[0] != B || cr != 2 || cd[1] * 2 != D || (a->q8 && (W % 34 || D % 32));
  for (size_t i = 1; i < 3 && !packed && !bad; i++)
    bad = (s = shape_of(in[i], nd, &nr)) || nr != 3 || nd[0] != B || nd[1] != S || nd[2] != KVH * D;
  if (s) return s;
  if (bad)
    return error("GroupQueryAttention: query must be [B, S, H D] (key, value [B, S, KVH D]) or the packed QKV "
                 "[B, S, (H + 2 KVH) D], the caches [B, KVH, L, D] (q8_0: D + D / 16 bytes, D a multiple of 32), "
                 "seqlens_k [B] and cos/sin [positions, D / 2]");
  int64_t yd[3] = {B, S, H * D};
  if ((s = CALL(KernelContext_GetOutput, context, (size_t)0, yd, (size_t)3, &out[0])) ||
      (s = CALL(KernelContext_GetOutput, context, (size_t)1, kd, (size_t)4, &out[1])) ||
      (s = CALL(KernelContext_GetOutput, context, (size_t)2, kd, (size_t)4, &out[2])))
    return s;
  for (size_t i = 0; i < 9; i++)
    if (in[i] && i != 6 && (s = CALL(GetTensorMutableData, (void *)in[i], &data[i]))) return s;
  for (size_t i = 0; i < 3; i++)
    if ((s = CALL(GetTensorMutableData, out[i], &data[9 + i]))) return s;
  size_t cache = (size_t)(B * KVH * kd[2] * W) * (a->q8 ? 1 : sizeof(uint16_t));
  for (size_t i = 0; i < 2; i++) /* present not bound to past: it starts as a copy */
    if (data[10 + i] != data[3 + i]) memcpy(data[10 + i], data[3 + i], cache);
  const int32_t *seqlens = data[5];
  int64_t N = 0;
  for (int64_t b = 0; b < B; b++) {
    if (seqlens[b] + 1 < S || seqlens[b] + 1 > kd[2] || seqlens[b] + 1 > cd[0])
      return error("GroupQueryAttention: a row's seqlens_k + 1 must hold its new tokens and fit the cache and "
                   "the cos/sin positions");
    N = seqlens[b] + 1 > N ? seqlens[b] + 1 : N;
  }
  if (B == 0 || S == 0) return NULL;
  const float *q = data[0];
  Job job = {q, packed ? q + H * D : data[1], packed ? q + (H + KVH) * D : data[2], qd[2],
             packed ? qd[2] : KVH * D, packed ? qd[2] : KVH * D, data[10], data[11], data[7], data[8], seqlens,
             data[9], S, kd[2], D, H, H / KVH, a->scale != 0.f ? a->scale : 1.f / sqrtf((float)D), NULL, a->q8,
             W, N};
  job.scratch = malloc(sizeof(float) * (size_t)(B * KVH * MAXG * (D + N)));
  if (!job.scratch) return error("GroupQueryAttention: out of memory");
  s = CALL(KernelContext_ParallelFor, context, run, (size_t)(B * KVH), (size_t)0, &job);
  free(job.scratch);
  return s;
}

static OrtStatus *create(const OrtCustomOp *op, const void *a, const void *info, void **out) {
  (void)a;
  Attention *k = malloc(sizeof *k);
  if (!k) return error("GroupQueryAttention: out of memory");
  k->q8 = op == &attention_q8_op;
  OrtStatus *s = CALL(KernelInfoGetAttribute_int64, info, "num_heads", &k->heads);
  if (!s) s = CALL(KernelInfoGetAttribute_int64, info, "kv_num_heads", &k->kv_heads);
  if (!s) s = CALL(KernelInfoGetAttribute_float, info, "scale", &k->scale);
  if (!s && (k->heads < 1 || k->kv_heads < 1 || k->heads % k->kv_heads))
    s = error("GroupQueryAttention: num_heads must be a multiple of kv_num_heads");
  if (s) free(k);
  else *out = k;
  return s;
}

static const char *name(const OrtCustomOp *op) {
  return op == &attention_q8_op ? "GroupQueryAttentionQ8" : "GroupQueryAttention";
}
static int cache_type(const OrtCustomOp *op) { return op == &attention_q8_op ? TYPE_UINT8 : TYPE_FLOAT16; }
static int input_type(const OrtCustomOp *op, size_t i) {
  return i < 3 ? TYPE_FLOAT : i == 5 || i == 6 ? TYPE_INT32 : i == 3 || i == 4 ? cache_type(op) : TYPE_FLOAT16;
}
static size_t nine(const OrtCustomOp *op) { (void)op; return 9; }
static int key_value_optional(const OrtCustomOp *op, size_t i) { (void)op; return i == 1 || i == 2; }
static int output_type(const OrtCustomOp *op, size_t i) { return i == 0 ? TYPE_FLOAT : cache_type(op); }

const OrtCustomOp attention_op = {16, NULL, name, provider, input_type, nine, output_type, three, NULL, destroy,
                                  key_value_optional, required, memory_default, min_arity, homogeneous, min_arity,
                                  homogeneous, create, compute};
const OrtCustomOp attention_q8_op = {16, NULL, name, provider, input_type, nine, output_type, three, NULL, destroy,
                                     key_value_optional, required, memory_default, min_arity, homogeneous, min_arity,
                                     homogeneous, create, compute};
