/* edgeinfer's CPU matmuls for decoders on onnxruntime: y = x @ W, fp32 activations, the weights as deployed.
 *
 *   MatMulF16  fp16 weights (the host fp16 class), converted to fp32 in registers (AVX-512F vcvtph2ps);
 *   MatMulW8   int8 weights with an fp32 scale per block of `block` rows and column (the host w8a16 class),
 *              each row converted and scaled in registers.
 * Both accumulate in fp32. onnxruntime 1.26's CPU provider has neither for x86 CPUs without AVX-512 FP16: it held
 * fp16 weights as fp32, and its 8-bit MatMulNBits dequantizes the whole weight at every call for fp32
 * activations (custom_ops.py says what the plugin did instead before these).
 *
 * Inputs:  x [..., K] float; w [P, K, 32]: W ([K, N]) in panels of 32 output columns, K rows each, the last
 *          panel padded with zeros (custom_ops.py packs it); MatMulW8: scales [P, ceil(K / block), 32] float.
 * Attributes: n, the real N (<= 32 P); MatMulW8: block (even).   Output: y [..., n] float.
 *
 * Built by custom_ops.py with the system C compiler; no onnxruntime header is needed: the few C API slots it
 * calls are declared below by their index in struct OrtApi, which onnxruntime only ever appends to (its
 * onnxruntime_c_api.h, "the order of the functions must never change"; the indices are those of ORT_API_VERSION
 * 17 and later, where KernelContext_ParallelFor is slot 274). The library asks for API 17.
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct OrtStatus OrtStatus;

typedef struct OrtApiBase {
  const void *const *(*GetApi)(uint32_t version);
  const char *(*GetVersionString)(void);
} OrtApiBase;

enum { /* slots of struct OrtApi */
  CreateStatus = 0, CreateCustomOpDomain = 26, CustomOpDomain_Add = 27, AddCustomOpDomain = 28,
  GetTensorMutableData = 51, GetDimensionsCount = 61, GetDimensions = 62, GetTensorTypeAndShape = 65,
  KernelInfoGetAttribute_int64 = 86, KernelContext_GetInput = 90, KernelContext_GetOutput = 91,
  ReleaseTensorTypeAndShapeInfo = 99, KernelContext_ParallelFor = 274,
};
#define API_VERSION 17
#define ORT_INVALID_ARGUMENT 2
#define TYPE_FLOAT 1
#define TYPE_INT8 3
#define TYPE_FLOAT16 10

static const void *const *api;
#define CALL(slot, ...) (((OrtStatus * (*)()) api[slot])(__VA_ARGS__))

typedef struct OrtCustomOp { /* the members through KernelComputeV2 (version 16) */
  uint32_t version;
  void *(*CreateKernel)(const struct OrtCustomOp *, const void *api, const void *info);
  const char *(*GetName)(const struct OrtCustomOp *);
  const char *(*GetExecutionProviderType)(const struct OrtCustomOp *);
  int (*GetInputType)(const struct OrtCustomOp *, size_t);
  size_t (*GetInputTypeCount)(const struct OrtCustomOp *);
  int (*GetOutputType)(const struct OrtCustomOp *, size_t);
  size_t (*GetOutputTypeCount)(const struct OrtCustomOp *);
  void (*KernelCompute)(void *kernel, void *context);
  void (*KernelDestroy)(void *kernel);
  int (*GetInputCharacteristic)(const struct OrtCustomOp *, size_t);
  int (*GetOutputCharacteristic)(const struct OrtCustomOp *, size_t);
  int (*GetInputMemoryType)(const struct OrtCustomOp *, size_t);
  int (*GetVariadicInputMinArity)(const struct OrtCustomOp *);
  int (*GetVariadicInputHomogeneity)(const struct OrtCustomOp *);
  int (*GetVariadicOutputMinArity)(const struct OrtCustomOp *);
  int (*GetVariadicOutputHomogeneity)(const struct OrtCustomOp *);
  OrtStatus *(*CreateKernelV2)(const struct OrtCustomOp *, const void *api, const void *info, void **kernel);
  OrtStatus *(*KernelComputeV2)(void *kernel, void *context);
} OrtCustomOp;

#define NR 32 /* output columns a panel */
#define MR 12 /* activation rows a pass over a panel: 24 accumulators of the 32 registers */

