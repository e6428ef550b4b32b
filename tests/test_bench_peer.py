"""The pure parts of bench/peer_llamacpp.py (bench/_peer.py): summaries, ratios, the quality-gate count and the
RSS of a process tree. The bench itself (servers, minutes) is not in the suite."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.append(str(BENCH))  # _peer imports bench/_common.py as the bench scripts do
_spec = importlib.util.spec_from_file_location("_peer", BENCH / "_peer.py")
peer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peer)


def _summary(tok_s: float, ttft50: float, ttft99: float, tpot: float) -> dict:
    return {"tok_s": tok_s, "ttft_ms_p50": ttft50, "ttft_ms_p99": ttft99, "tpot_ms": tpot}


def test_summarize_streams() -> None:
    rows = [{"ttft_s": t, "tpot_s": 0.01 * (i + 1), "tokens": 64, "prompt_tokens": 32}
            for i, t in enumerate([0.4, 0.1, 0.3, 0.2])]
    s = peer.summarize(rows, wall_s=2.0)
    assert s["tokens"] == 256 and s["tok_s"] == 128.0
    assert s["ttft_ms_p50"] == 200.0 and s["ttft_ms_p99"] == 400.0  # nearest rank of 4 samples
    assert s["tpot_ms"] == 25.0 and s["prompt_tokens"] == [32]


def test_median_over_rounds_and_ratio_table() -> None:
    rounds = [{"c1": _summary(10, 100, 120, 50)}, {"c1": _summary(12, 90, 110, 40)}, {"c1": _summary(30, 80, 95, 45)}]
    med = peer.median_over_rounds(rounds)
    assert med["c1"] == _summary(12, 90, 110, 45)
    assert peer.median_over_rounds(rounds[:2])["c1"]["tok_s"] == 11  # even count: mean of the middle two
    theirs = {"c1": _summary(24, 45, 220, 90), "peak_rss_bytes": 200}
    ratios = peer.ratio_table({**med, "peak_rss_bytes": 300, "rounds": rounds}, {**theirs, "rounds": []})
    assert ratios == {"c1": {"tok_s": 0.5, "ttft_ms_p50": 2.0, "ttft_ms_p99": 0.5, "tpot_ms": 0.5}, "peak_rss": 1.5}
    ratios = peer.ratio_table({**med, "peak_rss_bytes": 300, "peak_files_once_bytes": 240, "rounds": rounds},
                              {**theirs, "peak_files_once_bytes": 200, "rounds": []})
    assert ratios["peak_rss"] == 1.5 and ratios["peak_files_once"] == 1.2


def test_round_ratios_pair_each_round_and_settled_needs_every_round_on_one_side() -> None:
    ours = [{"c1": _summary(10, 100, 120, 50)}, {"c1": _summary(12, 90, 110, 40)}]
    theirs = [{"c1": _summary(8, 45, 220, 90)}, {"c1": _summary(16, 45, 220, 90)}]
    assert peer.round_ratios(ours, theirs) == {"c1": [1.25, 0.75]}
    assert peer.round_ratios(ours, theirs, "ttft_ms_p50") == {"c1": [2.222, 2.0]}
    assert not peer.settled([1.25, 0.75]) and peer.settled([1.0, 1.3]) and peer.settled([0.7, 0.99])
    assert not peer.settled([])


def test_leading_agreement_counts_reference_tokens_in_order() -> None:
    ref = [" the", " river", " city", " at", " dawn"]
    assert peer.leading_agreement(ref, " the river city at dawn and more") == 5
    assert peer.leading_agreement(ref, " the river town at dawn") == 2
    assert peer.leading_agreement(ref, "the river") == 0


def _descendant(pid: int) -> int | None:
    kids = Path(f"/proc/{pid}/task/{pid}/children")
    ids = kids.read_text().split() if kids.exists() else []
    return int(ids[0]) if ids else None


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads /proc (Linux)")
def test_tree_rss_includes_a_grandchild() -> None:
    grandchild = "x = bytearray(96 << 20); x[::4096] = b'1' * len(x[::4096]); print('ok', flush=True); " \
                 "import time; time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; "
                              f"subprocess.run([sys.executable, '-c', {grandchild!r}])"], stdout=subprocess.PIPE)
    gc = None
    try:
        assert child.stdout.readline().strip() == b"ok"  # the grandchild holds its 96 MiB now
        deadline = time.monotonic() + 5
        while (gc := _descendant(child.pid)) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gc is not None
        assert set(peer.tree_pids(child.pid)) == {child.pid, gc}
        own = int(Path(f"/proc/{child.pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        sampler = peer.TreeRssSampler(child.pid, interval=0.01, files_once_every=2)
        time.sleep(0.05)
        rss = sampler.stop()
        assert rss >= own + (96 << 20)
        # the grandchild's 96 MiB are its own anonymous pages; the interpreter's files both processes map count
        # once, so the tree holds less than its RSS adds up
        assert 96 << 20 <= sampler.peak_files_once < rss
    finally:
        if gc is not None:
            os.kill(gc, 9)
        child.kill()
        child.wait()


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads /proc (Linux)")
def test_a_file_both_processes_of_a_tree_map_counts_once_in_files_once(tmp_path: Path) -> None:
    """A 64 MiB file read through mmap by a child and its grandchild (as serve's HTTP process and worker both map
    libpython): tree_rss_bytes counts its pages in each, tree_files_once_bytes once."""
    data = tmp_path / "weights.bin"
    data.write_bytes(os.urandom(64 << 20))
    hold = (f"import mmap, sys, time; f = open({str(data)!r}, 'rb'); m = mmap.mmap(f.fileno(), 0, "
            "access=mmap.ACCESS_READ); sum(m[i] for i in range(0, len(m), 4096)); print('ok', flush=True); "
            "time.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; p = subprocess.Popen([sys.executable, "
                              f"'-c', {hold!r}]); exec({hold!r})"], stdout=subprocess.PIPE)
    gc = None
    try:
        assert [child.stdout.readline().strip() for _ in range(2)] == [b"ok", b"ok"]  # both have read the file
        gc = _descendant(child.pid)
        assert gc is not None
        pids = [child.pid, gc]
        rss, once = peer.tree_rss_bytes(child.pid, pids), peer.tree_files_once_bytes(child.pid, pids)
        assert rss - once >= 60 << 20, ((rss - once) >> 20)  # the file's pages (and the interpreter's) once less
        assert once >= 64 << 20  # counted once, not left out
    finally:
        for pid in (gc, child.pid):
            if pid is not None:
                os.kill(pid, 9)
        child.wait()
