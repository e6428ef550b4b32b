"""Output a person can read: tables at 80 columns, doctor with fixes, quiet stderr, closed pipes."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import edgeinfer, make_plugin_dist, tiny_bert_dir

from edgeinfer.run.doctor import cache_checks, plugins_check, python_check
from edgeinfer.testing.cli import run_cli

ROOT = Path(__file__).resolve().parents[1]
NARROW = {"COLUMNS": "80", "LINES": "50"}


@functools.cache  # one CLI start for the module
def _board_names() -> tuple[str, ...]:
    proc = edgeinfer("boards", "--json")
    assert proc.returncode == 0, proc.stderr
    return tuple(b["name"] for b in json.loads(proc.stdout)["boards"])


@pytest.fixture
def cli(capfd):
    """``edgeinfer ARGS`` in this process (edgeinfer.testing.cli.run_cli): the tables as the command prints them
    for the terminal width in ``env``."""
    return functools.partial(run_cli, capfd)


def _first_cells(table: str) -> list[str]:
    """The first cell of every table line (box-drawing borders stripped)."""
    cells = []
    for line in table.splitlines():
        parts = [p.strip() for p in line.replace("┃", "│").split("│")]
        if len(parts) > 2 and parts[1]:
            cells.append(parts[1])
    return cells


def test_boards_at_80_columns_has_full_names_and_no_ellipsis(cli) -> None:
    proc = cli("boards", env=NARROW)
    assert proc.returncode == 0, proc.stderr
    assert "…" not in proc.stdout
    assert max(len(line) for line in proc.stdout.splitlines()) <= 80
    names = _board_names()
    assert len(names) >= 20
    assert set(names) <= set(_first_cells(proc.stdout))  # each name whole, in its own cell


def test_plan_matrix_at_80_columns_keeps_names_and_reasons_whole(cli) -> None:
    proc = cli("plan", "qwen3-4b", "--board", "all", "--quant", "w8a8", env=NARROW)
    assert proc.returncode == 1  # some boards do not fit or lack w8a8
    assert "…" not in proc.stdout
    assert max(len(line) for line in proc.stdout.splitlines()) <= 80
    assert set(_board_names()) <= set(_first_cells(proc.stdout))
    flat = " ".join(" ".join(c for c in line.split("│")[2:] if c.strip()) for line in proc.stdout.splitlines())
    assert "does not support w8a8 for decoder models" in " ".join(flat.split())  # wrapped, not cut


def test_boards_on_a_wide_terminal_shows_the_family_column(cli) -> None:
    proc = cli("boards", env={"COLUMNS": "200"})
    assert proc.returncode == 0
    assert "family" in proc.stdout and "rk3588" in proc.stdout


# --------------------------------------------------------------------------------------------- doctor

TROUBLED = """
from edgeinfer import hookimpl
from edgeinfer.contract.backend import Backend, Probe, Problem

class TroubledBackend(Backend):
    name = "troubled"
    def probe(self):
        return Probe(False, problems=[Problem("libtroubled.so is missing", "apt install troubled-runtime")])
    def convert(self, model, scheme, calibration, out, **options):
        raise NotImplementedError
    def open(self, artifact, device, stamp, **options):
        raise NotImplementedError

@hookimpl
def register_backends(register):
    register(TroubledBackend)
"""


def test_doctor_prints_each_problem_with_its_fix_and_the_environment(tmp_path: Path) -> None:
    (tmp_path / "plug").mkdir()
    env = make_plugin_dist(tmp_path / "plug", "edgeinfer-troubled", "troubled", TROUBLED)
    env.update(EDGEINFER_PLUGINS="troubled,onnxruntime", EDGEINFER_CACHE_DIR=str(tmp_path / "cache"), **NARROW)
    proc = edgeinfer("doctor", env=env)
    assert proc.returncode == 0, proc.stderr  # onnxruntime is usable
    lines = [ln.strip() for ln in proc.stdout.splitlines()]
    i = lines.index("problem: libtroubled.so is missing")
    assert lines[i + 1] == "fix: apt install troubled-runtime"
    assert any(ln.startswith("✗ troubled") for ln in lines)
    assert any(ln.startswith("✓ onnxruntime") for ln in lines)
    text = " ".join(proc.stdout.split())
    assert f"python: {sys.version_info.major}.{sys.version_info.minor}" in text
    assert f"cache writable: {tmp_path / 'cache'}" in text
    assert "GiB free" in text
    assert "EDGEINFER_PLUGINS: only these plugins load: troubled, onnxruntime" in text
    assert "fix: unset EDGEINFER_PLUGINS" in text
    assert "usable backends: onnxruntime" in text


def test_doctor_json_carries_environment_checks_and_exit_3_without_backends(tmp_path: Path) -> None:
    proc = edgeinfer("doctor", "--json", env={"EDGEINFER_PLUGINS": "", "EDGEINFER_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 3
    report = json.loads(proc.stdout)
    checks = {c["name"]: c for c in report["environment"]}
    assert {"python", "cache writable", "cache free disk", "EDGEINFER_PLUGINS"} <= set(checks)
    assert checks["EDGEINFER_PLUGINS"]["status"] == "warn"
    assert report["usable"] == []


def test_doctor_reports_an_unwritable_cache_with_a_fix(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    writable, _space = cache_checks(blocker / "edgeinfer")
    assert writable.status == "fail"
    assert "EDGEINFER_CACHE_DIR" in writable.fix


def test_doctor_shows_the_cache_bound_and_fails_a_bad_one(tmp_path: Path, monkeypatch) -> None:
    from edgeinfer.run.doctor import cache_bound_check

    monkeypatch.setenv("EDGEINFER_CACHE_DIR", str(tmp_path))
    (tmp_path / "deploy" / "e1").mkdir(parents=True)
    (tmp_path / "deploy" / "e1" / "model.bin").write_bytes(b"x" * 3_000_000)
    monkeypatch.setenv("EDGEINFER_CACHE_MAX_GB", "2.5")
    ok = cache_bound_check()
    assert ok.status == "ok" and "conversions 0.0 GB of 2.5 GB" in ok.found
    monkeypatch.setenv("EDGEINFER_CACHE_MAX_GB", "off")
    assert "no bound" in cache_bound_check().found
    monkeypatch.setenv("EDGEINFER_CACHE_MAX_GB", "twenty")
    bad = cache_bound_check()
    assert bad.status == "fail" and "'twenty'" in bad.found and "EDGEINFER_CACHE_MAX_GB=50" in bad.fix


def test_python_and_plugin_checks() -> None:
    old = python_check((3, 9, 18))
    assert old.status == "fail" and "3.10" in old.fix
    assert python_check((3, 12, 1)).status == "ok"
    assert plugins_check({}).status == "ok"
    assert plugins_check({"EDGEINFER_PLUGINS": ""}).status == "warn"


def test_backends_table_points_to_doctor_for_problems(tmp_path: Path) -> None:
    env = make_plugin_dist(tmp_path, "edgeinfer-troubled", "troubled", TROUBLED)
    env.update(EDGEINFER_PLUGINS="troubled", **NARROW)
    proc = edgeinfer("backends", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "1: see doctor" in proc.stdout and "…" not in proc.stdout


# ---------------------------------------------------------------------------------------- closed pipes


def _with_closed_stdout(*args: str) -> subprocess.CompletedProcess:
    """Run the CLI with stdout a pipe whose reader is already gone: every write meets EPIPE."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, "-m", "edgeinfer.cli", *args], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)


