"""Board-side installs: the README's board install lines, each in a fresh venv, run the bundles they are for.

A fresh venv gets the README's Intel encoder line (``pip install '.[text]' ./plugins/openvino``; this
interpreter's pip, pointed at the venv with ``--python``; wheels from the configured index or cache, no network
needed beyond it), then runs a MiniLM bundle deployed by this (full) environment with ``edgeinfer run BUNDLE
--text … --json`` and ``edgeinfer golden BUNDLE``. Every module the process imported is dumped at exit: no
conversion-only package may be among them, nor installed.

With ``EDGEINFER_INSTALL_TESTS=1`` (``make test-install``; it needs the package index and a few minutes), a second
venv gets the README's Intel decoder line and runs a tiny OpenVINO decoder bundle with ``generate`` and the MiniLM
bundle with ``run``; the encoder line alone must answer the decoder bundle with exit 3 naming the decoder line's
extra; a third venv gets the serving line and serves both bundles (one embeddings and one chat request). The
host (onnxruntime) lines get the same three checks with host bundles: a MiniLM one and a w4a16 decoder with the
own CPU ops, whose greedy tokens must equal this environment's.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import venv
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
INSTALL_TESTS = pytest.mark.skipif(os.environ.get("EDGEINFER_INSTALL_TESTS") != "1",
                                   reason="fresh-venv installs: set EDGEINFER_INSTALL_TESTS=1 (make test-install)")
CONVERSION_ONLY = ("torch", "transformers", "onnx", "onnxruntime", "nncf", "optimum", "torchao", "onnxscript")

# Runs the CLI like the `edgeinfer` script does and writes sys.modules to $MODULES_OUT at exit.
WRAPPER = """
import atexit, json, os, runpy, sys
atexit.register(lambda: open(os.environ["MODULES_OUT"], "w").write(json.dumps(sorted(sys.modules))))
sys.argv = ["edgeinfer", *sys.argv[1:]]
runpy.run_module("edgeinfer.cli", run_name="__main__")
"""


def readme_lines(board: str) -> dict[str, list[str]]:
    """The README's board install lines of ``board`` (encoder, decoder, serve), as pip arguments from the root."""
    readme = (ROOT / "README.md").read_text()
    row = next(ln for ln in readme.splitlines() if ln.startswith(f"| {board} |"))
    lines = re.findall(r"`pip install ([^`]+)`", row)
    assert len(lines) == 3, row
    args = [[a if not a.startswith(".") else str(ROOT) + a[1:] for a in shlex.split(line)] for line in lines]
    return dict(zip(("encoder", "decoder", "serve"), args))


