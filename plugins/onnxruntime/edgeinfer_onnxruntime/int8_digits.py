"""w8a16 on onnxruntime's int8 kernel: each 8-bit ``MatMulNBits`` with fp32 activations computes its input as two
int8 digits.

On x86, onnxruntime 1.26 has no fast kernel for 8-bit weights with fp32 activations (accuracy level 1: it
dequantizes the whole weight at every call, a 1024 x 2816 weight 10-12 ms at one row), while its int8 kernel
(accuracy level 4, w8a8's) takes 0.17 ms: it quantizes each block of ``block_size`` activations to int8 with the
scale ``max|x| / 127`` and multiplies in integers. Here each such node's input ``x`` is split, per block of the
same size, into a high digit ``q = round(x / s) * s`` with ``s = max|x| / 127`` and the remainder ``r = x - q``;
``x @ W = q @ W + r @ W``, both through the int8 kernel in one call (concatenated on the first axis); the two
halves of its output are added by a ``MatMul`` with ``[1, 1]`` over them seen as ``[2, -1]``: for 16 rows of 5632,
21 µs, where ``Split`` + ``Add`` took 40 (and held a copy of both halves) and ``ReduceSum`` 309.
The kernel requantizes ``q`` exactly (its block maximum is ``127 s``: every value is on its grid), so only ``r``'s
own int8 rounding is lost: at most ``max|x| / (2 * 127 * 2 * 127)`` per block, ~1/64516 of the block's largest
value, against fp16's 1/2048 of each value (on random inputs 7.3e-5 of the output's range, fp16 activations
2.2e-4, one int8 digit 1.6e-2). The weights stay the int8 the quantizer wrote, held once (the int8 kernel's
packed copy, as w8a8's). Inputs shared by several nodes (q/k/v, gate/up) are split once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

DOMAIN = "com.microsoft"
INT8_LEVEL = 4  # MatMulNBits accuracy_level: int8 activations, quantized per block inside the kernel


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _split(x: str, k: int, block: int, opset: int, consts: dict[str, np.ndarray]) -> tuple[str, list[Any]]:
    """Nodes that concatenate ``x``'s two digits on its first axis (``[2 * x.shape[0], ...]``), padding its last
    axis ``k`` to whole blocks for the blocks' maxima (the kernel's last block is padded with zeros too).
    Returns the concatenated name and the nodes."""
    from onnx import helper

    blocks = -(-k // block)
    pad = blocks * block - k
    p = f"{x}_digits"
    rows_of = {n: f"digits_rows_of_{n}" for n in ((k, block, blocks * block) if pad else (block,))}
    consts.update({name: np.array([-1, n], np.int64) for n, name in rows_of.items()})  # Reshape to [-1, n]
    consts.update({"digits_axis0": np.array([0], np.int64), "digits_last": np.array([-1], np.int64),
                   "digits_127th": np.array(1 / 127, np.float32), "digits_tiny": np.array(1e-30, np.float32)})
    nodes = [helper.make_node("Shape", [x], [f"{p}_shape"], name=f"{p}_shape")]
    rows = x  # without padding, one Reshape to blocks: every node costs a few µs at one row
    if pad:
        consts[f"{p}_pads"] = np.array([0, 0, 0, pad], np.int64)
        nodes += [helper.make_node("Reshape", [x, rows_of[k]], [f"{p}_rows"], name=f"{p}_rows"),
                  helper.make_node("Pad", [f"{p}_rows", f"{p}_pads"], [f"{p}_padded"], name=f"{p}_pad")]
        rows = f"{p}_padded"
    nodes += [helper.make_node("Reshape", [rows, rows_of[block]], [f"{p}_b"], name=f"{p}_b"),
              helper.make_node("Abs", [f"{p}_b"], [f"{p}_abs"], name=f"{p}_abs"),
              helper.make_node("ReduceMax", [f"{p}_abs", "digits_last"], [f"{p}_max"], name=f"{p}_max", keepdims=1)
              if opset >= 18 else  # axes became an input in opset 18
              helper.make_node("ReduceMax", [f"{p}_abs"], [f"{p}_max"], name=f"{p}_max", keepdims=1, axes=[-1]),
              helper.make_node("Max", [f"{p}_max", "digits_tiny"], [f"{p}_nz"], name=f"{p}_nz"),
              helper.make_node("Mul", [f"{p}_nz", "digits_127th"], [f"{p}_s"], name=f"{p}_s"),
              helper.make_node("Div", [f"{p}_b", f"{p}_s"], [f"{p}_u"], name=f"{p}_u"),
              helper.make_node("Round", [f"{p}_u"], [f"{p}_r"], name=f"{p}_r"),
              helper.make_node("Mul", [f"{p}_r", f"{p}_s"], [f"{p}_qb"], name=f"{p}_qb")]
    q = f"{p}_qb"
    if pad:
        consts[f"{p}_ends"] = np.array([k], np.int64)
        nodes += [helper.make_node("Reshape", [q, rows_of[blocks * block]], [f"{p}_qw"], name=f"{p}_qw"),
                  helper.make_node("Slice", [f"{p}_qw", "digits_axis0", f"{p}_ends", "digits_last"], [f"{p}_qs"],
                                   name=f"{p}_qs")]
        q = f"{p}_qs"
    nodes += [helper.make_node("Reshape", [q, f"{p}_shape"], [f"{p}_q"], name=f"{p}_q"),
              helper.make_node("Sub", [x, f"{p}_q"], [f"{p}_rest"], name=f"{p}_rest"),
              helper.make_node("Concat", [f"{p}_q", f"{p}_rest"], [p], name=p, axis=0),
              # the products' shape: x's leading axes, then whatever the node's output width is
              helper.make_node("Slice", [f"{p}_shape", "digits_axis0", "digits_last"], [f"{p}_lead"],
                               name=f"{p}_lead"),
              helper.make_node("Concat", [f"{p}_lead", "digits_last"], [f"{p}_out_shape"], name=f"{p}_out_shape",
                               axis=0)]
    return p, nodes


def _halves_added(digits: str, out: str, out_shape: str, consts: dict[str, np.ndarray]) -> list[Any]:
    """``out`` (of shape ``out_shape``) = the first half of ``digits`` on its first axis (the high digit's
    product) + the second: ``[1, 1] @ digits`` seen as ``[2, -1]``, exact as an ``Add`` (1·a + 1·b)."""
    from onnx import helper

    consts.update({"digits_two_rows": np.array([2, -1], np.int64), "digits_ones": np.ones((1, 2), np.float32)})
    return [helper.make_node("Reshape", [digits, "digits_two_rows"], [f"{out}_halves"], name=f"{out}_halves"),
            helper.make_node("MatMul", ["digits_ones", f"{out}_halves"], [f"{out}_sum"], name=f"{out}_digits_sum"),
            helper.make_node("Reshape", [f"{out}_sum", out_shape], [out], name=f"{out}_digits_out")]


def split_digits(model: Any) -> int:
    """Rewrite, in place, every 8-bit ``MatMulNBits`` of ``model`` with fp32 activations (accuracy level < 4) to
    run on the int8 kernel over its input's two digits, whose two products are added. Returns the number of nodes
    rewritten."""
    from onnx import helper, numpy_helper

    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 13:  # the nodes below are written for opsets 13 and later (tests: 17 and 21)
        raise ValueError(f"the graph's opset {opset} is older than 13: re-export it with a newer one")
    nodes, consts, digits, done = [], {}, {}, 0
    for n in graph.node:
        a = _attrs(n) if n.op_type == "MatMulNBits" and n.domain == DOMAIN else {}
        if a.get("bits") != 8 or a.get("accuracy_level", 0) >= INT8_LEVEL:
            nodes.append(n)
            continue
        key = (n.input[0], a["K"], a["block_size"])
        if key not in digits:
            digits[key], split = _split(*key, opset, consts)
            nodes += split
        out = n.output[0]
        new = helper.make_node("MatMulNBits", [digits[key], *n.input[1:]], [f"{out}_digits"], name=n.name,
                               domain=DOMAIN, **{**a, "accuracy_level": INT8_LEVEL})
        nodes += [new, *_halves_added(f"{out}_digits", out, f"{digits[key]}_out_shape", consts)]
        done += 1
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items())
    return done
