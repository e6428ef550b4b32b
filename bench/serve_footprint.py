"""The plan's memory for a served decoder against the peak RSS of the whole ``edgeinfer serve`` process tree
(issue 30 §2: "the plan's memory for a served decoder within 10% of the measured peak").

For each (board, quant) below the model is deployed once (``deploy_decoder``; conversions are cached), then
``edgeinfer serve BUNDLE --slots SLOTS --ctx CTX --threads 2`` answers ``ROUNDS`` rounds of ``SLOTS`` concurrent
streaming ``/v1/completions`` (``PROMPT`` words a prompt, ``--prompt-words``; ``NEW`` new tokens, greedy). Measured:
  tree_peak_bytes   Σ VmHWM over the serve process and its workers (each process's own peak; the HTTP
                    process peaks at start, the worker while loading or generating: an upper bound of the
                    tree's simultaneous peak, and what a board must have room for)
  tree_rss_max_bytes the largest Σ VmRSS of the tree sampled every 20 ms during the requests
  worker_peak_bytes, main_peak_bytes: VmHWM of each side
and the plan for the same bundle, model, board, scheme, context and ``batch = SLOTS`` (``plan``'s breakdown,
without the board's OS reserve: weights + KV + activations + runtime), with
``plan_over_measured`` = plan total / tree_peak_bytes. The KV cache the worker allocated (``/ready``) and its dtype
are reported next to the plan's.

Boards other than ``host`` are planned for their device (an Intel NPU, an Atlas card) but run here on the CPU
(OpenVINO's CPU plugin; the Ascend plugin's torch CPU path): their rows say what was measured on this CPU, not
the device's figure.

    python bench/serve_footprint.py                 # the random Qwen3 (~160 M parameters), host fp32/fp16/w8a8
    python bench/serve_footprint.py --tiny --boards host:fp32 core-ultra-155h:fp16 atlas-300i-pro:fp16
    python bench/serve_footprint.py --boards host:gguf:Q8_0@llama.cpp   # the llamacpp backend
    python bench/serve_footprint.py --smollm2 --prompt-words 240 --boards host:w8a16   # a trained model
    python bench/serve_footprint.py --prompt-words 240 --boards host:w8a8 --kv-dtype q8_0   # a q8_0 KV cache

Writes bench/results/serve_footprint[-LABEL].json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

CTX, SLOTS, ROUNDS, PROMPT, NEW = 512, 4, 2, 32, 64
DEFAULT = ("host:fp32", "host:fp16", "host:w8a8")
MIB = 2**20


def tree(pid: int) -> list[int]:
    out = [pid]
    for t in Path(f"/proc/{pid}/task").iterdir():
        for c in (t / "children").read_text().split():
            out += tree(int(c))
    return out


def status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


class TreeSampler(threading.Thread):
    """The largest Σ VmRSS of the process tree under ``pid`` while running."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop = pid, 0, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.peak = max(self.peak, sum(status_kib(p, "VmRSS") for p in tree(self.pid)) * 1024)
            except (OSError, ValueError):
                pass
            time.sleep(0.02)


def stream_one(url: str, model: str, prompt: str, chat: bool = False) -> int:
    """One streamed greedy completion of ``prompt`` (``chat``: as the user message of a chat completion)."""
    import httpx

    body = {"model": model, "max_tokens": NEW, "temperature": 0, "stream": True, "ignore_eos": True,
            **({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt})}
    n = 0
    path = "/v1/chat/completions" if chat else "/v1/completions"
    with httpx.stream("POST", url + path, json=body, timeout=600) as r:
        if r.status_code != 200:
            raise SystemExit(f"the request failed: {r.status_code} {r.read()[:300]!r}")
        for line in r.iter_lines():
            n += line.startswith("data:") and not line.endswith("[DONE]")
    return n


def prompt_of(tokens: int, i: int) -> str:
    words = "the licence grants a worker each river under stone morning".split()
    return " ".join(words[(i + k) % len(words)] for k in range(tokens))


