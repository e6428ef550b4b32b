"""Ascend decoders on the torch CPU path (the code that runs on npu:N where torch_npu works).

Per model, fp32, one thread, context 256, prefill buckets 16 and 64:

1. eager vs compiled (torch.compile fullgraph, dynamic=False, inductor: TorchAir on Ascend) decode
   tokens/s: the synchronised decode-step times of greedy generation (64 new tokens, two prompts);
2. compile time per graph (each prefill bucket and the decode step: the first call at warm-up, compile
   included, against the steady call) and the whole warm-up time, with the compile count per graph;
3. padded-bucket prefill overhead (eager): a prompt prefilled padded up to its bucket against the same
   prompt at its exact length;
4. KV-cache bytes: the planner's prediction (`edgeinfer plan --kv-dtype fp32 --runtime torch-npu`)
   against the bytes of the tensors allocated at load.

Models: the trained tiny Qwen3 of the tests and a random-init Qwen3 of ~204 M parameters
(edgeinfer.testing.llm.random_qwen3). Writes bench/results/ascend_llm_cpu_path.json and a PNG.
Usage: python bench/ascend_llm_cpu_path.py [--quick]   (--quick: the tiny model only)
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, arguments, write  # noqa: E402

CONTEXT, BUCKETS, NEW_TOKENS = 256, (16, 64), 64
PROMPTS = ("The licence grants", "Permission is hereby granted, free of charge, to any person obtaining a copy")
BOARD = "atlas-300i-a2-910b4"


def generate(gen, prompt: str) -> tuple[list[int], list[float]]:
    d = gen.decoder
    d.step_ms = {"prefill": [], "decode": []}
    ids = gen.generate(prompt, max_new_tokens=NEW_TOKENS, ignore_eos=True).token_ids
    return ids, list(d.step_ms["decode"])


def decode_rate(gen) -> dict:
    tokens, steps = {}, []
    for p in PROMPTS:
        tokens[p], ms = generate(gen, p)
        steps += ms
    med = statistics.median(steps)
    return {"decode_step_median_ms": med, "decode_tok_s": 1e3 / med, "steps": len(steps), "tokens": tokens}


def padding_overhead(d, lengths=(5, 9, 40), repeat=7) -> list[dict]:
    rows = []
    buckets = d.buckets
    for n in lengths:
        ids = np.arange(100, 100 + n, dtype=np.int64)
        bucket = min(b for b in buckets if b >= n)
        timing = {}
        for label, shape in (("bucketed", buckets), ("exact", (n,))):
            d.buckets = shape  # eager runs any shape: (n,) prefills at the prompt's own length
            xs = []
            for _ in range(repeat):
                d.reset(0)
                t = time.perf_counter()
                d.prefill(0, ids)
                xs.append((time.perf_counter() - t) * 1e3)
            timing[label] = statistics.median(xs)
        d.buckets = buckets
        d.reset(0)
        rows.append({"prompt_tokens": n, "bucket": bucket, "exact_ms": timing["exact"],
                     "bucketed_ms": timing["bucketed"],
                     "overhead_pct": 100.0 * (timing["bucketed"] / timing["exact"] - 1.0)})
    return rows


def run_model(name: str, model_dir: Path) -> dict:
    import edgeinfer
    from edgeinfer.planning.planner import plan
    from edgeinfer.run.generation.generator import Generator
    from edgeinfer.run.generation.text import TextCodec

    be = edgeinfer.backend("ascend")
    gens, load_s = {}, {}
    for mode in ("eager", "compiled"):
        t = time.perf_counter()
        d = be.load_decoder(model_dir, context=CONTEXT, compile=mode == "compiled", prefill_buckets=list(BUCKETS))
        load_s[mode] = time.perf_counter() - t
        gens[mode] = Generator(d, TextCodec(model_dir))
        print(f"{name}: loaded {mode} in {load_s[mode]:.1f} s (warm-up {d.warmup_s:.1f} s)", file=sys.stderr)
    row: dict = {"model": name, "path": str(model_dir), "load_with_warmup_s": load_s}
    rates = {mode: decode_rate(g) for mode, g in gens.items()}
    row["same_greedy_tokens"] = rates["eager"].pop("tokens") == rates["compiled"].pop("tokens")
    row["decode"] = rates
    row["compiled_speedup"] = rates["compiled"]["decode_tok_s"] / rates["eager"]["decode_tok_s"]
    compiled, eager = gens["compiled"].decoder, gens["eager"].decoder
    row["graphs"] = {
        key: {"compiles": compiled.compiles.get(key, 0), "first_run_compiled_s": compiled.first_run_s[key],
              "first_run_eager_s": eager.first_run_s[key],
              "compile_s_estimate": compiled.first_run_s[key] - eager.first_run_s[key]}
        for key in compiled.graph_keys
    }
    row["warmup_s"] = {"eager": eager.warmup_s, "compiled": compiled.warmup_s}
    row["padding_overhead_eager"] = padding_overhead(eager)
    p = plan(model_dir, BOARD, quant="fp32", ctx=CONTEXT, batch=1, kv_dtype="fp32", runtime="torch-npu")
    allocated = sum(t.nbytes for t in eager.lm.k_cache + eager.lm.v_cache)
    row["kv_cache"] = {"predicted_bytes": p.breakdown["kv_cache"], "allocated_bytes": allocated,
                       "decoder_reports": eager.kv_cache_bytes, "equal": allocated == p.breakdown["kv_cache"]}
    row["params"] = sum(t.numel() for t in eager.model.parameters())
    for g in gens.values():
        g.close()
    print(f"{name}: decode eager {rates['eager']['decode_tok_s']:.0f} tok/s, compiled "
          f"{rates['compiled']['decode_tok_s']:.0f} tok/s; KV {allocated} B allocated vs "
          f"{p.breakdown['kv_cache']} B planned", file=sys.stderr)
    return row


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    x = np.arange(len(rows))
    for i, mode in enumerate(("eager", "compiled")):
        a.bar(x + (i - 0.5) * 0.4, [r["decode"][mode]["decode_tok_s"] for r in rows], 0.4, label=mode)
    a.set_xticks(x, [r["model"] for r in rows])
    a.set_ylabel("decode tokens/s (torch CPU, 1 thread)")
    a.set_title("Ascend decoder, CPU path: eager vs compiled")
    a.legend()
    keys = list(rows[0]["graphs"])
    for i, r in enumerate(rows):
        b.bar(np.arange(len(keys)) + (i - 0.5) * 0.4, [r["graphs"][k]["compile_s_estimate"] for k in keys], 0.4,
              label=r["model"])
    b.set_xticks(np.arange(len(keys)), keys)
    b.set_ylabel("compile time per graph (s)")
    b.set_title("torch.compile (inductor) per bucket / decode")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}", file=sys.stderr)


def main(quick: bool = False) -> None:
    import torch

    from edgeinfer.testing.llm import model_dir, random_qwen3

    torch.set_num_threads(1)
    models = [("tiny-qwen3 (4 layers, 3.9 M)", model_dir())]
    if not quick:
        models.append(("random qwen3 (16 layers, ~204 M)", random_qwen3()))
    rows = [run_model(name, path) for name, path in models]
    name = "ascend_llm_cpu_path_quick" if quick else "ascend_llm_cpu_path"
    plot(rows, RESULTS / f"{name}.png")
    write(name, {
        "device": "cpu (no Ascend NPU here; on Ascend the compiled path uses TorchAir's NPU backend)",
        "dtype": "fp32", "threads": 1, "context": CONTEXT, "prefill_buckets": list(BUCKETS),
        "new_tokens": NEW_TOKENS, "compile_backend": "inductor", "load_average": os.getloadavg(),
        "models": rows,
    })


if __name__ == "__main__":
    ap = arguments(__doc__)
    ap.add_argument("--quick", action="store_true", help="the tiny model only (a smoke run)")
    main(ap.parse_args().quick)