/* The weights of one panel: fp16 [K][32], or int8 [K][32] with fp32 scales [K / block][32] (symmetric, per
 * block of `block` rows and column). */
typedef struct {
  const void *w;
  const float *s;
  int64_t block;
} Panel;

/* row k of the panel as fp32, columns 0-15 and 16-31; int8: unscaled */
static inline __attribute__((always_inline)) void load_raw(const Panel *p, int int8, int64_t k, __m512 *w0,
                                                           __m512 *w1) {
  if (int8) {
    const int8_t *q = (const int8_t *)p->w + k * NR;
    *w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)));
    *w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16))));
  } else {
    const uint16_t *h = (const uint16_t *)p->w + k * NR;
    *w0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
    *w1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + 16)));
  }
}

/* row k as fp32; int8: times the scales s0, s1 of k's block */
static inline __attribute__((always_inline)) void load_row(const Panel *p, int int8, int64_t k, __m512 s0,
                                                           __m512 s1, __m512 *w0, __m512 *w1) {
  load_raw(p, int8, k, w0, w1);
  if (int8) {
    *w0 = _mm512_mul_ps(*w0, s0);
    *w1 = _mm512_mul_ps(*w1, s1);
  }
}

static inline __attribute__((always_inline)) void scales(const Panel *p, int int8, int64_t k, __m512 *s0,
                                                         __m512 *s1) {
  if (int8) {
    const float *s = p->s + k / p->block * NR;
    *s0 = _mm512_loadu_ps(s);
    *s1 = _mm512_loadu_ps(s + 16);
  }
}

static inline __attribute__((always_inline)) void store(float *y, int cols, __m512 a0, __m512 a1) {
  __mmask16 m0 = cols >= 16 ? 0xffff : (__mmask16)((1u << cols) - 1);
  __mmask16 m1 = cols >= 32 ? 0xffff : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1);
  _mm512_mask_storeu_ps(y, m0, a0);
  _mm512_mask_storeu_ps(y + 16, m1, a1);
}

/* rows x[0..mr) (stride K) times one panel, into y (stride ldy): outer products, no horizontal sums */
static inline __attribute__((always_inline)) void panel_rows(const float *x, const Panel *p, int int8, float *y,
                                                             int64_t K, int64_t ldy, int mr, int cols) {
  __m512 a0[MR], a1[MR], s0 = _mm512_setzero_ps(), s1 = s0, w0, w1;
  for (int i = 0; i < mr; i++) a0[i] = a1[i] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k++) {
    if (int8 && k % p->block == 0) scales(p, int8, k, &s0, &s1);
    load_row(p, int8, k, s0, s1, &w0, &w1);
    for (int i = 0; i < mr; i++) {
      __m512 xb = _mm512_set1_ps(x[i * K + k]);
      a0[i] = _mm512_fmadd_ps(xb, w0, a0[i]);
      a1[i] = _mm512_fmadd_ps(xb, w1, a1[i]);
    }
  }
  for (int i = 0; i < mr; i++) store(y + i * ldy, cols, a0[i], a1[i]);
}

/* one row: two k chains so that the FMA latency does not bound the stream of weights; int8 scales each block's
 * sums once (a scale per row of weights would cost a multiply per 16 weights, and one row is bound by them) */
static inline __attribute__((always_inline)) void panel_row(const float *x, const Panel *p, int int8, float *y,
                                                            int64_t K, int cols) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, s0 = _mm512_set1_ps(1.0f), s1 = s0;
  int64_t step = int8 ? p->block : K;
  for (int64_t kb = 0; kb < K; kb += step) {
    int64_t end = kb + step < K ? kb + step : K, k = kb;
    __m512 b0 = _mm512_setzero_ps(), b1 = b0, b2 = b0, b3 = b0, w0, w1, w2, w3;
    for (; k + 1 < end; k += 2) {
      load_raw(p, int8, k, &w0, &w1);
      load_raw(p, int8, k + 1, &w2, &w3);
      __m512 x0 = _mm512_set1_ps(x[k]), x1 = _mm512_set1_ps(x[k + 1]);
      b0 = _mm512_fmadd_ps(x0, w0, b0);
      b1 = _mm512_fmadd_ps(x0, w1, b1);
      b2 = _mm512_fmadd_ps(x1, w2, b2);
      b3 = _mm512_fmadd_ps(x1, w3, b3);
    }
    if (k < end) {
      load_raw(p, int8, k, &w0, &w1);
      __m512 x0 = _mm512_set1_ps(x[k]);
      b0 = _mm512_fmadd_ps(x0, w0, b0);
      b1 = _mm512_fmadd_ps(x0, w1, b1);
    }
    if (int8) scales(p, int8, kb, &s0, &s1);
    a0 = _mm512_fmadd_ps(_mm512_add_ps(b0, b2), s0, a0);
    a1 = _mm512_fmadd_ps(_mm512_add_ps(b1, b3), s1, a1);
  }
  store(y, cols, a0, a1);
}

