"""The decoder's KV-cache dtype: a graph property. The model builder's fp32 graph keeps past/present in
fp32; :func:`kv_to_fp16` makes them fp16 graph inputs and outputs and runs ``GroupQueryAttention`` in
fp16 (its CPU kernel is registered for float and MLFloat16: ``group_query_attention.cc`` in
onnxruntime/contrib_ops/cpu/bert, https://github.com/microsoft/onnxruntime), with a Cast of the new
token's query/key/value in and of the attention output back: the per-step casts touch the new rows
only, never the cache. Half the cache bytes of fp32, like llama.cpp's default f16 cache (``--cache-type-k``).

:func:`kv_to_q8` then puts the plugin's own attention (``custom_ops.use_attention``) on a q8_0 cache: each
position's row of a KV head holds its ``head_size`` values as int8 digits and an fp16 scale a block of 32
(``kernels/attention.c``, ``GroupQueryAttentionQ8``), 1.0625 bytes a value as llama.cpp's ``--cache-type-k q8_0``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# the names the plan and the manifest use -> the ONNX element type name; f16/f32 are llama.cpp's spellings
KV_DTYPES = {"fp32": "FLOAT", "f32": "FLOAT", "fp16": "FLOAT16", "f16": "FLOAT16", "q8_0": "UINT8"}
# a graph's KV input type -> the plan's name for it
GRAPH_TYPES = {"tensor(float)": "fp32", "tensor(float16)": "fp16", "tensor(uint8)": "q8_0"}
Q8_BLOCK = 32  # values a q8_0 block: 32 int8 digits and an fp16 scale
# GroupQueryAttention inputs that are not float tensors: seqlens_k, total_sequence_length (contrib op spec)
_INT_INPUTS = (5, 6)


def kv_name(dtype: str) -> str:
    """``fp16``/``fp32``/``q8_0`` for a KV dtype the plugin builds (f16/f32 spelled either way), else InputError."""
    from edgeinfer.errors import InputError

    t = str(dtype).strip().lower()
    if t not in KV_DTYPES:
        raise InputError(f"the onnxruntime decoder keeps its KV cache in fp16, q8_0 or fp32, not {dtype!r}",
                         "use fp16 (the plan's default for onnxruntime), q8_0 (half of fp16's bytes) or fp32")
    return {"FLOAT": "fp32", "FLOAT16": "fp16", "UINT8": "q8_0"}[KV_DTYPES[t]]


def layout(kv_dtype: str, head: int) -> tuple[Any, int]:
    """The NumPy type of a ``kv_dtype`` cache and its row's width for ``head`` values (q8_0: bytes)."""
    import numpy as np

    if kv_dtype == "q8_0":
        return np.uint8, head + 2 * head // Q8_BLOCK
    return (np.float16 if kv_dtype == "fp16" else np.float32), head


def is_kv(name: str) -> bool:
    return name.startswith(("past_key_values.", "present."))


def kv_to_fp16(model: Any) -> Any:
    """``model`` (an onnx ModelProto from the builder, possibly fp16-converted) with fp16 past/present and
    fp16 GroupQueryAttention; float initializers it reads (the rotary cos/sin caches) become fp16 in place."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    g = model.graph
    for v in [*g.input, *g.output]:
        if is_kv(v.name):
            v.type.tensor_type.elem_type = TensorProto.FLOAT16
    inits = {t.name: t for t in g.initializer}
    halved: set[str] = set()
    nodes = []
    for n in g.node:
        if n.op_type != "GroupQueryAttention":
            nodes.append(n)
            continue
        for i, name in enumerate(n.input):
            if not name or is_kv(name) or i in _INT_INPUTS:
                continue
            t = inits.get(name)
            if t is not None and (name in halved or t.data_type == TensorProto.FLOAT):
                if name not in halved:  # shared by every layer: converted once
                    t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), name))
                    halved.add(name)
                continue
            if t is not None:
                continue  # already fp16
            nodes.append(helper.make_node("Cast", [name], [f"{name}/fp16"], to=TensorProto.FLOAT16,
                                          name=f"{n.name}/CastIn{i}"))
            n.input[i] = f"{name}/fp16"
        out = n.output[0]
        n.output[0] = f"{out}/fp16"
        nodes += [n, helper.make_node("Cast", [n.output[0]], [out], to=TensorProto.FLOAT, name=f"{n.name}/CastOut")]
    del g.node[:]
    g.node.extend(nodes)
    return model


def check_q8(hf_dir: Path, unavailable: str | None) -> None:
    """Refuse a q8_0 cache before exporting ``hf_dir``: where deploy does not use the own ops (``unavailable``:
    why), or where its config's head size is not a multiple of :data:`Q8_BLOCK` (an export takes minutes on a
    large model)."""
    from edgeinfer.errors import InputError

    if unavailable:
        raise InputError(f"a q8_0 KV cache runs on edgeinfer's own attention op, which deploy does not use here "
                         f"({unavailable})", "deploy with --option kv_dtype=fp16")
    try:
        cfg = json.loads((hf_dir / "config.json").read_text())
    except (OSError, ValueError):
        return  # the builder reports a missing or broken config itself
    cfg = cfg.get("text_config", cfg)
    heads, hidden = cfg.get("num_attention_heads"), cfg.get("hidden_size")
    head = cfg.get("head_dim") or (hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads
                                   else None)
    if isinstance(head, int) and head % Q8_BLOCK:
        raise InputError(f"a q8_0 KV cache holds blocks of {Q8_BLOCK} values; this model's head size is {head}",
                         "deploy with --option kv_dtype=fp16")


def kv_to_q8(model: Any, head: int) -> None:
    """``model`` (after :func:`kv_to_fp16` and ``custom_ops.use_attention``) with a q8_0 cache: its KV inputs and
    outputs uint8 rows of :func:`layout`'s width, each own ``GroupQueryAttention`` a ``GroupQueryAttentionQ8``."""
    from onnx import TensorProto

    from edgeinfer.errors import InputError

    from .custom_ops import DOMAIN

    g = model.graph
    ops = [n for n in g.node if n.op_type == "GroupQueryAttention"]
    if not ops or any(n.domain != DOMAIN for n in ops):
        raise InputError("a q8_0 KV cache runs on edgeinfer's own attention op, which does not compute this model's "
                         "attention (custom_ops.use_attention)", "deploy with --option kv_dtype=fp16")
    width = layout("q8_0", head)[1]  # head: a multiple of Q8_BLOCK (check_q8, before the export)
    for v in [*g.input, *g.output]:
        if is_kv(v.name):
            v.type.tensor_type.elem_type = TensorProto.UINT8
            dims = v.type.tensor_type.shape.dim
            dims[len(dims) - 1].Clear()
            dims[len(dims) - 1].dim_value = width
    for n in ops:
        n.op_type = "GroupQueryAttentionQ8"
