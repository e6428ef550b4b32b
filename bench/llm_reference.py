"""Decode speed of edgeinfer's decoder paths against calling transformers directly.

Same model, same prompts, greedy, one process, one run:
- ``transformers generate``: ``model.generate(do_sample=False)`` with its default (dynamic) cache;
- ``transformers generate, static cache``: ``cache_implementation="static"``, compile disabled —
  the same cache edgeinfer's reference preallocates, so the difference to edgeinfer is loop overhead;
- ``edgeinfer transformers``: the reference backend through the decoder contract and the core loop;
- ``edgeinfer onnxruntime``: the onnxruntime backend through the same loop.

All engines run on one thread (the figures then compare engines, not thread scheduling on a shared
machine). Decode tokens/s = (new tokens − 1) / (time after the first token); taken as the median of
``REPEAT`` runs per prompt, the engines interleaved run by run. Models: the trained test model, and
(``--big``) a random-init Qwen3 of a few hundred million parameters so the figures are not all overhead.
Writes bench/results/llm_reference.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write  # noqa: E402

NEW_TOKENS = 64
REPEAT = 3
PROMPTS = ("The licence grants", "Permission is hereby granted, free of charge, to any person")


def _hf_decode_rate(model, ids, static: bool) -> float:
    import torch
    from transformers import TextStreamer  # noqa: F401  (import check only)

    times: list[float] = []

    class Clock:
        def put(self, value):  # called with the prompt first, then each new token
            times.append(time.perf_counter())

        def end(self):
            pass

    kw = {"cache_implementation": "static", "disable_compile": True} if static else {}
    times.clear()
    with torch.inference_mode():
        model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                       streamer=Clock(), pad_token_id=0, **kw)
    first, last = times[1], times[-1]
    return (len(times) - 2) / (last - first)


def _edgeinfer_rate(gen, ids) -> float:
    from edgeinfer.contract.generation import GenerationOptions

    r = gen.generate_ids(ids, GenerationOptions(max_new_tokens=NEW_TOKENS, ignore_eos=True))
    return r.metrics.decode_tokens_per_s


def run_model(model_dir: Path, label: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    import edgeinfer

    torch.manual_seed(0)
    torch.set_num_threads(1)  # one thread everywhere: comparable, and stable on a shared 2-core machine
    from edgeinfer.contract import remote_code

    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32,
                                              trust_remote_code=remote_code.allowed(model_dir)).eval()
    engines = {}
    with edgeinfer.load(model_dir, ctx=256, threads=1) as ref, \
            edgeinfer.load(model_dir, ctx=256, backend="onnxruntime", threads=1) as ort:
        prompt_ids = [ref.prompt_ids(p) for p in PROMPTS]
        runs = {
            "transformers generate": lambda ids: _hf_decode_rate(hf, ids, static=False),
            "transformers generate, static cache": lambda ids: _hf_decode_rate(hf, ids, static=True),
            "edgeinfer transformers": lambda ids: _edgeinfer_rate(ref, ids),
            "edgeinfer onnxruntime": lambda ids: _edgeinfer_rate(ort, ids),
        }
        for fn in runs.values():
            fn(prompt_ids[0])  # warm-up
        rates: dict[str, list[float]] = {name: [] for name in runs}
        # engines interleaved run by run, so a change in machine load hits them all alike
        for _ in range(REPEAT):
            for ids in prompt_ids:
                for name, fn in runs.items():
                    rates[name].append(fn(ids))
        for name, got in rates.items():
            engines[name] = {"decode_tokens_per_s": statistics.median(got), "runs": len(got)}
            print(f"{label}: {name}: {engines[name]['decode_tokens_per_s']:.1f} tok/s", file=sys.stderr)
    base = engines["transformers generate, static cache"]["decode_tokens_per_s"]
    overhead = 1 - engines["edgeinfer transformers"]["decode_tokens_per_s"] / base
    params = sum(p.numel() for p in hf.parameters())
    return {"model": label, "parameters": params, "new_tokens": NEW_TOKENS, "engines": engines,
            "edgeinfer_overhead_vs_static_generate": overhead}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--big", action="store_true", help="also a random-init Qwen3 of a few hundred M parameters")
    args = ap.parse_args()
    from edgeinfer.testing.llm import model_dir, random_qwen3

    results = [run_model(model_dir(), "tiny-qwen3 (trained, 4 M)")]
    if args.big:
        results.append(run_model(random_qwen3(), "random-init qwen3"))
    write("llm_reference", {"results": results, "note": "CPU, shared 2-core machine; see docstring"})


if __name__ == "__main__":
    main()
