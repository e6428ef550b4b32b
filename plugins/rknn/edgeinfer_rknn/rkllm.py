"""Run a ``.rkllm`` model (converted with Rockchip's RKLLM toolkit) through the RKLLM runtime's C API.

The structures and signatures below mirror the newest public header,
https://github.com/airockchip/rknn-llm/blob/878f9361fd3afa7e167b7079918918f78d2c1c2a/rkllm-runtime/Linux/librkllm_api/include/rkllm.h
(release v1.3.0 line; read 2026-12-01). The library is ``librkllmrt.so`` (found on the loader path,
or at ``$EDGEINFER_RKLLM_LIB``); it exists for aarch64 boards only.

What ran where: this binding has run only against the stand-in library built from
``plugins/rknn/tests/rkllm_standin.c`` by the tests (same functions and structures, a deterministic
token stream). It has never run against the real ``librkllmrt.so`` on a board.
"""

from __future__ import annotations

import ctypes as C
import json
import os
import platform
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from edgeinfer.contract.decoder import NativeDecoder
from edgeinfer.contract.helpers import first_line
from edgeinfer.errors import BackendError, BackendUnavailableError, ModelError

LIB_ENV = "EDGEINFER_RKLLM_LIB"
LIB_NAME = "librkllmrt.so"
GET_RUNTIME = ("install Rockchip's RKLLM runtime on the board (librkllmrt.so from "
               "https://github.com/airockchip/rknn-llm/tree/main/rkllm-runtime/Linux/librkllm_api/aarch64) "
               f"or set {LIB_ENV} to its path")

# enum LLMCallState, RKLLMInputType, RKLLMInferMode
RUN_NORMAL, RUN_WAITING, RUN_FINISH, RUN_ERROR = 0, 1, 2, 3
INPUT_PROMPT, INPUT_TOKEN, INPUT_EMBED, INPUT_MULTIMODAL = 0, 1, 2, 3
INFER_GENERATE = 0
CALLBACK_CONTINUE, CALLBACK_PAUSE = 0, 1
# Rockchip ships librkllmrt.so for aarch64 only: a library with its functions loaded on another machine is a
# stand-in (the tests' rkllm_standin.c), and its figures are the host CPU's, never a board's
DEVICE = "npu" if platform.machine().lower() in ("aarch64", "arm64") else "stand-in library on the host CPU"

LLMHandle = C.c_void_p


class RKLLMExtendParam(C.Structure):
    _fields_ = [("base_domain_id", C.c_int32), ("embed_flash", C.c_int8), ("enabled_cpus_num", C.c_int8),
                ("enabled_cpus_mask", C.c_uint32), ("n_batch", C.c_uint8), ("use_cross_attn", C.c_int8),
                ("reserved", C.c_uint8 * 104)]


class RKLLMParam(C.Structure):
    _fields_ = [("model_path", C.c_char_p), ("max_context_len", C.c_int32), ("max_new_tokens", C.c_int32),
                ("top_k", C.c_int32), ("n_keep", C.c_int32), ("top_p", C.c_float), ("temperature", C.c_float),
                ("repeat_penalty", C.c_float), ("frequency_penalty", C.c_float), ("presence_penalty", C.c_float),
                ("mirostat", C.c_int32), ("mirostat_tau", C.c_float), ("mirostat_eta", C.c_float),
                ("skip_special_token", C.c_bool), ("ignore_eos_token", C.c_bool), ("is_async", C.c_bool),
                ("extend_param", RKLLMExtendParam)]


class RKLLMEmbedInput(C.Structure):
    _fields_ = [("embed", C.POINTER(C.c_float)), ("n_tokens", C.c_size_t)]


class RKLLMTokenInput(C.Structure):
    _fields_ = [("input_ids", C.POINTER(C.c_int32)), ("n_tokens", C.c_size_t)]


