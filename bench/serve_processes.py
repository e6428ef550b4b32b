"""Each process of ``edgeinfer serve TARGET`` at the peer bench's settings (``--slots 16 --ctx 256 --threads 2``),
idle after start-up and after STREAMS concurrent streaming completions (32-token prompts, 64 new tokens, greedy):
VmHWM / VmRSS / RssAnon / RssFile from /proc/PID/status and Pss from smaps_rollup, per process, and the largest
mappings of the biggest process (anonymous vs file-backed: weights mapped or copied). Issue 30 §2, footprint.

    python bench/serve_processes.py ~/.cache/edgeinfer/bench/peer/<model>-host-w8a8 [--streams 16] [--label NAME]
        [--in-process]      # edgeinfer serve --in-process: one process
        [--chat]            # the streams as /v1/chat/completions (the model's chat template)
        [--peer-rounds N]   # instead: bench/peer_llamacpp.py's workloads, N rounds, a snapshot after each

Writes bench/results/serve_processes[-LABEL].json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
from serve_footprint import prompt_of, status_kib, stream_one, tree  # noqa: E402

MIB = 2**20


def snapshot(root: int) -> list[dict]:
    rows = []
    for pid in tree(root):
        roll = {line.split(":")[0]: int(line.split()[1]) * 1024
                for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]}
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
        rows.append({"pid": pid, "cmdline": cmd, "pss_bytes": roll["Pss"],
                     **{f"{k}_bytes": status_kib(pid, k) * 1024 for k in ("VmHWM", "VmRSS", "RssAnon", "RssFile")}})
    return rows


def mappings(pid: int, top: int = 12) -> list[dict]:
    agg: dict[str, list[int]] = {}
    name = "[anon]"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            parts = line.split(None, 5)
            name = parts[5] if len(parts) > 5 else "[anon]"
        elif line.startswith(("Rss:", "Anonymous:")):
            agg.setdefault(name, [0, 0])[line.startswith("Anonymous:")] += int(line.split()[1]) * 1024
    best = sorted(agg.items(), key=lambda kv: -kv[1][0])[:top]
    return [{"mapping": k, "rss_bytes": v[0], "anonymous_bytes": v[1]} for k, v in best]


def peer_workloads(url: str, model: str, rounds: int, root: int) -> list[dict]:
    """bench/peer_llamacpp.py's workloads (c1, c4, c16, single128; its prompts), ``rounds`` times, with each
    process's VmHWM / VmRSS after every one: where a peak that one 16-stream round does not reach comes from."""
    import _peer
    from peer_llamacpp import WORKLOADS, model_path, prompts

    texts = prompts(model_path("random"), 16)
    steps = []
    for r in range(rounds):
        for w, (n, new) in WORKLOADS.items():
            tok_s = _peer.run_level(url, model, texts[:n], new)["tok_s"]
            rows = snapshot(root)
            steps.append({"round": r, "workload": w, "tok_s": tok_s,
                          "VmHWM_MiB": [round(x["VmHWM_bytes"] / MIB, 1) for x in rows],
                          "VmRSS_MiB": [round(x["VmRSS_bytes"] / MIB, 1) for x in rows]})
            print(f"round {r} {w}: {tok_s} tok/s, VmHWM {steps[-1]['VmHWM_MiB']} MiB", file=sys.stderr)
    return steps


def main() -> None:
    import httpx

    from edgeinfer.testing.serve import free_port

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", type=Path)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--label", default="")
    ap.add_argument("--peer-rounds", type=int, default=0,
                    help="instead of one round of STREAMS: the peer bench's workloads, N rounds")
    ap.add_argument("--in-process", action="store_true", help="serve --in-process (the decoder on a thread)")
    ap.add_argument("--chat", action="store_true", help="the streams as chat completions (the prompt as the user "
                    "message, rendered by the model's chat template)")
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "edgeinfer.cli", "serve", str(args.target), "--port", str(port),
                             "--slots", "16", "--ctx", "256", "--threads", "2", "--max-queue", "64",
                             "--log-level", "warning", *(["--in-process"] if args.in_process else [])])
    try:
        while True:
            try:
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None:
                raise SystemExit(f"serve exited with {proc.returncode}")
            time.sleep(0.3)
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        idle = snapshot(proc.pid)
        steps = []
        if args.peer_rounds:
            steps = peer_workloads(url, model, args.peer_rounds, proc.pid)
        else:
            with concurrent.futures.ThreadPoolExecutor(args.streams) as pool:
                list(pool.map(lambda i: stream_one(url, model, prompt_of(32, i), args.chat), range(args.streams)))
        after = snapshot(proc.pid)
        big = max(after, key=lambda r: r["VmRSS_bytes"])["pid"]
        result = {"target": str(args.target), "streams": args.streams, "peer_rounds": args.peer_rounds,
                  "in_process": args.in_process, "chat": args.chat,
                  "idle": idle, "after": after, "steps": steps,
                  "tree_peak_bytes": sum(r["VmHWM_bytes"] for r in after), "largest_mappings": mappings(big)}
    finally:
        proc.terminate()
        proc.wait(60)
    for r in after:
        print(f"{r['VmHWM_bytes'] / MIB:7.1f} MiB  {r['cmdline'][:90]}", file=sys.stderr)
    _common.write("serve_processes" + (f"-{args.label}" if args.label else ""), result)


if __name__ == "__main__":
    main()
