"""What OpenVINO's u8 KV cache gives a CPU decoder against f16: the bytes a position takes, the decode step at
short and long contexts, and whether greedy tokens change.

The random Qwen3 of bench/kv_q8.py (~160 M parameters, 12 layers, 8 KV heads of 64) deployed once for the Core
Ultra's CPU cores (``--runtime openvino-cpu``, ``--scheme``, default fp16), opened with the ``kv_dtype`` load option
fp16 and u8 (OpenVINO's ``KV_CACHE_PRECISION``; deploy records the plan's and every load passes it), 4 slots
(GenAI's ContinuousBatchingPipeline, as serve runs it), 1 thread.

* Bytes: what GenAI reports its cache to hold (``PipelineMetrics.kv_cache_size_in_bytes``) after sequences of
  each fill, per position, layer and KV head, against what the plugin counts (``kv_cache_bytes``) and the plan.
* The decode step: ``ROWS`` sequences given prompts of each fill less ``STEPS``, then the median of the
  ``STEPS`` steps that decode them all; fp16 and u8 take turns (A B A B). Ratios are u8 / fp16.
* Greedy tokens: one sequence after a prompt of each fill, ``STEPS`` tokens, u8 against fp16.

    python bench/kv_openvino.py [--rounds 3] [--scheme fp16]

Writes bench/results/kv_openvino.json.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

CTX, SLOTS, STEPS = 4096, 4, 32
FILLS = (256, 1024, 3072)
ROWS = (1, 4)
KV = ("fp16", "u8")


def prompt(n: int, seed: int) -> list[int]:
    import numpy as np

    return [int(t) for t in np.random.default_rng(seed).integers(10, 3000, n)]


def run(d, rows: int, n: int, tag: str) -> tuple[list[float], list[int]]:
    """``rows`` sequences of ``n`` positions (prompts of ``n - STEPS``): the times of the steps that decode them
    all, s, and the first sequence's tokens."""
    from edgeinfer.contract.generation import GenerationOptions

    opts = GenerationOptions(max_new_tokens=STEPS, ignore_eos=True)
    for r in range(rows):
        d.add_request(f"{tag}-{r}", prompt(n - STEPS, r), opts)
    times, tokens, live = [], [], rows
    while live:
        t = time.perf_counter()
        steps = d.step_requests()
        took = time.perf_counter() - t
        moved = [s for s in steps if s.token_ids]
        if len(moved) == rows and all(len(s.token_ids) == 1 for s in moved):
            times.append(took)  # a decode step of every row (the prompt's step makes each row's first token)
        tokens += [t for s in steps if s.rid == f"{tag}-0" for t in s.token_ids]
        live -= sum(s.finished for s in steps)
    return times, tokens


def main() -> None:
    ap = _common.arguments(__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scheme", default="fp16")
    args = ap.parse_args()
    import edgeinfer
    from edgeinfer.contract import cache
    from edgeinfer.deploy.decoder import deploy_decoder
    from edgeinfer.planning.planner import plan
    from edgeinfer.testing.llm import random_qwen3

    model = random_qwen3(layers=12, hidden=1024, heads=16, kv_heads=8, intermediate=3200, max_positions=CTX)
    out = cache.area("bench") / "kv_openvino" / f"{model.name}-{args.scheme}"
    if not (out / "manifest.json").exists():
        deploy_decoder(model, "core-ultra-155h", out, quant=args.scheme, ctx=CTX, runtime="openvino-cpu", force=True)
    be = edgeinfer.backend("openvino")
    rows_heads = 12 * 8  # layers x KV heads
    decoders = {kv: be.load_decoder(out / "decoder", device="CPU", context=CTX, slots=SLOTS, threads=1, kv_dtype=kv)
                for kv in KV}
    held = {}
    for kv, d in decoders.items():
        run(d, SLOTS, 512, "size")
        held[kv] = d._cb.get_metrics().kv_cache_size_in_bytes / (SLOTS * 512 * rows_heads)  # GenAI's own figure
    runs: dict[str, dict[str, list[float]]] = {kv: {} for kv in KV}
    tokens: dict[str, dict[int, list[int]]] = {kv: {} for kv in KV}
    for r in range(args.rounds):
        print(f"round {r + 1} of {args.rounds}", file=sys.stderr)
        for n in FILLS:
            for rows in ROWS:
                for kv, d in decoders.items():
                    times, toks = run(d, rows, n, f"{r}-{n}-{rows}")
                    runs[kv].setdefault(f"decode_{rows}_at_{n}", []).append(statistics.median(times) * 1e3)
                    if rows == 1:
                        tokens[kv][n] = toks
    med = {kv: {k: round(statistics.median(v), 3) for k, v in r.items()} for kv, r in runs.items()}
    leading = {f"after_{n}": next((i for i, (a, b) in enumerate(zip(tokens["fp16"][n], tokens["u8"][n])) if a != b),
                                  STEPS) for n in FILLS}
    planned = {kv: plan(str(model), "core-ultra-155h", quant=args.scheme, ctx=CTX, batch=SLOTS, kv_dtype=kv,
                        runtime="openvino-cpu").breakdown["kv_cache"] / (SLOTS * CTX * rows_heads) for kv in KV}
    result = {"model": model.name, "runtime": "openvino-cpu", "scheme": args.scheme, "ctx": CTX, "slots": SLOTS,
              "fills": FILLS, "rows": ROWS, "steps": STEPS, "rounds": args.rounds, "threads": 1,
              "bytes_per_position_layer_kv_head": {
                  "genai_reports": {kv: round(v, 2) for kv, v in held.items()},
                  "plugin_counts": {kv: round(d.kv_cache_bytes / (SLOTS * CTX * rows_heads), 2)
                                    for kv, d in decoders.items()},
                  "plan_counts": {kv: round(v, 2) for kv, v in planned.items()}},
              "median_ms": med, "u8_over_fp16": {k: round(med["u8"][k] / med["fp16"][k], 3) for k in med["fp16"]},
              "greedy_tokens_equal_leading": leading, "new_tokens": STEPS, "runs_ms": runs}
    _common.write("kv_openvino", result)
    print({k: result[k] for k in ("bytes_per_position_layer_kv_head", "u8_over_fp16", "greedy_tokens_equal_leading")})


if __name__ == "__main__":
    main()