@pytest.mark.parametrize("args, code", [
    (("plan", "qwen3-4b", "--board", "rk3588-16g", "--quant", "w8a8"), 0),
    (("plan", "qwen3-4b", "--board", "rk3588-4g", "--quant", "w8a8"), 1),
    (("plan", "qwen3-4b", "--board", "rk3588-16g", "--quant", "w8a8", "--json"), 0),
    (("boards",), 0),
])
def test_a_closed_pipe_keeps_the_commands_own_exit_code_and_a_clean_stderr(args, code) -> None:
    proc = _with_closed_stdout(*args)
    assert proc.returncode == code
    assert proc.stderr == ""


def test_plan_piped_into_head_exits_0_when_it_fits() -> None:
    cmd = (f"{sys.executable} -m edgeinfer.cli plan qwen3-4b --board rk3588-16g --quant w8a8 | head -1; "
           "exit ${PIPESTATUS[0]}")
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    assert proc.stdout.startswith("Qwen/Qwen3-4B on rk3588-16g") and proc.stdout.count("\n") == 1
    assert proc.stderr == ""


# ---------------------------------------------------------------------------------------- quiet stderr


@pytest.mark.slow
def test_a_failing_deploy_prints_exactly_one_line_on_stderr(tmp_path: Path) -> None:
    """A fresh cache: the ONNX export (torch, transformers, torchao) and NNCF int8 both run and would
    print logs, warnings and progress bars; only edgeinfer's verdict may reach stderr. (A tiny BERT: the same
    libraries run as for MiniLM, in a fraction of the time.) ``--quiet``: edgeinfer's own progress lines (one
    every 10 s off a terminal, tests/test_progress.py) are off too."""
    model = tiny_bert_dir(tmp_path / "tiny-bert")
    env = {k: v for k, v in os.environ.items()  # the libraries' defaults, whatever the shell set
           if k not in ("TORCH_LOGS", "TRANSFORMERS_VERBOSITY", "EDGEINFER_VERBOSE", "EDGEINFER_DEBUG")}
    env["EDGEINFER_CACHE_DIR"] = str(tmp_path / "cache")
    args = ["deploy", str(model), "--board", "core-ultra-155h", "--quant", "int8", "--calib",
            str(ROOT / "examples" / "sentences.txt"), "--threshold", "0.9999999", "-o", str(tmp_path / "b")]
    proc = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "--quiet", *args], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()  # the plan deploy builds for (one line here), then the verdict
    assert len(lines) == 2, proc.stderr
    assert lines[0].startswith("plan: tiny-bert on core-ultra-155h: openvino-npu w8a8, ctx "), proc.stderr
    assert lines[1].startswith("error: golden check FAILED (threshold 0.9999999)")
    assert not (tmp_path / "b").exists()

    loud = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "--verbose", *args], capture_output=True,
                          text=True, env=env, timeout=600)
    assert loud.returncode == 1
    assert len(loud.stderr.splitlines()) > 1  # --verbose lets the libraries' output through


@pytest.mark.parametrize("args, code", [
    (("boards", "show", "rk3588-8g"), 0),
    (("boards", "show", "core-ultra-258v"), 0),
    (("plan", "Qwen/Qwen3-8B", "--board", "rk3588-8g", "--ctx", "8192"), 1),
    (("plan", "qwen3-4b", "qwen3-8b", "llama-3.1-8b", "--board", "all", "--quant", "fp16"), 1),
])
def test_other_tables_at_80_columns_never_cut_a_cell(args, code, cli) -> None:
    proc = cli(*args, env=NARROW)
    assert proc.returncode == code, proc.stderr
    assert "…" not in proc.stdout
    assert max(len(line) for line in proc.stdout.splitlines()) <= 80
