"""OpenVINO decoders on the CPU: edgeinfer against raw GenAI and transformers, TTFT, continuous batching.

Same model, same machine, one run, greedy, ``ignore_eos`` so every request makes ``NEW_TOKENS``:

* per weight format (fp16 / int8 weight-only / int4, converted by ``convert_decoder`` for the CPU):
  - ``raw LLMPipeline``: ``openvino_genai.LLMPipeline.generate`` on token ids, with a streamer;
  - ``edgeinfer``: the same IR through ``edgeinfer.load`` (the decoder contract's native loop, the
    core's Generator with its stop/detokenize thread);
  both with the same properties (1 inference thread, f32 inference precision, f32 KV cache).
  Reported: end-to-end tokens/s (new tokens / wall time of the request, measured outside both) and
  GenAI's own decode tokens/s; ``edgeinfer_overhead`` = 1 − edgeinfer / raw (end-to-end);
  ``edgeinfer_cpu_overhead`` = edgeinfer's process CPU time per token / raw's − 1 (CPU seconds the
  process spent, all threads: less sensitive than wall time to other jobs on a shared machine);
  ``--overhead-only`` adds ``edgeinfer_own_time_share``: edgeinfer's own part of its requests' CPU time
  (the caller's CPU outside ``LLMPipeline.generate`` plus its per-token callback's CPU inside), a
  decomposition of the same requests that other jobs on the machine cannot blur;
  ``plugin_overhead`` the same for the plugin's ``generate_native`` called directly (no core loop:
  no detokenizer, stop strings or consumer thread). The three run
  interleaved, request by request, with fresh prompts (no KV prefix reuse), median of the runs.
* transformers fp32 (1 torch thread): ``generate`` eager (dynamic cache) and compiled (static cache,
  transformers' automatic ``torch.compile`` of the decode step). transformers has no fp16/int8/int4
  CPU path of its own here, so the OpenVINO formats are set against its fp32 figures.
* TTFT (GenAI's metric, through edgeinfer) at prompts of 16 / 128 / 512 tokens, per format.
* ContinuousBatchingPipeline (``slots=8``, int4) aggregate tokens/s at 1 / 4 / 8 sequences at once.

Models: the trained test model and a random-init Qwen3 of ~200 M parameters (``random_qwen3``).
Writes bench/results/openvino_llm.json and bench/results/openvino_llm.png.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, write  # noqa: E402

NEW_TOKENS = 64
REPEAT = 5
FORMATS = ("fp16", "w8a16", "w4a16")
TTFT_PROMPTS = (16, 128, 512)
BATCHES = (1, 4, 8)
CTX = 640
PROPS = {"INFERENCE_NUM_THREADS": 1, "INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
OPTIONS = {"threads": 1, "precision": "f32", "kv_precision": "f32"}


def _prompt(n: int, salt: int = 0) -> list[int]:
    """``n`` token ids; a different ``salt`` changes the first token, so no runtime can reuse a KV prefix
    (GenAI's stateful LLMPipeline reuses the KV cache of a repeated prompt: TTFT 140 → 12 ms here)."""
    return [3 + (i * 37 + salt * 101) % 3000 for i in range(n)]


def _raw_rate(pipe, ids: list[int]) -> tuple[float, float]:
    import numpy as np
    import openvino as ov
    import openvino_genai as og

    g = pipe.get_generation_config()
    g.max_new_tokens, g.ignore_eos, g.do_sample = NEW_TOKENS, True, False

    class Streamer(og.StreamerBase):
        def write(self, token):
            return og.StreamingStatus.RUNNING

        def end(self):
            pass

    t0 = time.perf_counter()
    res = pipe.generate(ov.Tensor(np.asarray([ids], dtype=np.int64)), g, Streamer())
    wall = time.perf_counter() - t0
    return len(res.tokens[0]) / wall, 1e3 / res.perf_metrics.get_tpot().mean


def _edgeinfer_rate(gen, ids: list[int]) -> tuple[float, float]:
    from edgeinfer.contract.generation import GenerationOptions

    t0 = time.perf_counter()
    r = gen.generate_ids(ids, GenerationOptions(max_new_tokens=NEW_TOKENS, ignore_eos=True))
    wall = time.perf_counter() - t0
    return len(r.token_ids) / wall, r.metrics.decode_tokens_per_s


def _decoder_rate(decoder, ids: list[int]) -> tuple[float, float]:
    """The plugin's native loop alone (``generate_native`` with a no-op ``on_token``): no core loop."""
    from edgeinfer.contract.generation import GenerationOptions

    t0 = time.perf_counter()
    n = [0]

    def on_token(t: int) -> bool:
        n[0] += 1
        return True

    m = decoder.generate_native(ids, GenerationOptions(max_new_tokens=NEW_TOKENS, ignore_eos=True), on_token)
    return n[0] / (time.perf_counter() - t0), m["decode_tokens_per_s"]


def _interleaved(fns: dict, ids_list) -> dict:
    """Each engine in turn on each prompt, ``REPEAT`` rounds: drift of a shared machine hits all alike."""
    for fn in fns.values():
        fn(ids_list[0])  # warm-up
    runs: dict = {name: [] for name in fns}
    for r in range(REPEAT):
        for k, ids in enumerate(ids_list):
            for name, fn in fns.items():
                c0 = time.process_time()
                rate, genai = fn(_prompt(len(ids), salt=1 + r * 10 + k))
                runs[name].append((rate, genai, (time.process_time() - c0) / NEW_TOKENS))
    return {name: {"end_to_end_tokens_per_s": statistics.median(x[0] for x in rs),
                   "genai_decode_tokens_per_s": statistics.median(x[1] for x in rs),
                   "cpu_ms_per_token": 1e3 * statistics.median(x[2] for x in rs), "runs": len(rs)}
            for name, rs in runs.items()}


def _transformers(model_dir: Path, ids_list) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    from edgeinfer.contract import remote_code

    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32,
                                              trust_remote_code=remote_code.allowed(model_dir)).eval()
    out = {}
    from transformers import CompileConfig

    compiled = CompileConfig(mode="default")  # reduce-overhead (CUDA graphs) is GPU-only
    compiled._compile_all_devices = True  # transformers compiles on CUDA/XPU only unless told otherwise
    for name, kw in (("transformers fp32 eager", {}),
                     ("transformers fp32 compiled (static cache)",
                      {"cache_implementation": "static", "compile_config": compiled})):
        def run(ids, kw=kw):
            t0 = time.perf_counter()
            with torch.inference_mode():
                o = hf.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                do_sample=False, pad_token_id=0, **kw)
            n = o.shape[1] - len(ids)
            return n / (time.perf_counter() - t0), float("nan")
        try:
            t0 = time.perf_counter()
            run(ids_list[0])  # warm-up (compiles for the static-cache run)
            warm = time.perf_counter() - t0
            rates = [run(ids)[0] for ids in ids_list for _ in range(REPEAT)]
            out[name] = {"end_to_end_tokens_per_s": statistics.median(rates), "warmup_s": warm}
        except Exception as e:  # torch.compile may be unavailable on a machine: say so
            out[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
        print(f"  {name}: {out[name]}", file=sys.stderr)
    return out


def run_model(model_dir: Path, label: str, work: Path) -> dict:
    import warnings

    import openvino_genai as og

    import edgeinfer
    from edgeinfer.contract.generation import GenerationOptions

    warnings.simplefilter("ignore")
    be = edgeinfer.backend("openvino")
    ids_list = [_prompt(8), _prompt(24)]
    result: dict = {"model": label, "new_tokens": NEW_TOKENS, "formats": {}, "ttft_ms": {}}
    for fmt in FORMATS:
        path = work / f"{model_dir.name}-{fmt}"
        t0 = time.perf_counter()
        facts = be.convert_decoder(model_dir, fmt, CTX, path, target="cpu")
        convert_s = time.perf_counter() - t0
        pipe = og.LLMPipeline(str(path), "CPU", **PROPS)
        with edgeinfer.load(path, backend="openvino", device="CPU", ctx=CTX, **OPTIONS) as gen:
            both = _interleaved({"raw LLMPipeline": lambda ids, p=pipe: _raw_rate(p, ids),
                                 "edgeinfer": lambda ids, g=gen: _edgeinfer_rate(g, ids),
                                 "edgeinfer decoder only": lambda ids, g=gen: _decoder_rate(g.decoder, ids)},
                                ids_list)
            raw, ei = both["raw LLMPipeline"], both["edgeinfer"]
            ttft = {}
            two = GenerationOptions(max_new_tokens=2, ignore_eos=True)
            for n in TTFT_PROMPTS:
                gen.generate_ids(_prompt(n, salt=99), two)
                ttft[n] = statistics.median(gen.generate_ids(_prompt(n, salt=100 + r), two).metrics.ttft_ms
                                            for r in range(REPEAT))
        del pipe
        overhead = 1 - ei["end_to_end_tokens_per_s"] / raw["end_to_end_tokens_per_s"]
        result["formats"][fmt] = {"raw LLMPipeline": raw, "edgeinfer": ei, "edgeinfer_overhead": overhead,
                                  "edgeinfer_cpu_overhead": ei["cpu_ms_per_token"] / raw["cpu_ms_per_token"] - 1,
                                  "edgeinfer decoder only": both["edgeinfer decoder only"],
                                  "plugin_overhead": 1 - both["edgeinfer decoder only"]["end_to_end_tokens_per_s"]
                                  / raw["end_to_end_tokens_per_s"],
                                  "convert_s": convert_s, "weight_compression": facts["weight_compression"],
                                  "ir_bytes": (path / "openvino_model.bin").stat().st_size}
        result["ttft_ms"][fmt] = ttft
        print(f"{label} {fmt}: raw {raw['end_to_end_tokens_per_s']:.1f} tok/s, edgeinfer "
              f"{ei['end_to_end_tokens_per_s']:.1f} tok/s (overhead {overhead:.1%}), TTFT {ttft}", file=sys.stderr)
    result["transformers"] = _transformers(model_dir, ids_list)
    result["continuous_batching"] = _batching(be, work / f"{model_dir.name}-w4a16")
    return result


def _batching(be, path: Path) -> dict:
    from edgeinfer.contract.generation import GenerationOptions

    d = be.load_decoder(path, device="CPU", context=CTX, slots=max(BATCHES), threads=1)
    out = {}
    try:
        opts = GenerationOptions(max_new_tokens=NEW_TOKENS, ignore_eos=True)
        d.generate_native_batch([(_prompt(16), opts)], lambda i, t: True)  # warm-up
        for n in BATCHES:
            count = [0]

            def on_token(i: int, t: int, count=count) -> bool:
                count[0] += 1
                return True

            t0 = time.perf_counter()
            d.generate_native_batch([(_prompt(16, salt=n * 10 + i), opts) for i in range(n)], on_token)
            wall = time.perf_counter() - t0
            out[n] = {"aggregate_tokens_per_s": count[0] / wall, "tokens": count[0]}
            print(f"  continuous batching x{n}: {out[n]['aggregate_tokens_per_s']:.1f} tok/s", file=sys.stderr)
    finally:
        d.close()
    return out


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 3, figsize=(15, 4 * len(results)), squeeze=False)
    for row, r in zip(axes, results):
        names, vals = [], []
        for fmt, f in r["formats"].items():
            names += [f"raw {fmt}", f"edgeinfer {fmt}"]
            vals += [f["raw LLMPipeline"]["end_to_end_tokens_per_s"], f["edgeinfer"]["end_to_end_tokens_per_s"]]
        for name, t in r["transformers"].items():
            if "end_to_end_tokens_per_s" in t:
                names.append(name.replace("transformers ", "HF ").replace(" (static cache)", ""))
                vals.append(t["end_to_end_tokens_per_s"])
        row[0].barh(names, vals)
        row[0].set_title(f"{r['model']}: tokens/s (1 thread)")
        for fmt, t in r["ttft_ms"].items():
            row[1].plot(list(map(int, t)), list(t.values()), marker="o", label=fmt)
        row[1].set_title("TTFT (ms) vs prompt tokens")
        row[1].legend()
        cb = r["continuous_batching"]
        row[2].bar([str(k) for k in cb], [v["aggregate_tokens_per_s"] for v in cb.values()])
        row[2].set_title("ContinuousBatchingPipeline int4: aggregate tok/s vs sequences")
    fig.tight_layout()
    fig.savefig(path, dpi=80)


