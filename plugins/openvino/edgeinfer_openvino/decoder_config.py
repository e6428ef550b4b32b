"""The options of an OpenVINO decoder, checked, and the device properties they become.

edgeinfer's own option names are checked here because the NPU path of
``openvino_genai.LLMPipeline`` silently accepts keys it does not know: a typo would
otherwise change nothing and say nothing.

NPU static pipeline (https://docs.openvino.ai/2025/openvino-workflow-generative/inference-with-genai/
inference-with-genai-on-npu.html): the NPU compiles a prefill model for ``MAX_PROMPT_LEN`` tokens and
a generate model with a KV cache of ``MAX_PROMPT_LEN + MIN_RESPONSE_LEN`` positions. Both are
derived from the plan's context here: ``MIN_RESPONSE_LEN`` = a quarter of the context (at most 128,
GenAI's default), ``MAX_PROMPT_LEN`` = the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edgeinfer.errors import InputError

# open_decoder's options (OpenVinoBackend.decoders.options; the core refuses any other)
OPTIONS = ("scheme", "loop", "threads", "hint", "precision", "kv_precision", "kv_dtype", "cache_dir",
           "max_prompt_len", "min_response_len", "npu_config", "npu_on_cpu")
LOOPS = ("native", "steps")
HINTS = ("LATENCY", "THROUGHPUT")
PRECISIONS = {"f32": "f32", "fp32": "f32", "f16": "f16", "fp16": "f16", "bf16": "bf16"}
KV_PRECISIONS = {"f32": ("f32", 4), "fp32": ("f32", 4), "f16": ("f16", 2), "fp16": ("f16", 2),
                 "bf16": ("bf16", 2), "u8": ("u8", 1)}
#: ``kv_dtype``, the plan's name of the cache (deploy records it, every load passes it): OpenVINO's precision
KV_DTYPES = {"fp32": "f32", "fp16": "f16", "bf16": "bf16", "u8": "u8"}

#: NPU properties an edgeinfer user may set through ``npu_config`` (GenAI's NPU keys and the NPUW
#: options of the LLM pipeline, as named in libopenvino_intel_npu_plugin.so of OpenVINO 2026.4)
NPU_KEYS = frozenset({
    "MAX_PROMPT_LEN", "MIN_RESPONSE_LEN", "GENERATE_HINT", "PREFILL_HINT", "CACHE_DIR", "NPU_USE_NPUW",
    "NPUW_DEVICES", "NPUW_ONLINE_PIPELINE", "NPUW_FOLD", "NPUW_DQ", "NPUW_DQ_FULL", "NPUW_WEIGHTS_BANK",
    "NPUW_CACHE_DIR", "NPUW_FUNCALL_ASYNC", "NPUW_PARALLEL_COMPILE", "NPUW_HOST_GATHER", "NPUW_SLICE_OUT",
    "NPUW_LLM", "NPUW_LLM_BATCH_DIM", "NPUW_LLM_SEQ_LEN_DIM", "NPUW_LLM_MAX_PROMPT_LEN",
    "NPUW_LLM_MIN_RESPONSE_LEN", "NPUW_LLM_OPTIMIZE_V_TENSORS", "NPUW_LLM_PREFILL_CHUNK_SIZE",
    "NPUW_LLM_PREFILL_HINT", "NPUW_LLM_GENERATE_HINT", "NPUW_LLM_SHARED_HEAD", "NPUW_LLM_CACHE_ROPE",
    "NPUW_LLM_GENERATE_PYRAMID", "NPUW_LLM_PREFILL_ATTENTION_HINT", "NPUW_LLM_GENERATE_ATTENTION_HINT",
    "NPUW_LLM_MAX_LORA_RANK", "NPUW_LLM_ENABLE_PREFIX_CACHING", "NPUW_LLM_MAX_GENERATION_TOKEN_LEN",
})
#: stand-in for an absent NPU: run the NPU pipeline's (NPUW) logic on the CPU. Found on this machine
#: (OpenVINO 2026.4.1): with the default online partitioning every IR but fp16 failed ("Model references
#: undeclared parameters"); with NPUW_ONLINE_PIPELINE=NONE fp32, fp16 and symmetric INT4 IRs run.
#: NPUW_LLM_OPTIMIZE_V_TENSORS=NO keeps V untransposed (a layout for the NPU): with it on, the fp16 IR
#: on the CPU moved one greedy token of 96 away from the fp32 reference.
NPU_ON_CPU = {"NPUW_DEVICES": "CPU", "NPUW_ONLINE_PIPELINE": "NONE", "NPUW_LLM_OPTIMIZE_V_TENSORS": "NO"}


@dataclass
class DecoderConfig:
    scheme: str | None = None  # the format to export an HF directory to (None: by device)
    loop: str = "native"  # native: GenAI's pipelines; steps: the stateful IR stepped by the core
    properties: dict[str, Any] = field(default_factory=dict)  # OpenVINO properties for the device
    kv_bytes: int = 4  # bytes per KV cache element
    kv_dtype: str = "fp32"  # its name as plans name it (fp32, fp16, bf16, u8)
    max_prompt_len: int | None = None  # NPU: the static prefill length
    npu_on_cpu: bool = False


def parse(options: dict[str, Any], family: str, context: int) -> DecoderConfig:
    """Check edgeinfer's decoder options for ``family`` (CPU/GPU/NPU); build the device properties."""
    cfg = DecoderConfig(scheme=options.get("scheme"), loop=str(options.get("loop", "native")))
    if cfg.loop not in LOOPS:
        raise InputError(f"loop must be one of {', '.join(LOOPS)}, got {cfg.loop!r}")
    props: dict[str, Any] = {}
    if options.get("cache_dir"):
        props["CACHE_DIR"] = str(options["cache_dir"])
    if family == "NPU":
        npu_only = sorted(k for k in ("threads", "hint", "precision", "kv_precision") if k in options)
        if str(options.get("kv_dtype", "fp16")).lower() != "fp16":
            raise InputError(f"the NPU pipeline keeps its KV cache in fp16, not {options['kv_dtype']!r}",
                             "plan with --kv-dtype fp16; deploy with --option kv_dtype=fp16")
        if npu_only:
            raise InputError(f"option {npu_only[0]!r} does not apply to the NPU pipeline; set NPU properties "
                             "through npu_config")
        if cfg.loop != "native":
            raise InputError("the NPU runs decoders through GenAI's static pipeline only (loop='native')")
        props.update(npu_properties(options, context))
        cfg.max_prompt_len = int(props["MAX_PROMPT_LEN"])
        cfg.npu_on_cpu = bool(options.get("npu_on_cpu", False))
        if cfg.npu_on_cpu:
            props.update({k: v for k, v in NPU_ON_CPU.items() if k not in (options.get("npu_config") or {})})
        cfg.kv_bytes, cfg.kv_dtype = 2, "fp16"  # the NPU pipeline keeps the KV cache in fp16
    else:
        wrong = sorted(k for k in ("max_prompt_len", "min_response_len", "npu_config", "npu_on_cpu") if k in options)
        if wrong:
            raise InputError(f"option {wrong[0]!r} is for NPU decoders; this one runs on {family}")
        props.update(_cpu_gpu_properties(options, family))
        cfg.kv_bytes = KV_PRECISIONS[props["KV_CACHE_PRECISION"]][1]
        cfg.kv_dtype = {"f32": "fp32", "f16": "fp16"}.get(props["KV_CACHE_PRECISION"], props["KV_CACHE_PRECISION"])
    cfg.properties = props
    return cfg


