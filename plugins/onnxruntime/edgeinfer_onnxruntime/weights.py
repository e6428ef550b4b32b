"""The builder's fp32 decoder graph with int8 weights (:func:`quantize_int8`: w8a8, w8a16, and the host fp16
class as two int8 planes), and :func:`save`, which writes a graph back with its weights in the builder's one
external file."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from edgeinfer.errors import ModelError

from .int8_digits import split_digits
from .weight_planes import add_low_planes

PAGE = 4096  # onnxruntime maps a tensor of external data whose offset is page-aligned (4 KiB on Linux)
HUGE = 2 << 20  # one 2 MiB page-table entry maps a 2 MiB-aligned stretch of the file (pages.read_whole)
INLINE_BELOW = 1024  # bytes: smaller tensors stay in the graph file, as onnx.save_model's size_threshold


def data_path(graph: Path) -> Path:
    """The one external weights file of ``graph`` (``<graph>.data``, as the builder names it)."""
    return graph.with_name(graph.name + ".data")


def save(model: Any, graph: Path) -> None:
    """``model`` over ``graph``, its weights in the one external file the builder wrote (``<graph>.data``).

    Each tensor starts on a 4 KiB page, so that onnxruntime maps it from the file rather than copying it; one of
    2 MiB or more starts on a 2 MiB boundary where that costs at most an eighth of its size in padding: only a
    mapping's 2 MiB-aligned stretches can be mapped on 2 MiB pages, and the own ops read their weights straight
    from that mapping (docs/generation.md, "Weights on 2 MiB pages")."""
    import onnx
    from onnx.external_data_helper import set_external_data

    data = data_path(graph)
    data.unlink(missing_ok=True)
    at = 0
    with data.open("wb") as f:
        for t in model.graph.initializer:
            if not t.HasField("raw_data") or len(t.raw_data) < INLINE_BELOW:
                continue
            n = len(t.raw_data)
            pad = -at % HUGE if n >= HUGE and -at % HUGE <= n // 8 else -at % PAGE
            f.write(b"\0" * pad)
            at += pad
            set_external_data(t, data.name, offset=at, length=n)
            f.write(t.raw_data)
            at += n
            t.ClearField("raw_data")
            t.data_location = onnx.TensorProto.EXTERNAL
    onnx.save_model(model, str(graph))


def quantize_int8(graph: Path, block: int, activations_int8: bool, low_planes: bool = False) -> None:
    """int8 weights in place: the builder has no int8 precision (int4, bf16, fp16, fp32 in 0.14.1), so its
    fp32 graph's MatMuls become ``MatMulNBits`` with ``bits=8`` by onnxruntime's own quantizer
    (``onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer``, 2/4/8 bits), symmetric per
    block. Activations fp32 (accuracy_level 1, w8a16) or quantized to int8 per block inside the kernel
    (accuracy_level 4, w8a8). onnxruntime 1.26 has no fast x86 kernel for 8 bits with fp32 activations (it
    dequantizes the whole weight at every call), so w8a16's nodes then run on the int8 kernel over their input's
    two int8 digits (:mod:`.int8_digits`; docs/generation.md). ``low_planes`` (the host fp16 class, fp32
    activations): each weight's residual as a second int8 plane (:mod:`.weight_planes`)."""
    import onnx
    from onnx import numpy_helper
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = onnx.load(str(graph))
    floats = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer
              if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 2} if low_planes else {}
    q = MatMulNBitsQuantizer(model, bits=8, block_size=block, is_symmetric=True,
                             accuracy_level=4 if activations_int8 else 1)
    log = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")  # one INFO line per node
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        q.process()
    finally:
        log.setLevel(level)
    if low_planes:
        kernels = sum(n.op_type == "MatMulNBits" for n in q.model.model.graph.node)
        if add_low_planes(q.model.model, floats) != kernels:  # a weight left at int8 would pass for fp16
            raise ModelError(f"{graph.name}: not every quantized MatMul's fp32 weight was found for its second "
                             "plane", "deploy another scheme (fp32, w8a16), or report the model")
    if not activations_int8:
        split_digits(q.model.model)
    q.model.topological_sort()
    save(q.model.model, graph)