class _OwnTime:
    """Splits the CPU time of edgeinfer's requests into the runtime's and edgeinfer's own: the calling
    thread's CPU outside ``LLMPipeline.generate`` plus the CPU of edgeinfer's per-token callback inside
    it, over the process's CPU for the whole request. A decomposition of the same requests in CPU
    seconds, so other jobs on the machine (which steal wall time, not CPU time) do not blur it."""

    def __init__(self, decoder) -> None:
        self.total = self.in_runtime = self.callbacks = self.caller = 0.0
        pipe, native = decoder._pipe, decoder.generate_native

        class Timed:
            def generate(_self, *a):
                t = time.thread_time()
                try:
                    return pipe.generate(*a)
                finally:
                    self.in_runtime += time.thread_time() - t

        def generate_native(ids, options, on_token):
            def timed(tok):
                t = time.thread_time()
                try:
                    return on_token(tok)
                finally:
                    self.callbacks += time.thread_time() - t
            return native(ids, options, timed)

        decoder._pipe, decoder.generate_native = Timed(), generate_native

    def run(self, fn, gen, ids):
        t, c = time.thread_time(), time.process_time()
        try:
            return fn(gen, ids)
        finally:
            self.caller += time.thread_time() - t
            self.total += time.process_time() - c

    def share(self) -> float:
        return (self.caller - self.in_runtime + self.callbacks) / self.total


