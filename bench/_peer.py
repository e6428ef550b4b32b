"""The pure parts of bench/peer_llamacpp.py: a streaming ``/v1/completions`` client that works against both
``edgeinfer serve`` and ``llama-server``, the per-level summary, the ratio table, the quality gate and an RSS
sampler of a whole process tree (a server and every process it started). Tested by tests/test_bench_peer.py."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from pathlib import Path

from _common import timed_stream

from edgeinfer.contract.measure import latency_stats

#: metric -> True when a larger value is better (the ratio is always edgeinfer ÷ llama.cpp)
METRICS = {"tok_s": True, "ttft_ms_p50": False, "ttft_ms_p99": False, "tpot_ms": False}


# -- process tree RSS (Linux /proc) -------------------------------------------------------------------------

def tree_pids(root: int) -> list[int]:
    """``root`` and all its descendants alive now (parent links from /proc/PID/stat)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])  # the name in () may hold spaces
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def tree_rss_bytes(root: int, pids: list[int] | None = None) -> int:
    """Sum of the resident set sizes of ``root``'s tree (or of ``pids``, a listing of it); pages shared
    between its processes count once per process, as ``ps`` would add them up."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for pid in pids if pids is not None else tree_pids(root):
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        except (OSError, ValueError, IndexError):
            pass  # exited between the listing and the read
    return total


MAPPING = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")  # a mapping's line in /proc/PID/smaps, its fields after it


def tree_files_once_bytes(root: int, pids: list[int] | None = None) -> int:
    """Resident bytes of ``root``'s tree (or of ``pids``) with each file's pages counted once: every process's
    anonymous pages, plus per mapped file (a library, a model file) the most any one process of the tree holds of
    it (/proc/PID/smaps). Where :func:`tree_rss_bytes` counts a library both of edgeinfer serve's processes map
    twice, this counts it once, as one process would hold it; pages shared with processes outside the tree (the
    peer server mapping the same GGUF) still count whole, which a proportional set size (Pss) would halve."""
    anon, files = 0, {}
    for pid in pids if pids is not None else tree_pids(root):
        try:
            smaps = Path(f"/proc/{pid}/smaps").read_text()
        except OSError:
            continue  # exited between the listing and the read
        held: dict[str, int] = {}
        name, rss = "", 0
        for line in smaps.splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("Anonymous:"):
                private = int(line.split()[1]) * 1024  # anonymous pages, also those copied from a private file map
                anon += private
                if name.startswith("/"):
                    held[name] = held.get(name, 0) + rss - private
            elif MAPPING.match(line):
                parts = line.split(None, 5)
                name = parts[5] if len(parts) > 5 else ""
        for name, n in held.items():
            files[name] = max(files.get(name, 0), n)
    return anon + sum(files.values())


class TreeRssSampler:
    """Largest :func:`tree_rss_bytes` of ``root`` seen every ``interval`` seconds since start (a thread), and
    (``peak_files_once``) the largest :func:`tree_files_once_bytes` every ``files_once_every`` samples (it reads
    every mapping of every process). The tree is listed again every ``relist`` samples only: listing reads every
    process's /proc/PID/stat, which would take CPU from the servers being measured."""

    def __init__(self, root: int, interval: float = 0.05, relist: int = 20, files_once_every: int = 10) -> None:
        self.root, self.interval, self.relist, self.files_once_every = root, interval, relist, files_once_every
        self.peak = tree_rss_bytes(root)
        self.peak_files_once = tree_files_once_bytes(root)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()

    def _loop(self) -> None:
        n, pids = 0, tree_pids(self.root)
        while not self._stop.wait(self.interval):
            n += 1
            if n % self.relist == 0:
                pids = tree_pids(self.root)
            self.peak = max(self.peak, tree_rss_bytes(self.root, pids))
            if n % self.files_once_every == 0:
                self.peak_files_once = max(self.peak_files_once, tree_files_once_bytes(self.root, pids))

    def stop(self) -> int:
        """The peak RSS; ``peak_files_once`` holds the other peak."""
        self._stop.set()
        self._t.join()
        self.peak_files_once = max(self.peak_files_once, tree_files_once_bytes(self.root))
        return max(self.peak, tree_rss_bytes(self.root))


# -- the streaming client ------------------------------------------------------------------------------------

