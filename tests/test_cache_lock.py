"""edgeinfer.contract.cache.locked: two processes filling the same cache entry at the same time (two xdist
workers running the same session fixture, two deploys of one model) convert once; the second waits for the
first one's result and reuses it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

# each process fills the same entry; the build appends a line to builds.log, so the log counts conversions.
# The first one's build waits until the second has started its fill (second.ready), so the two overlap.
FILL = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from edgeinfer.contract import cache

    role, work = sys.argv[1], Path(sys.argv[2])

    def build(d):
        with open(work / "builds.log", "a") as f:
            f.write(role + "\\n")
        if role == "first":
            deadline = time.monotonic() + 120
            while not (work / "second.ready").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.5)  # the second is in fill(), waiting for the lock
        (d / "model.bin").write_bytes(role.encode())

    if role == "second":
        while not (work / "builds.log").exists():  # the first one is building
            time.sleep(0.01)
        (work / "second.ready").touch()
    entry = cache.fill(cache.area("artifacts") / "test" / "entry", build)
    print((entry / "model.bin").read_text())
""")


def _start(role: str, work: Path) -> subprocess.Popen:
    env = dict(os.environ, EDGEINFER_CACHE_DIR=str(work / "cache"))
    return subprocess.Popen([sys.executable, "-c", FILL, role, str(work)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_two_processes_filling_one_entry_convert_once_and_both_get_the_result(tmp_path):
    first, second = _start("first", tmp_path), _start("second", tmp_path)
    outs = [p.communicate(timeout=180) for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], outs
    assert (tmp_path / "second.ready").exists()  # they overlapped
    assert (tmp_path / "builds.log").read_text().splitlines() == ["first"]
    assert [o.strip() for o, _ in outs] == ["first", "first"]
