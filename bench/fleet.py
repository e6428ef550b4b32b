"""Ray Serve vs the single-box server: all-MiniLM-L6-v2 (onnxruntime CPU) behind ``edgeinfer serve`` and behind
``edgeinfer serve --ray auto --replicas 2`` on this one machine, loopback only.

For 1, 8 and 32 concurrent clients (one sentence per request, back to back, keep-alive; the load generator of
bench/serve_load.py) it measures throughput and p50/p99 latency of both, and Ray's added latency per request
as the difference of the 1-client latencies (no queueing at one client). The Ray path runs each request on
its own (no dynamic batching across requests); the single-box server batches.

    python bench/fleet.py [--seconds 5] [--clients 1,8,32]

Writes bench/results/fleet.json and prints a summary.

``--decoder``: the committed tiny-qwen3 deployed for board host (onnxruntime fp32, ctx 256) behind
``edgeinfer serve`` and ``edgeinfer serve --ray auto --replicas 1`` (same ``--slots``, ``--threads 1``), both
running, measured in turns (box, Ray, box, Ray, ... ``--rounds``): greedy streamed chats (``ignore_eos``,
``--max-tokens`` each) at 1 and a few concurrent streams; TTFT p50/p99 (send → first content) and TPOT
(mean time between a stream's tokens after its first), and Ray's added latency as the differences at 1
stream. Writes bench/results/fleet_decoder.json.

``--autoscale``: the same bundle under ``serve --ray auto --replicas auto --max-replicas M --slots 1`` with
the autoscaler's timing shortened (EDGEINFER_RAY_AUTOSCALING, ``--timing``): ``--load-clients`` stream chats back
to back for ``--load-s`` seconds, then stop; the replica count (the server's Serve replica processes) is
sampled every 0.25 s until it is back at 1 (at most ``--idle-s``). Writes bench/results/fleet_autoscale.json
with the count over time, the times to reach M and back to 1, and the requests sent / answered / failed.

    python bench/fleet.py --decoder [--streams 1,4] [--requests 8] [--max-tokens 48] [--rounds 2]
    python bench/fleet.py --autoscale [--max-replicas 2] [--load-clients 4] [--load-s 20]
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
from serve_load import _level  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="measured seconds per concurrency level")
    ap.add_argument("--max-requests", type=int, default=5000, help="most requests per level")
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--decoder", action="store_true", help="streamed chat, tiny decoder: Ray vs one box")
    ap.add_argument("--streams", default="1,4", help="--decoder: concurrent streams per level")
    ap.add_argument("--requests", type=int, default=8, help="--decoder: streams per level and round")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2, help="--decoder: box / Ray turns per level")
    ap.add_argument("--autoscale", action="store_true", help="the autoscaling round trip, replicas over time")
    ap.add_argument("--max-replicas", type=int, default=2)
    ap.add_argument("--load-clients", type=int, default=4, help="--autoscale: clients during the load")
    ap.add_argument("--load-s", type=float, default=20.0)
    ap.add_argument("--idle-s", type=float, default=60.0)
    ap.add_argument("--timing", default='{"upscale_delay_s": 1, "downscale_delay_s": 3, "look_back_period_s": 2, '
                                       '"metrics_interval_s": 0.5}', help="--autoscale: EDGEINFER_RAY_AUTOSCALING")
    args = ap.parse_args()
    if args.decoder or args.autoscale:
        from _fleet_decoder import autoscale, decoder

        (decoder if args.decoder else autoscale)(args)
        return
    levels = [int(c) for c in args.clients.split(",")]

    from edgeinfer.testing import minilm
    from edgeinfer.testing.fixtures import _cached_export
    from edgeinfer.testing.serve import ServerProc, minilm_bundle

    tmp = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    bundle = minilm_bundle(_cached_export("minilm-dynamic", None, None), tmp / "minilm", "onnxruntime")
    bodies = [json.dumps({"input": s, "model": "minilm"}).encode() for s in minilm.sentences()]
    modes = {"single_box": [], "ray": ["--ray", "auto", "--replicas", str(args.replicas)]}
    results: dict[str, list[dict]] = {}
    startup: dict[str, float] = {}
    for mode, extra in modes.items():  # one at a time: both on the same 2 cores would measure each other
        t0 = time.perf_counter()
        server = ServerProc([bundle], *extra, log=tmp / f"{mode}.log")
        startup[mode] = round(time.perf_counter() - t0, 2)
        try:
            results[mode] = []
            for clients in levels:
                row = asyncio.run(_level(server.port, clients, args.seconds, args.max_requests, bodies))
                results[mode].append(row)
                print(f"{mode:10s} clients={clients:3d}  {row['throughput_rps']:7.1f} req/s  "
                      f"p50 {row['latency_ms'].get('p50', float('nan')):7.1f} ms  "
                      f"p99 {row['latency_ms'].get('p99', float('nan')):7.1f} ms  errors {row['errors']}", flush=True)
        finally:
            t1 = time.perf_counter()
            server.terminate()
            startup[f"{mode}_shutdown"] = round(time.perf_counter() - t1, 2)
    one = {m: next((r for r in rows if r["clients"] == 1), None) for m, rows in results.items()}
    added = None
    if one["ray"] and one["single_box"]:
        ray_ms, box_ms = one["ray"]["latency_ms"], one["single_box"]["latency_ms"]
        added = {k: round(ray_ms[k] - box_ms[k], 2) for k in ("p50", "p99")}
    ratio = {str(b["clients"]): round(r["throughput_rps"] / b["throughput_rps"], 2) if b["throughput_rps"] else None
             for b, r in zip(results["single_box"], results["ray"])}
    data = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 (fp32, onnxruntime CPU, dynamic batch and sequence)",
        "request": "one sentence per request (POST /v1/embeddings), keep-alive, loopback",
        "settings": {"seconds_per_level": args.seconds, "max_requests_per_level": args.max_requests,
                     "ray_replicas": args.replicas, "single_box_workers": 1},
        "startup_to_ready_s": startup,
        "results": results,
        "throughput_ray_over_single_box": ratio,
        "ray_added_latency_ms_at_1_client": added,
        "note": "2-core machine shared with other jobs; both Ray replicas and the router run on the same cores "
                "as the single-box server did, so this measures Ray's overhead, not a fleet's scaling",
    }
    _common.write("fleet", data)
    print("throughput ray / single box:", ratio, " Ray's added latency at 1 client (ms):", added)


if __name__ == "__main__":
    main()
