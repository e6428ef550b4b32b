"""The token embedding of an int8 or int4 decoder as int8 blocks, looked up by ``GatherBlockQuantized``; of the
host fp16 class as fp16 rows, cast to fp32 after the lookup.

onnxruntime-genai's builder keeps the embedding table in fp32 whatever the precision: a ``Gather`` over
``model.embed_tokens.weight``, or, for a tied model in fp32 (the graph the int8 schemes start from), over a
``Transpose`` of the LM head's fp32 weight, which then stays in the file beside its quantized copy only for the
lookup. With a Qwen-sized vocabulary that table is most of a small model: 151,936 × 1,024 × 4 B = 622 MB for
Qwen3-0.6B against ~440 M other parameters. Here it becomes int8, symmetric, one fp32 scale per block of the
hidden dimension, read by onnxruntime's ``com.microsoft.GatherBlockQuantized`` (``bits=8``; uint8 data with no
zero-point input is offset by 128, checked against a one-node graph on onnxruntime 1.26; its schema:
https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md#com.microsoft.GatherBlockQuantized),
as llama.cpp keeps ``token_embd`` in the model's quantized type and NNCF keeps OpenVINO's embeddings int8.
An fp16 table is read by a plain ``Gather`` (any element type) and only the rows it read are cast. Where one of
edgeinfer's own matmuls holds a tied model's LM head (fp16, w8a16, w4a16 and w4a8: custom_ops.py), the lookup
reads the head's packed weights instead (``edgeinfer.EmbedF16`` / ``EmbedW8``, kernels/embedding.c): the table is
held once, as llama.cpp holds ``token_embd`` once (:func:`head_embedding`). The int4 classes hold their head in int8
(MatMulW8), as llama.cpp's 4-bit mixes hold a tied ``token_embd`` in Q8_0 or Q6_K, so they read it through EmbedW8.
"""

from __future__ import annotations

from typing import Any

BITS = 8
EMBED = {"MatMulF16": "EmbedF16", "MatMulW8": "EmbedW8"}  # a tied head's own op -> its lookup


def _lookup(model: Any, ids: str) -> tuple[Any, Any, Any, Any] | None:
    """The ``Gather`` that looks input ``ids`` up, the fp32 initializer it reads (directly, or through the
    ``Transpose`` also returned) and that table as ``[vocab, width]``; None for any other lookup."""
    import numpy as np
    from onnx import numpy_helper

    g = model.graph
    gather = next((n for n in g.node if n.op_type == "Gather" and len(n.input) == 2 and n.input[1] == ids), None)
    if gather is None:
        return None
    inits = {t.name: t for t in g.initializer}
    producer = next((n for n in g.node if gather.input[0] in n.output), None)
    if gather.input[0] in inits:
        source, transpose = inits[gather.input[0]], None
    elif producer is not None and producer.op_type == "Transpose" and producer.input[0] in inits:
        source, transpose = inits[producer.input[0]], producer
    else:
        return None
    table = numpy_helper.to_array(source)
    if table.dtype != np.float32 or table.ndim != 2:
        return None
    return gather, source, transpose, (table.T if transpose is not None else table)


def _replace(model: Any, found: tuple[Any, Any, Any, Any], tables: list[Any], lookup: list[Any]) -> None:
    """``found``'s lookup replaced by the ``lookup`` nodes over the initializers ``tables``; its fp32 table (and
    Transpose) dropped where nothing else reads them."""
    g = model.graph
    gather, source, transpose, _ = found
    g.initializer.extend(tables)
    nodes = list(g.node)
    at = nodes.index(gather)
    nodes[at: at + 1] = lookup
    if transpose is not None and not any(transpose.output[0] in n.input for n in nodes):
        nodes.remove(transpose)
    del g.node[:]
    g.node.extend(nodes)
    if not any(source.name in n.input for n in g.node):
        g.initializer.remove(source)