def fresh_venv(root: Path, pip_args: list[str]) -> Path:
    venv.EnvBuilder(with_pip=False).create(root)  # no ensurepip: this interpreter's pip installs into it
    py = root / "bin" / "python"
    # pip builds a local project inside its tree (build/, *.egg-info): two builds of the repository at once (two
    # xdist workers) or one left half-done collide there ("File exists: build/bdist..."), so build a copy
    src = root.parent / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".hypothesis", ".pytest_cache"))
    pip_args = [str(src) + a[len(str(ROOT)):] if a.startswith(str(ROOT)) else a for a in pip_args]
    # --no-compile: byte-compiling every installed module (seconds) is no part of what is checked here
    proc = subprocess.run(_pip(py, "install", "-q", "--no-compile", *pip_args), capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return py


@pytest.fixture(scope="module")
def board_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fresh_venv(tmp_path_factory.mktemp("board") / "venv", readme_lines("Intel Core Ultra")["encoder"])


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


@pytest.fixture(scope="module")
def decoder_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fresh_venv(tmp_path_factory.mktemp("board-llm") / "venv", readme_lines("Intel Core Ultra")["decoder"])


@pytest.fixture(scope="module")
def ov_decoder_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny test decoder deployed for core-ultra-155h by this environment (its conversion is cached)."""
    from edgeinfer.deploy.decoder import deploy_decoder
    from edgeinfer.testing.llm import model_dir

    out = tmp_path_factory.mktemp("llm-bundle") / "tiny-qwen3-ov"
    deploy_decoder(model_dir(), "core-ultra-155h", out, ctx=256)
    return out


@INSTALL_TESTS
@pytest.mark.slow
def test_board_decoder_line_runs_a_decoder_bundle_and_an_encoder_bundle(decoder_venv: Path, ov_decoder_bundle: Path,
                                                                        ov_bundle: Path, tmp_path: Path) -> None:
    gen, mods = _run(decoder_venv, tmp_path, "generate", str(ov_decoder_bundle), "--prompt",
                     "THE SOFTWARE IS PROVIDED", "--max-new-tokens", "8", "--json")
    assert gen.returncode == 0, gen.stderr
    out = json.loads(gen.stdout)
    assert out["backend"] == "openvino" and len(out["token_ids"]) == 8 and out["text"].strip()
    assert {"openvino_genai", "edgeinfer_openvino"} <= mods
    assert mods.isdisjoint(CONVERSION_ONLY), mods & set(CONVERSION_ONLY)

    run, mods = _run(decoder_venv, tmp_path, "run", str(ov_bundle), "--text", "a board runs bundles", "--json")
    assert run.returncode == 0, run.stderr
    assert np.asarray(json.loads(run.stdout)["embeddings"]).shape == (1, 384)

    verify, _ = _run(decoder_venv, tmp_path, "verify", str(ov_decoder_bundle), "--json")
    assert verify.returncode == 0, verify.stderr
    assert json.loads(verify.stdout)["installed"] is True


@INSTALL_TESTS
@pytest.mark.slow
def test_board_encoder_line_answers_a_decoder_bundle_with_the_decoder_extra(board_venv: Path,
                                                                            ov_decoder_bundle: Path,
                                                                            tmp_path: Path) -> None:
    gen, _ = _run(board_venv, tmp_path, "generate", str(ov_decoder_bundle), "--prompt", "hi", "--max-new-tokens", "2")
    assert gen.returncode == 3, gen.stderr
    assert "needs the Python package 'openvino_genai', which is not installed" in gen.stderr
    assert "pip install './plugins/openvino[decoders]'" in gen.stderr

    verify, _ = _run(board_venv, tmp_path, "verify", str(ov_decoder_bundle), "--json")
    assert verify.returncode == 3, verify.stderr
    report = json.loads(verify.stdout)
    assert report["ok"] is True and report["installed"] is False
    lacking = {r["requirement"]: r for r in report["requires"] if not r["installed"]}
    assert "openvino-genai" in lacking["edgeinfer-openvino[decoders]"]["missing"]
    assert lacking["edgeinfer-openvino[decoders]"]["install"].startswith("pip install './plugins/openvino[decoders]'")


@INSTALL_TESTS
@pytest.mark.slow
def test_board_serving_line_serves_both_bundles(ov_decoder_bundle: Path, ov_bundle: Path,
                                                tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    py = fresh_venv(tmp_path_factory.mktemp("board-serve") / "venv", readme_lines("Intel Core Ultra")["serve"])
    _serves_both(py, ov_bundle, ov_decoder_bundle, tmp_path)


def _serves_both(py: Path, encoder: Path, decoder: Path, tmp_path: Path) -> None:
    """``edgeinfer serve`` of both bundles in venv ``py`` answers one embeddings and one chat request."""
    from edgeinfer.testing.serve import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "EDGEINFER_PLUGINS")}
    server = subprocess.Popen([str(py), "-m", "edgeinfer.cli", "serve", str(encoder), str(decoder),
                               "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              cwd=tmp_path, env=env)
    try:
        deadline = time.monotonic() + 180
        while not _ready(port):
            assert server.poll() is None, server.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "serve was not ready (GET /ready) in 180 s"
            time.sleep(0.2)
        data = _post(port, "/v1/embeddings", {"model": encoder.name, "input": ["a board serves bundles"]})
        assert len(data["data"][0]["embedding"]) == 384
        hi = [{"role": "user", "content": "Hi"}]
        chat = _post(port, "/v1/chat/completions", {"model": decoder.name, "max_tokens": 4,
                                                    "temperature": 0, "messages": hi})
        assert chat["choices"][0]["message"]["content"] and 0 < chat["usage"]["completion_tokens"] <= 4
    finally:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=60)
    assert server.returncode == 0


HOST = "any CPU, onnxruntime (`--board host`)"
NOT_ON_A_HOST_BOX = {"torch", "transformers"}  # onnx and onnxruntime are what the host backend runs with


@pytest.fixture(scope="module")
def host_decoder_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny test decoder deployed w4a16 for the host board by this environment: the own CPU ops."""
    from edgeinfer.deploy.decoder import deploy_decoder
    from edgeinfer.testing.llm import model_dir

    out = tmp_path_factory.mktemp("host-bundle") / "tiny-qwen3-host"
    deploy_decoder(model_dir(), "host", out, quant="w4a16", ctx=256)
    return out


@pytest.fixture(scope="module")
def host_encoder_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edgeinfer.deploy.encoder import deploy
    from edgeinfer.testing.minilm import model_dir

    out = tmp_path_factory.mktemp("host-bundle") / "minilm-host"
    deploy(model_dir(), "host", out, buckets="none")
    return out


@INSTALL_TESTS
@pytest.mark.slow
def test_host_decoder_line_runs_a_host_bundle_deployed_here(host_decoder_bundle: Path,
                                                           tmp_path_factory: pytest.TempPathFactory,
                                                           tmp_path: Path) -> None:
    """A w4a16 bundle with the own CPU ops, deployed by this environment, generates the same tokens in a fresh venv
    with the README's host decoder line (whatever onnxruntime release pip picks there, when not older than this
    environment's: the stamp check allows newer ones) and passes its golden check there, without torch."""
    py = fresh_venv(tmp_path_factory.mktemp("board-host") / "venv", readme_lines(HOST)["decoder"])
    installed = _installed(py)
    assert "onnxruntime" in installed and installed.isdisjoint(NOT_ON_A_HOST_BOX), installed
    prompt = ["--prompt", "THE SOFTWARE IS PROVIDED", "--max-new-tokens", "12", "--json"]
    here = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "generate", str(host_decoder_bundle), *prompt],
                          capture_output=True, text=True, timeout=300)
    assert here.returncode == 0, here.stderr
    gen, mods = _run(py, tmp_path, "generate", str(host_decoder_bundle), *prompt)
    assert gen.returncode == 0, gen.stderr
    assert json.loads(gen.stdout)["token_ids"] == json.loads(here.stdout)["token_ids"]
    assert {"onnxruntime", "edgeinfer_onnxruntime"} <= mods and mods.isdisjoint(NOT_ON_A_HOST_BOX)
    golden, _ = _run(py, tmp_path, "golden", str(host_decoder_bundle))
    assert golden.returncode == 0, golden.stderr + golden.stdout


