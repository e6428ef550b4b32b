"""What the backend declares (``edgeinfer plan`` reads it) and the modules that convert share, without importing
them: the schemes rknn-toolkit2 converts to per target, the architectures the layer-paged export writes, and
what runtime ``rkllm`` needs."""

from __future__ import annotations

# quantized_dtype values rknn-toolkit2 2.5.0 accepts per target (checked with config() on each)
QUANT_SUPPORT: dict[str, tuple[str, ...]] = {
    "rk3588": ("w8a8",),
    "rk3576": ("w8a8", "w4a16"),
    "rk3562": ("w8a8", "w8a16"),
    "rk3568": ("w8a8",),
    "rk3566": ("w8a8",),
    "rv1103": ("w8a8",),
    "rv1103b": ("w8a8",),
    "rv1106": ("w8a8",),
    "rv1106b": ("w8a8",),
    "rv1126b": ("w8a8", "w4a16"),
    "rk2118": ("w8a8",),
}


def supported_schemes(target: str) -> tuple[str, ...]:
    return ("fp16",) + QUANT_SUPPORT.get(target, ("w8a8",))


# the layer-paged export's prefill chunk when the convert option prefill_chunk is not given, and what its
# graphs compute that no option names: part of deploy's conversion cache key (RknnBackend.decoders.defaults)
DEFAULT_PREFILL_CHUNK = 16
CONVERSION_DEFAULTS = {"prefill_chunk": DEFAULT_PREFILL_CHUNK, "prefill_logits": "last row"}
# the int8 calibration's options (the encoders' too) that reach every graph of a quantized decoder
DECODER_QUANT_OPTIONS = ("quantized_algorithm", "quantized_method", "auto_hybrid_cos_thresh")

# the model_types whose blocks decoder_segments writes out (RknnBackend.decoders.architectures)
ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral")
TOOLKIT = "the RKLLM toolkit (package rkllm-toolkit, rkllm.api)"
GET_TOOLKIT = ("install the rkllm-toolkit wheel for your Python from "
               "https://github.com/airockchip/rknn-llm/tree/main/rkllm-toolkit/packages "
               "(x86_64 Linux only; not on PyPI)")