async def stream_one(client, url: str, model: str, prompt: str, max_tokens: int) -> dict:
    """One streamed greedy completion (bench/_common.py timed_stream: TTFT, TPOT, text, usage)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    return await timed_stream(client, url, "/v1/completions", body)


async def _level(url: str, model: str, prompts: list[str], max_tokens: int) -> tuple[list[dict], float]:
    import httpx

    async with httpx.AsyncClient(timeout=httpx.Timeout(900.0),
                                 limits=httpx.Limits(max_connections=len(prompts) + 2)) as client:
        t0 = time.perf_counter()
        rows = await asyncio.gather(*(stream_one(client, url, model, p, max_tokens) for p in prompts))
        return list(rows), time.perf_counter() - t0


def run_level(url: str, model: str, prompts: list[str], max_tokens: int) -> dict:
    """All ``prompts`` sent at once (one stream each) and summarised by :func:`summarize`."""
    rows, wall = asyncio.run(_level(url, model, prompts, max_tokens))
    return summarize(rows, wall)


def run_level_texts(url: str, model: str, prompts: list[str], max_tokens: int) -> list[str]:
    """The generated texts of ``prompts`` sent at once."""
    rows, _ = asyncio.run(_level(url, model, prompts, max_tokens))
    return [r["text"] for r in rows]


def summarize(rows: list[dict], wall_s: float) -> dict:
    """Aggregate generated tok/s (all streams' tokens / wall time), TTFT p50/p99 and mean TPOT in ms."""
    ttft = latency_stats([r["ttft_s"] * 1e3 for r in rows])
    tpot = latency_stats([r["tpot_s"] * 1e3 for r in rows])
    tokens = sum(r["tokens"] for r in rows)
    return {"streams": len(rows), "tokens": tokens, "wall_s": round(wall_s, 3),
            "tok_s": round(tokens / wall_s, 3), "ttft_ms_p50": round(ttft["p50"], 2),
            "ttft_ms_p99": round(ttft["p99"], 2), "tpot_ms": round(tpot["mean"], 3),
            "prompt_tokens": sorted({r["prompt_tokens"] for r in rows if r["prompt_tokens"] is not None})}


# -- rounds, ratios ------------------------------------------------------------------------------------------

def median_over_rounds(rounds: list[dict]) -> dict:
    """Per workload and metric, the median over rounds (``rounds``: [{workload: summary}, ...])."""
    out: dict[str, dict] = {}
    for workload in rounds[0]:
        out[workload] = {}
        for metric in METRICS:
            xs = sorted(r[workload][metric] for r in rounds if workload in r)
            out[workload][metric] = xs[(len(xs) - 1) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] +
                                                                                 xs[len(xs) // 2]) / 2
    return out


def ratio_table(edgeinfer: dict, llamacpp: dict) -> dict:
    """edgeinfer ÷ llama.cpp per workload and metric (None where llama.cpp's figure is 0), and
    ``peak_rss`` (``peak_files_once``): the ratio of the two ``peak_rss_bytes`` (``peak_files_once_bytes``)."""
    table: dict[str, dict] = {}
    for workload, ours in edgeinfer.items():
        if not isinstance(ours, dict) or workload not in llamacpp:  # peak_*_bytes, rounds
            continue
        table[workload] = {}
        for metric in METRICS:
            a, b = ours[metric], llamacpp[workload][metric]
            table[workload][metric] = round(a / b, 3) if b else None
    for key in ("rss", "files_once"):
        if edgeinfer.get(f"peak_{key}_bytes") and llamacpp.get(f"peak_{key}_bytes"):
            table[f"peak_{key}"] = round(edgeinfer[f"peak_{key}_bytes"] / llamacpp[f"peak_{key}_bytes"], 3)
    return table


def round_ratios(edgeinfer: list[dict], llamacpp: list[dict], metric: str = "tok_s") -> dict[str, list[float]]:
    """Per workload, edgeinfer ÷ llama.cpp of ``metric`` in each round (the two sides of a round ran back to back,
    A B): how far one round's verdict can move from the median's on this machine."""
    out: dict[str, list[float]] = {}
    for workload in edgeinfer[0] if edgeinfer else []:
        pairs = [(a[workload][metric], b[workload][metric]) for a, b in zip(edgeinfer, llamacpp)]
        out[workload] = [round(x / y, 3) for x, y in pairs if y]
    return out


def settled(ratios: list[float], line: float = 1.0) -> bool:
    """Whether every round is on the same side of ``line`` (a verdict no single round contradicts)."""
    return bool(ratios) and (min(ratios) >= line or max(ratios) < line)


def leading_agreement(reference_tokens: list[str], text: str) -> int:
    """How many of the reference's leading tokens (their text pieces) ``text`` reproduces in order."""
    pos = n = 0
    for piece in reference_tokens:
        if text[pos:pos + len(piece)] != piece:
            break
        pos += len(piece)
        n += 1
    return n


