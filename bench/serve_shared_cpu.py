"""Two decoders on one CPU: what busy-waiting threads cost when both are busy, and what the alternatives cost
when only one is (docs/serve.md, "Several decoders on one CPU").

One host w8a8 bundle of the random Qwen3 of ~53 M parameters (``edgeinfer.testing.llm.random_qwen3``: 8 layers,
hidden 768), deployed once (``edgeinfer deploy --board host --quant w8a8 --ctx 512``; conversions are cached) and
copied under a second name, served three ways, in turns (``--rounds``):

  separate        two ``edgeinfer serve`` processes, one decoder each: every decoder at its backend's default
                  threads, busy-waiting between parallel sections (onnxruntime's default), as before serve
                  stopped that for several decoders
  shared          one ``edgeinfer serve A B``: serve's default for several decoders (``ServeConfig.spin_wait``:
                  the runtimes' idle threads do not busy-wait)
  threads1        one ``edgeinfer serve A B --threads 1``: the cores split between the decoders

Workloads, each twice per server (tokens generated / wall time, both models together): ``both`` 4 concurrent
completions of 64 tokens to each model; ``one`` 4 to the first model only; ``single`` one completion to the first
model. ``--slots 4``; greedy; the prompt is 32 words.

Writes bench/results/serve_shared_cpu.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import arguments, write  # noqa: E402

NEW, STREAMS, PROMPT = 64, 4, "the quick brown fox jumps over the lazy dog " * 4
SHAPE = {"layers": 8, "hidden": 768, "heads": 12, "kv_heads": 4, "intermediate": 2048}
EDGEINFER = str(Path(sys.executable).with_name("edgeinfer"))


def complete(port: int, model: str, tokens: list[int]) -> None:
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": NEW, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        tokens.append(json.loads(r.read())["usage"]["completion_tokens"])


def tok_per_s(targets: list[tuple[int, str]], streams: int) -> float:
    """``streams`` concurrent completions to each (port, model) of ``targets``: generated tokens / wall time."""
    tokens: list[int] = []
    threads = [threading.Thread(target=complete, args=(port, model, tokens))
               for port, model in targets for _ in range(streams)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(tokens) != len(threads):
        raise SystemExit("a completion failed (see the server's log above)")
    return sum(tokens) / (time.perf_counter() - t0)


def measure(way: str, a: Path, b: Path) -> dict:
    from edgeinfer.testing.serve import ServerProc

    common = ("--slots", str(STREAMS), *(["--threads", "1"] if way == "threads1" else []))
    groups = [[a], [b]] if way == "separate" else [[a, b]]
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(ServerProc(g, *common, log=g[0].with_suffix(".log"))) for g in groups]
        targets = [(servers[0].port, a.name), (servers[-1].port, b.name)]
        tok_per_s(targets, 1)  # warm-up: each decoder's first steps
        return {"both": [tok_per_s(targets, STREAMS) for _ in range(2)],
                "one": [tok_per_s(targets[:1], STREAMS) for _ in range(2)],
                "single": [tok_per_s(targets[:1], 1) for _ in range(2)]}


def bundle(tmp: Path) -> tuple[Path, Path]:
    from edgeinfer.testing.llm import random_qwen3

    a, b = tmp / "qwen-a", tmp / "qwen-b"
    subprocess.run([EDGEINFER, "deploy", str(random_qwen3(**SHAPE)), "--board", "host", "--quant", "w8a8",
                    "--ctx", "512", "-o", str(a)], check=True, stdout=subprocess.DEVNULL)
    shutil.copytree(a, b)
    return a, b


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--rounds", type=int, default=2, help="turns of the three servers (default 2)")
    args = parser.parse_args()
    ways = ("separate", "shared", "threads1")
    runs: dict[str, list[dict]] = {w: [] for w in ways}
    with tempfile.TemporaryDirectory(prefix="edgeinfer-shared-cpu-") as tmp:
        a, b = bundle(Path(tmp))
        for r in range(args.rounds):
            for way in ways:
                runs[way].append(measure(way, a, b))
                print(f"round {r + 1} {way}: " + ", ".join(f"{k} {statistics.median(v):.0f} tok/s"
                                                           for k, v in runs[way][-1].items()), file=sys.stderr)
    summary = {w: {k: round(statistics.median(x for run in runs[w] for x in run[k]), 1)
                   for k in ("both", "one", "single")} for w in ways}
    write("serve_shared_cpu", {"model": f"random_qwen3({SHAPE}) host w8a8, ctx 512, --slots {STREAMS}",
                               "new_tokens": NEW, "streams": STREAMS, "load_average": os.getloadavg(),
                               "tok_per_s_median": summary, "runs": runs})
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
