"""Board-side install: the core plus the OpenVINO plugin with only its runtime runs a bundle.

A fresh venv gets ``pip install '.[text]' ./plugins/openvino`` (this interpreter's pip, pointed at the
venv with ``--python``; wheels from the configured index or cache, no network needed beyond it), then
runs a MiniLM bundle deployed by this (full) environment with ``edgeinfer run BUNDLE --text … --json``
and ``edgeinfer golden BUNDLE``. Every module the process imported is dumped at exit: no conversion-only
package may be among them, nor installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
CONVERSION_ONLY = ("torch", "transformers", "onnx", "onnxruntime", "nncf", "optimum", "torchao", "onnxscript")

# Runs the CLI like the `edgeinfer` script does and writes sys.modules to $MODULES_OUT at exit.
WRAPPER = """
import atexit, json, os, runpy, sys
atexit.register(lambda: open(os.environ["MODULES_OUT"], "w").write(json.dumps(sorted(sys.modules))))
sys.argv = ["edgeinfer", *sys.argv[1:]]
runpy.run_module("edgeinfer.cli", run_name="__main__")
"""


@pytest.fixture(scope="module")
def board_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("board") / "venv"
    venv.EnvBuilder(with_pip=False).create(root)  # no ensurepip: this interpreter's pip installs into it
    py = root / "bin" / "python"
    pkgs = [f"{ROOT}[text]", str(ROOT / "plugins" / "openvino")]  # README: pip install '.[text]' ./plugins/openvino
    proc = subprocess.run(_pip(py, "install", "-q", *pkgs), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return py


@pytest.fixture(scope="module")
def ov_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MiniLM deployed for core-ultra-155h by this environment (the conversion cache makes reruns quick)."""
    from edgeinfer.deploy.encoder import deploy
    from edgeinfer.testing.minilm import model_dir

    out = tmp_path_factory.mktemp("bundle") / "minilm-ov"
    deploy(model_dir(), "core-ultra-155h", out, buckets="none")  # one artifact is enough here
    return out


def _pip(py: Path, *args: str) -> list[str]:
    """pip acting on the environment of interpreter ``py`` (https://pip.pypa.io/en/stable/cli/pip/#cmdoption-python)."""
    return [sys.executable, "-m", "pip", "--python", str(py), *args]


def _installed(py: Path) -> set[str]:
    proc = subprocess.run(_pip(py, "list", "--format=json"), capture_output=True, text=True, timeout=120)
    return {p["name"].lower().replace("-", "_") for p in json.loads(proc.stdout)}


def _run(py: Path, tmp: Path, *args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    dump = tmp / f"modules-{args[0]}.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "EDGEINFER_PLUGINS")}
    env["MODULES_OUT"] = str(dump)
    proc = subprocess.run([str(py), "-c", WRAPPER, *args], capture_output=True, text=True, env=env, cwd=tmp,
                          timeout=300)
    return proc, {m.split(".")[0] for m in json.loads(dump.read_text())}


@pytest.mark.slow
def test_board_side_install_runs_a_bundle_without_conversion_packages(board_venv: Path, ov_bundle: Path,
                                                                      tmp_path: Path) -> None:
    installed = _installed(board_venv)
    assert {"edgeinfer", "edgeinfer_openvino", "openvino", "tokenizers"} <= installed
    assert installed.isdisjoint(CONVERSION_ONLY), installed & set(CONVERSION_ONLY)

    run, mods = _run(board_venv, tmp_path, "run", str(ov_bundle), "--text", "a board runs bundles", "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["backend"] == "openvino"
    emb = np.asarray(report["embeddings"])
    assert emb.shape == (1, 384)  # all-MiniLM-L6-v2's width
    assert abs(np.linalg.norm(emb) - 1) < 1e-3  # the bundle's pooling normalizes
    assert "openvino" in mods and "edgeinfer_openvino" in mods
    assert mods.isdisjoint(CONVERSION_ONLY), mods & set(CONVERSION_ONLY)

    golden, mods = _run(board_venv, tmp_path, "golden", str(ov_bundle))
    assert golden.returncode == 0, golden.stderr
    assert "golden check passed" in golden.stdout
    assert mods.isdisjoint(CONVERSION_ONLY), mods & set(CONVERSION_ONLY)


@pytest.mark.slow
def test_board_side_install_says_how_to_get_conversion(board_venv: Path, tmp_path: Path) -> None:
    """Converting needs NNCF; the board install names the extra that adds it."""
    proc = subprocess.run([str(board_venv), "-m", "edgeinfer.cli", "doctor"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert "nncf is not installed" in text
    assert "fix: pip install './plugins/openvino[convert]'" in text
