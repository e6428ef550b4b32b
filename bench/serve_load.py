"""Load test of ``edgeinfer serve``: all-MiniLM-L6-v2 on OpenVINO CPU, dynamic batching vs ``--max-batch 1``.

Loopback only. For 1, 8, 32 and 64 concurrent clients (each sending one sentence per request, back to
back, over a keep-alive connection) it measures throughput and p50/p99 latency, bounded in time
(``--seconds`` per level) and in requests (``--max-requests`` per level). The client is a minimal asyncio
HTTP/1.1 client so that the load generator takes as little of the machine's CPU as possible.

    python bench/serve_load.py [--seconds 8] [--clients 1,8,32,64]

Writes bench/results/serve_load.json and prints a summary.

    python bench/serve_load.py --static-buckets [--clients 32]

compares, on the same load, MiniLM deployed for core-ultra-155h (static shapes for the NPU; run on OpenVINO
CPU here) as one [1, 128] artifact (``--buckets none``) and with its (batch × seq) buckets, next to the dynamic
fp32 bundle above; writes bench/results/serve_load_buckets.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

from edgeinfer.contract.measure import latency_stats  # noqa: E402


async def _client(port: int, bodies: list[bytes], stop_at: float, budget: list[int], lat_ms: list[float],
                  errors: list[str], offset: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    i = offset
    try:
        while time.monotonic() < stop_at and budget[0] > 0:
            budget[0] -= 1
            body = bodies[i % len(bodies)]
            i += 1
            head = (f"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n").encode()
            t0 = time.perf_counter()
            writer.write(head + body)
            await writer.drain()
            raw = await reader.readuntil(b"\r\n\r\n")
            lines = raw.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            length = next(int(ln.split(":", 1)[1]) for ln in lines[1:] if ln.lower().startswith("content-length:"))
            payload = await reader.readexactly(length)
            lat_ms.append((time.perf_counter() - t0) * 1e3)
            if status != 200 or not payload.startswith(b'{"object":"list"'):
                errors.append(f"{status}: {payload[:200]!r}")
    finally:
        writer.close()


async def _level(port: int, clients: int, seconds: float, max_requests: int, bodies: list[bytes]) -> dict:
    # warm-up (not measured): a second at this concurrency
    await asyncio.gather(*[_client(port, bodies, time.monotonic() + 1.0, [10**9], [], [], k) for k in range(clients)])
    lat: list[float] = []
    errors: list[str] = []
    budget = [max_requests]
    t0 = time.perf_counter()
    stop_at = time.monotonic() + seconds
    await asyncio.gather(*[_client(port, bodies, stop_at, budget, lat, errors, 97 * k) for k in range(clients)])
    wall = time.perf_counter() - t0
    stats = latency_stats(lat) if lat else {}
    return {"clients": clients, "requests": len(lat), "errors": len(errors), "first_errors": errors[:3],
            "seconds": round(wall, 3), "throughput_rps": round(len(lat) / wall, 1),
            "latency_ms": {k: round(v, 2) for k, v in stats.items()}}


def _batch_stats(port: int) -> dict:
    import httpx

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    vals = {}
    for line in text.splitlines():
        for name in ("edgeinfer_batch_size_sum", "edgeinfer_batch_size_count"):
            if line.startswith(name + "{"):
                vals[name] = vals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    n = vals.get("edgeinfer_batch_size_count", 0.0)
    return {"runs": int(n), "mean_rows_per_run": round(vals.get("edgeinfer_batch_size_sum", 0.0) / n,
                                                       2) if n else None}


def _measure(servers: dict, levels: list[int], args: argparse.Namespace, bodies: list[bytes]) -> dict[str, list]:
    """Every mode at every level, ``args.rounds`` times, modes interleaved; per level the best round."""
    rounds: dict[str, list[list[dict]]] = {m: [] for m in servers}
    for r in range(args.rounds):  # modes interleaved per level: background load hits both alike
        for mode in servers:
            rounds[mode].append([])
        for clients in levels:
            for mode, server in servers.items():
                before = _batch_stats(server.port)
                row = asyncio.run(_level(server.port, clients, args.seconds, args.max_requests, bodies))
                row["model_runs"] = _batch_stats(server.port)["runs"] - before["runs"]
                rounds[mode][-1].append(row)
                print(f"round {r} {mode:12s} clients={clients:3d}  {row['throughput_rps']:7.1f} req/s  "
                      f"p50 {row['latency_ms'].get('p50', float('nan')):7.1f} ms  "
                      f"p99 {row['latency_ms'].get('p99', float('nan')):7.1f} ms  errors {row['errors']}  "
                      f"runs {row['model_runs']}", flush=True)
    best = {m: [max((rd[i] for rd in rounds[m]), key=lambda x: x["throughput_rps"]) for i in range(len(levels))]
            for m in servers}
    return {"results": best, "all_rounds": rounds}


def static_buckets(args: argparse.Namespace, levels: list[int]) -> None:
    """Single-shape static bundle vs bucketed static bundle (vs the dynamic one) under the same load."""
    from edgeinfer.deploy.encoder import deploy
    from edgeinfer.testing import minilm
    from edgeinfer.testing.fixtures import _cached_export
    from edgeinfer.testing.serve import ServerProc, minilm_bundle

    bodies = [json.dumps({"input": s, "model": "minilm-ov"}).encode() for s in minilm.sentences()]
    tmp = Path(tempfile.mkdtemp(prefix="serve-buckets-"))
    bundles = {"static_1x128": tmp / "single" / "minilm-ov", "static_buckets": tmp / "buckets" / "minilm-ov"}
    deploy(minilm.model_dir(), "core-ultra-155h", bundles["static_1x128"], buckets="none")
    result = deploy(minilm.model_dir(), "core-ultra-155h", bundles["static_buckets"])
    bundles["dynamic_fp32"] = minilm_bundle(_cached_export("minilm-dynamic", None, None), tmp / "dyn" / "minilm-ov")
    servers = {mode: ServerProc([path], "--max-batch", "32", "--batch-window-ms", str(args.window_ms),
                                "--max-queue", "4096", log=tmp / f"{mode}.log") for mode, path in bundles.items()}
    try:
        measured = _measure(servers, levels, args, bodies)
    finally:
        for server in servers.values():
            server.terminate()
    rps = {m: {str(r["clients"]): r["throughput_rps"] for r in rows} for m, rows in measured["results"].items()}
    gain = {c: round(rps["static_buckets"][c] / rps["static_1x128"][c], 2) if rps["static_1x128"][c] else None
            for c in rps["static_buckets"]}
    _common.write("serve_load_buckets", {
        "model": "sentence-transformers/all-MiniLM-L6-v2 deployed for core-ultra-155h (fp16, static shapes for the "
                 "NPU; served on OpenVINO CPU here: no NPU on this machine)",
        "modes": {"static_1x128": "edgeinfer deploy --buckets none: one [1, 128] artifact",
                  "static_buckets": "edgeinfer deploy (auto buckets): "
                                    + " ".join(f"{i['batch']}x{i['seq']}" for i in result.manifest.buckets["items"]),
                  "dynamic_fp32": "the dynamic fp32 bundle of serve_load.json (reference)"},
        "buckets_chosen_by": result.manifest.buckets["chosen_by"],
        "request": "one sentence per request (POST /v1/embeddings), keep-alive, loopback",
        "settings": {"seconds_per_level": args.seconds, "max_requests_per_level": args.max_requests,
                     "batch_window_ms": args.window_ms, "max_batch": 32, "workers": 1, "rounds": args.rounds},
        **measured,
        "throughput_rps": rps,
        "throughput_gain_buckets_vs_1x128": gain,
        "note": "machine (2 cores) shared with other jobs while measuring; per level the best of the rounds",
    })
    print("req/s:", rps, "gain (buckets / 1x128):", gain)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds per concurrency level")
    ap.add_argument("--max-requests", type=int, default=5000, help="most requests per level")
    ap.add_argument("--clients", default="1,8,32,64")
    ap.add_argument("--window-ms", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2, help="repeats of every level (best round reported)")
    ap.add_argument("--static-buckets", action="store_true",
                    help="compare static single-shape vs bucketed bundles (serve_load_buckets.json)")
    args = ap.parse_args()
    levels = [int(c) for c in args.clients.split(",")]
    if args.static_buckets:
        static_buckets(args, levels)
        return

    from edgeinfer.testing import minilm
    from edgeinfer.testing.fixtures import _cached_export
    from edgeinfer.testing.serve import ServerProc, minilm_bundle

    sentences = minilm.sentences()
    bodies = [json.dumps({"input": s, "model": "minilm-ov"}).encode() for s in sentences]
    tmp = Path(tempfile.mkdtemp(prefix="serve-load-"))
    bundle = minilm_bundle(_cached_export("minilm-dynamic", None, None), tmp / "minilm-ov", "openvino")

    modes = {"batched": ["--max-batch", "32"], "max_batch_1": ["--max-batch", "1"]}
    servers = {mode: ServerProc([bundle], *extra, "--batch-window-ms", str(args.window_ms), "--max-queue", "4096",
                                log=tmp / f"{mode}.log") for mode, extra in modes.items()}
    try:
        measured = _measure(servers, levels, args, bodies)
    finally:
        for server in servers.values():
            server.terminate()
    results, rounds = measured["results"], measured["all_rounds"]

    speedup = {}
    for b, u in zip(results["batched"], results["max_batch_1"]):
        speedup[str(b["clients"])] = round(b["throughput_rps"] / u["throughput_rps"],
                                           2) if u["throughput_rps"] else None
    data = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 (fp32, OpenVINO CPU, dynamic batch and sequence)",
        "request": "one sentence per request (POST /v1/embeddings), keep-alive, loopback",
        "settings": {"seconds_per_level": args.seconds, "max_requests_per_level": args.max_requests,
                     "batch_window_ms": args.window_ms, "workers": 1,
                     "rounds": args.rounds},
        "results": results,
        "all_rounds": rounds,
        "note": "machine shared with other jobs while measuring; per level the best of the rounds is reported",
        "throughput_speedup_batched_vs_max_batch_1": speedup,
        "target": "at least 3x throughput at 32 clients",
        "target_met_at_32": (speedup.get("32") or 0) >= 3.0,
    }
    _common.write("serve_load", data)
    print("speedup (batched / max-batch 1):", speedup)


if __name__ == "__main__":
    main()
