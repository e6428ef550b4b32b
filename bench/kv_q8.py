"""What a q8_0 KV cache gives the host decoder against fp16: the bytes it allocates, the pages a filled context
touches, the decode step at short and long contexts, and whether greedy tokens change.

The same random Qwen3 (~160 M parameters, 12 layers, 8 KV heads of 64) converted twice by the onnxruntime plugin
(its deploy conversion, ``--scheme``), the KV cache in fp16 and in q8_0 (``--option kv_dtype=q8_0``:
``edgeinfer.GroupQueryAttentionQ8``, docs/generation.md), opened side by side with ``CTX`` positions per slot and
``SLOTS`` slots, 1 thread. ``--runtime llama.cpp``: the llamacpp backend instead, one gguf:Q8_0 bundle of the same
model opened twice with its ``kv_dtype`` load option (llama.cpp's own q8_0 cache). Each round fills slot 0 to
each of ``FILLS`` positions (timed: the prompt's prefill, in the decoder's chunks of 512) and times ``STEPS``
one-row decode steps after it, then ``SLOTS`` rows at the longest fill; fp16 and q8_0 take turns (A B A B).
Ratios are q8_0 ÷ fp16 of the rounds' medians. The touched pages: RSS before and after one decoder's slots are
filled to the longest fill (numpy's zeroed pages are mapped as they are written; llama.cpp allocates its cache at
load, so there the figure is what the fill itself added).

    python bench/kv_q8.py [--rounds 3] [--scheme w8a8] [--runtime llama.cpp]

Writes bench/results/kv_q8.json (kv_q8-llamacpp.json).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

CTX, SLOTS, STEPS, NEW = 4096, 4, 32, 64
FILLS = (256, 1024, 3072)
KV = ("fp16", "q8_0")


def fill(d, slot: int, n: int, seed: int = 0):
    import numpy as np

    d.reset(slot)
    ids = np.random.default_rng(seed + slot).integers(10, 3000, n)
    logits = None
    for i in range(0, n, 512):  # the decoder's prefill chunk
        logits = d.prefill(slot, ids[i: i + 512])
    return logits


def steps(d, slots: list[int]) -> float:
    """The median of ``STEPS`` decode steps over ``slots``, ms."""
    import numpy as np

    times = []
    for _ in range(STEPS):
        t = time.perf_counter()
        d.decode(slots, np.ones(len(slots), np.int64))
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3  # each measurement fills its slots again first (fill resets them)


def greedy(d, n: int) -> list[int]:
    import numpy as np

    logits = fill(d, 0, n, seed=7)
    out = []
    for _ in range(NEW):
        out.append(int(np.argmax(logits)))
        logits = d.decode([0], np.asarray(out[-1:], np.int64))[0]
    return out


def onnxruntime(model: Path, scheme: str):
    """``kv`` -> the plugin's decoder of its conversion with that cache."""
    from edgeinfer_onnxruntime.decoder import OnnxRuntimeDecoder

    paths = {kv: _common.onnxruntime_decoder("kv_q8", model.name, model, scheme, CTX, kv) for kv in KV}
    return lambda kv: OnnxRuntimeDecoder(paths[kv], CTX, SLOTS, threads=1)


def llama_cpp(model: Path, scheme: str):
    """``kv`` -> the llamacpp backend's decoder of one deployed bundle, opened with that cache."""
    import edgeinfer
    from edgeinfer.contract import cache
    from edgeinfer.deploy.decoder import deploy_decoder

    out = cache.area("bench") / "kv_q8" / f"{model.name}-{scheme.replace(':', '-')}-llamacpp"
    if not (out / "manifest.json").exists():
        deploy_decoder(model, "host", out, quant=scheme, ctx=CTX, runtime="llama.cpp", force=True)
    backend = edgeinfer.backend("llamacpp")
    return lambda kv: backend.load_decoder(out / "decoder", context=CTX, slots=SLOTS, threads=1, kv_dtype=kv)


def main() -> None:
    ap = _common.arguments(__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scheme", default=None, help="the decoders' scheme (default w8a8; llama.cpp: gguf:Q8_0)")
    ap.add_argument("--runtime", default="onnxruntime", choices=("onnxruntime", "llama.cpp"))
    args = ap.parse_args()
    from edgeinfer.testing.llm import random_qwen3

    model = random_qwen3(layers=12, hidden=1024, heads=16, kv_heads=8, intermediate=3200, max_positions=CTX)
    llama = args.runtime == "llama.cpp"
    args.scheme = args.scheme or ("gguf:Q8_0" if llama else "w8a8")
    opened = llama_cpp(model, args.scheme) if llama else onnxruntime(model, args.scheme)
    decoders, touched = {}, {}
    for kv in KV:
        decoders[kv] = d = opened(kv)
        before = _common.rss()
        for s in range(SLOTS):
            fill(d, s, max(FILLS))
        touched[kv] = _common.rss() - before
    runs: dict[str, dict[str, list[float]]] = {kv: {} for kv in KV}
    for r in range(args.rounds):
        print(f"round {r + 1} of {args.rounds}", file=sys.stderr)
        for n in FILLS:
            for kv, d in decoders.items():
                t = time.perf_counter()
                fill(d, 0, n)
                runs[kv].setdefault(f"prefill_{n}", []).append((time.perf_counter() - t) * 1e3)
                runs[kv].setdefault(f"decode_1_at_{n}", []).append(steps(d, [0]))
        for kv, d in decoders.items():
            for s in range(SLOTS):
                fill(d, s, max(FILLS))
            runs[kv].setdefault(f"decode_{SLOTS}_at_{max(FILLS)}", []).append(steps(d, list(range(SLOTS))))
    med = {kv: {k: round(statistics.median(v), 3) for k, v in r.items()} for kv, r in runs.items()}
    tokens = {kv: {n: greedy(d, n) for n in (32, max(FILLS))} for kv, d in decoders.items()}
    leading = {n: next((i for i, (a, b) in enumerate(zip(tokens["fp16"][n], tokens["q8_0"][n])) if a != b), NEW)
               for n in tokens["fp16"]}
    result = {"model": model.name, "runtime": args.runtime, "scheme": args.scheme, "ctx": CTX, "slots": SLOTS,
              "fills": FILLS, "steps": STEPS, "rounds": args.rounds, "threads": 1,
              "kv_cache_bytes": {kv: d.kv_cache_bytes for kv, d in decoders.items()},
              "rss_touched_by_filling_bytes": touched,
              "median_ms": med, "q8_0_over_fp16": {k: round(med["q8_0"][k] / med["fp16"][k], 3) for k in med["fp16"]},
              "greedy_tokens_equal_leading": {f"after_{n}": v for n, v in leading.items()}, "new_tokens": NEW,
              "runs_ms": runs}
    _common.write("kv_q8" + ("-llamacpp" if llama else ""), result)
    print({k: result[k] for k in ("kv_cache_bytes", "rss_touched_by_filling_bytes", "q8_0_over_fp16",
                                  "greedy_tokens_equal_leading")})


if __name__ == "__main__":
    main()
