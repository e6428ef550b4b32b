"""bench/fleet.py ``--decoder`` and ``--autoscale`` (its docstring says what they measure)."""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
from serve_llm import prompts  # noqa: E402

from edgeinfer.contract.measure import latency_stats  # noqa: E402

MODEL = "tiny-qwen3-host"
REPLICA = "ServeReplica:edgeinfer:bundle-"


def bundle(work: Path) -> Path:
    from edgeinfer.deploy.decoder import deploy_decoder
    from edgeinfer.testing import llm

    out = work / MODEL
    deploy_decoder(llm.model_dir(), "host", out, ctx=256)  # the conversion is cached
    return out


def body(prompt: str, max_tokens: int) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


async def chat(client: Any, url: str, prompt: str, max_tokens: int) -> dict:
    """One streamed chat: TTFT (send → first content), TPOT (mean gap between chunks after the first)."""
    row = await _common.timed_stream(client, url, "/v1/chat/completions", body(prompt, max_tokens))
    assert row["tokens"] == max_tokens, (row["tokens"], max_tokens)
    return row


async def level(url: str, texts: list[str], concurrency: int, max_tokens: int) -> list[dict]:
    import httpx

    gate = asyncio.Semaphore(concurrency)

    async def gated(client: Any, p: str) -> dict:
        async with gate:
            return await chat(client, url, p, max_tokens)

    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        return list(await asyncio.gather(*(gated(client, p) for p in texts)))


def summary(rows: list[dict]) -> dict:
    ttft = latency_stats([r["ttft_s"] * 1e3 for r in rows])
    return {"streams": len(rows), "ttft_ms_p50": round(ttft["p50"], 2), "ttft_ms_p99": round(ttft["p99"], 2),
            "tpot_ms_mean": round(statistics.fmean(r["tpot_s"] * 1e3 for r in rows), 3)}


def decoder(args: Any) -> None:
    from edgeinfer.testing.serve import ServerProc

    work = Path(tempfile.mkdtemp(prefix="fleet-decoder-bench-"))
    path, levels = bundle(work), [int(c) for c in args.streams.split(",")]
    common = ("--slots", str(max(levels)), "--threads", "1")
    texts = prompts(args.requests)
    modes = {"single_box": [], "ray": ["--ray", "auto", "--replicas", "1"]}
    servers = {m: ServerProc([path], *common, *extra, log=work / f"{m}.log") for m, extra in modes.items()}
    rows: dict[str, dict[int, list[dict]]] = {m: {c: [] for c in levels} for m in modes}
    try:
        for m, server in servers.items():
            asyncio.run(level(server.url, texts[:2], 2, 8))  # warm-up
        for r in range(args.rounds):  # in turns: the machine's load falls on both alike
            for c in levels:
                for m, server in servers.items():
                    rows[m][c] += asyncio.run(level(server.url, texts, c, args.max_tokens))
                    print(f"round {r + 1} {m:10s} streams={c}: {summary(rows[m][c])}", file=sys.stderr)
    finally:
        for server in servers.values():
            server.terminate()
    results = {m: [{"concurrency": c, **summary(rows[m][c])} for c in levels] for m in modes}
    one = {m: next(x for x in results[m] if x["concurrency"] == levels[0]) for m in modes}
    added = {k: round(one["ray"][k] - one["single_box"][k], 3) for k in ("ttft_ms_p50", "ttft_ms_p99",
                                                                         "tpot_ms_mean")}
    _common.write("fleet_decoder", {
        "model": "the committed tiny-qwen3 (edgeinfer.testing.llm) for board host: onnxruntime fp32, ctx 256",
        "request": f"streamed chat (POST /v1/chat/completions), greedy, ignore_eos, {args.max_tokens} tokens",
        "settings": {"slots": max(levels), "threads": 1, "ray_replicas": 1, "streams_per_level_and_round":
                     args.requests, "rounds": args.rounds},
        "results": results, f"ray_added_at_{levels[0]}_stream": added,
        "note": "2-core machine shared with other jobs; both servers run at once and are measured in turns"})
    print("Ray's added latency at", levels[0], "stream(s) (ms):", added)


def replicas(pid: int) -> int:
    """Serve replicas of a bundle among process ``pid``'s descendants (Ray titles them ServeReplica:...)."""
    import psutil

    n = 0
    for p in psutil.Process(pid).children(recursive=True):
        try:
            n += REPLICA in " ".join(p.cmdline())
        except psutil.Error:
            pass
    return n


def autoscale(args: Any) -> None:
    import httpx

    from edgeinfer.fleet.router import AUTOSCALING_ENV
    from edgeinfer.testing.serve import ServerProc

    work = Path(tempfile.mkdtemp(prefix="fleet-autoscale-bench-"))
    path, texts = bundle(work), prompts(8)
    server = ServerProc([path], "--ray", "auto", "--replicas", "auto", "--max-replicas", str(args.max_replicas),
                        "--slots", "1", "--threads", "1", log=work / "ray.log", env={AUTOSCALING_ENV: args.timing})
    counts: list[tuple[float, int]] = []
    statuses: list[str] = []
    stop = threading.Event()

    def client(i: int) -> None:
        with httpx.Client(timeout=120) as http:
            while not stop.is_set():
                try:
                    with http.stream("POST", server.url + "/v1/chat/completions",
                                     json=body(texts[i % len(texts)], args.max_tokens)) as r:
                        events = [ln[len("data: "):] for ln in r.iter_lines() if ln.startswith("data: ")]
                    ok = r.status_code == 200 and events[-1:] == ["[DONE]"] and not any(
                        e.startswith('{"error"') for e in events)
                    statuses.append("200" if ok else f"{r.status_code} error event")
                except httpx.HTTPError as e:
                    statuses.append(type(e).__name__)

    t0 = time.monotonic()
    try:
        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.load_clients)]
        for t in threads:
            t.start()
        while time.monotonic() - t0 < args.load_s:
            counts.append((round(time.monotonic() - t0, 2), replicas(server.proc.pid)))
            time.sleep(0.25)
        stop.set()
        stopped = time.monotonic() - t0
        for t in threads:
            t.join()
        while time.monotonic() - t0 < args.load_s + args.idle_s:
            counts.append((round(time.monotonic() - t0, 2), replicas(server.proc.pid)))
            if counts[-1][1] == 1:
                break
            time.sleep(0.25)
    finally:
        stop.set()
        server.terminate()
    up = next((t for t, n in counts if n == args.max_replicas), None)
    down = next((t for t, n in counts if t > stopped and n == 1), None)
    data = {"model": MODEL, "settings": {"max_replicas": args.max_replicas, "slots": 1, "target_ongoing_requests": 1,
                                         "load_clients": args.load_clients, "load_s": args.load_s,
                                         "max_tokens": args.max_tokens, "timing": json.loads(args.timing)},
            "up_s": up, "load_stopped_s": round(stopped, 2),
            "down_s_after_load_stopped": round(down - stopped, 2) if down is not None else None,
            "max_seen": max(n for _, n in counts),
            "requests": {"sent": len(statuses), "answered": statuses.count("200"),
                         "failed": dict(Counter(s for s in statuses if s != "200"))},
            "replicas_over_time": counts}
    _common.write("fleet_autoscale", data)
    print({k: v for k, v in data.items() if k != "replicas_over_time"})
