"""``edgeinfer serve`` on a decoder: continuous batching vs the same requests one at a time.

Starts a real server on loopback (``--slots`` = the highest concurrency, ``--threads 1``) and sends the same
set of streamed completion requests (``max_tokens`` tokens each, ``ignore_eos``, greedy) 1, 4, 8 and 16 at
a time. Per level: aggregate generated tokens/s (all tokens / wall time), per-stream TPOT (mean time
between a stream's tokens after its first) and TTFT p50/p99 (send → first token), against level 1, which
is "one at a time". Models: the committed tiny-qwen3, and with ``--big`` the random-init ~204 M
parameter Qwen3 of ``edgeinfer.testing.llm.random_qwen3`` served from its directory (transformers), and the
same shape with a 3200-wide MLP (~210 M) deployed for board ``host`` (an onnxruntime bundle, batched
decode). For comparison, the tiny model's same prompts through raw
``openvino_genai.ContinuousBatchingPipeline`` (fp32 IR, 1 thread, no HTTP).

    python bench/serve_llm.py [--levels 1,4,8,16] [--requests 16] [--max-tokens 64] [--big]
    python bench/serve_llm.py --openvino
    python bench/serve_llm.py --host --levels 1,4,16 [--prefill-chunk N] [--label after]

Writes bench/results/serve_llm.json and serve_llm.png. With ``--openvino``, instead: the tiny model
deployed for core-ultra-155h (an OpenVINO fp16 decoder bundle, run on this CPU), served through the
worker's native scheduler over GenAI's ContinuousBatchingPipeline (``--slots`` = the highest level);
writes bench/results/serve_llm_openvino.json. With ``--host``, instead: the ~160 M random Qwen3 of
``bench/decoder_footprint.py`` deployed for board host (onnxruntime), writing
bench/results/serve_llm_host[-LABEL].json.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

from edgeinfer.contract.measure import latency_stats  # noqa: E402

WORDS = ("the river city morning village children market winter music garden school story mountain light "
         "road summer").split()


def prompts(n: int) -> list[str]:
    return [" ".join(WORDS[(i * 5 + k * 3) % len(WORDS)] for k in range(12 + i % 5)) for i in range(n)]


async def one(client, url: str, model: str, prompt: str, max_tokens: int) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    row = await _common.timed_stream(client, url, "/v1/completions", body)
    assert row["tokens"] == max_tokens, (row["tokens"], max_tokens)
    return row


async def level(url: str, model: str, texts: list[str], concurrency: int, max_tokens: int) -> dict:
    import httpx

    gate = asyncio.Semaphore(concurrency)

    async def gated(client, p: str) -> dict:
        async with gate:
            return await one(client, url, model, p, max_tokens)

    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0),
                                 limits=httpx.Limits(max_connections=concurrency + 2)) as client:
        t0 = time.perf_counter()
        rows = await asyncio.gather(*(gated(client, p) for p in texts))
        wall = time.perf_counter() - t0
    tokens = sum(r["tokens"] for r in rows)
    ttft = latency_stats([r["ttft_s"] * 1e3 for r in rows])
    tpot = latency_stats([r["tpot_s"] * 1e3 for r in rows])
    return {"concurrency": concurrency, "requests": len(rows), "generated_tokens": tokens, "wall_s": round(wall, 3),
            "aggregate_tokens_per_s": round(tokens / wall, 2), "ttft_ms_p50": round(ttft["p50"], 2),
            "ttft_ms_p99": round(ttft["p99"], 2), "tpot_ms_mean": round(tpot["mean"], 3),
            "tpot_ms_p50": round(tpot["p50"], 3), "tpot_ms_p99": round(tpot["p99"], 3)}


def run_model(model_dir: Path, label: str, levels: list[int], n_requests: int, max_tokens: int, ctx: int,
              work: Path, extra: tuple[str, ...] = ()) -> dict:
    from edgeinfer.testing.serve import ServerProc

    texts = prompts(n_requests)
    log = work / f"{label}.log"
    with ServerProc([model_dir], "--slots", str(max(levels)), "--ctx", str(ctx), "--threads", "1",
                    "--max-queue", str(n_requests), *extra, log=log) as server:
        asyncio.run(level(server.url, model_dir.name, texts[:2], 2, 8))  # warm-up
        rows = []
        for c in levels:
            row = asyncio.run(level(server.url, model_dir.name, texts, c, max_tokens))
            print(f"{label} c={c}: {row['aggregate_tokens_per_s']} tok/s, TTFT p50 {row['ttft_ms_p50']} ms, "
                  f"TPOT {row['tpot_ms_mean']} ms", file=sys.stderr)
            rows.append(row)
        started = next((ln for ln in server.output().splitlines() if "reserved at start" in ln), "")
    base = rows[0]["aggregate_tokens_per_s"]
    for r in rows:
        r["speedup_vs_one_at_a_time"] = round(r["aggregate_tokens_per_s"] / base, 2)
    return {"model": label, "path": str(model_dir), "ctx": ctx, "slots": max(levels), "max_tokens": max_tokens,
            "requests_per_level": n_requests, "kv_line": started.split(" INFO ")[-1], "levels": rows}


OV_PROPS = {"INFERENCE_NUM_THREADS": 1, "INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}


def raw_continuous_batching(model_dir: Path, levels: list[int], n_requests: int, max_tokens: int, ctx: int,
                            work: Path) -> dict:
    """The same prompts through raw ``openvino_genai.ContinuousBatchingPipeline`` (the model converted to an
    fp32 OpenVINO IR by the openvino backend; 1 thread, f32 precision and KV): at level c, the requests go
    in waves of c prompts per ``generate`` call (no HTTP)."""
    import openvino_genai as og

    import edgeinfer

    path = work / f"{model_dir.name}-ov-fp32"
    edgeinfer.backend("openvino").convert_decoder(model_dir, "fp32", ctx, path, target="cpu")
    sched = og.SchedulerConfig()
    sched.max_num_seqs, sched.num_kv_blocks = max(levels), max(levels) * -(-ctx // 32)
    sched.max_num_batched_tokens, sched.dynamic_split_fuse, sched.enable_prefix_caching = 256, True, False
    pipe = og.ContinuousBatchingPipeline(str(path), sched, "CPU", OV_PROPS)
    cfg = og.GenerationConfig()
    cfg.max_new_tokens, cfg.ignore_eos, cfg.do_sample = max_tokens, True, False
    texts = prompts(n_requests)
    pipe.generate(texts[:2], [cfg, cfg])  # warm-up
    rows = []
    for c in levels:
        t0 = time.perf_counter()
        for i in range(0, len(texts), c):
            wave = texts[i : i + c]
            pipe.generate(wave, [cfg] * len(wave))
        wall = time.perf_counter() - t0
        rows.append({"concurrency": c, "aggregate_tokens_per_s": round(len(texts) * max_tokens / wall, 2)})
        print(f"raw ContinuousBatchingPipeline c={c}: {rows[-1]['aggregate_tokens_per_s']} tok/s", file=sys.stderr)
    base = rows[0]["aggregate_tokens_per_s"]
    for r in rows:
        r["speedup_vs_one_at_a_time"] = round(r["aggregate_tokens_per_s"] / base, 2)
    return {"what": "openvino_genai.ContinuousBatchingPipeline, fp32 IR, 1 thread, waves of c prompts",
            "levels": rows}


def openvino_bundle(work: Path) -> Path:
    from edgeinfer.deploy.decoder import deploy_decoder
    from edgeinfer.testing import llm

    out = work / "tiny-qwen3-ov"
    deploy_decoder(llm.model_dir(), "core-ultra-155h", out, ctx=256)  # the conversion is cached
    return out


def host_bundle(model_dir: Path, work: Path) -> Path:
    """``model_dir`` deployed for the host board: an onnxruntime decoder bundle (fp32, golden-checked), whose
    ``decode`` runs all slots in one batched call."""
    from edgeinfer.deploy.decoder import deploy_decoder

    out = work / f"{model_dir.name}-host"
    deploy_decoder(model_dir, "host", out, ctx=256)  # the conversion is cached
    return out


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 3, figsize=(13, 3.6 * len(results)), squeeze=False)
    for row, res in zip(axes, results):
        cs = [r["concurrency"] for r in res["levels"]]
        row[0].plot(cs, [r["aggregate_tokens_per_s"] for r in res["levels"]], "o-", label="edgeinfer serve")
        if "levels" in res.get("raw_continuous_batching", {}):
            raw = res["raw_continuous_batching"]["levels"]
            row[0].plot([r["concurrency"] for r in raw], [r["aggregate_tokens_per_s"] for r in raw], "s--",
                        label="raw OpenVINO CB (no HTTP)")
        row[0].legend()
        row[0].set_title(f"{res['model']}: aggregate generated tok/s")
        row[1].plot(cs, [r["tpot_ms_mean"] for r in res["levels"]], "o-")
        row[1].set_title("per-stream TPOT (ms)")
        row[2].plot(cs, [r["ttft_ms_p50"] for r in res["levels"]], "o-", label="p50")
        row[2].plot(cs, [r["ttft_ms_p99"] for r in res["levels"]], "s--", label="p99")
        row[2].set_title("TTFT (ms)")
        row[2].legend()
        for ax in row:
            ax.set_xlabel("concurrent streams")
            ax.set_xticks(cs)
            ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="1,4,8,16")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--big", action="store_true", help="also the random-init ~204 M Qwen3")
    ap.add_argument("--openvino", action="store_true", help="only the tiny model as an OpenVINO decoder bundle")
    ap.add_argument("--host", action="store_true", help="only the ~160 M random Qwen3 deployed for board host")
    ap.add_argument("--prefill-chunk", type=int, help="with --host: serve's --prefill-chunk")
    ap.add_argument("--label", default="", help="with --host: suffix of the result file (e.g. before / after)")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    from edgeinfer.testing import llm

    if args.host:
        import os

        extra = ("--prefill-chunk", str(args.prefill_chunk)) if args.prefill_chunk else ()
        with tempfile.TemporaryDirectory() as tmp:
            model = llm.random_qwen3(layers=12, hidden=1024, heads=16, kv_heads=8, intermediate=3200)
            res = run_model(host_bundle(model, Path(tmp)), "random-qwen3-160M-onnxruntime", levels, args.requests,
                            args.max_tokens, 256, Path(tmp), extra)
        _common.write("serve_llm_host" + (f"-{args.label}" if args.label else ""), {
            "note": "loopback, the ~160 M random Qwen3 (12 layers, hidden 1024, MLP 3200) deployed for board host "
                    "(onnxruntime fp32, 1 thread), greedy, ignore_eos; level 1 = the same requests one at a time; "
                    "a shared, loaded machine: compare runs made close together",
            "prefill_chunk": args.prefill_chunk, "load_average": [round(x, 2) for x in os.getloadavg()],
            "results": [res]})
        return
    if args.openvino:
        with tempfile.TemporaryDirectory() as tmp:
            res = run_model(openvino_bundle(Path(tmp)), "tiny-qwen3-ov", levels, args.requests, args.max_tokens,
                            256, Path(tmp))
        _common.write("serve_llm_openvino", {
            "note": "loopback, OpenVINO decoder bundle (tiny-qwen3 deployed for core-ultra-155h: fp16 IR, run on "
                    "the CPU, f32 inference, 1 thread) through GenAI's ContinuousBatchingPipeline, greedy, "
                    "ignore_eos; level 1 = the same requests one at a time", "results": [res]})
        return

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        results.append(run_model(llm.model_dir(), "tiny-qwen3", levels, args.requests, args.max_tokens, 256,
                                 Path(tmp)))
        try:
            results[0]["raw_continuous_batching"] = raw_continuous_batching(llm.model_dir(), levels, args.requests,
                                                                            args.max_tokens, 256, Path(tmp))
        except Exception as e:  # noqa: BLE001 - the comparison is optional; the serve figures stand alone
            results[0]["raw_continuous_batching"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        if args.big:
            big = llm.random_qwen3()
            results.append(run_model(big, "random-qwen3-204M", levels, args.requests, args.max_tokens, 256,
                                     Path(tmp)))
            # MLP width 3200, not 3072: onnxruntime-genai's builder mistakes a 3072-wide MLP projection for the
            # LM head when the vocabulary is 3072 too (the plugin refuses such a model: check_exportable)
            wide = llm.random_qwen3(intermediate=3200)
            results.append(run_model(host_bundle(wide, Path(tmp)), "random-qwen3-210M-onnxruntime", levels,
                                     args.requests, args.max_tokens, 256, Path(tmp)))
    _common.write("serve_llm", {"note": "loopback, transformers reference backend (fp32, 1 thread; the "
                                        "'-onnxruntime' row: intermediate 3200, deployed for board host, "
                                        "onnxruntime fp32, 1 thread), greedy, ignore_eos; level 1 = the same "
                                        "requests one at a time",
                                "results": results})
    plot(results, _common.RESULTS / "serve_llm.png")


if __name__ == "__main__":
    main()