def _cpu_gpu_properties(options: dict[str, Any], family: str) -> dict[str, Any]:
    # f32 on CPU by default: lossless IRs then give the fp32 reference's tokens exactly
    default = "f32" if family == "CPU" else "f16"
    precision = str(options.get("precision", default)).lower()
    if precision not in PRECISIONS:
        raise InputError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    kv = str(options.get("kv_precision", _planned_kv(options) or default)).lower()
    if kv not in KV_PRECISIONS:
        raise InputError(f"kv_precision must be one of {', '.join(KV_PRECISIONS)}, got {kv!r}")
    props: dict[str, Any] = {"INFERENCE_PRECISION_HINT": PRECISIONS[precision],
                             "KV_CACHE_PRECISION": KV_PRECISIONS[kv][0]}
    if "threads" in options:
        threads = options["threads"]
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise InputError(f"threads must be a positive integer, got {threads!r}")
        props["INFERENCE_NUM_THREADS"] = threads
    if "hint" in options:
        hint = str(options["hint"]).upper()
        if hint not in HINTS:
            raise InputError(f"hint must be one of {', '.join(HINTS)}, got {options['hint']!r}")
        props["PERFORMANCE_HINT"] = hint
    return props


def kv_position_bytes(cfg: DecoderConfig, head_dim: int) -> int:
    """Bytes one position of one KV head takes, K and V together. A u8 cache keeps head/4 + 8 more: what GenAI
    reports it holding on the CPU (OpenVINO 2026.4: 152 bytes at head size 64, 296 at 128; bench/kv_openvino.py),
    the size of an f32 scale and zero point per channel of K a block of 32 positions and per position of V."""
    extra = head_dim // 4 + 8 if cfg.kv_dtype == "u8" else 0
    return 2 * head_dim * cfg.kv_bytes + extra


def _planned_kv(options: dict[str, Any]) -> str | None:
    """OpenVINO's precision for the plan's ``kv_dtype``; ``kv_precision``, where given too, wins over it."""
    if "kv_dtype" not in options:
        return None
    name = str(options["kv_dtype"]).lower()
    if name not in KV_DTYPES:
        raise InputError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, got {options['kv_dtype']!r}")
    return KV_DTYPES[name]


def npu_properties(options: dict[str, Any], context: int) -> dict[str, Any]:
    """MAX_PROMPT_LEN / MIN_RESPONSE_LEN from ``context`` (or the options), plus checked ``npu_config``."""
    response = options.get("min_response_len")
    if response is None:
        response = max(1, min(128, context // 4))
    prompt = options.get("max_prompt_len")
    if prompt is None:
        prompt = context - response
    for name, value in (("min_response_len", response), ("max_prompt_len", prompt)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"{name} must be a positive integer, got {value!r}")
    if prompt + response > context:
        raise InputError(f"max_prompt_len ({prompt}) + min_response_len ({response}) exceed the context of "
                         f"{context}; lower one of them or load with a larger context")
    extra = options.get("npu_config") or {}
    if not isinstance(extra, dict):
        raise InputError("npu_config must be a mapping of NPU property names to values")
    bad = sorted(k for k in extra if k not in NPU_KEYS)
    if bad:
        raise InputError(f"unknown NPU property {bad[0]!r} in npu_config (the NPU pipeline would ignore it "
                         f"silently); known: {', '.join(sorted(NPU_KEYS))}")
    props: dict[str, Any] = {"MAX_PROMPT_LEN": prompt, "MIN_RESPONSE_LEN": response}
    props.update({k: (str(v) if not isinstance(v, (int, str)) else v) for k, v in extra.items()})
    return props
