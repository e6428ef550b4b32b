"""What the runtimes under edgeinfer do with one linear layer on this CPU, outside edgeinfer: the kernels the
host and OpenVINO decoder paths can use (issue 30's goals for fp16 and w8a16 rest on them).

One ``[M, K] x [K, N]`` layer (default K=4096, N=8192: 32 M weights, 128 MiB in fp32), one thread, each runtime
in a fresh process so that RSS differences are the layer's own:

- onnxruntime ``MatMul`` with fp32 weights and with fp16 weights (fp16 in and out): the memory the session adds
  and the time of one row — whether fp16 weights stay fp16 in memory and are read as such;
- onnxruntime ``MatMulNBits`` (its own quantizer, block 32, symmetric) at 8 bits with fp32 activations
  (accuracy level 1: what w8a16 means), at 8 bits with int8 activations (level 4: w8a8, and what w8a16's two
  activation digits run on) and at 4 bits with fp32 activations (level 1: w4a16), each at 1 and 16 rows;
- OpenVINO's CPU plugin on an IR saved with fp16-compressed weights (``ov.save_model(compress_to_fp16=True)``,
  as optimum-intel exports them), compiled with ``INFERENCE_PRECISION_HINT`` f32 as edgeinfer compiles fp16 IRs:
  anonymous RSS after compiling and after the first inference of 1, 2, 4, 8, 16 and 64 rows — each new packed
  copy of the weights — and the time of one row; the same for an fp32 IR;
- with ``--ov-ir DIR`` (a decoder bundle's ``decoder/`` with a stateful ``openvino_model.xml``, e.g. the peer
  bench's core-ultra-155h fp16 bundle): the whole compiled decoder without GenAI or edgeinfer, compiled as the
  plugin compiles it for the CPU (f32 precision, f16 KV cache, 1 thread): anonymous RSS after a 16-token prompt
  and after single-token steps, and ms per decoded token; ``--ov-precisions f32,bf16`` compiles it at each
  ``INFERENCE_PRECISION_HINT`` (bf16: what OpenVINO's CPU plugin picks by itself on a CPU with AVX512_BF16 or
  AMX, and edgeinfer does not), in the order given, ``--ov-rounds`` times.

    python bench/runtime_kernels.py [--k 4096] [--n 8192] [--runtimes onnxruntime,openvino] [--ov-ir DIR]
        [--ov-precisions f32[,bf16]] [--ov-rounds 1] [--out runtime_kernels]

Writes bench/results/<out>.json. Needs onnxruntime (with its quantization tools' ``onnx_ir``) and openvino.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
from serve_footprint import status_kib  # noqa: E402

MIB = 2**20
ROWS = (1, 16)
OV_ROWS = (1, 2, 4, 8, 16, 64)


def status(key: str) -> int:
    """Bytes of ``key`` (VmRSS, RssAnon, VmHWM) in this process's /proc status."""
    return status_kib(os.getpid(), key) * 1024


def per_call_ms(run, x, calls: int) -> float:
    for _ in range(3):
        run(x)
    t = time.perf_counter()
    for _ in range(calls):
        run(x)
    return (time.perf_counter() - t) / calls * 1e3


def weights(k: int, n: int):
    import numpy as np

    return (np.random.default_rng(0).standard_normal((k, n)) * 0.02).astype(np.float32)


