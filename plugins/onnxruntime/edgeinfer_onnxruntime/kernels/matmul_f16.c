/* edgeinfer.MatMulF16: y = x @ W for fp32 activations and fp16 weights, an onnxruntime custom op.
 *
 * onnxruntime 1.26's CPU provider has no fp16-weight MatMul for x86 CPUs without AVX-512 FP16, so the host fp16
 * class ran each weight as two int8 planes (weight_planes.py). This kernel reads the fp16 weights themselves
 * (16 bits a weight, converted to fp32 in registers by AVX-512F's vcvtph2ps) and accumulates in fp32.
 *
 * Inputs:  x [..., K] float; w [P, K, 32] float16: W ([K, N]) in panels of 32 output columns, K rows each,
 *          the last panel padded with zeros (matmul_f16.py packs it).
 * Attribute: n, the real N (<= 32 P).   Output: y [..., n] float.
 *
 * Built by matmul_f16.py with the system C compiler; no onnxruntime header is needed: the few C API slots it
 * calls are declared below by their index in struct OrtApi, which onnxruntime only ever appends to (its
 * onnxruntime_c_api.h, "the order of the functions must never change"; the indices are those of ORT_API_VERSION
 * 17 and later, where KernelContext_ParallelFor is slot 274). The library asks for API 17.
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct OrtStatus OrtStatus;
typedef OrtStatus *(*status_fn)();

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

/* rows x[0..mr) (stride K) times one panel, into y (stride N): outer products, no horizontal sums */
static inline __attribute__((always_inline)) void panel_rows(const float *x, const uint16_t *wp, float *y,
                                                             int64_t K, int64_t ldy, int mr, int cols) {
  __m512 a0[MR], a1[MR];
  for (int i = 0; i < mr; i++) a0[i] = a1[i] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k++, wp += NR) {
    __m512 w0 = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)wp));
    __m512 w1 = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(wp + 16)));
    for (int i = 0; i < mr; i++) {
      __m512 xb = _mm512_set1_ps(x[i * K + k]);
      a0[i] = _mm512_fmadd_ps(xb, w0, a0[i]);
      a1[i] = _mm512_fmadd_ps(xb, w1, a1[i]);
    }
  }
  __mmask16 m0 = cols >= 16 ? 0xffff : (__mmask16)((1u << cols) - 1);
  __mmask16 m1 = cols >= 32 ? 0xffff : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1);
  for (int i = 0; i < mr; i++) {
    _mm512_mask_storeu_ps(y + i * ldy, m0, a0[i]);
    _mm512_mask_storeu_ps(y + i * ldy + 16, m1, a1[i]);
  }
}

/* one row: two k chains so that the FMA latency does not bound the stream of weights */
static void panel_row(const float *x, const uint16_t *wp, float *y, int64_t K, int cols) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t k = 0;
  for (; k + 1 < K; k += 2, wp += 2 * NR) {
    __m512 x0 = _mm512_set1_ps(x[k]), x1 = _mm512_set1_ps(x[k + 1]);
    a0 = _mm512_fmadd_ps(x0, _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)wp)), a0);
    a1 = _mm512_fmadd_ps(x0, _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(wp + 16))), a1);
    a2 = _mm512_fmadd_ps(x1, _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(wp + 32))), a2);
    a3 = _mm512_fmadd_ps(x1, _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(wp + 48))), a3);
  }
  if (k < K) {
    __m512 x0 = _mm512_set1_ps(x[k]);
    a0 = _mm512_fmadd_ps(x0, _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)wp)), a0);
    a1 = _mm512_fmadd_ps(x0, _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(wp + 16))), a1);
  }
  __mmask16 m0 = cols >= 16 ? 0xffff : (__mmask16)((1u << cols) - 1);
  __mmask16 m1 = cols >= 32 ? 0xffff : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1);
  _mm512_mask_storeu_ps(y, m0, _mm512_add_ps(a0, a2));
  _mm512_mask_storeu_ps(y + 16, m1, _mm512_add_ps(a1, a3));
}

typedef struct {
  const float *x;
  const uint16_t *w;
  float *y;
  int64_t M, K, n;
} Job;

