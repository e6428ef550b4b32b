"""What batched decode can give the serve benchmark: the step costs behind ``bench/serve_llm.py``'s speedup.

For a random-init Qwen3 (``edgeinfer.testing.llm.random_qwen3``, by default the ~160 M shape of
``bench/decoder_footprint.py``: 12 layers, hidden 1024, MLP 3200 — not 3072, the vocabulary size, which
onnxruntime-genai's builder would take for the LM head), one thread, on onnxruntime (and with
``--backends transformers,onnxruntime`` the transformers reference): a prefill of the serve benchmark's mean
prompt length, one decode step of 1, 4 and ``--rows`` slots in one batched call (onnxruntime also: the same
rows one call each, its decode before batching), and a ``prefill_batch`` of ``--rows`` such prompts (where
the backend has its own; else ``--rows`` prefills). From those, the speedup bound of ``--rows`` concurrent
requests over one at a time when each request is a prefill plus ``T`` decode steps:
``(P + T·d1) / (P + T·dN/N)``.

    python bench/decode_batching.py [--rows 16] [--tokens 32,64] [--profile] [--label after]

Writes bench/results/decode_batching[-LABEL].json. Figures from a shared, loaded machine: compare runs
made close together.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
import serve_llm  # noqa: E402


def ms_per_call(f, reps: int) -> float:
    f()  # warm-up
    t0 = time.perf_counter()
    for _ in range(reps):
        f()
    return (time.perf_counter() - t0) / reps * 1e3


def step_costs(d, prompt_len: int, rows: int, one_by_one: bool) -> dict:
    prompt = np.arange(5, 5 + prompt_len)

    def prefill() -> None:
        d.reset(0)
        d.prefill(0, prompt)

    def prefill_batch() -> None:
        for s in range(rows):
            d.reset(s)
        d.prefill_batch(list(range(rows)), [prompt] * rows)

    def decode(slots: list[int], one_by_one: bool = False):
        def f() -> None:
            ids = np.arange(len(slots)) + 7
            if one_by_one:
                for s, t in zip(slots, ids):
                    d.decode([s], np.array([t]))
            else:
                d.decode(slots, ids)
            for s in slots:
                d.lengths[s] -= 1  # the same positions again next time
        return f

    out = {"prefill_ms": round(ms_per_call(prefill, 3), 1),
           f"prefill_batch_{rows}_rows_ms": round(ms_per_call(prefill_batch, 2), 1)}
    for s in range(rows):
        d.reset(s)
        d.prefill(s, prompt)
    for n in sorted({1, 4, rows}):
        out[f"decode_{n}_row{'s' if n > 1 else ''}_ms"] = round(ms_per_call(decode(list(range(n))), 5), 1)
    if one_by_one:
        out[f"decode_{rows}_rows_one_call_each_ms"] = round(ms_per_call(decode(list(range(rows)), True), 2), 1)
    return out


def op_breakdown(d, prompt_len: int, rows: int) -> dict:
    """onnxruntime's own profiler (``SessionOptions.enable_profiling``) over the decoder's model and KV buffers:
    per op type, the ms of one decode step of 1, 4 and ``rows`` rows and of one ``prefill_batch`` of ``rows``
    prompts (the last of two runs each), and the whole run's ms next to the sum over its nodes."""
    import collections
    import json
    import os
    import tempfile

    prompt = np.arange(5, 5 + prompt_len)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, n in [("decode_1_row", 1), ("decode_4_rows", 4), (f"decode_{rows}_rows", rows),
                         (f"prefill_batch_{rows}_rows", rows)]:
            keep = d._sess
            d._sess = d._ort.InferenceSession(d._onnx, d._options(os.path.join(tmp, label)),
                                              providers=["CPUExecutionProvider"])
            for _ in range(2):
                for s in range(rows):
                    d.reset(s)
                if label.startswith("prefill"):
                    d.prefill_batch(list(range(n)), [prompt] * n)
                else:
                    d.prefill_batch(list(range(rows)), [prompt] * rows)
                    d.decode(list(range(n)), np.arange(n) + 7)
            events = json.loads(Path(d._sess.end_profiling()).read_text())
            d._sess = keep
            run = [e for e in events if e.get("name") == "model_run"][-1]
            ops: collections.Counter = collections.Counter()
            for e in events:
                if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and \
                        run["ts"] <= e["ts"] <= run["ts"] + run["dur"]:
                    ops[e["args"]["op_name"]] += e["dur"] / 1e3
            out[label] = {"run_ms": round(run["dur"] / 1e3, 1), "nodes_ms": round(sum(ops.values()), 1),
                          "ops_ms": {k: round(v, 1) for k, v in ops.most_common(6)}}
    return out


def bound(costs: dict, rows: int, tokens: int) -> float:
    p, d1, dn = costs["prefill_ms"], costs["decode_1_row_ms"], costs[f"decode_{rows}_rows_ms"]
    return round((p + tokens * d1) / (p + tokens * dn / rows), 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--tokens", default="32,64", help="decode steps per request for the bound")
    ap.add_argument("--backends", default="onnxruntime")
    ap.add_argument("--profile", action="store_true", help="onnxruntime: per-op-type ms of each step")
    ap.add_argument("--label", default="", help="suffix of the result file (e.g. before / after)")
    args = ap.parse_args()
    import edgeinfer
    from edgeinfer.run.generation.text import TextCodec
    from edgeinfer.testing.llm import random_qwen3

    model = random_qwen3(layers=12, hidden=1024, heads=16, kv_heads=8, intermediate=3200)
    codec = TextCodec(model)
    prompt_len = round(float(np.mean([len(codec.encode(p)) for p in serve_llm.prompts(16)])))
    results = []
    for backend in args.backends.split(","):
        d = edgeinfer.backend(backend).load_decoder(model, device="CPU", context=256, slots=args.rows, threads=1)
        costs = step_costs(d, prompt_len, args.rows, one_by_one=backend == "onnxruntime")
        if backend == "onnxruntime" and args.profile:
            costs["profile"] = op_breakdown(d, prompt_len, args.rows)
        d.release()
        decode_only = args.rows * costs["decode_1_row_ms"] / costs[f"decode_{args.rows}_rows_ms"]
        row = {"backend": backend, **costs, "decode_only_bound": round(decode_only, 2),
               **{f"bound_{t}_tokens": bound(costs, args.rows, int(t)) for t in args.tokens.split(",")}}
        print(row, file=sys.stderr)
        results.append(row)
    name = "decode_batching" + (f"-{args.label}" if args.label else "")
    _common.write(name, {"model": model.name, "threads": 1, "prompt_tokens": prompt_len, "rows": args.rows,
                         "load_average": [round(x, 2) for x in os.getloadavg()], "results": results})


if __name__ == "__main__":
    main()
