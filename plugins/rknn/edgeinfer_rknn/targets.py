"""The schemes rknn-toolkit2 converts to, per target: data the backend's declarations, the Ray resource names
and the converters share, without importing the toolkit wrapper (``edgeinfer plan`` reads the declarations)."""

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