def quantize_embedding(model: Any, ids: str, block: int) -> dict[str, Any] | None:
    """Rewrite ``model`` (an ``onnx.ModelProto`` with its weights loaded) in place: the float table the lookup of
    input ``ids`` reads becomes int8 per ``block`` columns (32 where ``block`` does not divide its width). The
    facts for the conversion's stamp, or None when the graph's lookup is not a ``Gather`` over an fp32
    initializer (or its transpose) whose width 32 divides."""
    import numpy as np
    from onnx import helper, numpy_helper

    found = _lookup(model, ids)
    if found is None:
        return None
    gather, source, _, table = found
    vocab, width = table.shape
    block = next((b for b in (block, 32) if width % b == 0), 0)
    if not block:
        return None
    blocks = table.reshape(vocab, width // block, block)
    scales = np.abs(blocks).max(axis=2) / 127
    scales[scales == 0] = 1
    q = np.clip(np.rint(blocks / scales[..., None]), -127, 127).astype(np.int16) + 128
    name = f"{source.name}/int8"
    tables = [numpy_helper.from_array(q.astype(np.uint8).reshape(vocab, width), name),
              numpy_helper.from_array(scales.astype(np.float32), f"{name}/scales")]
    lookup = helper.make_node("GatherBlockQuantized", [name, ids, f"{name}/scales"], list(gather.output),
                              name=f"{gather.name}BlockQuantized", domain="com.microsoft", bits=BITS,
                              block_size=block, gather_axis=0, quantize_axis=1)
    _replace(model, found, tables, [lookup])
    return {"embedding": f"int8, block {block} (GatherBlockQuantized)"}


def embedding_fp16(model: Any, ids: str) -> dict[str, Any] | None:
    """As :func:`quantize_embedding`, the table fp16 instead: a ``Gather`` of fp16 rows and a ``Cast`` of the
    rows it read to fp32 (the host fp16 class: :mod:`.weight_planes`)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    found = _lookup(model, ids)
    if found is None:
        return None
    gather, source, _, table = found
    name, rows = f"{source.name}/fp16", f"{gather.output[0]}/fp16"
    lookup = [helper.make_node("Gather", [name, ids], [rows], name=f"{gather.name}Fp16", axis=0),
              helper.make_node("Cast", [rows], list(gather.output), name=f"{gather.name}Fp32", to=TensorProto.FLOAT)]
    _replace(model, found, [numpy_helper.from_array(table.astype(np.float16), name)], lookup)
    return {"embedding": "fp16 (Gather, then Cast to fp32)"}


def head_embedding(model: Any, ids: str) -> dict[str, Any] | None:
    """Rewrite ``model`` in place where its lookup of ``ids`` reads the LM head's weight of a tied model and
    :func:`.custom_ops.use_kernels` packed that head: the lookup becomes ``edgeinfer.EmbedF16`` or ``EmbedW8`` over
    the head's packed weights, and the fp32 table is dropped. The builder writes a tied model's lookup over a
    ``Transpose`` of the head's fp32 weight. The facts for the conversion's stamp, or None (the graph left as it is)
    for any other lookup."""
    from onnx import TensorProto, helper

    from .custom_ops import DOMAIN

    found = _lookup(model, ids)
    g = model.graph
    int64 = any(i.name == ids and i.type.tensor_type.elem_type == TensorProto.INT64 for i in g.input)
    if found is None or not int64:
        return None
    gather, source, transpose, table = found
    head = None if transpose is None else next(
        (n for n in g.node if n.domain == DOMAIN and n.op_type in EMBED and len(n.input) > 1
         and n.input[1] == f"{source.name}/{n.op_type}"), None)
    if head is None:
        return None
    op = EMBED[head.op_type]
    vocab, width = table.shape
    attrs = {"n": vocab, "k": width}
    if op == "EmbedW8":
        block = next((b for b in (_attribute(head, "block"), 32) if width % b == 0), 0)
        if not block:
            return None
        if block != _attribute(head, "block"):  # the head in the blocks quantize_embedding gives the table
            _repack_w8(model, head, table.T, block)
        attrs["block"] = block
    lookup = helper.make_node(op, [ids, *head.input[1:]], list(gather.output), name=f"{gather.name}{op}",
                              domain=DOMAIN, **attrs)
    _replace(model, found, [], [lookup])
    blocks = f", int8 in blocks of {attrs['block']}" if op == "EmbedW8" else ""
    return {"embedding": f"the LM head's weights, read by {DOMAIN}.{op} (tied: one table{blocks})"}


def _attribute(node: Any, name: str) -> int:
    return next(a.i for a in node.attribute if a.name == name)


def _repack_w8(model: Any, head: Any, w: Any, block: int) -> None:
    """``head`` (a MatMulW8) over ``w`` packed again in blocks of ``block``."""
    from onnx import helper, numpy_helper

    from .custom_ops import pack_w8

    packed = dict(zip(head.input[1:], pack_w8(w, block)))
    for t in model.graph.initializer:
        if t.name in packed:
            t.CopyFrom(numpy_helper.from_array(packed[t.name], t.name))
    kept = [a for a in head.attribute if a.name != "block"]
    del head.attribute[:]
    head.attribute.extend([*kept, helper.make_attribute("block", block)])
