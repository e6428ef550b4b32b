"""The builder's fp32 decoder graph with other weights: fp16 (:func:`to_fp16`) or int8 (:func:`quantize_int8`),
and :func:`save`, which writes a graph back with its weights in the builder's one external file."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from .int8_digits import split_digits
from .kv_cache import is_kv


def to_fp16(graph: Path, kv_dtype: str) -> None:
    """fp16 weights and compute in place, with fp32 ids, mask and logits where the step loop binds
    (``keep_io_types``; the builder's own fp16 precision would make the logits fp16 too); the KV cache and
    GroupQueryAttention fp16, or (``kv_dtype`` fp32) both kept fp32. Converter: onnxruntime.transformers.float16."""
    import onnx
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    model = onnx.load(str(graph))
    kept = [v.name for v in [*model.graph.input, *model.graph.output] if not is_kv(v.name)]
    model = convert_float_to_float16(model, keep_io_types=kept if kv_dtype == "fp16" else True,
                                     op_block_list=[*DEFAULT_OP_BLOCK_LIST,
                                                    *(["GroupQueryAttention"] if kv_dtype == "fp32" else [])])
    # the converter gives a shared fp16 initializer one identical Cast per blocked consumer (the layers' rotary
    # cos/sin caches; 1.26): onnxruntime refuses the duplicate names, and the first Cast serves them all
    seen: set[str] = set()
    nodes = []
    for n in model.graph.node:
        if not (n.output and n.output[0] in seen):
            nodes.append(n)
            seen.update(n.output)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    save(model, graph)


def save(model: Any, graph: Path) -> None:
    """``model`` over ``graph``, its weights in the one external file the builder wrote (``<graph>.data``)."""
    import onnx

    data = graph.with_name(graph.name + ".data")
    data.unlink(missing_ok=True)
    onnx.save_model(model, str(graph), save_as_external_data=True, all_tensors_to_one_file=True, location=data.name)


def quantize_int8(graph: Path, block: int, activations_int8: bool) -> None:
    """int8 weights in place: the builder has no int8 precision (int4, bf16, fp16, fp32 in 0.14.1), so its
    fp32 graph's MatMuls become ``MatMulNBits`` with ``bits=8`` by onnxruntime's own quantizer
    (``onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer``, 2/4/8 bits), symmetric per
    block. Activations fp32 (accuracy_level 1, w8a16) or quantized to int8 per block inside the kernel
    (accuracy_level 4, w8a8). onnxruntime 1.26 has no fast x86 kernel for 8 bits with fp32 activations (it
    dequantizes the whole weight at every call), so w8a16's nodes then run on the int8 kernel over their input's
    two int8 digits (:mod:`.int8_digits`; docs/generation.md)."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    q = MatMulNBitsQuantizer(onnx.load(str(graph)), bits=8, block_size=block, is_symmetric=True,
                             accuracy_level=4 if activations_int8 else 1)
    log = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")  # one INFO line per node
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        q.process()
    finally:
        log.setLevel(level)
    if not activations_int8:
        split_digits(q.model.model)
    q.model.topological_sort()
    save(q.model.model, graph)
