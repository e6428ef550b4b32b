"""Where one token's time goes at one stream: the runtime's decode call alone, serve's scheduler step around
it (in this process, no pipe), and the whole path through ``edgeinfer serve`` (worker -> pipe -> HTTP process ->
SSE), next to ``llama-server``'s own per-token eval time (its ``timings.predicted_per_token_ms``) on the same GGUF.

Per pair of bench/peer_llamacpp.py (its deploy, cached as it caches it, and its GGUF for llama-server; ``--bundles``
takes existing deploys instead, in the order of ``--pairs``): greedy, ``ignore_eos``, one 32-token prompt,
``--tokens`` new tokens, ``--threads`` CPU threads, in rounds that alternate the layers (A B C A B C); medians over
rounds. Per-process CPU time per token (from /proc/PID/task/*/schedstat) says what each process spent, which a
loaded machine disturbs less than wall time. The per-token overhead of a layer is its ms/token minus the
layer under it:
  runtime     ``decoder.decode`` of one slot, back to back (the argmax only between two calls)
  scheduler   ``Scheduler.step`` (decode, sampling, detokenizing, events) of one sequence, back to back
  serve       mean gap between SSE text chunks seen by a client of ``edgeinfer serve`` (TPOT)
  llama-eval  llama-server's eval time per token; ``llama-server``: its TPOT as the same client sees it

    python bench/token_path.py [--pairs llamacpp-q8_0,host-w8a8] [--bundles DIR,DIR] [--rounds 3] [--tokens 128]

Writes bench/results/token_path.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _llamacpp  # noqa: E402
import _peer  # noqa: E402
import peer_llamacpp  # noqa: E402
from _common import cpu_ms  # noqa: E402

PROMPT_TOKENS = 32


def load(bundle: Path, threads: int):
    from edgeinfer.model.bundle import Bundle
    from edgeinfer.run.loading import load as load_generator
    from edgeinfer.run.loading import threads_option

    backend = Bundle.open(bundle).manifest.backend
    return load_generator(bundle, ctx=peer_llamacpp.CTX, slots=peer_llamacpp.SLOTS,
                          **threads_option(backend, threads))


def runtime_ms(gen, tokens: int) -> float:
    import numpy as np

    d = gen.decoder
    d.reset(0)
    tok = int(np.argmax(d.prefill(0, np.arange(1, PROMPT_TOKENS + 1, dtype=np.int64))))
    t0 = time.perf_counter()
    for _ in range(tokens):
        tok = int(np.argmax(d.decode([0], np.array([tok], dtype=np.int64))[0]))
    ms = (time.perf_counter() - t0) * 1e3 / tokens
    d.reset(0)
    return ms


def scheduler_ms(gen, tokens: int) -> float:
    from edgeinfer.contract.generation import GenerationOptions
    from edgeinfer.serve.decoder_scheduler import Scheduler

    sched = Scheduler(gen)
    sched.add("1", list(range(1, PROMPT_TOKENS + 1)), GenerationOptions(max_new_tokens=tokens, temperature=0.0,
                                                                         ignore_eos=True))
    stamps = []
    while sched.busy:
        for e in sched.step():
            if e.tokens:
                stamps.append(time.perf_counter())
    return (stamps[-1] - stamps[0]) * 1e3 / (len(stamps) - 1)


def tree(pid: int) -> list[int]:
    return [pid] + [int(k) for t in os.listdir(f"/proc/{pid}/task")
                    for k in Path(f"/proc/{pid}/task/{t}/children").read_text().split()]


def client_tpot_ms(server, prompt: str, tokens: int) -> tuple[float, list[float], dict]:
    """TPOT of one stream (ms), the CPU ms per token of each process of the server's tree (largest last), and
    llama-server's own timings of a non-streamed twin request (llama-server only)."""
    import httpx

    pids = tree(server.proc.pid)
    before = {p: cpu_ms(p) for p in pids}
    row = _peer.run_level(server.url, server.model, [prompt], tokens)
    cpu = sorted((cpu_ms(p) - before[p]) / row["tokens"] for p in pids)
    timings = {}
    if "llama" in server.log.name:
        body = {"prompt": prompt, "n_predict": tokens, "temperature": 0, "ignore_eos": True}
        timings = httpx.post(server.url + "/completion", json=body, timeout=300).json().get("timings", {})
    return row["tpot_ms"], [round(c, 3) for c in cpu if c > 0.001], timings


