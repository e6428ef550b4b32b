"""``make test``'s scheduling holds with the pytest and pytest-xdist installed: under ``-n 2 --dist loadgroup``
the repository's conftest.py groups a module whose tests share a module-scoped fixture, so that fixture (a deploy,
a server) is built once, on one worker. pytest 9.2 with pytest-xdist 3.8 broke this silently: every such fixture
was built on both workers (https://github.com/pytest-dev/pytest-xdist/issues/1386, requirements-dev.txt)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SHARED = '''
import os, pytest

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    with open(os.environ["SETUPS"], "a") as f:
        f.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")
    return 1

@pytest.mark.parametrize("i", range(8))
def test_uses_the_module_fixture(built, i):
    assert built == 1
'''

ALONE = '''
import pytest

@pytest.mark.parametrize("i", range(8))
def test_needs_nothing_shared(i):
    assert i >= 0
'''


def test_a_module_fixture_is_built_once_under_two_workers(tmp_path):
    (tmp_path / "conftest.py").write_text((ROOT / "conftest.py").read_text())  # the scheduling under test
    (tmp_path / "test_shared.py").write_text(SHARED)
    (tmp_path / "test_alone.py").write_text(ALONE)
    setups = tmp_path / "setups.txt"
    env = {**os.environ, "SETUPS": str(setups)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-q", "-p",
                          "no:cacheprovider", "--rootdir", str(tmp_path), "--basetemp", str(tmp_path / "tmp"),
                          str(tmp_path / "test_shared.py"), str(tmp_path / "test_alone.py")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "16 passed" in run.stdout
    workers = setups.read_text().split()
    assert len(workers) == 1, f"the module fixture was built {len(workers)} times, on {workers}"
    assert workers[0].startswith("gw")  # it did run under xdist