static void run_panel(void *data, size_t p) {
  const Job *j = data;
  const uint16_t *wp = j->w + (int64_t)p * j->K * NR;
  int64_t col = (int64_t)p * NR;
  int cols = j->n - col < NR ? (int)(j->n - col) : NR;
  if (j->M == 1) {
    panel_row(j->x, wp, j->y + col, j->K, cols);
    return;
  }
  for (int64_t m = 0; m < j->M; m += MR) {
    int mr = j->M - m < MR ? (int)(j->M - m) : MR;
    const float *x = j->x + m * j->K;
    float *y = j->y + m * j->n + col;
    switch (mr) { /* a constant row count, so that the accumulators stay in registers */
#define ROWS(R) case R: panel_rows(x, wp, y, j->K, j->n, R, cols); break;
      ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8) ROWS(9) ROWS(10) ROWS(11) ROWS(12)
#undef ROWS
    }
  }
}

typedef struct {
  int64_t n;
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
  if (!s && *rank > 8) s = error("MatMulF16: more than 8 dimensions");
  return s;
}

static OrtStatus *compute(void *kernel, void *context) {
  const Kernel *kn = kernel;
  const void *xv, *wv;
  void *yv, *x, *w, *y;
  int64_t xd[8], wd[8], yd[8];
  size_t xr, wr;
  OrtStatus *s;
  if ((s = CALL(KernelContext_GetInput, context, (size_t)0, &xv)) || (s = CALL(KernelContext_GetInput, context,
      (size_t)1, &wv)) || (s = shape_of(xv, xd, &xr)) || (s = shape_of(wv, wd, &wr)))
    return s;
  if (xr < 1 || wr != 3 || wd[2] != NR || xd[xr - 1] != wd[1] || kn->n < 1 || kn->n > wd[0] * NR)
    return error("MatMulF16: x must be [..., K], w [P, K, 32] with 0 < n <= 32 P");
  int64_t M = 1;
  for (size_t i = 0; i + 1 < xr; i++) M *= (yd[i] = xd[i]);
  yd[xr - 1] = kn->n;
  if ((s = CALL(KernelContext_GetOutput, context, (size_t)0, yd, xr, &yv)) ||
      (s = CALL(GetTensorMutableData, (void *)xv, &x)) || (s = CALL(GetTensorMutableData, (void *)wv, &w)) ||
      (s = CALL(GetTensorMutableData, yv, &y)))
    return s;
  if (M == 0) return NULL;
  Job job = {x, w, y, M, wd[1], kn->n};
  return CALL(KernelContext_ParallelFor, context, run_panel, (size_t)wd[0], (size_t)0, &job);
}

static OrtStatus *create(const OrtCustomOp *op, const void *a, const void *info, void **out) {
  (void)op, (void)a;
  Kernel *k = malloc(sizeof *k);
  if (!k) return error("MatMulF16: out of memory");
  OrtStatus *s = CALL(KernelInfoGetAttribute_int64, info, "n", &k->n);
  if (s) free(k);
  else *out = k;
  return s;
}
static void destroy(void *k) { free(k); }
static const char *name(const OrtCustomOp *op) { (void)op; return "MatMulF16"; }
static const char *provider(const OrtCustomOp *op) { (void)op; return "CPUExecutionProvider"; }
static int input_type(const OrtCustomOp *op, size_t i) { (void)op; return i == 0 ? TYPE_FLOAT : TYPE_FLOAT16; }
static size_t two(const OrtCustomOp *op) { (void)op; return 2; }
static int output_type(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return TYPE_FLOAT; }
static size_t one(const OrtCustomOp *op) { (void)op; return 1; }
static int required(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return 0; }
static int memory_default(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return 0; }
static int min_arity(const OrtCustomOp *op) { (void)op; return 1; }
static int homogeneous(const OrtCustomOp *op) { (void)op; return 1; }

static const OrtCustomOp op = {16, NULL, name, provider, input_type, two, output_type, one, NULL, destroy,
                               required, required, memory_default, min_arity, homogeneous, min_arity, homogeneous,
                               create, compute};

__attribute__((visibility("default"))) OrtStatus *RegisterCustomOps(void *options, const OrtApiBase *base) {
  api = base->GetApi(API_VERSION);
  if (!api) return NULL; /* an onnxruntime older than 1.17: the op stays unknown and the graph is refused */
  void *domain;
  OrtStatus *s = CALL(CreateCustomOpDomain, "edgeinfer", &domain);
  if (!s) s = CALL(CustomOpDomain_Add, domain, &op);
  if (!s) s = CALL(AddCustomOpDomain, options, domain);
  return s;
}