def measure(model: Path, board: str, quant: str, work: Path, words: int = PROMPT, runtime: str | None = None,
            kv_dtype: str | None = None) -> dict:
    import httpx

    from edgeinfer.deploy.decoder import deploy_decoder
    from edgeinfer.testing.serve import ServerProc

    out = work / f"{model.name}-{board}-{quant.replace(':', '-')}"
    res = deploy_decoder(model, board, out, quant=quant, ctx=CTX, runtime=runtime,
                         options={"kv_dtype": kv_dtype} if kv_dtype else None)
    m = res.manifest
    kv_dtype = m.decoder.get("kv_dtype")
    with ServerProc([out], "--slots", str(SLOTS), "--ctx", str(CTX), "--threads", "2", log=work / "serve.log") as s:
        ready = httpx.get(s.url + "/ready", timeout=10).json()
        sampler = TreeSampler(s.proc.pid)
        sampler.start()
        tokens = 0
        for r in range(ROUNDS):
            with concurrent.futures.ThreadPoolExecutor(SLOTS) as pool:
                tokens += sum(pool.map(lambda i: stream_one(s.url, out.name, prompt_of(words, i + r)),
                                       range(SLOTS)))
        sampler.stop.set()
        sampler.join()
        pids = tree(s.proc.pid)
        peaks = {pid: status_kib(pid, "VmHWM") * 1024 for pid in pids}
        workers = {d["pid"] for d in ready.get("decoders", [])}
        roles = [{"role": "http" if pid == s.proc.pid else "decoder worker" if pid in workers else "other child",
                  "peak_bytes": peaks[pid], "rss_bytes": status_kib(pid, "VmRSS") * 1024} for pid in pids]
    measured = sum(peaks.values())
    row = {"model": model.name, "board": board, "backend": m.backend, "scheme": m.scheme,
           "runtime": m.decoder.get("runtime"), "ctx": CTX, "slots": SLOTS, "sse_events": tokens,
           "measured_on": "this machine's CPU" + ("" if board == "host" else f" (planned for {board}'s device)"),
           "model_path": str(model), "kv_dtype_plan": kv_dtype, "prompt_words": words,
           "ready": {k: v for k, v in ready.items() if k in ("models", "decoders")} or ready,
           "main_peak_bytes": peaks[s.proc.pid],
           "processes": roles, "tree_peak_bytes": measured, "tree_rss_max_bytes": sampler.peak}
    score(row)
    print(json.dumps({k: row[k] for k in ("board", "scheme", "kv_dtype_plan", "plan_served_bytes",
                                          "tree_peak_bytes", "plan_over_measured")}), file=sys.stderr)
    return row


def score(row: dict) -> None:
    """The plan against the measurement: the served total (``plan``'s ``memory.served``: the decoder's
    breakdown + serve's own processes) against the tree, and the decoder's breakdown against the worker."""
    from edgeinfer.planning.planner import plan as make_plan

    p = make_plan(row["model_path"], row["board"], quant=row["scheme"], ctx=row["ctx"], batch=row["slots"],
                  runtime=row["runtime"], kv_dtype=row["kv_dtype_plan"], suggest=False)
    row["plan_breakdown_bytes"] = {k: v for k, v in p.breakdown.items() if k != "reserved"}
    row["kv_bytes_plan"] = p.breakdown["kv_cache"]
    plan = p.to_dict()["memory"]["served"]
    worker = sum(p["peak_bytes"] for p in row["processes"] if p["role"] == "decoder worker")
    row.update(plan_total_bytes=plan["decoder_process_bytes"], plan_served_bytes=plan["total_bytes"],
               worker_peak_bytes=worker, serve_processes_peak_bytes=row["tree_peak_bytes"] - worker,
               plan_over_measured=round(plan["total_bytes"] / row["tree_peak_bytes"], 3),
               decoder_plan_over_worker=round(plan["decoder_process_bytes"] / worker, 3))


# --- --chain: an embedding bundle, a classifier bundle and the tiny decoder in one serve ----------------------------
CHAIN_ROUNDS = 3  # rounds of full requests to each model (embeddings: --max-batch texts of ~120 tokens each)


