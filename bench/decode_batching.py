"""What batched decode can give the serve benchmark: the step costs behind ``bench/serve_llm.py``'s speedup.

For the random-init ~204 M Qwen3 (``edgeinfer.testing.llm.random_qwen3``), one thread, on the transformers
reference and on onnxruntime: a prefill of the serve benchmark's mean prompt length, and a decode step of
1 and of ``--rows`` slots in one batched call (onnxruntime also: the same rows one call each, its decode
before batching). From those, the speedup bound of ``--rows`` concurrent requests over one at a time when
each request is a prefill plus ``T`` decode steps: ``(P + T·d1) / (P + T·dN/N)`` (prefill is compute-bound
already, so batching does not make it cheaper).

    python bench/decode_batching.py [--rows 16] [--tokens 32,64]

Writes bench/results/decode_batching.json.
"""

from __future__ import annotations

import argparse
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

    def prefill() -> None:
        d.reset(0)
        d.prefill(0, np.arange(5, 5 + prompt_len))

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

    out = {"prefill_ms": round(ms_per_call(prefill, 3), 1)}
    for s in range(rows):
        d.reset(s)
        d.prefill(s, np.arange(5, 5 + prompt_len))
    out["decode_1_row_ms"] = round(ms_per_call(decode([0]), 5), 1)
    out[f"decode_{rows}_rows_ms"] = round(ms_per_call(decode(list(range(rows))), 3), 1)
    if one_by_one:
        out[f"decode_{rows}_rows_one_call_each_ms"] = round(ms_per_call(decode(list(range(rows)), True), 2), 1)
    return out


def bound(costs: dict, rows: int, tokens: int) -> float:
    p, d1, dn = costs["prefill_ms"], costs["decode_1_row_ms"], costs[f"decode_{rows}_rows_ms"]
    return round((p + tokens * d1) / (p + tokens * dn / rows), 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--tokens", default="32,64", help="decode steps per request for the bound")
    args = ap.parse_args()
    import edgeinfer
    from edgeinfer.run.generation.text import TextCodec
    from edgeinfer.testing.llm import random_qwen3

    model = random_qwen3()
    codec = TextCodec(model)
    prompt_len = round(float(np.mean([len(codec.encode(p)) for p in serve_llm.prompts(16)])))
    results = []
    for backend in ("transformers", "onnxruntime"):
        d = edgeinfer.backend(backend).load_decoder(model, device="CPU", context=256, slots=args.rows, threads=1)
        costs = step_costs(d, prompt_len, args.rows, one_by_one=backend == "onnxruntime")
        d.release()
        decode_only = args.rows * costs["decode_1_row_ms"] / costs[f"decode_{args.rows}_rows_ms"]
        row = {"backend": backend, **costs, "decode_only_bound": round(decode_only, 2),
               **{f"bound_{t}_tokens": bound(costs, args.rows, int(t)) for t in args.tokens.split(",")}}
        print(row, file=sys.stderr)
        results.append(row)
    _common.write("decode_batching", {"model": model.name, "threads": 1, "prompt_tokens": prompt_len,
                                      "rows": args.rows, "results": results})


if __name__ == "__main__":
    main()
