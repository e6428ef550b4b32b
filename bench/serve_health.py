"""``/health`` latency of ``edgeinfer serve`` while it works on the largest request its defaults allow.

The request: 256 strings (``--max-inputs``) filling the 8 MB body limit (``--max-body-mb``), sent to
all-MiniLM-L6-v2 (fp32, onnxruntime CPU). Meanwhile ``/health`` is polled on a fixed 10 ms schedule, each
sample timed from its scheduled moment (a stall of 2 s counts as 200 slow samples, not one). The same
probe polls a second, idle server over the same seconds: that is the machine's own scheduling noise.

    python bench/serve_health.py [--rounds 3]

Writes bench/results/serve_health.json and prints a summary.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402


def stats_ms(values: list[float]) -> dict:
    from edgeinfer.run.measure import latency_stats

    s = latency_stats([v * 1e3 for v in values])
    return {"samples": len(values), "p50": round(s["p50"], 2), "p99": round(s["p99"], 2), "max": round(s["max"], 2)}


def one_round(bundle: Path, idle_bundle: Path, body: bytes, tmp: Path, i: int) -> dict:
    import httpx

    from edgeinfer.testing.serve import HealthProbe, ServerProc

    with ServerProc([idle_bundle], log=tmp / f"idle-{i}.log") as idle, \
            ServerProc([bundle], "--timeout-s", "600", log=tmp / f"server-{i}.log") as server, \
            HealthProbe(server.url) as probe, HealthProbe(idle.url) as control:
        time.sleep(0.5)
        start = time.perf_counter()
        r = httpx.post(server.url + "/v1/embeddings", content=body, headers={"content-type": "application/json"},
                       timeout=600)
        end = time.perf_counter()
    if r.status_code != 200:
        raise SystemExit(f"the request failed: {r.status_code} {r.text[:300]}")
    return {"request_seconds": round(end - start, 2), "idle_server_ms": stats_ms(control.between(start, end)),
            "during_ms": stats_ms(probe.between(start, end))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    from edgeinfer.testing.fixtures import _cached_export
    from edgeinfer.testing.serve import largest_embeddings_body, log_bundle, minilm_bundle

    tmp = Path(tempfile.mkdtemp(prefix="serve-health-"))
    bundle = minilm_bundle(_cached_export("minilm-dynamic", None, None), tmp / "minilm-ort", "onnxruntime")
    body = largest_embeddings_body()
    rounds = []
    for i in range(args.rounds):
        row = one_round(bundle, log_bundle(tmp / "log"), body, tmp, i)
        rounds.append(row)
        print(f"round {i}: request {row['request_seconds']} s; /health during p50 {row['during_ms']['p50']} ms "
              f"p99 {row['during_ms']['p99']} ms max {row['during_ms']['max']} ms; "
              f"idle server p99 {row['idle_server_ms']['p99']} ms",
              flush=True)
    _common.write("serve_health", {
        "model": "sentence-transformers/all-MiniLM-L6-v2 (fp32, onnxruntime CPU), one worker, default options",
        "request": f"POST /v1/embeddings, 256 strings, {len(body)} bytes "
                   "(the default --max-inputs and --max-body-mb)",
        "probe": "GET /health every 10 ms over keep-alive, latency from the scheduled time (no coordinated omission)",
        "target": "/health p99 under 50 ms while the request is worked on",
        "rounds": rounds,
        "best_round_p99_ms": min(r["during_ms"]["p99"] for r in rounds),
        "median_round_p99_ms": sorted(r["during_ms"]["p99"] for r in rounds)[len(rounds) // 2],
        "note": "2-core machine shared with other jobs while measuring; idle_server_ms is the same probe on a "
                "second, idle server over the same seconds, i.e. the machine's scheduling noise",
    })


if __name__ == "__main__":
    main()
