"""The host fp16 class on onnxruntime as the plugin builds it: each weight as two int8 planes, not as fp32.

onnxruntime has no x86 kernel for fp16 weights, so an fp16 graph runs them as fp32: twice fp16's bytes in memory
and per token. Since 2026-12-05 ``deploy --board host --quant fp16`` holds each weight as two int8 planes instead,
``hi`` over its input's two int8 digits and the residual ``lo`` over the input itself on the int8 kernel
(plugins/onnxruntime/edgeinfer_onnxruntime/weight_planes.py, docs/generation.md). This measures it against the
graphs the plugin builds for fp32 and w8a16 (``edgeinfer_onnxruntime.decoder.convert``) on the peer bench's random
Qwen3 (188 M parameters, ``edgeinfer.testing.llm.random_qwen3``), onnxruntime, one thread: a decode step at 1 and 16
rows (past 64, best of 3), each graph's peak RSS in its own process (load + one 16-row step), and the last
position's logits of a 24-token random prompt against the fp32 graph's (largest difference over the logits'
range, cosine, same argmax). Writes ``results/fp16_planes.json``; the first prototype's figures (four int8 products
a weight, and the fp16 graph before) are in results/fp16_planes-prototype.json.

    python bench/fp16_planes.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _common import arguments, onnxruntime_decoder, write

CTX = 256
PAST = 64


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


def peer_model() -> Path:
    from edgeinfer.testing import llm

    return llm.random_qwen3(layers=16, hidden=1024, heads=16, kv_heads=8, intermediate=2816)


def measure(dirs: dict[str, Path]) -> dict:
    """Each graph's decode step at 1 and 16 rows, peak RSS, files, last-position logits against fp32's."""
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
    return {"past": PAST, "step_ms_best_of_3": steps,
            "peak_rss_mib": {k: round(child_peak(d), 1) for k, d in dirs.items()},
            "graph_files_mib": {k: round(sum(f.stat().st_size for f in d.glob("model.onnx*")) / 2**20, 1)
                                for k, d in dirs.items()},
            "logits_vs_fp32": accuracy}


def main() -> None:
    arguments(__doc__).parse_args()
    model = peer_model()
    dirs = {s: onnxruntime_decoder("fp16_planes", model.name, model, s, CTX) for s in ("fp32", "fp16", "w8a16")}
    result = {"model": model.name, **measure(dirs)}
    print(json.dumps(result, indent=1))
    write("fp16_planes", result)


if __name__ == "__main__":
    main()
