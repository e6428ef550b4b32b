"""The planner's quantization arithmetic: GGUF block sizes, KV-cache bytes per element and the resident bits of
a runtime's blocked int8 and int4 weights. The scheme names and their bits per weight are the contract's
(:mod:`edgeinfer.contract.schemes`).

GGUF block types: block bytes × 8 / block elements (ggml-common.h), e.g. Q4_0 = 18 B / 32 = 4.5 bpw.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgeinfer.contract.helpers import row_block
from edgeinfer.errors import InputError

if TYPE_CHECKING:
    from edgeinfer.contract.schemes import Scheme

# GGUF tensor types: (block elements, block bytes) — ggml/src/ggml-common.h
GGUF_BLOCKS: dict[str, tuple[int, int]] = {
    "F32": (1, 4), "F16": (1, 2), "BF16": (1, 2),
    "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24),
    "Q8_0": (32, 34), "Q8_1": (32, 36),
    "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144), "Q5_K": (256, 176),
    "Q6_K": (256, 210), "Q8_K": (256, 292),
    "IQ1_S": (256, 50), "IQ1_M": (256, 56), "IQ2_XXS": (256, 66), "IQ2_XS": (256, 74),
    "IQ2_S": (256, 82), "IQ3_XXS": (256, 98), "IQ3_S": (256, 110), "IQ4_NL": (32, 18),
    "IQ4_XS": (256, 136), "TQ1_0": (256, 54), "TQ2_0": (256, 66), "MXFP4": (32, 17),
}


def kv_bytes_per_element(kv_dtype: str, head_dim: int = 0) -> float:
    """Bytes per KV-cache element: fp32 4, fp16/bf16 2, int8 1, q8_0 34/32, q4_0 18/32; u8 (OpenVINO's CPU cache)
    1 + 1/8 + 4/``head_dim`` (1.1875 at head size 64; 1.125 where that is unknown): what GenAI reports it holding, a
    position of a KV head in 2 x head + head/4 + 8 bytes, the size of an f32 scale and zero point per channel of K a
    block of 32 positions and per position of V (bench/results/kv_openvino.json)."""
    t = kv_dtype.strip().lower()
    table = {"fp32": 4.0, "f32": 4.0, "fp16": 2.0, "f16": 2.0, "bf16": 2.0,
             "int8": 1.0, "u8": 1.125, "q8_0": 34 / 32, "q4_0": 18 / 32, "fp8": 1.0}
    if t not in table:
        raise InputError(f"unknown KV-cache dtype '{kv_dtype}'", "use one of: " + ", ".join(table))
    return table[t] + (4 / head_dim if t == "u8" and head_dim else 0.0)


# spellings of one KV dtype: llama.cpp's f16 / f32
KV_ALIASES = {"f16": "fp16", "f32": "fp32"}


def kv_dtypes(prof: dict) -> list[str]:
    """The KV dtypes a runtime builds (its profile's ``kv_dtypes``), or [] where the profile does not say."""
    return list((prof.get("kv_dtypes") or {}).get("values", []))


def planned_kv_dtype(prof: dict, runtime: str, scheme, asked: str | None) -> str:
    """``asked`` (``--kv-dtype``) where the runtime builds it, else the runtime's own (:func:`runtime_kv_dtype`);
    a dtype the runtime's profile does not list is refused, as deploy would refuse it."""
    if asked is None:
        return runtime_kv_dtype(prof, scheme)
    kv_bytes_per_element(asked)  # a name the planner knows at all
    name = KV_ALIASES.get(asked.strip().lower(), asked.strip().lower())
    built = kv_dtypes(prof)
    if built and name not in built:
        raise InputError(f"runtime {runtime} keeps its KV cache in {', '.join(built)}, not {asked!r}",
                         f"use --kv-dtype {' or '.join(built)}; deploy: --option kv_dtype={built[0]}")
    return name


def kv_read_bytes(prof: dict, kv_dtype: str, head_dim: int = 0) -> float:
    """Bytes a value a decode step reads of a ``kv_dtype`` cache at the runtime's pace: its measured fp16-equivalent
    (the profile's ``kv_read_bytes``: a cache whose conversions, not its bytes, set the pace), else its bytes."""
    measured = (prof.get("kv_read_bytes") or {}).get("values", {})
    return float(measured[kv_dtype]) if kv_dtype in measured else kv_bytes_per_element(kv_dtype, head_dim)


def runtime_kv_dtype(prof: dict, scheme) -> str:
    """The KV dtype a runtime keeps for ``scheme`` (a contract Scheme): its profile's ``kv_dtype`` (default
    fp16), where ``scheme`` means the scheme's activation type (fp32, bf16, else fp16: torch keeps the cache in
    the dtype it computes in)."""
    kv = prof.get("kv_dtype") or "fp16"
    if kv != "scheme":
        return kv
    return "fp32" if scheme.act_bits == 32 else "bf16" if scheme.name == "bf16" else "fp16"


def packed_bits(scheme: Scheme, prof: dict, k: int | None = None) -> float | None:
    """Resident bits per weight where the runtime holds int8 or int4 weights in blocks with per-block extras (the
    profile's ``int8_blocks`` / ``int4_blocks``: its block size and, per activation width, the bytes each block
    adds), or None. onnxruntime: MLAS repacks MatMulNBits' weights for int8 activations (w8a8, w4a8) with a float
    scale and a float block sum per block (8 + 64/128 = 8.5 bits at block 128; 4 + 64/32 = 6 bits at block 32);
    w8a16 runs on the plugin's own op with a float scale per block (8 + 32/128 = 8.25 bits). ``k``: on rows of
    that many weights (:func:`block_of`)."""
    if scheme.kind != "int" or scheme.weight_bits not in (4, 8):
        return None
    layout = prof.get(f"int{scheme.weight_bits}_blocks")
    extra = (layout or {}).get("bytes_per_block", {}).get(f"a{scheme.act_bits}")
    if extra is None:
        return None
    return scheme.weight_bits + 8 * extra / block_of(scheme, layout, k)


def embedding_bits(prof: dict, width: int) -> float | None:
    """Bits a weight of a quantized decoder's token table where the runtime holds it in int8 blocks (the profile's
    ``decoder_embedding_blocks``: the first of its ``blocks`` that divides the table's ``width``, each block with
    a float scale of ``scale_bytes``; none dividing it, the table stays float: ``float_bits``), else None."""
    layout = prof.get("decoder_embedding_blocks")
    if not layout or not width:
        return None
    block = next((b for b in layout["blocks"] if width % b == 0), None)
    return float(layout["float_bits"]) if block is None else 8 + 8 * layout["scale_bytes"] / block


def block_of(scheme: Scheme, layout: dict, k: int | None = None) -> int:
    """The block of rows of ``k`` weights: the scheme's group or the layout's block, halved while it does not
    divide ``k`` where the runtime does so (the layout's ``halve_to``, the smallest block it halves to; else, or
    below it, the whole row is one block), as the plugins that write int8 in blocks do
    (:func:`edgeinfer.contract.helpers.row_block`). Without ``k`` (or a ``halve_to``): the block as given."""
    block = scheme.group_size or layout["block"]
    smallest = layout.get("halve_to")
    if block <= 0:  # per channel: a row is one block
        return k or block
    if not k or not smallest:
        return block
    return row_block(k, block, smallest)


def row_widths(spec) -> list[tuple[int, int]] | None:
    """A dense decoder's matrices as (row width, parameters) over all its layers: q, k, v, gate and up read
    hidden-wide rows, o the heads' width, down the MLP's; None where the architecture is not that."""
    h, heads, hd, kv, inter, n = spec.hidden, spec.heads, spec.head_dim, spec.kv_heads, spec.intermediate, spec.layers
    if spec.encoder or spec.is_moe or spec.kv_row or not (h and heads and hd and kv and inter and n):
        return None
    return [(h, n * h * (heads * hd + 2 * kv * hd + 2 * inter)), (heads * hd, n * heads * hd * h),
            (inter, n * inter * h)]


def packed_layout(scheme: Scheme, prof: dict, blocks: set[int] | None = None) -> str:
    layout = prof[f"int{scheme.weight_bits}_blocks"]
    block = scheme.group_size or layout["block"]
    halved = sorted(b for b in blocks or () if b != block)
    return (f"int{scheme.weight_bits} in blocks of {block} weights" +
            (f" ({', '.join(map(str, halved))} on rows {block} does not divide)" if halved else "") +
            f" + {layout['bytes_per_block'][f'a{scheme.act_bits}']} bytes per block" +
            (f"; the LM head int{layout['lm_head']}" if layout.get("lm_head") else ""))


def lm_head_bits(scheme: Scheme, prof: dict) -> float | None:
    """Bits a weight of the LM head where the runtime holds it apart from the rest (the scheme's layout's
    ``lm_head``: 8, in the ``int8_blocks`` layout of 16-bit activations, as llama.cpp's 4-bit mixes keep the head
    in 8 bits or more), else None."""
    if scheme.kind != "int" or not (prof.get(f"int{scheme.weight_bits}_blocks") or {}).get("lm_head"):
        return None
    int8 = prof["int8_blocks"]
    return 8 + 8 * int8["bytes_per_block"]["a16"] / int8["block"]