typedef struct {
  const float *x;
  const void *w;
  const float *s;
  float *y;
  int64_t M, K, n, block;
} Job;

static inline __attribute__((always_inline)) void run_panel(const Job *j, size_t i, int int8) {
  int64_t blocks = int8 ? (j->K + j->block - 1) / j->block : 0;
  Panel p = {int8 ? (const void *)((const int8_t *)j->w + (int64_t)i * j->K * NR)
                  : (const void *)((const uint16_t *)j->w + (int64_t)i * j->K * NR),
             int8 ? j->s + (int64_t)i * blocks * NR : NULL, j->block};
  int64_t col = (int64_t)i * NR;
  int cols = j->n - col < NR ? (int)(j->n - col) : NR;
  if (j->M == 1) {
    panel_row(j->x, &p, int8, j->y + col, j->K, cols);
    return;
  }
  for (int64_t m = 0; m < j->M; m += MR) {
    int mr = j->M - m < MR ? (int)(j->M - m) : MR;
    const float *x = j->x + m * j->K;
    float *y = j->y + m * j->n + col;
    switch (mr) { /* a constant row count, so that the accumulators stay in registers */
#define ROWS(R) case R: panel_rows(x, &p, int8, y, j->K, j->n, R, cols); break;
      ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8) ROWS(9) ROWS(10) ROWS(11) ROWS(12)
#undef ROWS
    }
  }
}

static void run_f16(void *job, size_t i) { run_panel(job, i, 0); }
static void run_i8(void *job, size_t i) { run_panel(job, i, 1); }

typedef struct {
  int64_t n, block; /* block: 0 for MatMulF16 */
} Kernel;

static OrtStatus *error(const char *message) {
  return ((OrtStatus * (*)(int, const char *)) api[CreateStatus])(ORT_INVALID_ARGUMENT, message);
}

static OrtStatus *shape_of(const void *value, int64_t *dims, size_t *rank) {
  void *info;
  OrtStatus *s = CALL(GetTensorTypeAndShape, value, &info);
  if (s) return s;
  s = CALL(GetDimensionsCount, info, rank);
  if (!s && *rank <= 8) s = CALL(GetDimensions, info, dims, *rank);
  ((void (*)(void *))api[ReleaseTensorTypeAndShapeInfo])(info);
  if (!s && *rank > 8) s = error("MatMulF16/MatMulW8: more than 8 dimensions");
  return s;
}

static OrtStatus *compute(void *kernel, void *context) {
  const Kernel *kn = kernel;
  int int8 = kn->block > 0;
  const void *xv, *wv, *sv = NULL;
  void *yv, *x, *w, *sc = NULL, *y;
  int64_t xd[8], wd[8], sd[8], yd[8];
  size_t xr, wr, sr = 3;
  OrtStatus *s;
  if ((s = CALL(KernelContext_GetInput, context, (size_t)0, &xv)) || (s = CALL(KernelContext_GetInput, context,
      (size_t)1, &wv)) || (s = shape_of(xv, xd, &xr)) || (s = shape_of(wv, wd, &wr)))
    return s;
  if (int8 && ((s = CALL(KernelContext_GetInput, context, (size_t)2, &sv)) || (s = shape_of(sv, sd, &sr))))
    return s;
  if (xr < 1 || wr != 3 || wd[2] != NR || xd[xr - 1] != wd[1] || kn->n < 1 || kn->n > wd[0] * NR)
    return error(int8 ? "MatMulW8: x must be [..., K], w [P, K, 32] with 0 < n <= 32 P"
                      : "MatMulF16: x must be [..., K], w [P, K, 32] with 0 < n <= 32 P");
  if (int8 && (sr != 3 || sd[0] != wd[0] || sd[1] != (wd[1] + kn->block - 1) / kn->block || sd[2] != NR))
    return error("MatMulW8: scales must be [P, ceil(K / block), 32]");
  int64_t M = 1;
  for (size_t i = 0; i + 1 < xr; i++) M *= (yd[i] = xd[i]);
  yd[xr - 1] = kn->n;
  if ((s = CALL(KernelContext_GetOutput, context, (size_t)0, yd, xr, &yv)) ||
      (s = CALL(GetTensorMutableData, (void *)xv, &x)) || (s = CALL(GetTensorMutableData, (void *)wv, &w)) ||
      (int8 && (s = CALL(GetTensorMutableData, (void *)sv, &sc))) || (s = CALL(GetTensorMutableData, yv, &y)))
    return s;
  if (M == 0) return NULL;
  Job job = {x, w, sc, y, M, wd[1], kn->n, kn->block};
  return CALL(KernelContext_ParallelFor, context, int8 ? run_i8 : run_f16, (size_t)wd[0], (size_t)0, &job);
}

