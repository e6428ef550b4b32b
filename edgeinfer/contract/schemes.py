"""Quantization schemes: their canonical names and bits per weight. What a backend names in
``schemes`` / ``decoder_schemes`` and what :func:`normalize_scheme` accepts from a user.

Standard library only: every backend and ``edgeinfer plan`` import it.

Bits per weight (bpw) are *effective* storage bits including scales:

* ``w4a16_g128``: 4 bits + one fp16 scale per 128 weights = 4 + 16/128 = 4.125
* ``w8a8`` per channel: 8 bits (one scale per output row, negligible)
* GGUF *file types* (Q4_K_M ...) are mixtures; their effective bpw is the whole-file figure for
  Llama-3-8B printed by llama-quantize (docs/board-facts.md#gguf-bpw) and is only used when no file is given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from edgeinfer.errors import InputError

# GGUF file types (mixtures): effective bpw from llama-quantize sizes for Llama-3-8B
# (docs/board-facts.md#gguf-bpw, derived: GiB × 2^30 × 8 / 8.03e9).
GGUF_FILE_TYPES: dict[str, float] = {
    "Q2_K": 3.17, "Q3_K_S": 3.65, "Q3_K_M": 4.00, "Q3_K_L": 4.31,
    "Q4_0": 4.64, "Q4_1": 5.11, "Q4_K_S": 4.67, "Q4_K_M": 4.90,
    "Q5_0": 5.57, "Q5_K_S": 5.57, "Q5_K_M": 5.70, "Q6_K": 6.57, "Q8_0": 8.52,
    "IQ2_XXS": 2.06, "IQ2_XS": 2.31, "IQ2_S": 2.5, "IQ2_M": 2.7, "IQ3_XXS": 3.06,
    "IQ3_XS": 3.3, "IQ3_S": 3.44, "IQ3_M": 3.66, "IQ4_XS": 4.25, "IQ4_NL": 4.50,
}

ALIASES = {
    "int8": "w8a8", "i8": "w8a8", "float32": "fp32", "f32": "fp32", "float16": "fp16",
    "f16": "fp16", "half": "fp16", "bfloat16": "bf16", "int4": "w4a16", "w4": "w4a16",
    "w8": "w8a16",
}

_BASE = {  # name: (weight bits, activation bits, kind)
    "fp32": (32, 32, "float"), "fp16": (16, 16, "float"), "bf16": (16, 16, "float"),
    "w8a8": (8, 8, "int"), "w8a16": (8, 16, "int"), "w4a16": (4, 16, "int"),
    "w4a8": (4, 8, "int"),
}
_GROUPED = re.compile(r"^(w8a8|w8a16|w4a16|w4a8)_g(\d+)$")
_GROUP_SIZES = {32, 64, 128, 256, 512}


@dataclass(frozen=True)
class Scheme:
    name: str  # canonical name: "w8a8", "w4a16_g128", "fp16", "gguf:Q4_K_M"
    weight_bits: int  # nominal storage bits of a quantized weight
    bpw: float  # effective bits per weight, scales included
    act_bits: int  # activation bits
    kind: str  # "float", "int", "gguf"
    group_size: int | None = None

    @property
    def family(self) -> str:
        """Scheme without the group suffix: w4a16_g128 -> w4a16."""
        return self.name.split("_g")[0] if self.kind == "int" else self.name


def known_schemes() -> list[str]:
    names = list(_BASE) + ["w4a16_g32", "w4a16_g64", "w4a16_g128", "w8a8_g128", "w8a8_g256", "w8a8_g512"]
    names += sorted(GGUF_FILE_TYPES) + ["F16", "BF16", "F32"]
    return names


def normalize_scheme(name: str) -> Scheme:
    """Return the :class:`Scheme` for a user-given name; raise InputError listing known ones."""
    if not isinstance(name, str) or not name.strip():
        raise InputError("empty quantization scheme", "use one of: " + ", ".join(known_schemes()))
    raw = name.strip()
    low = raw.lower()
    low = ALIASES.get(low, low)
    if low in _BASE:
        wb, ab, kind = _BASE[low]
        return Scheme(low, wb, float(wb), ab, kind)
    m = _GROUPED.match(low)
    if m:
        base, g = m.group(1), int(m.group(2))
        if g not in _GROUP_SIZES:
            raise InputError(f"unsupported group size {g} in '{raw}'",
                             f"use one of {sorted(_GROUP_SIZES)}")
        wb, ab, _ = _BASE[base]
        return Scheme(f"{base}_g{g}", wb, wb + 16.0 / g, ab, "int", g)
    up = raw.upper()
    if up.startswith("GGUF:"):
        up = up[5:]
    if up in GGUF_FILE_TYPES:
        return Scheme(f"gguf:{up}", int(GGUF_FILE_TYPES[up]), GGUF_FILE_TYPES[up], 32, "gguf")
    if up in ("F16", "BF16", "F32"):
        return normalize_scheme({"F16": "fp16", "BF16": "bf16", "F32": "fp32"}[up])
    raise InputError(f"unknown quantization scheme '{raw}'",
                     "known schemes: " + ", ".join(known_schemes()))
