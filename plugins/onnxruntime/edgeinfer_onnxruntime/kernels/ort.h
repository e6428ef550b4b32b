/* The part of onnxruntime's C API that edgeinfer's ops call, declared by slot in struct OrtApi
 * (include/onnxruntime/core/session/onnxruntime_c_api.h in github.com/microsoft/onnxruntime): onnxruntime keeps
 * that table's layout across versions and only appends to it (onnxruntime/core/session/onnxruntime_c_api.cc
 * asserts the offsets of members such as ReleaseCustomOpDomain, slot 101); the slots are those of ORT_API_VERSION
 * 17 and later, where KernelContext_ParallelFor was added as slot 274. No onnxruntime header is needed. */
#ifndef EDGEINFER_ORT_H
#define EDGEINFER_ORT_H
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
  KernelInfoGetAttribute_float = 85, KernelInfoGetAttribute_int64 = 86, KernelContext_GetInput = 90, KernelContext_GetOutput = 91,
  ReleaseTensorTypeAndShapeInfo = 99, KernelContext_ParallelFor = 274,
};
#define API_VERSION 17
#define ORT_INVALID_ARGUMENT 2
#define TYPE_FLOAT 1
#define TYPE_UINT8 2
#define TYPE_FLOAT16 10

extern const void *const *api; /* set by RegisterCustomOps (matmul.c) */
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

#define TYPE_INT32 6
#define TYPE_INT64 7

static inline OrtStatus *error(const char *message) {
  return ((OrtStatus * (*)(int, const char *)) api[CreateStatus])(ORT_INVALID_ARGUMENT, message);
}

/* The OrtCustomOp members that every op of the library answers alike (static inline: one source, a copy in each
 * file that takes their address). */
static inline void destroy(void *kernel) { free(kernel); }
static inline const char *provider(const OrtCustomOp *op) { (void)op; return "CPUExecutionProvider"; }
static inline size_t one(const OrtCustomOp *op) { (void)op; return 1; }
static inline size_t two(const OrtCustomOp *op) { (void)op; return 2; }
static inline size_t three(const OrtCustomOp *op) { (void)op; return 3; }
static inline int float_output(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return TYPE_FLOAT; }
static inline int required(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return 0; }
static inline int memory_default(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return 0; }
static inline int min_arity(const OrtCustomOp *op) { (void)op; return 1; }
static inline int homogeneous(const OrtCustomOp *op) { (void)op; return 1; }

OrtStatus *shape_of(const void *value, int64_t *dims, size_t *rank); /* up to 8 dimensions, every op (matmul.c) */
extern const OrtCustomOp attention_op, attention_q8_op; /* edgeinfer.GroupQueryAttention / Q8 (attention.c) */
extern const OrtCustomOp embed_f16_op, embed_w8_op; /* edgeinfer.EmbedF16 / W8 (embedding.c) */

#endif