static OrtStatus *create(const void *info, void **out, int int8) {
  Kernel *k = malloc(sizeof *k);
  if (!k) return error("MatMulF16/MatMulW8: out of memory");
  k->block = 0;
  OrtStatus *s = CALL(KernelInfoGetAttribute_int64, info, "n", &k->n);
  if (!s && int8) s = CALL(KernelInfoGetAttribute_int64, info, "block", &k->block);
  if (!s && int8 && (k->block < 2 || k->block % 2)) s = error("MatMulW8: block must be even and at least 2");
  if (s) free(k);
  else *out = k;
  return s;
}
static OrtStatus *create_f16(const OrtCustomOp *op, const void *a, const void *info, void **out) {
  (void)op, (void)a;
  return create(info, out, 0);
}
static OrtStatus *create_w8(const OrtCustomOp *op, const void *a, const void *info, void **out) {
  (void)op, (void)a;
  return create(info, out, 1);
}
static void destroy(void *k) { free(k); }
static const char *name_f16(const OrtCustomOp *op) { (void)op; return "MatMulF16"; }
static const char *name_w8(const OrtCustomOp *op) { (void)op; return "MatMulW8"; }
static const char *provider(const OrtCustomOp *op) { (void)op; return "CPUExecutionProvider"; }
static int type_f16(const OrtCustomOp *op, size_t i) { (void)op; return i == 0 ? TYPE_FLOAT : TYPE_FLOAT16; }
static int type_w8(const OrtCustomOp *op, size_t i) { (void)op; return i == 1 ? TYPE_INT8 : TYPE_FLOAT; }
static size_t two(const OrtCustomOp *op) { (void)op; return 2; }
static size_t three(const OrtCustomOp *op) { (void)op; return 3; }
static int output_type(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return TYPE_FLOAT; }
static size_t one(const OrtCustomOp *op) { (void)op; return 1; }
static int required(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return 0; }
static int memory_default(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return 0; }
static int min_arity(const OrtCustomOp *op) { (void)op; return 1; }
static int homogeneous(const OrtCustomOp *op) { (void)op; return 1; }

static const OrtCustomOp f16 = {16, NULL, name_f16, provider, type_f16, two, output_type, one, NULL, destroy,
                                required, required, memory_default, min_arity, homogeneous, min_arity, homogeneous,
                                create_f16, compute};
static const OrtCustomOp w8 = {16, NULL, name_w8, provider, type_w8, three, output_type, one, NULL, destroy,
                               required, required, memory_default, min_arity, homogeneous, min_arity, homogeneous,
                               create_w8, compute};

__attribute__((visibility("default"))) OrtStatus *RegisterCustomOps(void *options, const OrtApiBase *base) {
  api = base->GetApi(API_VERSION);
  if (!api) return NULL; /* an onnxruntime older than 1.17: the ops stay unknown and the graph is refused */
  void *domain;
  OrtStatus *s = CALL(CreateCustomOpDomain, "edgeinfer", &domain);
  if (!s) s = CALL(CustomOpDomain_Add, domain, &f16);
  if (!s) s = CALL(CustomOpDomain_Add, domain, &w8);
  if (!s) s = CALL(AddCustomOpDomain, options, domain);
  return s;
}
