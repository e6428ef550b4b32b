/* edgeinfer.EmbedF16 and EmbedW8: a tied model's token embedding read from its LM head's packed weights, so that
 * the table is held once, as llama.cpp holds token_embd once for a tied model.
 *
 * The LM head's W ([K = hidden, N = vocabulary]) is the embedding table transposed, packed for MatMulF16 or MatMulW8
 * (matmul.c) in panels of 32 columns: token t's row is column t % 32 of panel t / 32. These ops gather those
 * columns: the embedding of each id, as the head's weights hold it (for EmbedW8 the integers of the head's blocks of
 * `block` rows, times their scales). The int4 classes hold their head in int8 (custom_ops.py), so EmbedW8 reads it.
 *
 * Inputs:  ids int64 [...], each in [0, n); w: EmbedF16 fp16 [P, K, 32]; EmbedW8 uint8 q + 128 [P, K4, 32]
 *          (K4 = K rounded up to 4, each panel's bytes four rows of a column side by side), its fp32 scales
 *          [P, ceil(K / block), 32].
 * Attributes: n, the vocabulary (<= 32 P); k, the hidden width K; EmbedW8: block.   Output: [..., K] float.
 * A row's K values are K cache lines apart in the fp16 panels (K / 4 in the integer ones): a decode step reads a few
 * rows, a long prompt some thousands, a small part of its time.
 */
#include <stdlib.h>

#include "half.h"
#include "ort.h"

#define NR 32

enum { F16, W8 };
static const char *const NAMES[] = {"EmbedF16", "EmbedW8"};

typedef struct {
  int64_t n, k, block; /* block: 0 for EmbedF16 */
  int kind;
} Embed;

static OrtStatus *compute(void *kernel, void *context) {
  const Embed *e = kernel;
  int kind = e->kind;
  const void *iv, *wv, *sv = NULL;
  void *yv, *ids, *w, *sc = NULL, *y;
  int64_t id[8], wd[8], sd[8], yd[9];
  size_t ir, wr, sr = 3;
  OrtStatus *s;
  if ((s = CALL(KernelContext_GetInput, context, (size_t)0, &iv)) ||
      (s = CALL(KernelContext_GetInput, context, (size_t)1, &wv)) || (s = shape_of(iv, id, &ir)) ||
      (s = shape_of(wv, wd, &wr)))
    return s;
  if (kind != F16 && ((s = CALL(KernelContext_GetInput, context, (size_t)2, &sv)) || (s = shape_of(sv, sd, &sr))))
    return s;
  int64_t K = e->k, K4 = (K + 3) / 4 * 4, KB = kind != F16 ? (K + e->block - 1) / e->block : 0;
  int64_t rows = kind == F16 ? K : K4; /* a panel's rows of 32 elements */
  if (wr != 3 || wd[2] != NR || e->n > wd[0] * NR || wd[1] != rows)
    return error(kind == F16 ? "EmbedF16: w must be [P, k, 32] with n <= 32 P"
                             : "EmbedW8: w must be [P, k rounded up to 4, 32] with n <= 32 P");
  if (kind != F16 && (sr != 3 || sd[0] != wd[0] || sd[1] != KB || sd[2] != NR))
    return error("EmbedW8: scales must be [P, ceil(k / block), 32]");
  int64_t M = 1;
  for (size_t i = 0; i < ir; i++) M *= (yd[i] = id[i]);
  yd[ir] = K;
  if ((s = CALL(KernelContext_GetOutput, context, (size_t)0, yd, ir + 1, &yv)) ||
      (s = CALL(GetTensorMutableData, (void *)iv, &ids)) || (s = CALL(GetTensorMutableData, (void *)wv, &w)) ||
      (kind != F16 && (s = CALL(GetTensorMutableData, (void *)sv, &sc))) || (s = CALL(GetTensorMutableData, yv, &y)))
    return s;
  const int64_t *t = ids;
  float *out = y;
  for (int64_t m = 0; m < M; m++, out += K) {
    if (t[m] < 0 || t[m] >= e->n) return error("EmbedF16/EmbedW8: a token id is outside the vocabulary");
    int64_t p = t[m] / NR, c = t[m] % NR;
    if (kind == F16) {
      const uint16_t *col = (const uint16_t *)w + p * K * NR + c;
      for (int64_t k = 0; k < K; k++) out[k] = half_to_float(col[k * NR]);
      continue;
    }
    const float *scale = (const float *)sc + p * KB * NR + c;
    const uint8_t *col = (const uint8_t *)w + p * K4 * NR + c * 4;
    for (int64_t k = 0; k < K; k++)
      out[k] = (float)((int)col[(k / 4) * NR * 4 + k % 4] - 128) * scale[(k / e->block) * NR];
  }
  return NULL;
}

static OrtStatus *create(const void *info, void **out, int kind) {
  Embed *e = malloc(sizeof *e);
  if (!e) return error("EmbedF16/EmbedW8: out of memory");
  e->block = 0;
  e->kind = kind;
  OrtStatus *s = CALL(KernelInfoGetAttribute_int64, info, "n", &e->n);
  if (!s) s = CALL(KernelInfoGetAttribute_int64, info, "k", &e->k);
  if (!s && kind != F16) s = CALL(KernelInfoGetAttribute_int64, info, "block", &e->block);
  if (!s && (e->n < 1 || e->k < 1 || (kind != F16 && e->block < 1)))
    s = error("EmbedF16/EmbedW8: n, k and block must be positive");
  if (s) free(e);
  else *out = e;
  return s;
}
static OrtStatus *create_f16(const OrtCustomOp *op, const void *a, const void *info, void **out) {
  (void)op, (void)a;
  return create(info, out, F16);
}
static OrtStatus *create_w8(const OrtCustomOp *op, const void *a, const void *info, void **out) {
  (void)op, (void)a;
  return create(info, out, W8);
}
static const char *name_f16(const OrtCustomOp *op) { (void)op; return NAMES[F16]; }
static const char *name_w8(const OrtCustomOp *op) { (void)op; return NAMES[W8]; }
static int type_f16(const OrtCustomOp *op, size_t i) { (void)op; return i == 0 ? TYPE_INT64 : TYPE_FLOAT16; }
static int type_w8(const OrtCustomOp *op, size_t i) {
  (void)op;
  return i == 0 ? TYPE_INT64 : i == 1 ? TYPE_UINT8 : TYPE_FLOAT;
}

const OrtCustomOp embed_f16_op = {16, NULL, name_f16, provider, type_f16, two, float_output, one, NULL, destroy,
                                  required, required, memory_default, min_arity, homogeneous, min_arity,
                                  homogeneous, create_f16, compute};
const OrtCustomOp embed_w8_op = {16, NULL, name_w8, provider, type_w8, three, float_output, one, NULL, destroy,
                                 required, required, memory_default, min_arity, homogeneous, min_arity,
                                 homogeneous, create_w8, compute};