class _Image(C.Structure):
    _fields_ = [("image_embed", C.POINTER(C.c_float)), ("n_image_tokens", C.c_size_t), ("n_image", C.c_size_t),
                ("image_start", C.c_char_p), ("image_end", C.c_char_p), ("image_content", C.c_char_p),
                ("image_width", C.c_size_t), ("image_height", C.c_size_t)]


class _Video(C.Structure):
    _fields_ = [("video_embed", C.POINTER(C.c_float)), ("n_frame_tokens", C.c_size_t),
                ("n_frame_per_video", C.c_size_t), ("n_video", C.c_size_t), ("video_start", C.c_char_p),
                ("video_end", C.c_char_p), ("video_content", C.c_char_p), ("frame_width", C.c_size_t),
                ("frame_height", C.c_size_t)]


class RKLLMMultiModalInput(C.Structure):
    _fields_ = [("prompt", C.c_char_p), ("image", _Image), ("video", _Video)]


class _InputUnion(C.Union):
    _fields_ = [("prompt_input", C.c_char_p), ("embed_input", RKLLMEmbedInput),
                ("token_input", RKLLMTokenInput), ("multimodal_input", RKLLMMultiModalInput)]


class RKLLMInput(C.Structure):
    _anonymous_ = ("u",)
    _fields_ = [("role", C.c_char_p), ("enable_thinking", C.c_bool), ("input_type", C.c_int), ("u", _InputUnion)]


class RKLLMLoraParam(C.Structure):
    _fields_ = [("lora_adapter_name", C.c_char_p)]


class RKLLMPromptCacheParam(C.Structure):
    _fields_ = [("save_prompt_cache", C.c_int), ("prompt_cache_path", C.c_char_p)]


class RKLLMSamplingParam(C.Structure):
    _fields_ = [("top_k", C.c_int32), ("top_p", C.c_float), ("temperature", C.c_float),
                ("repeat_penalty", C.c_float), ("frequency_penalty", C.c_float), ("presence_penalty", C.c_float),
                ("mirostat", C.c_int32), ("mirostat_tau", C.c_float), ("mirostat_eta", C.c_float)]


class RKLLMInferParam(C.Structure):
    _fields_ = [("mode", C.c_int), ("lora_params", C.POINTER(RKLLMLoraParam)),
                ("prompt_cache_params", C.POINTER(RKLLMPromptCacheParam)),
                ("sampling_params", C.POINTER(RKLLMSamplingParam)), ("keep_history", C.c_int),
                ("max_new_tokens", C.c_int32)]


class RKLLMResultLastHiddenLayer(C.Structure):
    _fields_ = [("hidden_states", C.POINTER(C.c_float)), ("embd_size", C.c_int), ("num_tokens", C.c_int)]


class RKLLMResultLogits(C.Structure):
    _fields_ = [("logits", C.POINTER(C.c_float)), ("vocab_size", C.c_int), ("num_tokens", C.c_int)]


class RKLLMPerfStat(C.Structure):
    _fields_ = [("prefill_time_ms", C.c_float), ("prefill_tokens", C.c_int), ("generate_time_ms", C.c_float),
                ("generate_tokens", C.c_int), ("memory_usage_mb", C.c_float)]


class RKLLMResult(C.Structure):
    _fields_ = [("text", C.c_char_p), ("token_id", C.c_int32), ("last_hidden_layer", RKLLMResultLastHiddenLayer),
                ("logits", RKLLMResultLogits), ("perf", RKLLMPerfStat)]


LLMResultCallback = C.CFUNCTYPE(C.c_int, C.POINTER(RKLLMResult), C.c_void_p, C.c_int)
LLMTokenizerCallback = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_char_p, C.c_int32, C.POINTER(C.c_int32), C.c_int32)
LLMGetEmbedCallback = C.CFUNCTYPE(C.c_int, C.c_void_p, C.POINTER(C.c_int32), C.c_uint64, C.c_void_p, C.c_uint64)


