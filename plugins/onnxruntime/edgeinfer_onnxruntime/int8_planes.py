"""w8a16 on onnxruntime's fast kernels: each 8-bit ``MatMulNBits`` with fp32 activations rewritten as two exact
4-bit ones.

On x86, onnxruntime 1.26 has no 8-bit kernel for fp32 activations (accuracy level 1): it dequantizes the whole
weight at every call and runs an fp32 GEMM (a 1024 x 2816 weight took 5.5-8.3 ms at one row, the same at 16 rows),
while its 4-bit kernel with fp32 activations took 0.10 ms. A signed int8 weight ``v`` (-128..127) is
``16 * h + l`` with ``l = v mod 16`` (0..15) and ``h = (v - l) / 16`` (-8..7), both exact 4-bit values; with the
block's scale ``s``, ``x @ (v * s) = x @ (h * 16 s) + x @ (l * s)``: a high plane (zero point 8, scale 16 s) and
a low plane (zero point 0, scale s), added. Weights and activations stay what w8a16 says (int8 per block, fp32),
the two sums differ from one dequantized GEMM only in fp32 rounding (relative error ~2e-7 on random weights).
On the peer bench's random Qwen3 (188 M) a one-thread decode step took 376 ms before and 39.7 ms after, the same
greedy tokens (docs/generation.md, bench/README.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np

DOMAIN = "com.microsoft"


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _pack4(q: np.ndarray) -> np.ndarray:
    """``[N, blocks, block]`` values 0..15 as MatMulNBits' 4-bit blobs ``[N, blocks, block / 2]`` (element
    ``2i`` in the low nibble of byte ``i``)."""
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def split_planes(model: Any) -> int:
    """Rewrite, in place, every 8-bit ``MatMulNBits`` of ``model`` with fp32 activations (accuracy level < 4) and
    no zero points, ``g_idx`` or bias into two 4-bit ones and an ``Add``; the 8-bit initializers go where nothing
    else reads them. Returns the number of nodes rewritten."""
    from onnx import helper, numpy_helper

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    readers: dict[str, int] = {}
    for n in graph.node:
        for name in n.input:
            readers[name] = readers.get(name, 0) + 1
    nodes, added, freed, done = [], [], set(), 0
    for n in graph.node:
        a = _attrs(n) if n.op_type == "MatMulNBits" and n.domain == DOMAIN else {}
        if (a.get("bits") != 8 or a.get("accuracy_level", 0) >= 4 or len(n.input) != 3
                or n.input[1] not in inits or n.input[2] not in inits):
            nodes.append(n)
            continue
        k, rows, block = a["K"], a["N"], a["block_size"]
        blocks = -(-k // block)
        v = numpy_helper.to_array(inits[n.input[1]]).reshape(rows, blocks, block).astype(np.int16) - 128
        scales = numpy_helper.to_array(inits[n.input[2]]).astype(np.float32).reshape(rows, blocks)
        low = np.mod(v, 16)
        high = (v - low) // 16 + 8  # stored with the default zero point 8
        out = n.output[0]
        planes = {"hi": (_pack4(high.astype(np.uint8)), scales * 16, []),
                  "lo": (_pack4(low.astype(np.uint8)), scales, [np.zeros((rows, -(-blocks // 2)), np.uint8)])}
        for tag, (blob, scale, zp) in planes.items():
            names = [f"{n.input[1]}_{tag}", f"{n.input[2]}_{tag}"] + ([f"{n.input[1]}_{tag}_zp"] if zp else [])
            added += [numpy_helper.from_array(arr, name) for arr, name in zip([blob, scale.reshape(-1), *zp], names)]
            nodes.append(helper.make_node("MatMulNBits", [n.input[0], *names], [f"{out}_{tag}"],
                                          name=f"{n.name}_{tag}", domain=DOMAIN, K=k, N=rows, bits=4,
                                          block_size=block, accuracy_level=a.get("accuracy_level", 0)))
        nodes.append(helper.make_node("Add", [f"{out}_hi", f"{out}_lo"], [out], name=f"{n.name}_planes"))
        for name in n.input[1:]:
            readers[name] -= 1
            if not readers[name]:
                freed.add(name)
        done += 1
    kept = [t for t in graph.initializer if t.name not in freed]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept + added)
    return done
