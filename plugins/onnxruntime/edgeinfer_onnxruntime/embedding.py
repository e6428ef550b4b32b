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
reads the head's packed weights instead (``edgeinfer.EmbedF16`` / ``EmbedW8`` / ``EmbedW4``, kernels/embedding.c):
the table is held once, as llama.cpp holds ``token_embd`` once (:func:`head_embedding`). For int4 that is the
class llama.cpp's Q4_0 looks its tokens up in: the head's int4 rows, not an int8 table.
"""

from __future__ import annotations

from typing import Any

BITS = 8
EMBED = {"MatMulF16": "EmbedF16", "MatMulW8": "EmbedW8", "MatMulW4": "EmbedW4"}  # a tied head's own op -> its lookup
SAMPLE = 256  # rows of a table checked against an int4 head (:func:`_int4_head`)


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
    :func:`.custom_ops.use_kernels` packed that head: the lookup becomes ``edgeinfer.EmbedF16``, ``EmbedW8`` or
    ``EmbedW4`` over the head's packed weights, and the fp32 table is dropped. The builder writes a tied model's
    lookup over a ``Transpose`` of the head's fp32 weight (fp16, w8a16), or, where it quantized the head to int4,
    over a table of its own whose int4 the head holds (:func:`_int4_head`). The facts for the conversion's stamp, or
    None (the graph left as it is) for any other lookup."""
    from onnx import TensorProto, helper

    from .custom_ops import DOMAIN

    found = _lookup(model, ids)
    g = model.graph
    int64 = any(i.name == ids and i.type.tensor_type.elem_type == TensorProto.INT64 for i in g.input)
    if found is None or not int64:
        return None
    gather, source, transpose, table = found
    if transpose is None:
        head = _int4_head(model, table)
    else:
        head = next((n for n in g.node if n.domain == DOMAIN and n.op_type in ("MatMulF16", "MatMulW8")
                     and len(n.input) > 1 and n.input[1] == f"{source.name}/{n.op_type}"), None)
    if head is None:
        return None
    op = EMBED[head.op_type]
    vocab, width = table.shape
    attrs = {"n": vocab, "k": width}
    if op == "EmbedW4":
        attrs["block"] = _attribute(head, "block")
    elif op == "EmbedW8":
        block = next((b for b in (_attribute(head, "block"), 32) if width % b == 0), 0)
        if not block:
            return None
        if block != _attribute(head, "block"):  # the head in the blocks quantize_embedding gives the table
            _repack_w8(model, head, table.T, block)
        attrs["block"] = block
    lookup = helper.make_node(op, [ids, *head.input[1:]], list(gather.output), name=f"{gather.name}{op}",
                              domain=DOMAIN, **attrs)
    _replace(model, found, [], [lookup])
    bits = {"EmbedW8": "int8", "EmbedW4": "int4"}.get(op)
    blocks = f", {bits} in blocks of {attrs['block']}" if bits else ""
    return {"embedding": f"the LM head's weights, read by {DOMAIN}.{op} (tied: one table{blocks})"}


def _int4_head(model: Any, table: Any) -> Any:
    """The ``edgeinfer.MatMulW4`` node whose weights are ``table``'s int4 ([vocab, width]: the head of a tied model
    the builder quantized to int4), or None. :data:`SAMPLE` rows spread over the vocabulary must each lie within
    one scale of the head's column (half of one rounding to the nearest level, one where +8 was clipped to +7; the
    head's fp16 scales add a part in 2^11 of a scale for each of the 8 levels)."""
    import numpy as np
    from onnx import numpy_helper

    from .custom_ops import DOMAIN, PANEL

    vocab, width = table.shape
    inits = {t.name: t for t in model.graph.initializer}
    rows = np.unique(np.linspace(0, vocab - 1, min(SAMPLE, vocab)).astype(np.int64))
    for n in model.graph.node:
        if (n.domain != DOMAIN or n.op_type != "MatMulW4" or _attribute(n, "n") != vocab
                or not all(i in inits for i in n.input[1:3])):
            continue
        packed, scales = (numpy_helper.to_array(inits[i]) for i in n.input[1:3])
        block = _attribute(n, "block")
        if packed.shape[1] * 2 != -(-width // 4) * 4 or scales.shape[1] != -(-width // block):
            continue
        # the kernel's reading (kernels/embedding.c): column c of panel p, quad row q's bytes 4 (c % 16) + r
        p, c = rows // PANEL, rows % PANEL
        quads = packed[p].reshape(len(rows), -1, 16, 4)[np.arange(len(rows)), :, c % 16]  # [rows, K4 / 4, 4]
        u = (quads >> np.where(c < 16, 0, 4)[:, None, None]) & 15
        s = np.repeat(scales[p, :, c].astype(np.float64), block, axis=1)[:, :width]  # signed: largest |w| = -8 s
        if np.all(np.abs((u.reshape(len(rows), -1)[:, :width] - 8.0) * s - table[rows]) <= np.abs(s) * 1.01):
            return n
    return None


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
