"""A prototype for the host fp16 class on onnxruntime: each weight as two int8 planes, not as fp32.

onnxruntime has no x86 kernel for fp16 weights, so ``deploy --board host --quant fp16`` runs them as fp32: twice
fp16's bytes in memory and per token (docs/generation.md). This measures an alternative before anyone builds it:
every 8-bit ``MatMulNBits`` of the w8a16 graph (the int8 kernel over two activation digits, int8_digits.py) also
gets the weight's int8 *residual*: ``W = hi + lo`` where ``hi`` is the quantizer's int8 (per block of 128, scale
``max|W|/127``) and ``lo`` the remainder quantized the same way (its scale at most ``1/254`` of ``hi``'s), so the
error is at most ``1/64516`` of each block's largest weight, where fp16 rounds each weight to ``1/2048`` of itself.
Both planes are one node: the weight ``[hi; lo]`` along K (2 K rows, 17 bits a weight with the scales) times the
input's digits concatenated with themselves along K (``x @ hi + x @ lo`` in one call).

Measured on the peer bench's random Qwen3 (188 M parameters, ``edgeinfer.testing.llm.random_qwen3``), onnxruntime,
one thread, against the graphs the plugin builds today for fp32, fp16 and w8a16 (``edgeinfer_onnxruntime.decoder
.convert``): a decode step at 1 and 16 rows (past 64, best of 3), each graph's peak RSS in its own process (load +
one 16-row step), and the last position's logits of a 24-token random prompt against the fp32 graph's (largest
difference over the logits' range, cosine, same argmax). Writes ``results/fp16_planes.json``. Not a scheme: nothing
in edgeinfer builds this graph.

    python bench/fp16_planes.py
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _common import arguments, onnxruntime_decoder, write

CTX = 256
BLOCK = 128
PAST = 64


def residual_plane(w: np.ndarray, hi: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The int8 plane (MatMulNBits' layout: uint8 ``[N, blocks, BLOCK]`` around 128, scales ``[N, blocks]``) of
    ``w`` ([K, N], fp32) minus the dequantized ``hi`` plane of the same layout."""
    k, n = w.shape
    blocks = k // BLOCK
    deq = (hi.reshape(n, blocks, BLOCK).astype(np.float32) - 128) * scales.reshape(n, blocks, 1)
    rest = w.T.reshape(n, blocks, BLOCK) - deq
    s = np.abs(rest).max(axis=2, keepdims=True) / 127
    s[s == 0] = 1.0
    q = np.clip(np.rint(rest / s), -127, 127) + 128
    return q.astype(np.uint8), s.reshape(n, blocks).astype(np.float32)


def planes_graph(fp32_dir: Path, out: Path) -> Path:
    """``fp32_dir``'s graph with every MatMul as one 8-bit MatMulNBits over ``[hi; lo]`` and the input's digits
    twice along K; written to ``out`` (the other files copied)."""
    import shutil

    import onnx
    from edgeinfer_onnxruntime.int8_digits import split_digits
    from edgeinfer_onnxruntime.weights import save
    from onnx import helper, numpy_helper
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    if (out / "model.onnx").is_file():
        return out
    shutil.copytree(fp32_dir, out, dirs_exist_ok=True)
    graph = out / "model.onnx"
    model = onnx.load(str(graph))
    floats = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer
              if t.data_type == onnx.TensorProto.FLOAT}
    q = MatMulNBitsQuantizer(model, bits=8, block_size=BLOCK, is_symmetric=True, accuracy_level=1)
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    q.process()
    m = q.model.model
    split_digits(m)
    inits = {t.name: t for t in m.graph.initializer}
    doubled: dict[str, str] = {}
    nodes = []
    for node in m.graph.node:
        if node.op_type != "MatMulNBits":
            nodes.append(node)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        w = floats[node.input[1].removesuffix("_Q8")]
        if attrs["K"] % BLOCK:
            raise SystemExit(f"{node.name}: K {attrs['K']} is not a whole number of {BLOCK}-blocks")
        hi = numpy_helper.to_array(inits[node.input[1]])
        scales = numpy_helper.to_array(inits[node.input[2]])
        lo, lo_scales = residual_plane(w, hi, scales)
        n, blocks = w.shape[1], attrs["K"] // BLOCK
        inits[node.input[1]].CopyFrom(numpy_helper.from_array(
            np.concatenate([hi.reshape(n, blocks, BLOCK), lo], axis=1), node.input[1]))
        inits[node.input[2]].CopyFrom(numpy_helper.from_array(
            np.concatenate([scales.reshape(n, blocks), lo_scales], axis=1).reshape(-1), node.input[2]))
        x = node.input[0]
        if x not in doubled:
            doubled[x] = f"{x}_twice"
            nodes.append(helper.make_node("Concat", [x, x], [doubled[x]], name=doubled[x], axis=-1))
        node.input[0] = doubled[x]
        for a in node.attribute:
            if a.name == "K":
                a.i = 2 * attrs["K"]
        nodes.append(node)
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    q.model.topological_sort()
    save(m, graph)
    return out