class RKLLMCallback(C.Structure):
    _fields_ = [("result_callback", LLMResultCallback), ("result_userdata", C.c_void_p),
                ("tokenizer_callback", LLMTokenizerCallback), ("tokenizer_userdata", C.c_void_p),
                ("embed_callback", LLMGetEmbedCallback), ("embed_userdata", C.c_void_p)]


_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "rkllm_createDefaultParam": (RKLLMParam, []),
    "rkllm_init": (C.c_int, [C.POINTER(LLMHandle), C.POINTER(RKLLMParam), C.POINTER(RKLLMCallback)]),
    "rkllm_run": (C.c_int, [LLMHandle, C.POINTER(RKLLMInput), C.POINTER(RKLLMInferParam), C.c_void_p]),
    "rkllm_run_async": (C.c_int, [LLMHandle, C.POINTER(RKLLMInput), C.POINTER(RKLLMInferParam), C.c_void_p]),
    "rkllm_abort": (C.c_int, [LLMHandle]),
    "rkllm_is_running": (C.c_int, [LLMHandle]),
    "rkllm_destroy": (C.c_int, [LLMHandle]),
}


def library_path() -> str:
    return os.environ.get(LIB_ENV) or LIB_NAME


def load_library(path: str | None = None) -> C.CDLL:
    """``librkllmrt.so`` with its functions typed; BackendUnavailableError (exit 3) when absent."""
    where = path or library_path()
    try:
        lib = C.CDLL(where)
    except OSError as e:
        raise BackendUnavailableError(f"the RKLLM runtime library {where} cannot be loaded ({first_line(e)})",
                                      GET_RUNTIME) from None
    for name, (restype, argtypes) in _SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise BackendUnavailableError(f"{where} has no {name}: not the RKLLM runtime", GET_RUNTIME) from None
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def perf_metrics(perf: RKLLMPerfStat) -> dict[str, Any]:
    """RKLLM's perf stats in edgeinfer's names. RKLLM reports totals, not per-token times: ``tpot_ms``
    is the mean over the generate stage (no p50/p99); ``ttft_ms`` is its prefill time (prefill yields
    the first token); ``peak_rss_bytes`` its VmHWM in MB as printed (MiB)."""
    def rate(n: int, ms: float) -> float | None:
        return n * 1000.0 / ms if ms > 0 and n > 0 else None

    return {"ttft_ms": float(perf.prefill_time_ms), "prefill_tokens": int(perf.prefill_tokens),
            "prefill_tokens_per_s": rate(perf.prefill_tokens, perf.prefill_time_ms),
            "generated_tokens": int(perf.generate_tokens),
            "tpot_ms": perf.generate_time_ms / perf.generate_tokens if perf.generate_tokens > 0 else None,
            "decode_tokens_per_s": rate(perf.generate_tokens, perf.generate_time_ms),
            "peak_rss_bytes": int(perf.memory_usage_mb * 2**20), "runtime": "rkllm"}


def sampling(options: Any) -> RKLLMSamplingParam:
    """GenerationOptions → RKLLMSamplingParam (greedy = top-k 1; top_k 0 means no filter in edgeinfer)."""
    greedy = options.temperature == 0.0
    return RKLLMSamplingParam(top_k=1 if greedy else options.top_k, top_p=options.top_p,
                              temperature=options.temperature, repeat_penalty=options.repetition_penalty,
                              frequency_penalty=0.0, presence_penalty=0.0, mirostat=0, mirostat_tau=5.0,
                              mirostat_eta=0.1)


def vocab_size(model: Path) -> int:
    """From the Hugging Face config.json next to the .rkllm (a decoder bundle keeps it); the RKLLM API
    does not expose it. Unknown: the largest int32 (token ids are int32 in RKLLMTokenInput)."""
    try:
        v = json.loads((model.parent / "config.json").read_text(encoding="utf-8")).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        v = None
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 2**31 - 1


