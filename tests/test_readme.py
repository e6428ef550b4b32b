"""The README runs as written: its Quickstart bash and Python blocks, executed line by line.

What runs how (README.md says the same):
- every Quickstart bash line runs in one bash script, in a temporary directory that links the
  repository's ``examples/``, with this interpreter's venv first on PATH; each line must exit 0,
  or 1 where its comment says "(exit 1: …)";
- ``make dev`` and ``source .venv/bin/activate`` are skipped: this test's environment is that venv;
- ``edgeinfer serve …`` starts in the background on a free port instead of 8000; the test waits
  for ``/health`` to answer 200, one ``/v1/embeddings`` and one ``/v1/chat/completions`` request,
  then stops it with SIGTERM
  (exit 0);
- the Python block runs afterwards in the same directory;
- of the first block (fresh venv + ``pip install .``), the ``edgeinfer plan`` command runs;
  the install itself is what tests/test_board_install.py does for the board-side install.
Deploys reuse the user's conversion cache (~/.cache/edgeinfer), so only a first run converts.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SKIPPED = ("make dev", "source .venv/bin/activate")


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def quickstart() -> tuple[list[str], str]:
    """(bash lines, python source) of the README's Quickstart."""
    section = _section(README.read_text(encoding="utf-8"), "Quickstart")
    bash, python = _blocks(section, "bash"), _blocks(section, "python")
    assert len(bash) == 1 and len(python) == 1, "the Quickstart has one bash and one Python block"
    lines = [ln for ln in bash[0].splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert not any(ln.rstrip().endswith("\\") for ln in lines), "keep Quickstart commands on one line each"
    return lines, python[0]


def _expected_code(line: str) -> int:
    comment = line.partition(" # ")[2]
    return 1 if "exit 1:" in comment else 0  # "(exit 1: some do not fit)" marks an expected verdict


def _script(lines: list[str]) -> tuple[str, str | None]:
    """The bash script for every runnable line (each checked), and the serve line kept aside."""
    out, serve = ["set -u"], None
    for n, line in enumerate(lines, 1):
        if line.startswith(SKIPPED):
            continue
        if line.startswith("edgeinfer serve "):
            serve = line.partition(" # ")[0].strip()
            continue
        code = _expected_code(line)
        out.append(line)
        out.append(f'rc=$?; if [ $rc -ne {code} ]; then echo "Quickstart line {n} exited $rc, expected {code}" >&2; '
                   'exit 100; fi')
    return "\n".join(out) + "\n", serve


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.pop("EDGEINFER_PLUGINS", None)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_quickstart_is_parsed_as_expected() -> None:
    lines, python = quickstart()
    script, serve = _script(lines)
    assert serve is not None and serve.startswith("edgeinfer serve minilm-ov tiny-qwen3-ov --port 8000")
    assert "--quant int8 --calib examples/sentences.txt" in script
    assert script.count("rc=$?") == len(lines) - len(SKIPPED) - 1
    assert "edgeinfer.load(" in python and "edgeinfer.plan(" in python
    assert sum(1 for ln in (ROOT / "examples" / "sentences.txt").read_text().splitlines() if ln.strip()) == 100


@pytest.mark.slow
def test_the_readme_runs_as_written(tmp_path: Path) -> None:
    lines, python = quickstart()
    script, serve = _script(lines)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = _env()

    top = _blocks(README.read_text(encoding="utf-8").split("\n## ")[0], "bash")[0]
    plan = "edgeinfer plan " + top.split(".venv/bin/edgeinfer plan ", 1)[1].splitlines()[0].strip()
    assert "\nmake test\n" in top + "\n", "the README's first block gives the test command too"
    first = subprocess.run(["bash", "-c", plan], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr

    proc = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for bundle in ("minilm-ov", "minilm-rk", "minilm-ascend", "minilm-ov-int8", "tiny-qwen3-ov"):
        assert (tmp_path / bundle / "manifest.json").is_file(), bundle
    x = np.load(tmp_path / "x.npy")
    assert np.load(tmp_path / "out" / "y.npy").shape == (x.shape[0], 8)  # mlp: [batch, 16] -> [batch, 8]
    assert (tmp_path / "bench.png").stat().st_size > 1000

    (tmp_path / "snippet.py").write_text(python)
    snippet = subprocess.run([sys.executable, "snippet.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=300)
    assert snippet.returncode == 0, snippet.stderr
    assert snippet.stdout.splitlines() == [str((x.shape[0], 8)), "True"]

    _serve_answers(serve, tmp_path, env)


def _serve_answers(serve: str, cwd: Path, env: dict[str, str]) -> None:
    port = _free_port()
    args = serve.replace("--port 8000", f"--port {port}").split()
    server = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert server.poll() is None, server.communicate()[1][-2000:]
                assert time.monotonic() < deadline, "serve was not ready (GET /ready) in 180 s"
                time.sleep(1)
        data = _post(port, "/v1/embeddings", {"model": "minilm-ov", "input": ["the same command on every bundle"]})
        assert len(data["data"]) == 1 and len(data["data"][0]["embedding"]) == 384  # all-MiniLM-L6-v2's width
        chat = _post(port, "/v1/chat/completions", {"model": "tiny-qwen3-ov", "max_tokens": 8, "temperature": 0,
                                                    "messages": [{"role": "user", "content": "Hello"}]})
        assert chat["choices"][0]["message"]["content"] and 0 < chat["usage"]["completion_tokens"] <= 8
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            code = server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            raise
    assert code == 0


def _post(port: int, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)
