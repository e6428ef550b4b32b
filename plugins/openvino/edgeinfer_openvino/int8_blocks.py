"""INT8 weights in blocks of the input dimension, written into an OpenVINO IR.

NNCF's INT8 modes scale each output channel as a whole and refuse a ``group_size`` ("INT8 modes
require per-channel quantization"); llama.cpp's Q8_0 and the host's w8a16 scale blocks of 32 / 128
weights, which rounds closer. This writes the block form as the same decompression subgraph NNCF
writes for its grouped INT4 (``u8 [N, K/G, G] -> Convert f16 -> Subtract zero point -> Multiply
scale -> Reshape [N, K] -> Convert f32``), which the CPU plugin fuses into its compressed
FullyConnected and Gather kernels (the weights stay 8-bit in memory; docs/openvino.md). numpy is imported
where arrays are made: ``edgeinfer plan`` imports this module (the backend's defaults) and no numpy.

Asymmetric: a block's scale is ``(max - min) / 255`` and its zero point ``round(-min / scale)``, over the
block's range widened to hold 0 (so that 0 is exact). Blocks of 256 by default: the CPU plugin's one-row kernel
reads them faster than blocks of 128 (a token of the peer bench's model 13.86 against 14.95 ms) and deploy's
golden check still passes there, where blocks of 512 and symmetric ones (as Q8_0) of 128 or 256 did not
(docs/openvino.md, "w8a16 in blocks"; bench/openvino_int8_forms.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgeinfer.contract import helpers

if TYPE_CHECKING:
    import numpy as np

BLOCK = 256
MIN_BLOCK = 32  # a block halved to divide a row stops here; below it the row is one block
METHOD = "int8 blocks (edgeinfer)"  # the facts' weight_compression.method of an IR written here


def compress(model: Any, block: int = BLOCK) -> dict[str, Any]:
    """Replace each fp32 2-D weight of ``model``'s MatMuls (``transpose_b``) and embedding Gathers by its
    blocked INT8 form, in place (:func:`row_block`); return what was done, for the bundle's facts."""
    import numpy as np
    from openvino import Type
    from openvino import opset13 as ops

    count = rows = smaller = 0
    for node in model.get_ordered_ops():
        if not _eligible(node):
            continue
        w = node.get_data().astype(np.float32)
        n, k = w.shape
        size = row_block(k, block)
        q, scale, zero = quantize(w, size)
        deq = ops.subtract(ops.convert(ops.constant(q), Type.f16), ops.convert(ops.constant(zero), Type.f16))
        deq = ops.multiply(deq, ops.constant(scale))
        deq = ops.reshape(deq, ops.constant(np.array([n, k], dtype=np.int64)), special_zero=False)
        out = ops.convert(deq, Type.f32).output(0)
        for target in list(node.output(0).get_target_inputs()):
            target.replace_source_output(out)
        whole_row = size == k and k != block
        count, rows, smaller = count + 1, rows + whole_row, smaller + (not whole_row and size != block)
    return {"method": METHOD, "mode": "int8_asym", "group_size": block, "weights": count,
            "channel_wise": rows, "smaller_blocks": smaller}


def row_block(k: int, block: int) -> int:
    """The block a row of ``k`` weights is cut into: ``block``, halved while it does not divide ``k``, down to
    :data:`MIN_BLOCK`; else (or ``block`` -1) the whole row (:func:`edgeinfer.contract.helpers.row_block`)."""
    return helpers.row_block(k, block, MIN_BLOCK)


def quantize(w: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``w`` [N, K] as u8 [N, K/block, block] with fp16 scales and u8 zero points [N, K/block, 1] (the weights
    are rounded on the fp16 scale the IR holds)."""
    import numpy as np

    n, k = w.shape
    g = w.reshape(n, k // block, block)
    lo = np.minimum(g.min(axis=2, keepdims=True), 0.0)
    hi = np.maximum(g.max(axis=2, keepdims=True), 0.0)
    scale = ((hi - lo) / 255.0).astype(np.float16)
    scale[scale == 0] = 1.0  # an all-zero block (or one too small for fp16): its weights come back as 0
    zero = np.clip(np.round(-lo / scale), 0, 255)
    q = np.clip(np.round(g / scale.astype(np.float32)) + zero, 0, 255).astype(np.uint8)
    return q, scale, zero.astype(np.uint8)


def _eligible(node: Any) -> bool:
    from openvino import Type

    if node.get_type_name() != "Constant" or node.get_element_type() != Type.f32:
        return False
    shape = node.get_output_partial_shape(0)
    if not shape.is_static or shape.rank.get_length() != 2:
        return False
    targets = node.output(0).get_target_inputs()
    return bool(targets) and all(_weight_input(t) for t in targets)


def _weight_input(target: Any) -> bool:
    op = target.get_node()
    kind = op.get_type_name()
    if kind == "MatMul":
        return target.get_index() == 1 and bool(op.get_attributes().get("transpose_b"))
    if kind != "Gather" or target.get_index() != 0:
        return False
    import numpy as np

    axis = op.input_value(2).get_node()
    return axis.get_type_name() == "Constant" and int(np.asarray(axis.get_data()).reshape(-1)[0]) == 0
