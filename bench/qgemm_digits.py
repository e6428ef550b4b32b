"""A prototype for host w8a16 on onnxruntime's QGEMM (``MatMulInteger``, uint8 × int8) instead of ``MatMulNBits``.

w8a16 runs each 8-bit ``MatMulNBits`` on its int8 kernel (accuracy level 4, MLAS's ``SQNBitGemm`` CompInt8) over two
int8 digits of its input (plugins/onnxruntime/edgeinfer_onnxruntime/int8_digits.py). Measured alone on one thread,
that kernel spends ~28 µs a row on a 1024 × 2816 weight from 8 rows up, where MLAS's QGEMM behind
``MatMulInteger`` (uint8 activations, int8 weights, prepacked) spends ~13.5: at 16 rows (32 digit rows) a decode
step is compute-bound, so the kernel decides it. QGEMM takes one scale per row of its input and per column of its
weight, not per block of 128, so here each weight is int8 per output column (TensorRT-LLM's int8 weight-only
layout) and each input row is split into two digits with the row's scale ``s = max|x| / 127``: ``d1 = round(x / s)``
and ``d2 = round(254 (x / s - d1))``, so ``x = s (d1 + d2 / 254)`` to within ``s / 508``. Both digits go through one
``com.microsoft.MatMulIntegerToFloat`` call (stacked on the sequence axis, zero point 128, the weight's column
scales), and ``s (P1 + P2 / 254)`` adds the halves (a ``[1, 1/254]`` ``MatMul``, as w8a16's sum). Every MatMul of
the fp32 graph, LM head included, is rewritten; the graph's inputs are rank 3.

On the peer bench's random Qwen3 (188 M parameters), onnxruntime, one thread, against the plugin's fp32 and w8a16
graphs: a decode step at 1 and 16 rows (past 64, best of 3), peak RSS in its own process and the last position's
logits against fp32's (``fp16_planes.py``'s measures). Writes ``results/qgemm_digits.json``. Not a scheme: nothing in
edgeinfer builds this graph.

    python bench/qgemm_digits.py
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from _common import arguments, onnxruntime_decoder, write
from fp16_planes import CTX, measure, peer_model

MS = "com.microsoft"


def qgemm_graph(fp32_dir: Path, out: Path) -> Path:
    """``fp32_dir``'s graph with every fp32 ``MatMul`` as per-column int8 weights times its input's two per-row
    digits through ``MatMulIntegerToFloat``; written to ``out`` (the other files copied)."""
    import onnx
    from edgeinfer_onnxruntime.weights import save
    from onnx import TensorProto, helper, numpy_helper

    if (out / "model.onnx").is_file():
        return out
    shutil.copytree(fp32_dir, out, dirs_exist_ok=True)
    model = onnx.load(str(out / "model.onnx"))
    if not any(o.domain == MS for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS, 1))
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    consts = {"qg_127th": np.array(1 / 127, np.float32), "qg_tiny": np.array(1e-30, np.float32),
              "qg_254": np.array(254, np.float32), "qg_128": np.array(128, np.float32),
              "qg_zero": np.array(128, np.uint8), "qg_one": np.array(1, np.float32),
              "qg_last": np.array([-1], np.int64), "qg_halves": np.array([0, 2, -1], np.int64),
              "qg_sum": np.array([[1, 1 / 254]], np.float32)}
    nodes, split, replaced = [], {}, set()
    for n in g.node:
        w = inits.get(n.input[1]) if n.op_type == "MatMul" and len(n.input) == 2 else None
        if w is None or w.data_type != TensorProto.FLOAT or len(w.dims) != 2:
            nodes.append(n)
            continue
        weight = numpy_helper.to_array(w)
        scale = np.abs(weight).max(axis=0) / 127
        scale[scale == 0] = 1
        name = f"{n.input[1]}_int8"
        consts[name] = np.clip(np.rint(weight / scale), -127, 127).astype(np.int8)
        consts[f"{name}_scales"] = scale.astype(np.float32)
        consts[f"qg_rows_of_{weight.shape[1]}"] = np.array([0, -1, weight.shape[1]], np.int64)
        replaced.add(n.input[1])
        x = n.input[0]
        if x not in split:
            p = split[x] = f"{x}_qg"
            step = [("Abs", [x], "abs", {}), ("ReduceMax", [f"{p}_abs", "qg_last"], "max", {"keepdims": 1}),
                    ("Max", [f"{p}_max", "qg_tiny"], "nz", {}), ("Mul", [f"{p}_nz", "qg_127th"], "s", {}),
                    ("Div", [x, f"{p}_s"], "u", {}), ("Round", [f"{p}_u"], "d1", {}),
                    ("Sub", [f"{p}_u", f"{p}_d1"], "r", {}), ("Mul", [f"{p}_r", "qg_254"], "r254", {}),
                    ("Round", [f"{p}_r254"], "d2", {}), ("Concat", [f"{p}_d1", f"{p}_d2"], "d", {"axis": 1}),
                    ("Add", [f"{p}_d", "qg_128"], "d128", {}),
                    ("Cast", [f"{p}_d128"], "a", {"to": TensorProto.UINT8})]
            nodes += [helper.make_node(op, ins, [f"{p}_{o}"], name=f"{p}_{o}", **kw) for op, ins, o, kw in step]
        p, o = split[x], n.output[0]
        nodes += [helper.make_node("MatMulIntegerToFloat", [f"{p}_a", name, "qg_one", f"{name}_scales", "qg_zero"],
                                   [f"{o}_f"], name=f"{o}_qgemm", domain=MS),
                  helper.make_node("Reshape", [f"{o}_f", "qg_halves"], [f"{o}_h"], name=f"{o}_h"),
                  helper.make_node("MatMul", ["qg_sum", f"{o}_h"], [f"{o}_sum"], name=f"{o}_sum"),
                  helper.make_node("Reshape", [f"{o}_sum", f"qg_rows_of_{weight.shape[1]}"], [f"{o}_y"],
                                   name=f"{o}_y"),
                  helper.make_node("Mul", [f"{o}_y", f"{p}_s"], [o], name=f"{o}_scaled")]
    del g.node[:]
    g.node.extend(nodes)
    read = {i for n in nodes for i in n.input}  # a tied LM head's weight still feeds the embedding's lookup
    kept = [t for t in g.initializer if t.name not in replaced or t.name in read]
    del g.initializer[:]
    g.initializer.extend([*kept, *(numpy_helper.from_array(v, k) for k, v in consts.items())])
    save(model, out / "model.onnx")
    return out


def main() -> None:
    arguments(__doc__).parse_args()
    model = peer_model()
    dirs = {s: onnxruntime_decoder("fp16_planes", model.name, model, s, CTX) for s in ("fp32", "w8a16")}
    dirs["qgemm"] = qgemm_graph(dirs["fp32"], dirs["fp32"].with_name(dirs["fp32"].name + "-qgemm"))
    result = {"model": model.name, **measure(dirs)}
    print(json.dumps(result, indent=1))
    write("qgemm_digits", result)


if __name__ == "__main__":
    main()