class RkllmDecoder(NativeDecoder):
    """A ``.rkllm`` model in the RKLLM runtime: a native loop (the runtime samples and keeps the KV cache)."""

    def __init__(self, model: Path, context: int, lib: C.CDLL):
        # RKLLM allocates its KV cache itself and does not say how large, nor the vocabulary size
        super().__init__(context=context, vocab_size=vocab_size(model), kv_cache_bytes=0, slots=1, device=DEVICE)
        self._lib = lib
        self._handle = LLMHandle()
        self._lock = threading.Lock()
        self._on_token: Callable[[int], bool] | None = None
        self._stopped = False
        self._perf: dict[str, Any] = {}
        self._error: str | None = None
        self._cb = LLMResultCallback(self._result)  # kept alive as long as the handle
        param = lib.rkllm_createDefaultParam()
        self._path = str(model).encode()
        param.model_path = self._path
        param.max_context_len = context
        param.is_async = False
        self._callbacks = RKLLMCallback(result_callback=self._cb)
        code = lib.rkllm_init(C.byref(self._handle), C.byref(param), C.byref(self._callbacks))
        if code != 0 or not self._handle:
            raise ModelError(f"rkllm_init failed for {model.name} (code {code}): not a model this RKLLM runtime "
                             "loads", "convert it with the RKLLM toolkit of the same version as librkllmrt.so")

    def _result(self, result: Any, userdata: Any, state: int) -> int:
        r = result.contents
        # WAITING: a token whose text is an incomplete UTF-8 character; its id counts all the same
        # (edgeinfer detokenizes the ids itself and ignores RKLLM's text)
        if state in (RUN_NORMAL, RUN_WAITING) and not self._stopped and self._on_token is not None:
            try:
                keep = self._on_token(int(r.token_id))
            except BaseException as e:  # never let an exception cross the C frame: stop, re-raise after
                self._error, keep = f"on_token raised {type(e).__name__}: {e}", False
            if not keep:
                self._stopped = True
                return CALLBACK_PAUSE
        elif state == RUN_FINISH:
            self._perf = perf_metrics(r.perf)
        elif state == RUN_ERROR:
            self._error = "the RKLLM runtime reported an error while generating"
        return CALLBACK_PAUSE if self._stopped else CALLBACK_CONTINUE

    def generate_native(self, prompt_ids: Sequence[int], options: Any, on_token: Callable[[int], bool]
                        ) -> dict[str, Any]:
        if self._closed:
            raise BackendError("this RKLLM decoder is closed")
        with self._lock:
            ids = (C.c_int32 * len(prompt_ids))(*[int(i) for i in prompt_ids])
            inp = RKLLMInput(role=b"user", enable_thinking=False, input_type=INPUT_TOKEN)
            inp.token_input = RKLLMTokenInput(input_ids=ids, n_tokens=len(prompt_ids))
            samp = sampling(options)
            infer = RKLLMInferParam(mode=INFER_GENERATE, sampling_params=C.pointer(samp), keep_history=0,
                                    max_new_tokens=options.max_new_tokens)
            self._on_token, self._stopped, self._perf, self._error = on_token, False, {}, None
            try:
                code = self._lib.rkllm_run(self._handle, C.byref(inp), C.byref(infer), None)
            finally:
                self._on_token = None
            if code != 0 or self._error:
                raise BackendError(self._error or f"rkllm_run failed (code {code})")
            return dict(self._perf, stopped_by_consumer=self._stopped)

    def abort(self) -> None:
        """Stop a generation running in another thread (rkllm_abort)."""
        if self._handle and not self._closed:
            self._lib.rkllm_abort(self._handle)

    def release(self) -> None:
        if self._handle:
            self._lib.rkllm_destroy(self._handle)
            self._handle = LLMHandle()


def open_rkllm(model: Path, context: int, slots: int = 1) -> RkllmDecoder:
    """What the rknn backend's ``open_decoder`` returns for a ``.rkllm`` file. It declares one slot whatever
    ``slots`` asks (RKLLM's n_batch is not wired), as the OpenVINO NPU pipeline does; the server reads that."""
    return RkllmDecoder(Path(model), context, load_library())
