/* STAND-IN for Rockchip's librkllmrt.so, for tests only: NOT the RKLLM runtime.
 *
 * Same exported functions and structure layouts as the public header
 * https://github.com/airockchip/rknn-llm/blob/878f9361fd3afa7e167b7079918918f78d2c1c2a/rkllm-runtime/Linux/librkllm_api/include/rkllm.h
 * (written out again here in C; the header itself includes <cstdint> and is C++).
 *
 * Behaviour, documented so that tests derive expected values on their own:
 *  - a "model" is a text file "RKLLM-STANDIN vocab=V eos=E delay_us=D"; anything else makes
 *    rkllm_init return -1 (after printing one line to stderr, as the runtime does);
 *  - rkllm_run takes RKLLM_INPUT_TOKEN input only; token 1 = (sum(prompt ids) * 31 + 7) mod V,
 *    token k+1 = (token k * 31 + 7) mod V; it stops after max_new_tokens (the infer param when > 0,
 *    else the init param), at the eos token (emitted, unless ignore_eos_token), when the callback
 *    returns 1 (pause), or when rkllm_abort was called; each token is preceded by a sleep of D us;
 *    a token divisible by 5 comes with state RKLLM_RUN_WAITING (as for an incomplete UTF-8 text piece);
 *  - the last callback has state RKLLM_RUN_FINISH with perf: prefill_tokens = number of prompt ids,
 *    generate_tokens = tokens emitted, times measured with CLOCK_MONOTONIC, memory = VmHWM in MB;
 *  - standin_* functions let a test read what crossed the boundary.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef void *LLMHandle;
typedef enum { RKLLM_RUN_NORMAL = 0, RKLLM_RUN_WAITING = 1, RKLLM_RUN_FINISH = 2, RKLLM_RUN_ERROR = 3 } LLMCallState;
typedef enum { RKLLM_INPUT_PROMPT = 0, RKLLM_INPUT_TOKEN = 1, RKLLM_INPUT_EMBED = 2, RKLLM_INPUT_MULTIMODAL = 3 } RKLLMInputType;
typedef enum { RKLLM_INFER_GENERATE = 0, RKLLM_INFER_GET_LAST_HIDDEN_LAYER = 1, RKLLM_INFER_GET_LOGITS = 2 } RKLLMInferMode;
typedef int (*LLMGetEmbedCallback)(void *userdata, int32_t *tokens, uint64_t num_tokens, void *embed, uint64_t len);
typedef int (*LLMTokenizerCallback)(void *userdata, const char *text, int32_t text_len, int32_t *tokens, int32_t n_tokens_max);

typedef struct {
    int32_t base_domain_id; int8_t embed_flash; int8_t enabled_cpus_num; uint32_t enabled_cpus_mask;
    uint8_t n_batch; int8_t use_cross_attn; uint8_t reserved[104];
} RKLLMExtendParam;

typedef struct {
    const char *model_path; int32_t max_context_len; int32_t max_new_tokens; int32_t top_k; int32_t n_keep;
    float top_p; float temperature; float repeat_penalty; float frequency_penalty; float presence_penalty;
    int32_t mirostat; float mirostat_tau; float mirostat_eta;
    bool skip_special_token; bool ignore_eos_token; bool is_async; RKLLMExtendParam extend_param;
} RKLLMParam;

typedef struct { float *embed; size_t n_tokens; } RKLLMEmbedInput;
typedef struct { int32_t *input_ids; size_t n_tokens; } RKLLMTokenInput;
typedef struct {
    char *prompt;
    struct { float *image_embed; size_t n_image_tokens; size_t n_image; const char *image_start;
             const char *image_end; const char *image_content; size_t image_width; size_t image_height; } image;
    struct { float *video_embed; size_t n_frame_tokens; size_t n_frame_per_video; size_t n_video;
             const char *video_start; const char *video_end; const char *video_content; size_t frame_width;
             size_t frame_height; } video;
} RKLLMMultiModalInput;

typedef struct {
    const char *role; bool enable_thinking; RKLLMInputType input_type;
    union { const char *prompt_input; RKLLMEmbedInput embed_input; RKLLMTokenInput token_input;
            RKLLMMultiModalInput multimodal_input; };
} RKLLMInput;

typedef struct { const char *lora_adapter_name; } RKLLMLoraParam;
typedef struct { int save_prompt_cache; const char *prompt_cache_path; } RKLLMPromptCacheParam;
typedef struct {
    int32_t top_k; float top_p; float temperature; float repeat_penalty; float frequency_penalty;
    float presence_penalty; int32_t mirostat; float mirostat_tau; float mirostat_eta;
} RKLLMSamplingParam;
typedef struct {
    RKLLMInferMode mode; RKLLMLoraParam *lora_params; RKLLMPromptCacheParam *prompt_cache_params;
    RKLLMSamplingParam *sampling_params; int keep_history; int32_t max_new_tokens;
} RKLLMInferParam;
typedef struct { const float *hidden_states; int embd_size; int num_tokens; } RKLLMResultLastHiddenLayer;
typedef struct { const float *logits; int vocab_size; int num_tokens; } RKLLMResultLogits;
typedef struct {
    float prefill_time_ms; int prefill_tokens; float generate_time_ms; int generate_tokens; float memory_usage_mb;
} RKLLMPerfStat;
typedef struct {
    const char *text; int32_t token_id; RKLLMResultLastHiddenLayer last_hidden_layer; RKLLMResultLogits logits;
    RKLLMPerfStat perf;
} RKLLMResult;
typedef int (*LLMResultCallback)(RKLLMResult *result, void *userdata, LLMCallState state);
typedef struct {
    LLMResultCallback result_callback; void *result_userdata;
    LLMTokenizerCallback tokenizer_callback; void *tokenizer_userdata;
    LLMGetEmbedCallback embed_callback; void *embed_userdata;
} RKLLMCallback;

typedef struct {
    RKLLMParam param; RKLLMCallback cb; int vocab; int eos; int delay_us;
    volatile int abort_flag; volatile int running;
} Instance;

static int live_handles = 0;
static RKLLMSamplingParam last_sampling;
static RKLLMInferParam last_infer;
static RKLLMParam last_param;

RKLLMParam rkllm_createDefaultParam(void) {
    RKLLMParam p;
    memset(&p, 0, sizeof p);
    p.max_context_len = 512; p.max_new_tokens = 16; p.top_k = 40; p.n_keep = -1; p.top_p = 0.9f;
    p.temperature = 0.8f; p.repeat_penalty = 1.1f; p.mirostat_tau = 5.0f; p.mirostat_eta = 0.1f;
    p.skip_special_token = true; p.extend_param.n_batch = 1;
    return p;
}

int rkllm_init(LLMHandle *handle, RKLLMParam *param, RKLLMCallback *callback) {
    int vocab = 0, eos = -1, delay = 0;
    FILE *f = param && param->model_path ? fopen(param->model_path, "r") : NULL;
    if (!f || fscanf(f, "RKLLM-STANDIN vocab=%d eos=%d delay_us=%d", &vocab, &eos, &delay) != 3 || vocab <= 0) {
        if (f) fclose(f);
        fprintf(stderr, "E RKLLM: stand-in cannot load %s\n", param && param->model_path ? param->model_path : "(null)");
        *handle = NULL;
        return -1;
    }
    fclose(f);
    Instance *in = calloc(1, sizeof *in);
    in->param = *param; in->cb = *callback; in->vocab = vocab; in->eos = eos; in->delay_us = delay;
    last_param = *param;
    *handle = in;
    live_handles++;
    return 0;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static float vm_hwm_mb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb / 1024.0f;
}

int rkllm_run(LLMHandle handle, RKLLMInput *input, RKLLMInferParam *infer, void *userdata) {
    Instance *in = handle;
    if (!in || !input || input->input_type != RKLLM_INPUT_TOKEN || !infer) return -1;
    void *ud = userdata ? userdata : in->cb.result_userdata;
    last_infer = *infer;
    if (infer->sampling_params) last_sampling = *infer->sampling_params;
    in->running = 1;
    in->abort_flag = 0;
    int max_new = infer->max_new_tokens > 0 ? infer->max_new_tokens : in->param.max_new_tokens;
    long sum = 0;
    for (size_t i = 0; i < input->token_input.n_tokens; i++) sum += input->token_input.input_ids[i];
    long tok = (sum * 31 + 7) % in->vocab;
    double t0 = now_ms(), t_first = t0;
    int n = 0;
    char text[32];
    RKLLMResult r;
    while (n < max_new && !in->abort_flag) {
        if (in->delay_us) usleep(in->delay_us);
        if (in->abort_flag) break;
        memset(&r, 0, sizeof r);
        snprintf(text, sizeof text, "<%ld>", tok);
        r.text = text; r.token_id = (int32_t)tok;
        if (n == 0) t_first = now_ms();
        n++;
        if (in->cb.result_callback(&r, ud, tok % 5 == 0 ? RKLLM_RUN_WAITING : RKLLM_RUN_NORMAL) == 1) break;
        if (tok == in->eos && !in->param.ignore_eos_token) break;
        tok = (tok * 31 + 7) % in->vocab;
    }
    double t_end = now_ms();
    memset(&r, 0, sizeof r);
    r.token_id = -1;
    r.perf.prefill_time_ms = (float)(t_first - t0);
    r.perf.prefill_tokens = (int)input->token_input.n_tokens;
    r.perf.generate_time_ms = (float)(t_end - t_first);
    r.perf.generate_tokens = n;
    r.perf.memory_usage_mb = vm_hwm_mb();
    in->cb.result_callback(&r, ud, RKLLM_RUN_FINISH);
    in->running = 0;
    return 0;
}

typedef struct { LLMHandle h; RKLLMInput in; RKLLMInferParam p; void *ud; } AsyncArgs;

static void *async_main(void *arg) {
    AsyncArgs *a = arg;
    rkllm_run(a->h, &a->in, &a->p, a->ud);
    free(a);
    return NULL;
}

int rkllm_run_async(LLMHandle handle, RKLLMInput *input, RKLLMInferParam *infer, void *userdata) {
    AsyncArgs *a = malloc(sizeof *a);
    pthread_t t;
    a->h = handle; a->in = *input; a->p = *infer; a->ud = userdata;
    ((Instance *)handle)->running = 1;
    if (pthread_create(&t, NULL, async_main, a)) { free(a); return -1; }
    pthread_detach(t);
    return 0;
}

int rkllm_abort(LLMHandle handle) {
    if (!handle) return -1;
    ((Instance *)handle)->abort_flag = 1;
    return 0;
}

int rkllm_is_running(LLMHandle handle) { return handle ? ((Instance *)handle)->running : 0; }

int rkllm_destroy(LLMHandle handle) {
    if (!handle) return -1;
    free(handle);
    live_handles--;
    return 0;
}

/* --- what the tests read (not part of the RKLLM API) --- */
int standin_live_handles(void) { return live_handles; }
RKLLMSamplingParam standin_last_sampling(void) { return last_sampling; }
RKLLMInferParam standin_last_infer(void) { return last_infer; }
RKLLMParam standin_last_param(void) { return last_param; }
void standin_sizes(size_t *out) {
    out[0] = sizeof(RKLLMParam); out[1] = sizeof(RKLLMInput); out[2] = sizeof(RKLLMInferParam);
    out[3] = sizeof(RKLLMResult); out[4] = sizeof(RKLLMCallback); out[5] = sizeof(RKLLMExtendParam);
    out[6] = offsetof(RKLLMParam, extend_param); out[7] = offsetof(RKLLMInput, token_input);
    out[8] = offsetof(RKLLMResult, perf); out[9] = sizeof(RKLLMMultiModalInput);
}
