"""Decode speed with the packed weights on 2 MiB pages and without (``EDGEINFER_HUGE_PAGES=off``).

After a decoder is loaded, ``edgeinfer.contract.pages.collapse_resident`` moves the weights onnxruntime (and
OpenVINO's CPU plugin) packed into anonymous memory onto transparent huge pages (``MADV_COLLAPSE``). This
measures what that buys, per bundle of the peer bench's random Qwen3 (188 M parameters, 16 layers; deployed once
through ``peer_llamacpp.edgeinfer_target``), in rounds that alternate the order of the two settings:

- ``bench``: ``edgeinfer bench BUNDLE --prompt-lengths 32 --new-tokens 64 --threads 1`` in a fresh process
  (decode tok/s, TPOT p50, peak RSS: the in-process path of ``generate``, ``chat`` and ``bench``);
- ``serve``: ``edgeinfer serve BUNDLE --threads 1`` and ``SERVE_REQUESTS`` streamed requests of 64 tokens one
  after another (TPOT median over the requests: the path ``peer_llamacpp.py`` measures), and the seconds from
  starting the server to its first answered request (the load, with the collapse inside it when on).

``--cold`` drops the bundle's files from the page cache before every run (``POSIX_FADV_DONTNEED``, as after a
reboot): with ``on``, the onnxruntime plugin reads a graph's weights file whole before it maps it, so that the
kernel caches it in 2 MiB folios (``pages.read_whole``: the own ops' fp16 and w8a16 compute from that mapping);
with ``off`` the graph's first steps fault it in, 4 KiB at a time.

    python bench/huge_pages.py [--pairs host-fp16,host-w8a8] [--rounds 2] [--no-serve] [--cold]

Writes bench/results/huge_pages.json (``--out NAME``: NAME.json).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import arguments, write  # noqa: E402

PAIRS = ["host-fp16", "host-w8a16", "host-w8a8", "ov-fp16"]
SETTINGS = ["off", "on"]
SERVE_REQUESTS = 4
PROMPT = "the river city morning village children market winter music garden school story mountain light"


def drop_cached(bundle: Path) -> None:
    """The bundle's files out of the page cache (those no process maps)."""
    for f in bundle.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def edgeinfer_bench(bundle: Path, setting: str) -> dict:
    cmd = [sys.executable, "-m", "edgeinfer.cli", "bench", str(bundle), "--prompt-lengths", "32",
           "--new-tokens", "64", "--threads", "1", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True,
                         env={**os.environ, "EDGEINFER_HUGE_PAGES": setting})
    r = json.loads(out.stdout)["results"][0]
    return {"decode_tokens_per_s": r["decode_tokens_per_s"], "tpot_ms_p50": r["tpot_ms_p50"],
            "peak_rss_bytes": r["peak_rss_bytes"]}


def serve(bundle: Path, setting: str) -> dict:
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "edgeinfer.cli", "serve", str(bundle), "--port", str(port),
                             "--threads", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "EDGEINFER_HUGE_PAGES": setting})
    try:
        body = {"prompt": PROMPT, "max_tokens": 1, "temperature": 0}
        for _ in range(600):
            try:
                body["model"] = httpx.get(url + "/v1/models", timeout=5).json()["data"][0]["id"]
                if httpx.post(url + "/v1/completions", json=body, timeout=60).status_code == 200:
                    break
            except (httpx.HTTPError, KeyError, IndexError, ValueError):
                pass
            time.sleep(0.5)
        else:
            raise RuntimeError(f"edgeinfer serve {bundle} answered nothing in 5 minutes")
        ready_s = time.perf_counter() - t0
        tpots = []
        for _ in range(SERVE_REQUESTS):
            stamps = []
            with httpx.stream("POST", url + "/v1/completions", timeout=120,
                              json={**body, "max_tokens": 64, "stream": True, "ignore_eos": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        stamps.append(time.perf_counter())
            tpots.append((stamps[-1] - stamps[0]) / (len(stamps) - 1) * 1e3)
        return {"tpot_ms": statistics.median(tpots), "tpots_ms": tpots, "ready_s": ready_s}
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = arguments(__doc__)
    ap.add_argument("--pairs", default=",".join(PAIRS), help=f"comma-separated, of {', '.join(PAIRS)}")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-serve", action="store_true", help="only the in-process edgeinfer bench")
    ap.add_argument("--cold", action="store_true", help="drop the bundle from the page cache before each run")
    ap.add_argument("--out", default="huge_pages")
    args = ap.parse_args()
    import peer_llamacpp as peer

    pairs = args.pairs.split(",")
    unknown = sorted(set(pairs) - set(PAIRS))
    if unknown:
        ap.error(f"unknown pairs {unknown}; choose from {PAIRS}")
    model = peer.model_path("random")
    results = {}
    for name in pairs:
        bundle = peer.edgeinfer_target(peer.PAIRS[name], model)
        runs: dict[str, dict[str, list]] = {s: {"bench": [], "serve": []} for s in SETTINGS}
        for r in range(args.rounds):
            for setting in SETTINGS if r % 2 == 0 else SETTINGS[::-1]:
                if args.cold:
                    drop_cached(bundle)
                runs[setting]["bench"].append(edgeinfer_bench(bundle, setting))
                if not args.no_serve:
                    if args.cold:
                        drop_cached(bundle)
                    runs[setting]["serve"].append(serve(bundle, setting))
                print(name, r, setting, runs[setting]["bench"][-1],
                      runs[setting]["serve"][-1] if runs[setting]["serve"] else "", file=sys.stderr)
        med = {s: {"bench_decode_tokens_per_s": statistics.median(b["decode_tokens_per_s"] for b in v["bench"]),
                   "bench_peak_rss_bytes": max(b["peak_rss_bytes"] for b in v["bench"]),
                   **({"serve_tpot_ms": statistics.median(x["tpot_ms"] for x in v["serve"]),
                       "serve_ready_s": statistics.median(x["ready_s"] for x in v["serve"])} if v["serve"] else {})}
               for s, v in runs.items()}
        on, off = med["on"], med["off"]
        gain = {"bench_decode": round(on["bench_decode_tokens_per_s"] / off["bench_decode_tokens_per_s"], 3)}
        if not args.no_serve:
            gain["serve_decode"] = round(off["serve_tpot_ms"] / on["serve_tpot_ms"], 3)
        results[name] = {"bundle": bundle.name, "median": med, "on_over_off": gain, "runs": runs}
        print(name, gain, file=sys.stderr)
    write(args.out, {"settings": {"rounds": args.rounds, "threads": 1, "prompt_tokens": 32, "new_tokens": 64,
                                  "cold": args.cold,
                                  "serve_requests": 0 if args.no_serve else SERVE_REQUESTS},
                     "results": results})


if __name__ == "__main__":
    main()