def overhead_only(repeat: int) -> None:
    import openvino_genai as og

    import edgeinfer
    from edgeinfer.testing.llm import model_dir

    global REPEAT
    REPEAT = repeat
    be, formats = edgeinfer.backend("openvino"), {}
    ids_list = [_prompt(8), _prompt(24)]
    with tempfile.TemporaryDirectory(prefix="bench-ov-llm-") as tmp:
        for fmt in FORMATS:
            path = Path(tmp) / fmt
            be.convert_decoder(model_dir(), fmt, CTX, path, target="cpu")
            pipe = og.LLMPipeline(str(path), "CPU", **PROPS)
            with edgeinfer.load(path, backend="openvino", device="CPU", ctx=CTX, **OPTIONS) as gen:
                own = _OwnTime(gen.decoder)
                both = _interleaved({"raw LLMPipeline": lambda ids, p=pipe: _raw_rate(p, ids),
                                     "edgeinfer": lambda ids, g=gen: own.run(_edgeinfer_rate, g, ids)}, ids_list)
            raw, ei = both["raw LLMPipeline"], both["edgeinfer"]
            wall = 1 - ei["end_to_end_tokens_per_s"] / raw["end_to_end_tokens_per_s"]
            formats[fmt] = {**both, "edgeinfer_overhead": wall,
                            "edgeinfer_cpu_overhead": ei["cpu_ms_per_token"] / raw["cpu_ms_per_token"] - 1,
                            "edgeinfer_own_time_share": own.share()}
            print(f"{fmt}: wall overhead {wall:.1%}, CPU-time overhead {formats[fmt]['edgeinfer_cpu_overhead']:.1%}, "
                  f"edgeinfer's own share of the requests' CPU time {own.share():.2%}", file=sys.stderr)
    write("openvino_llm_overhead", {"model": "tiny-qwen3 (trained, 4 layers)", "new_tokens": NEW_TOKENS,
                                    "repeat": repeat, "formats": formats,
                                    "note": "CPU only, 1 inference thread; interleaved request by request"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny-only", action="store_true", help="skip the random-init ~200 M model")
    ap.add_argument("--overhead-only", type=int, metavar="REPEAT",
                    help="only edgeinfer vs raw LLMPipeline on the test model, REPEAT rounds; writes "
                         "openvino_llm_overhead.json")
    args = ap.parse_args()
    if args.overhead_only:
        return overhead_only(args.overhead_only)
    from edgeinfer.testing.llm import model_dir, random_qwen3

    with tempfile.TemporaryDirectory(prefix="bench-ov-llm-") as tmp:
        results = [run_model(model_dir(), "tiny-qwen3 (trained, 4 layers)", Path(tmp))]
        if not args.tiny_only:
            global REPEAT
            REPEAT = 2  # ~200 M parameters on one thread: fewer rounds keep the run within minutes
            results.append(run_model(random_qwen3(), "random-init qwen3 (~204 M)", Path(tmp)))
    write("openvino_llm", {"results": results, "note": "CPU only (no NPU/GPU here), shared 2-core machine, "
                           "1 inference thread everywhere; see the docstring for what each figure is"})
    plot(results, RESULTS / "openvino_llm.png")


if __name__ == "__main__":
    main()
