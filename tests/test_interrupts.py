"""Interrupted work leaves nothing behind: real signals sent to a real `edgeinfer deploy` mid-way.

SIGINT exits 130 and SIGTERM 143 (128 + signal) after removing the run's temporaries; a run killed
with SIGKILL cannot clean up, so the next run removes what it left — but never the temporaries of
a run that is still going.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import tiny_bert_dir

from edgeinfer import files
from edgeinfer.contract import seal
from edgeinfer.contract.seal import SEAL
from edgeinfer.testing import minilm

pytestmark = pytest.mark.slow  # three real deploys of a tiny BERT (torch import + export each)


@pytest.fixture(scope="module")
def hf(tmp_path_factory) -> Path:
    return tiny_bert_dir(tmp_path_factory.mktemp("hf") / "tiny")


@pytest.fixture(scope="module")
def many_sentences(tmp_path_factory) -> Path:
    """Enough golden samples that the golden check (inside the deploy's temporary bundle) takes seconds."""
    path = tmp_path_factory.mktemp("g") / "golden.txt"
    lines = list(minilm.sentences()) * 8
    path.write_text("\n".join(lines) + "\n")
    return path


def _start(args: list[str], cache: Path) -> subprocess.Popen:
    """``edgeinfer ARGS`` with its own cache, writing each step's name to ``cache/../steps.log`` as it starts."""
    env = dict(os.environ, EDGEINFER_CACHE_DIR=str(cache), EDGEINFER_STEP_LOG=str(_step_log(cache)))

    def default_sigint() -> None:  # a background job may inherit SIGINT ignored; a user's shell does not
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    return subprocess.Popen([sys.executable, "-m", "edgeinfer.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, preexec_fn=default_sigint)


def _wait_for(proc: subprocess.Popen, found, timeout: float = 180) -> Path:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        hit = found()
        if hit:
            return hit
        if proc.poll() is not None:
            pytest.fail(f"edgeinfer ended (rc {proc.returncode}) before the step under test: {proc.stderr.read()}")
        time.sleep(0.01)
    proc.kill()
    pytest.fail("the step under test never started")


def _deploy_tmp(parent: Path):
    return lambda: next(iter(parent.glob(".edgeinfer-deploy-*")), None)


def _step_log(cache: Path) -> Path:
    return cache.parent / "steps.log"


def _in_step(cache: Path, prefix: str, then=lambda: True):
    """Found once a step whose name starts with ``prefix`` has started (the run writes its step log:
    edgeinfer/progress.py), and ``then()`` holds."""
    def found():
        log = _step_log(cache)
        steps = log.read_text(encoding="utf-8").splitlines() if log.is_file() else []
        return any(s.startswith(prefix) for s in steps) and then()
    return found


def _leftovers(*roots: Path) -> list[Path]:
    out = []
    for root in roots:
        # the seal of a finished cache entry (the sealed reference export) is not a leftover
        out += [p for p in root.rglob("*")
                if (p.name.startswith(".edgeinfer-") and p.name != SEAL) or ".tmp" in p.name]
    return out


def test_sigterm_during_the_golden_check_exits_143_and_leaves_nothing(hf, many_sentences, tmp_path):
    cache, work = tmp_path / "cache", tmp_path / "work"
    work.mkdir()
    proc = _start(["deploy", str(hf), "--board", "host", "--golden-inputs", str(many_sentences),
                   "-o", str(work / "b")], cache)
    _wait_for(proc, _in_step(cache, "golden check"))  # checking inside the temporary bundle
    tmp = _deploy_tmp(work)()
    assert tmp is not None
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "interrupted (SIGTERM)" in err.splitlines()[-1]
    assert not tmp.exists() and not (work / "b").exists()
    assert _leftovers(work, cache) == []
    assert sorted(p.name for p in (cache / "deploy").iterdir()) == ["onnx"]  # no half-stored cache entry


def test_sigint_during_the_onnx_export_exits_130_and_leaves_nothing(hf, tmp_path):
    cache, work = tmp_path / "cache", tmp_path / "work"
    work.mkdir()
    proc = _start(["deploy", str(hf), "--board", "host", "-o", str(work / "b")], cache)
    exports = cache / "deploy" / "onnx"
    # inside the export step, once it has started filling its cache entry
    _wait_for(proc, _in_step(cache, "exporting", lambda: exports.is_dir() and any(exports.iterdir())))
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted (SIGINT)" in err.splitlines()[-1]
    assert _leftovers(work, cache) == []
    # no partial model.onnx either: on a fast machine the export may finish (and be sealed) before the
    # signal lands; then it is a complete cache entry, which its seal proves (locks/ holds the entries' lock files)
    for entry in {p.parent for p in cache.rglob("*") if p.is_file() and p.parent != cache / "locks"}:
        assert seal.intact(entry), f"partial files left in {entry}"
    assert not (work / "b").exists()


def test_a_caught_interrupt_in_string_code_does_not_make_the_exit_a_sigint(tmp_path):
    """CPython remembers a KeyboardInterrupt that ended ``exec``'d string code (a dataclass being built during an
    import) even when it was caught, and under ``python -m`` dies by SIGINT at exit: the SIGINT test above once
    exited -2 after printing its message. ``main`` forgets it, so the exit code is the command's."""
    (tmp_path / "caught_then_cli.py").write_text(
        "import edgeinfer.cli as cli\n"
        "def invoke(argv, real=cli.invoke):\n"
        "    code = real(argv)\n"
        "    try:  # what a Ctrl-C landing in a dataclass's exec during the command's work leaves\n"
        "        exec('raise KeyboardInterrupt')\n"
        "    except KeyboardInterrupt:\n"
        "        pass\n"
        "    return code\n"
        "cli.invoke = invoke\n"
        "cli.main(['--version'])\n")
    proc = subprocess.run([sys.executable, "-m", "caught_then_cli"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert "edgeinfer" in proc.stdout


def test_a_later_run_removes_what_a_killed_run_left_but_not_a_live_runs(hf, tmp_path):
    cache, work = tmp_path / "cache", tmp_path / "work"
    work.mkdir()
    # the default golden inputs: the first run is killed as soon as its temporary appears, and the
    # later run must only finish (the SIGTERM test above needs the long golden check)
    args = ["deploy", str(hf), "--board", "host", "-o", str(work / "b")]
    proc = _start(args, cache)
    killed_tmp = _wait_for(proc, _deploy_tmp(work))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert killed_tmp.exists()  # SIGKILL cannot be handled: this is what the next run must clean

    dead = subprocess.Popen(["true"])
    dead.wait()
    stale_cache_entry = cache / "deploy" / f"0123456789abcdef01234567.tmp{dead.pid}"  # 0.x cache-store naming
    stale_cache_entry.mkdir(parents=True)
    (stale_cache_entry / "model.onnx").write_bytes(b"\0" * 1024)
    export_dir = next((cache / "deploy" / "onnx").iterdir())
    stale_export = export_dir / f".edgeinfer-export-{dead.pid}-{int(time.time())}-dead.onnx"
    stale_export.write_bytes(b"\0" * 1024)
    live = subprocess.Popen(["sleep", "120"])  # stands for a concurrent deploy into the same folder
    try:
        live_tmp = work / f".edgeinfer-deploy-{live.pid}-{int(time.time())}-live"
        live_tmp.mkdir()
        proc = _start(args, cache)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert not killed_tmp.exists() and not stale_cache_entry.exists() and not stale_export.exists()
        assert live_tmp.exists()  # its owner is alive: never touched
        assert (work / "b" / "manifest.json").is_file()
    finally:
        live.kill()
        live.wait()
    assert files.sweep(work) == [live_tmp]  # owner gone now: swept
