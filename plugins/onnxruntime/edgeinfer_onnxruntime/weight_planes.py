"""The host fp16 class on onnxruntime: each weight as two int8 planes on the int8 kernel, not as fp32.

onnxruntime 1.26 has no x86 kernel for fp16 weights: an fp16 graph's MatMuls run through Casts folded into fp32
initializers, so fp16 weights were held, and read at every token, at fp32's size. Here each of the fp32 graph's
8-bit ``MatMulNBits`` (the quantizer's int8 ``hi``: per block of 128, scale ``max|W| / 127``) gets a second node
over the weight's *residual* ``lo = W - hi``, quantized the same way (its scale at most ``1/254`` of ``hi``'s), and
the two outputs are added: ``x @ W = x @ hi + x @ lo`` to within ``1/64516`` of each block's largest weight, where
fp16 rounds each weight to ``1/2048`` of itself. ``hi`` runs over its input's two int8 digits (:mod:`.int8_digits`,
w8a16's path); ``lo`` over the input's high digit only, which is what the int8 kernel makes of the input itself
(accuracy level 4: it quantizes each block to ``max|x| / 127``): the low digit's share of ``x @ lo`` is below
``1/254`` of ``1/254`` of the product, so three int8 products instead of four. Held as the kernel packs it: 8.5
bits a plane (a float scale and block sum per 128), 17 a weight, against fp32's 32 (docs/generation.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .int8_digits import DOMAIN, INT8_LEVEL

ZERO = 128  # MatMulNBits' default zero point for 8 bits without a zero-point input


def residual(w: np.ndarray, hi: np.ndarray, scales: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """The int8 plane of ``w`` ([K, N], fp32) minus the dequantized ``hi`` (MatMulNBits' 8-bit layout: uint8
    ``[N, blocks, block]`` around 128, fp32 ``scales`` ``[N * blocks]``), in that same layout."""
    k, n = w.shape
    blocks = -(-k // block)
    padded = np.zeros((blocks * block, n), np.float32)
    padded[:k] = w
    held = (hi.reshape(n, blocks, block).astype(np.float32) - ZERO) * scales.reshape(n, blocks, 1)
    rest = padded.T.reshape(n, blocks, block) - held
    rest.reshape(n, -1)[:, k:] = 0  # the quantizer's padding need not be 128: those rows meet zero activations
    s = np.abs(rest).max(axis=2, keepdims=True) / 127
    s[s == 0] = 1.0
    q = np.clip(np.rint(rest / s), -127, 127) + ZERO
    return q.astype(np.uint8), s.reshape(-1).astype(np.float32)


def add_low_planes(model: Any, floats: dict[str, np.ndarray]) -> int:
    """Give every 8-bit ``MatMulNBits`` of ``model`` whose fp32 weight is in ``floats`` (by the quantizer's input
    name, before its ``_Q8`` suffix) a second node over the weight's residual plane, and add the two outputs.
    Run before :func:`.int8_digits.split_digits`, which then splits the first node's input. Returns the number of
    nodes given a plane."""
    from onnx import helper, numpy_helper

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    nodes, added = [], 0
    for n in graph.node:
        w = floats.get(n.input[1].removesuffix("_Q8")) if n.op_type == "MatMulNBits" else None
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute} if w is not None else {}
        if w is None or n.domain != DOMAIN or attrs.get("bits") != 8 or len(n.input) != 3:
            nodes.append(n)
            continue
        lo, lo_scales = residual(w, numpy_helper.to_array(inits[n.input[1]]),
                                 numpy_helper.to_array(inits[n.input[2]]), attrs["block_size"])
        name, out = f"{n.input[1]}_lo", n.output[0]
        graph.initializer.extend([numpy_helper.from_array(lo, name),
                                  numpy_helper.from_array(lo_scales, f"{name}_scales")])
        n.output[0] = f"{out}_hi"
        low = helper.make_node("MatMulNBits", [n.input[0], name, f"{name}_scales"], [f"{out}_lo"],
                               name=f"{n.name}_lo", domain=DOMAIN, **{**attrs, "accuracy_level": INT8_LEVEL})
        nodes += [n, low, helper.make_node("Add", [f"{out}_hi", f"{out}_lo"], [out], name=f"{n.name}_planes")]
        added += 1
    del graph.node[:]
    graph.node.extend(nodes)
    return added
