"""Every benchmark's command line: ``--help`` prints its usage and measures nothing, and an argument it does not
know exits 2 (argparse's error). A script that read ``sys.argv`` by hand ran a full measurement on ``--help`` and
overwrote its committed results (bench/planner_host_llm.py did). The scripts run from a copy of bench/, so one that
still measures writes into the copy; a timeout ends it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"

RUNNER = r"""
import contextlib, io, json, runpy, sys
bench, names = sys.argv[1], sys.argv[2:]
sys.path.insert(0, bench)  # what `python bench/NAME.py` puts first on the path
out = {}
for name in names:
    for arg in ("--help", "--no-such-flag"):
        sys.argv = [f"{bench}/{name}.py", arg]
        text = io.StringIO()
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
            try:
                runpy.run_path(sys.argv[0], run_name="__main__")
                code = "returned"
            except SystemExit as e:
                code = e.code
        out[f"{name} {arg}"] = [code, text.getvalue()]
print(json.dumps(out))
"""


def test_every_benchmark_prints_usage_on_help_and_refuses_an_unknown_argument(tmp_path: Path) -> None:
    copy = tmp_path / "bench"
    shutil.copytree(BENCH, copy, ignore=shutil.ignore_patterns("results", "__pycache__"))
    names = sorted(p.stem for p in BENCH.glob("*.py") if not p.name.startswith("_"))
    assert "planner_host_llm" in names and len(names) > 30
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(copy), *names], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = json.loads(proc.stdout.strip().splitlines()[-1])
    wrong = {}
    for name in names:
        code, text = runs[f"{name} --help"]
        if code != 0 or not text.startswith("usage: "):
            wrong[f"{name} --help"] = (code, text[:200])
        code, text = runs[f"{name} --no-such-flag"]
        if code != 2 or f"{name}.py: error: " not in text:  # unrecognized, or a required argument missing
            wrong[f"{name} --no-such-flag"] = (code, text[-200:])
    assert not wrong, wrong
    # `make bench` runs every script without arguments but those it lists as run by hand
    makefile = (BENCH.parent / "Makefile").read_text()
    by_hand = set(re.search(r"^BENCH_BY_HAND := (.*)$", makefile, re.M).group(1).split())
    need_arguments = {f"bench/{n}.py" for n in names
                      if "the following arguments are required" in runs[f"{n} --no-such-flag"][1]}
    assert need_arguments <= by_hand, need_arguments - by_hand
    assert not (copy / "results").exists(), sorted(p.name for p in (copy / "results").iterdir())