@INSTALL_TESTS
@pytest.mark.slow
def test_host_encoder_line_runs_a_host_text_bundle(host_encoder_bundle: Path,
                                                   tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    py = fresh_venv(tmp_path_factory.mktemp("board-host-text") / "venv", readme_lines(HOST)["encoder"])
    assert _installed(py).isdisjoint(NOT_ON_A_HOST_BOX)
    run, mods = _run(py, tmp_path, "run", str(host_encoder_bundle), "--text", "a board runs bundles", "--json")
    assert run.returncode == 0, run.stderr
    assert np.asarray(json.loads(run.stdout)["embeddings"]).shape == (1, 384)
    assert mods.isdisjoint(NOT_ON_A_HOST_BOX), mods & NOT_ON_A_HOST_BOX
    golden, _ = _run(py, tmp_path, "golden", str(host_encoder_bundle))
    assert golden.returncode == 0 and "golden check passed" in golden.stdout, golden.stderr


@INSTALL_TESTS
@pytest.mark.slow
def test_host_serving_line_serves_both_host_bundles(host_encoder_bundle: Path, host_decoder_bundle: Path,
                                                    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    py = fresh_venv(tmp_path_factory.mktemp("board-host-serve") / "venv", readme_lines(HOST)["serve"])
    _serves_both(py, host_encoder_bundle, host_decoder_bundle, tmp_path)


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def _post(port: int, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)