def classifier_dir(work: Path) -> Path:
    """MiniLM as a 3-label ``BertForSequenceClassification`` with a random head (memory does not care what it
    says)."""
    import shutil

    import torch
    from transformers import BertForSequenceClassification

    from edgeinfer.testing import minilm

    out = work / "minilm-classifier"
    torch.manual_seed(0)
    labels = {0: "negative", 1: "neutral", 2: "positive"}
    BertForSequenceClassification.from_pretrained(minilm.model_dir(), num_labels=3, id2label=labels,
                                                  label2id={v: k for k, v in labels.items()}).save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(minilm.model_dir() / f, out / f)
    return out


def chain_requests(url: str, models: list[dict]) -> int:
    """CHAIN_ROUNDS rounds: a full batch to every tensor model (through the first endpoint it lists) and SLOTS
    streams to every decoder, all at once."""
    import httpx

    texts = [prompt_of(120, i) for i in range(32)]

    def tensor(m: dict) -> int:
        path = m["endpoints"][0]
        body = {"model": m["id"], "input": texts} if path.endswith(("embeddings", "classify")) else {
            "model": m["id"], "inputs": texts}
        r = httpx.post(url + path, json=body, timeout=600)
        if r.status_code != 200:
            raise SystemExit(f"{path} failed: {r.status_code} {r.text[:300]}")
        return len(texts)

    done = 0
    for r in range(CHAIN_ROUNDS):
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            jobs = [pool.submit(tensor, m) for m in models if "slots" not in m]
            jobs += [pool.submit(stream_one, url, m["id"], prompt_of(PROMPT, i + r)) for m in models if "slots" in m
                     for i in range(SLOTS)]
            done += sum(j.result() for j in jobs)
    return done


def measure_chain(work: Path) -> dict:
    import httpx

    from edgeinfer.deploy.decoder import deploy_decoder
    from edgeinfer.deploy.encoder import deploy
    from edgeinfer.planning.chain_plan import Entry, plan_chain
    from edgeinfer.serve.app import open_models
    from edgeinfer.serve.budget import check_budget
    from edgeinfer.serve.config import ServeConfig
    from edgeinfer.testing import minilm
    from edgeinfer.testing.llm import model_dir
    from edgeinfer.testing.serve import ServerProc

    sources = {"minilm": minilm.model_dir(), "minilm-classifier": classifier_dir(work), "tiny-qwen3": model_dir()}
    bundles = [work / "bundles" / n for n in sources]
    deploy(sources["minilm"], "host", bundles[0], use_cache=False)  # the manifest records this planner's plan
    deploy(sources["minilm-classifier"], "host", bundles[1], use_cache=False)
    deploy_decoder(sources["tiny-qwen3"], "host", bundles[2], ctx=CTX)
    with ServerProc(bundles, "--slots", str(SLOTS), "--ctx", str(CTX), "--threads", "2",
                    log=work / "serve.log") as s:
        ready = httpx.get(s.url + "/ready", timeout=10).json()
        listed = httpx.get(s.url + "/v1/models", timeout=10).json()["data"]
        sampler = TreeSampler(s.proc.pid)
        sampler.start()
        answered = chain_requests(s.url, listed)
        sampler.stop.set()
        sampler.join()
        pids = tree(s.proc.pid)
        peaks = {pid: status_kib(pid, "VmHWM") * 1024 for pid in pids}
    role = {s.proc.pid: "http", **{w["pid"]: "encoder worker" for w in ready.get("workers", [])},
            **{d["pid"]: f"decoder worker {d.get('model', '')}".strip() for d in ready.get("decoders", [])}}
    processes = [{"role": role.get(pid, "other child"), "peak_bytes": peaks[pid]} for pid in pids]
    measured = sum(peaks.values())
    planned = plan_chain([Entry(str(sources["minilm"])), Entry(str(sources["minilm-classifier"])),
                          Entry(str(sources["tiny-qwen3"]), {"ctx": CTX, "batch": SLOTS})], "host")
    config = ServeConfig(bundles, slots=SLOTS, ctx=CTX)
    checked = check_budget(*open_models(config.bundles, config.ctx, config.slots), config)
    row = {"models": list(sources), "board": "host", "ctx": CTX, "slots": SLOTS, "rounds": CHAIN_ROUNDS,
           "answered": answered, "processes": processes, "tree_peak_bytes": measured,
           "tree_rss_max_bytes": sampler.peak, "plan": _without_reserve(planned),
           "serve_check": _without_reserve(checked) if checked else None}
    row["plan_over_measured"] = round(row["plan"]["total_bytes"] / measured, 3)
    if checked:
        row["serve_check_over_measured"] = round(row["serve_check"]["total_bytes"] / measured, 3)
    print(json.dumps({k: row[k] for k in ("tree_peak_bytes", "plan_over_measured")}), file=sys.stderr)
    return row


