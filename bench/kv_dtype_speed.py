"""What an fp16 KV cache costs the onnxruntime decoder against fp32: decode step time at 1 and 4 slots and
prefill time, interleaved (fp32 / fp16 / fp32 / ...), and whether greedy tokens change.

The same random Qwen3 (~160 M parameters, fp32 weights, exported by onnxruntime-genai's builder) opened twice
through the plugin's ``open_decoder`` with ``kv_dtype`` fp32 and fp16 (the fp16 graph: fp16 past/present and
GroupQueryAttention, :mod:`edgeinfer_onnxruntime.kv_cache`), ``CTX`` positions per slot, 2 threads. Ratios
only: the machine is shared.

    python bench/kv_dtype_speed.py [--tiny]

Writes bench/results/kv_dtype_speed.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

CTX, PROMPT, NEW, ROUNDS, SLOTS = 512, 128, 64, 3, 4


def greedy(d, prompt) -> tuple[list[int], list[float], float]:
    import numpy as np

    d.reset(0)
    t = time.perf_counter()
    logits = d.prefill(0, np.asarray(prompt, np.int64))
    prefill = time.perf_counter() - t
    out, steps = [], []
    for _ in range(NEW):
        tok = int(np.argmax(logits))
        out.append(tok)
        t = time.perf_counter()
        logits = d.decode([0], np.asarray([tok], np.int64))[0]
        steps.append(time.perf_counter() - t)
    return out, steps, prefill


def batched_steps(d, prompt) -> list[float]:
    import numpy as np

    for s in range(SLOTS):
        d.reset(s)
        d.prefill(s, np.asarray(prompt[: PROMPT // 2 + s], np.int64))
    steps = []
    for _ in range(NEW // 2):
        t = time.perf_counter()
        d.decode(list(range(SLOTS)), np.ones(SLOTS, np.int64))
        steps.append(time.perf_counter() - t)
    return steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="the committed tiny test decoder")
    args = ap.parse_args()
    import numpy as np
    from edgeinfer_onnxruntime.decoder import open_decoder

    from edgeinfer.contract import cache
    from edgeinfer.testing.llm import model_dir, random_qwen3

    model = model_dir() if args.tiny else random_qwen3(layers=12, hidden=1024, heads=16, kv_heads=8,
                                                       intermediate=3200)
    prompt = list(np.random.default_rng(0).integers(10, 3000, PROMPT))
    decoders = {kv: open_decoder(model, CTX, SLOTS, cache.area("artifacts"), {"kv_dtype": kv, "threads": 2})
                for kv in ("fp32", "fp16")}
    runs: dict[str, dict[str, list[float]]] = {kv: {"decode_1": [], "decode_4": [], "prefill": []} for kv in decoders}
    tokens = {}
    for _ in range(ROUNDS):
        for kv, d in decoders.items():  # interleaved: fp32, fp16, fp32, fp16, ...
            tokens[kv], steps, prefill = greedy(d, prompt)
            runs[kv]["decode_1"].append(statistics.median(steps) * 1e3)
            runs[kv]["prefill"].append(prefill * 1e3)
            runs[kv]["decode_4"].append(statistics.median(batched_steps(d, prompt)) * 1e3)
    med = {kv: {k: round(statistics.median(v), 3) for k, v in r.items()} for kv, r in runs.items()}
    same = next((i for i, (a, b) in enumerate(zip(tokens["fp32"], tokens["fp16"])) if a != b), NEW)
    result = {"model": model.name, "ctx": CTX, "slots": SLOTS, "prompt_tokens": PROMPT, "new_tokens": NEW,
              "rounds": ROUNDS, "threads": 2,
              "kv_cache_bytes": {kv: d.kv_cache_bytes for kv, d in decoders.items()},
              "median_ms": med,
              "fp16_over_fp32": {k: round(med["fp16"][k] / med["fp32"][k], 3) for k in med["fp32"]},
              "greedy_tokens_equal_leading": same, "runs_ms": runs}
    _common.write("kv_dtype_speed" + ("-tiny" if args.tiny else ""), result)
    print({k: result[k] for k in ("kv_cache_bytes", "median_ms", "fp16_over_fp32", "greedy_tokens_equal_leading")})


if __name__ == "__main__":
    main()
