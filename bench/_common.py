"""Shared by the benchmarks: their command line, where results go and how they are written, an RSS sampler (the
definitions of RSS and peak are edgeinfer.contract.measure's) and a process's CPU time."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
from pathlib import Path

from edgeinfer.contract.measure import current_rss_bytes

RESULTS = Path(__file__).resolve().parent / "results"


def arguments(doc: str | None) -> argparse.ArgumentParser:
    """Every benchmark's parser: ``--help`` prints the module's docstring and measures nothing, and an argument
    it does not know is an error (exit 2), not a full run that overwrites the committed results."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def onnxruntime_decoder(bench: str, name: str, model: Path, scheme: str, ctx: int, kv_dtype: str = "fp16") -> Path:
    """The onnxruntime plugin's decoder of ``model`` in ``scheme`` with its KV cache in ``kv_dtype`` (its deploy
    conversion), built once into the cache (``bench/<bench>/<name>-<scheme>[-kv]-<ctx>-<the plugin's code>``): a
    changed converter is measured, not its old output."""
    import shutil

    from edgeinfer_onnxruntime.decoder import convert, is_built

    import edgeinfer
    from edgeinfer.contract import cache
    from edgeinfer.contract.schemes import normalize_scheme

    code = cache.code(edgeinfer.backend("onnxruntime"))
    kv = "" if kv_dtype == "fp16" else f"-{kv_dtype}"
    out = cache.area("bench") / bench / f"{name}-{scheme}{kv}-{ctx}-{code}"
    if not is_built(out):
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        convert(model, scheme, ctx, out, normalize_scheme(scheme).group_size, kv_dtype)  # as the backend passes it
    return out


def cpu_ms(pid: int) -> float:
    """CPU time of every thread of ``pid`` so far, in ms (ns resolution, unlike /proc/PID/stat's ticks)."""
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        total += int(Path(f"/proc/{pid}/task/{t}/schedstat").read_text().split()[0])
    return total / 1e6


def machine() -> dict:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write(name: str, data: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "machine": machine(), **data}, indent=2) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    return path


async def timed_stream(client, url: str, path: str, body: dict) -> dict:
    """One streamed OpenAI request (``path`` /v1/completions or /v1/chat/completions, ``body`` with
    ``"stream": True``) read as SSE: TTFT (send → first text chunk), TPOT (mean gap between text chunks after
    the first), end to end, the text and the server's token counts (``usage``, else the chunks seen)."""
    t0 = time.perf_counter()
    first = last = None
    chunks, text, usage = 0, [], {}
    async with client.stream("POST", url + path, json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line.strip() == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if "error" in data:
                raise RuntimeError(str(data["error"])[:300])
            usage = data.get("usage") or usage
            choice = data["choices"][0] if data.get("choices") else {}
            piece = choice.get("text") or choice.get("delta", {}).get("content")
            if piece:
                last = time.perf_counter()
                first = first or last
                chunks += 1
                text.append(piece)
    if first is None or last is None:
        raise RuntimeError(f"no text streamed from {path} for {str(body)[:80]}")
    return {"ttft_s": first - t0, "tpot_s": (last - first) / max(1, chunks - 1),
            "tokens": usage.get("completion_tokens") or chunks, "prompt_tokens": usage.get("prompt_tokens"),
            "e2e_s": last - t0, "text": "".join(text)}


def rss() -> int:
    """Resident set size of this process now (Linux /proc; the benchmarks that sample it need Linux)."""
    n = current_rss_bytes()
    if n is None:
        raise SystemExit("this benchmark reads RSS from /proc/self/statm, which this system does not have")
    return n


class RssSampler:
    """Largest RSS seen (every 2 ms) between start and stop: the peak of one phase in a process that
    may not reset its high-water mark (edgeinfer.contract.measure.reset_peak_rss needs /proc/self/clear_refs)."""

    def __init__(self) -> None:
        self.peak = rss()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, rss())

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        return max(self.peak, rss())