def ort_case(case: str, k: int, n: int) -> dict:
    """One onnxruntime session in this process: RSS it adds, ms per call at ROWS, largest relative error."""
    import gc

    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    w = weights(k, n)
    fp16 = case == "MatMul fp16"
    dtype, np_dtype = (TensorProto.FLOAT16, np.float16) if fp16 else (TensorProto.FLOAT, np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "layer",
                              [helper.make_tensor_value_info("x", dtype, ["M", k])],
                              [helper.make_tensor_value_info("y", dtype, ["M", n])],
                              [numpy_helper.from_array(w.astype(np_dtype), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    if case.startswith("MatMulNBits"):
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        bits, level = {"MatMulNBits 8-bit level 1": (8, 1), "MatMulNBits 8-bit level 4": (8, 4),
                       "MatMulNBits 4-bit level 1": (4, 1)}[case]
        q = MatMulNBitsQuantizer(model, bits=bits, block_size=32, is_symmetric=True, accuracy_level=level)
        q.process()
        model = q.model.model
    blob = model.SerializeToString()
    del model, graph
    gc.collect()
    before = status("VmRSS")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(blob, options, providers=["CPUExecutionProvider"])
    del blob
    gc.collect()
    row = {"runtime": "onnxruntime " + ort.__version__, "case": case, "session_rss_mib": None, "ms": {}}
    rng = np.random.default_rng(1)
    worst = 0.0
    for m in ROWS:
        x = rng.standard_normal((m, k)).astype(np_dtype)
        y = session.run(None, {"x": x})[0].astype(np.float32)
        ref = x.astype(np.float32) @ w
        worst = max(worst, float(np.abs(y - ref).max() / np.abs(ref).max()))
        row["ms"][m] = round(per_call_ms(lambda a: session.run(None, {"x": a}), x, 40 if m == 1 else 10), 3)
    row["session_rss_mib"] = round((status("VmRSS") - before) / MIB, 1)
    row["max_relative_error"] = float(f"{worst:.2e}")
    return row


def ov_case(case: str, k: int, n: int) -> dict:
    """One OpenVINO CPU compiled model: anonymous RSS after compile and after the first call of each row
    count (each pack of the weights the plugin makes for a new kind of call), and ms per 1-row call."""
    import numpy as np
    import openvino as ov
    from openvino import opset13 as ops

    w = weights(k, n)
    x = ops.parameter([-1, k], np.float32, name="x")
    model = ov.Model([ops.matmul(x, ops.constant(w), False, False)], [x], "layer")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "layer.xml"
        ov.save_model(model, path, compress_to_fp16=case == "fp16 IR")
        del model, w
        core = ov.Core()
        anon0 = status("RssAnon")
        compiled = core.compile_model(core.read_model(path), "CPU", {
            "INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1, "NUM_STREAMS": 1})
        request = compiled.create_infer_request()
        row = {"runtime": "openvino " + ov.get_version().split("-")[0], "case": case,
               "ir_bin_mib": round(path.with_suffix(".bin").stat().st_size / MIB, 1),
               "anonymous_mib_after": {"compile": round((status("RssAnon") - anon0) / MIB, 1)}}
        rng = np.random.default_rng(1)
        for m in OV_ROWS:
            request.infer({"x": rng.standard_normal((m, k)).astype(np.float32)})
            row["anonymous_mib_after"][f"{m} rows"] = round((status("RssAnon") - anon0) / MIB, 1)
        one = rng.standard_normal((1, k)).astype(np.float32)
        row["ms"] = {1: round(per_call_ms(lambda a: request.infer({"x": a}), one, 40), 3)}
    return row


def ov_ir_case(case: str, tokens: int = 40) -> dict:
    """``case``: ``DIR`` or ``DIR::PRECISION`` (the inference precision hint, default f32)."""
    import numpy as np
    import openvino as ov

    ir_dir, _, precision = case.partition("::")
    precision = precision or "f32"
    core = ov.Core()
    anon0 = status("RssAnon")
    compiled = core.compile_model(core.read_model(Path(ir_dir) / "openvino_model.xml"), "CPU", {
        "INFERENCE_PRECISION_HINT": precision, "KV_CACHE_PRECISION": "f16", "INFERENCE_NUM_THREADS": 1,
        "NUM_STREAMS": 1})
    request = compiled.create_infer_request()
    rng = np.random.default_rng(0)
    vocab = compiled.outputs[0].get_partial_shape()[-1].get_length()

    def step(ids: list[int], pos: int) -> None:
        request.infer({"input_ids": np.array([ids], np.int64),
                       "attention_mask": np.ones((1, pos + len(ids)), np.int64),
                       "position_ids": np.arange(pos, pos + len(ids), dtype=np.int64)[None],
                       "beam_idx": np.zeros(1, np.int32)})

    row = {"runtime": "openvino " + ov.get_version().split("-")[0], "case": "decoder IR " + Path(ir_dir).parent.name,
           "inference_precision": precision,
           "ir_bin_mib": round((Path(ir_dir) / "openvino_model.bin").stat().st_size / MIB, 1),
           "anonymous_mib_after": {"compile": round((status("RssAnon") - anon0) / MIB, 1)}}
    step([int(t) for t in rng.integers(3, vocab, 16)], 0)
    # the prompt's last-token logits, to compare the precisions' outputs across processes
    row["prompt_logits_head"] = [round(float(x), 4) for x in request.get_output_tensor(0).data[0, -1, :8]]
    row["anonymous_mib_after"]["16-token prompt"] = round((status("RssAnon") - anon0) / MIB, 1)
    step([5], 16)
    row["anonymous_mib_after"]["1-token step"] = round((status("RssAnon") - anon0) / MIB, 1)
    t = time.perf_counter()
    for i in range(tokens):
        step([int(rng.integers(3, vocab))], 17 + i)
    row["ms"] = {1: round((time.perf_counter() - t) / tokens * 1e3, 2)}
    row["vm_hwm_mib"] = round(status("VmHWM") / MIB, 1)
    return row


ORT_CASES = ("MatMul fp32", "MatMul fp16", "MatMulNBits 8-bit level 1", "MatMulNBits 8-bit level 4",
             "MatMulNBits 4-bit level 1")
OV_CASES = ("fp32 IR", "fp16 IR")


def in_fresh_process(kind: str, case: str, k: int, n: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--one", kind, case, "--k", str(k), "--n", str(n)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        return {"runtime": kind, "case": case, "failed": (out.stderr.strip().splitlines() or ["?"])[-1][:300]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--runtimes", default="onnxruntime,openvino", help="comma-separated: onnxruntime, openvino")
    ap.add_argument("--ov-ir", metavar="DIR", help="also a whole decoder IR directory (openvino_model.xml)")
    ap.add_argument("--ov-precisions", default="f32", help="comma-separated inference precisions for --ov-ir")
    ap.add_argument("--ov-rounds", type=int, default=1, help="times each --ov-ir precision runs, interleaved")
    ap.add_argument("--out", default="runtime_kernels")
    ap.add_argument("--one", nargs=2, metavar=("KIND", "CASE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        kind, case = args.one
        row = (ov_ir_case(case) if kind == "openvino-ir" else
               (ort_case if kind == "onnxruntime" else ov_case)(case, args.k, args.n))
        print(json.dumps(row))
        return
    wanted = args.runtimes.split(",")
    rows = [in_fresh_process(kind, c, args.k, args.n)
            for kind, cases in (("onnxruntime", ORT_CASES), ("openvino", OV_CASES)) if kind in wanted for c in cases]
    if args.ov_ir:
        rows += [in_fresh_process("openvino-ir", f"{Path(args.ov_ir).resolve()}::{p}", args.k, args.n)
                 for _ in range(args.ov_rounds) for p in args.ov_precisions.split(",")]
    for r in rows:
        print(json.dumps(r))
    _common.write(args.out, {"k": args.k, "n": args.n, "threads": 1,
                             "weights_mib": {"fp32": round(args.k * args.n * 4 / MIB, 1),
                                             "fp16": round(args.k * args.n * 2 / MIB, 1)}, "rows": rows})


if __name__ == "__main__":
    main()