def measure(name: str, bundle: Path | None, args: argparse.Namespace, work: Path) -> dict:
    pair = peer_llamacpp.PAIRS[name]
    model = peer_llamacpp.model_path(pair["model"])
    bundle = bundle or peer_llamacpp.edgeinfer_target(pair, model)
    gguf = next((bundle / "decoder").glob("*.gguf")) if pair.get("same_file") else _llamacpp.gguf(model, pair["gguf"])
    prompt = peer_llamacpp.prompts(model, 1)[0]
    rows: dict[str, list] = {k: [] for k in ("runtime", "scheduler", "serve", "serve_cpu", "llama-server",
                                              "llama-server_cpu", "llama-eval")}
    gen = load(bundle, args.threads)
    (work / name).mkdir()
    servers = peer_llamacpp.start_servers(bundle, gguf, _llamacpp.binaries(), args.threads, work / name)
    try:
        for s in servers.values():
            _peer.run_level(s.url, s.model, [prompt], 8)  # warm-up
        for _ in range(args.rounds):
            rows["runtime"].append(runtime_ms(gen, args.tokens))
            rows["scheduler"].append(scheduler_ms(gen, args.tokens))
            tpot, cpu, _ = client_tpot_ms(servers["edgeinfer"], prompt, args.tokens)
            rows["serve"].append(tpot)
            rows["serve_cpu"].append(cpu)
            tpot, cpu, timings = client_tpot_ms(servers["llamacpp"], prompt, args.tokens)
            rows["llama-server"].append(tpot)
            rows["llama-server_cpu"].append(cpu)
            rows["llama-eval"].append(timings.get("predicted_per_token_ms", float("nan")))
    finally:
        for s in servers.values():
            s.close()
        gen.close()
    med = {k: statistics.median(v) for k, v in rows.items() if not k.endswith("_cpu")}
    cpu = {k: [statistics.median(r[i] for r in v) for i in range(min(map(len, v)))]
           for k, v in rows.items() if k.endswith("_cpu")}
    return {"bundle": str(bundle), "gguf": str(gguf), "rounds": rows, "median_ms_per_token": med,
            "median_cpu_ms_per_token": cpu,
            "overhead_ms": {"scheduler": med["scheduler"] - med["runtime"], "pipe_http_sse": med["serve"] -
                            med["scheduler"], "llama_server_http": med["llama-server"] - med["llama-eval"]}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", default="llamacpp-q8_0,host-w8a8")
    ap.add_argument("--bundles", default="", help="existing deploys of the pairs, comma-separated, same order")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="token_path")
    args = ap.parse_args()
    pairs = args.pairs.split(",")
    bundles = [Path(b) for b in args.bundles.split(",")] if args.bundles else [None] * len(pairs)
    out = {"benchmark": "token_path", "settings": vars(args), "loadavg_before": os.getloadavg(), "pairs": {}}
    work = Path(tempfile.mkdtemp(prefix="token-path-"))
    for name, bundle in zip(pairs, bundles):
        out["pairs"][name] = measure(name, bundle, args, work)
        print(name, json.dumps(out["pairs"][name]["median_ms_per_token"]),
              json.dumps(out["pairs"][name]["median_cpu_ms_per_token"]), flush=True)
    out["loadavg_after"] = os.getloadavg()
    dst = Path(__file__).resolve().parent / "results" / f"{args.out}.json"
    dst.write_text(json.dumps(out, indent=2) + "\n")
    print("->", dst)


if __name__ == "__main__":
    main()