def _without_reserve(chain) -> dict:
    """The chain's processes and models (the measured peak holds no OS reserve: it is left out of the total)."""
    d = chain.to_dict()
    return {"total_bytes": d["memory"]["total_bytes"] - d["memory"]["reserved_bytes"],
            "processes": d["processes"], "models": [{k: m[k] for k in ("name", "options", "memory")}
                                                    for m in d["models"]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="the committed tiny test decoder (seconds, not minutes)")
    ap.add_argument("--smollm2", action="store_true", help="a trained model, SmolLM2-135M (bench/_smollm2.py)")
    ap.add_argument("--boards", nargs="*", default=list(DEFAULT), metavar="BOARD:QUANT[@RUNTIME]",
                    help="e.g. host:w8a8, or host:gguf:Q8_0@llama.cpp for the llamacpp backend")
    ap.add_argument("--kv-dtype", help="deploy every bundle with this KV cache (--option kv_dtype=...; e.g. q8_0)")
    ap.add_argument("--label", default="", help="a name for this run in the results (e.g. before / after)")
    ap.add_argument("--prompt-words", type=int, default=PROMPT, help="words per prompt (~1.8 tokens each on the "
                    "random Qwen3's tokenizer; 240: ~432 tokens + 64 new fill most of the 512-position context, "
                    "the KV cache and prefill the plan budgets)")
    ap.add_argument("--rescore", type=Path, help="recompute the plan figures of a results file (after a change "
                                                 "of the planner's constants) and write it back")
    ap.add_argument("--chain", action="store_true", help="one serve carrying an embedding bundle, a classifier "
                    "bundle and the tiny decoder, against the chain plan (edgeinfer plan A B C --board host)")
    args = ap.parse_args()
    if args.chain:
        with tempfile.TemporaryDirectory() as tmp:
            row = measure_chain(Path(tmp))
        _common.write("serve_footprint-chain" + (f"-{args.label}" if args.label else ""),
                      {"ctx": CTX, "slots": SLOTS, "unit": "bytes", "rows": [row]})
        return
    if args.rescore:
        data = json.loads(args.rescore.read_text())
        for row in data["rows"]:
            if "refused" not in row:
                score(row)
        args.rescore.write_text(json.dumps(data, indent=2) + "\n")
        return
    from edgeinfer.errors import CheckFailed
    from edgeinfer.testing.llm import model_dir, random_qwen3

    if args.smollm2:
        import _smollm2

        model = _smollm2.model_dir()
    else:
        model = model_dir() if args.tiny else random_qwen3(layers=12, hidden=1024, heads=16, kv_heads=8,
                                                           intermediate=3200)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.boards:
            board, _, quant = spec.partition(":")
            quant, _, runtime = quant.partition("@")
            try:
                rows.append(measure(model, board, quant, Path(tmp), args.prompt_words, runtime or None,
                                    args.kv_dtype))
            except CheckFailed as e:  # deploy's golden check refused the bundle (4 bits of random weights): no row
                print(f"{spec}: not measured: {e}", file=sys.stderr)
                rows.append({"board": board, "scheme": quant, "runtime": runtime or None, "refused": str(e)})
    name = "serve_footprint" + (f"-{args.label}" if args.label else "")
    _common.write(name, {"ctx": CTX, "slots": SLOTS, "rounds": ROUNDS, "prompt_words": args.prompt_words,
                         "new_tokens": NEW,
                         "unit": "bytes", "rows": rows})


if __name__ == "__main__":
    main()