def feeds(sess, rows: int, past: int, ids: np.ndarray | None = None) -> dict:
    tokens = 1 if ids is None else ids.shape[1]
    f = {"input_ids": np.ones((rows, 1), np.int64) if ids is None else ids,
         "attention_mask": np.ones((rows, past + tokens), np.int64)}
    for i in sess.get_inputs():
        if i.name == "last_index":
            f[i.name] = np.full((rows, 1, 1), tokens - 1, np.int64)
        elif i.name.startswith("past"):
            dtype = np.float16 if "float16" in i.type else np.float32
            f[i.name] = np.zeros((rows, i.shape[1], past, i.shape[3]), dtype)
    return f


def session(graph_dir: Path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(graph_dir / "model.onnx"), opts, providers=["CPUExecutionProvider"])


def child_peak(graph_dir: Path) -> float:
    """MiB: VmHWM of a process that opens the graph and runs one 16-row step."""
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import fp16_planes as b; "
            f"from pathlib import Path; s = b.session(Path({str(graph_dir)!r}))\n"
            f"s.run(None, b.feeds(s, 16, {PAST}))\n"
            "print([int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')][0])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(r.stdout.strip().splitlines()[-1]) / 1024


def step_ms(sessions: dict, rows: int) -> dict[str, float]:
    best = {k: float("inf") for k in sessions}
    for _ in range(3):
        for name, s in sessions.items():
            f = feeds(s, rows, PAST)
            s.run(None, f)
            n = 30 if rows == 1 else 8
            t = time.perf_counter()
            for _ in range(n):
                s.run(None, f)
            best[name] = min(best[name], (time.perf_counter() - t) / n * 1000)
    return {k: round(v, 2) for k, v in best.items()}


def main() -> None:
    arguments(__doc__).parse_args()
    from edgeinfer.testing import llm

    model = llm.random_qwen3(layers=16, hidden=1024, heads=16, kv_heads=8, intermediate=2816)
    dirs = {s: onnxruntime_decoder("fp16_planes", model.name, model, s, CTX) for s in ("fp32", "fp16", "w8a16")}
    dirs["planes"] = planes_graph(dirs["fp32"], dirs["fp32"].with_name(dirs["fp32"].name + "-planes"))
    sessions = {k: session(d) for k, d in dirs.items()}
    ids = np.random.default_rng(0).integers(0, 3000, (1, 24)).astype(np.int64)  # vocabulary 3072
    logits = {k: s.run(["logits"], feeds(s, 1, 0, ids))[0].reshape(-1).astype(np.float64)
              for k, s in sessions.items()}
    ref = logits["fp32"]
    span = ref.max() - ref.min()
    accuracy = {k: {"max_abs_over_range": float(np.abs(v - ref).max() / span),
                    "cosine": float(v @ ref / np.linalg.norm(v) / np.linalg.norm(ref)),
                    "same_argmax": bool(v.argmax() == ref.argmax())} for k, v in logits.items() if k != "fp32"}
    steps = {"1": step_ms(sessions, 1), "16": step_ms(sessions, 16)}
    del sessions
    peaks = {k: round(child_peak(d), 1) for k, d in dirs.items()}
    weights = {k: round(sum(f.stat().st_size for f in d.glob("model.onnx*")) / 2**20, 1) for k, d in dirs.items()}
    result = {"model": model.name, "past": PAST,
              "step_ms_best_of_3": steps, "peak_rss_mib": peaks, "graph_files_mib": weights,
              "logits_vs_fp32": accuracy}
    print(json.dumps(result, indent=1))
    write("fp16_planes", result)


if __name__ == "__main__":
    main()
