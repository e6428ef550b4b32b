"""The README runs as written: its Quickstart bash and Python blocks, executed line by line.

What runs how (README.md says the same):
- every Quickstart bash line runs, in a temporary directory that links the repository's
  ``examples/``, with this interpreter's venv first on PATH; each line must exit 0, or 1 where its
  comment says "(exit 1: …)";
- lines run in order within chains, and chains run side by side (the RKNN simulator's rebuild alone
  takes over a minute): each paragraph of the block is a chain, except that an ``edgeinfer deploy …
  -o NAME`` line starts its own chain, joined by the paragraph's later lines that name NAME; a
  paragraph's variable assignments (``M=$(…)``) run once, before its chains, which see their values;
- ``make dev`` and ``source .venv/bin/activate`` are skipped: this test's environment is that venv;
- ``edgeinfer serve …`` starts in the background on a free port instead of 8000; the test waits
  for ``/ready`` to answer 200, one ``/v1/embeddings`` and one ``/v1/chat/completions`` request,
  then stops it with SIGTERM (exit 0);
- serve and the Python block (in the same directory, while serve loads its models) start as soon as the
  chains that write their bundles and files are done, while the other chains go on;
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
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SKIPPED = ("make dev", "source .venv/bin/activate")


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def fenced(text: str) -> list[tuple[str, str]]:
    """Every fenced block of a Markdown text as (language, body); an unlabelled block's language is ""."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)


def _blocks(text: str, lang: str) -> list[str]:
    return [body for block_lang, body in fenced(text) if block_lang == lang]


def _paragraphs(block: str) -> list[list[tuple[int, str]]]:
    """The block's paragraphs (split at blank lines), each a list of (line number, line); the numbers count
    the block's command lines (comments and blank lines skipped), as error messages name them."""
    paragraphs: list[list[tuple[int, str]]] = [[]]
    n = 0
    for ln in block.splitlines():
        if not ln.strip():
            paragraphs.append([])
        elif not ln.lstrip().startswith("#"):
            n += 1
            paragraphs[-1].append((n, ln))
    return [p for p in paragraphs if p]


def quickstart_paragraphs() -> tuple[list[list[tuple[int, str]]], str]:
    """(numbered paragraphs of the bash block, python source) of the README's Quickstart."""
    section = _section(README.read_text(encoding="utf-8"), "Quickstart")
    bash, python = _blocks(section, "bash"), _blocks(section, "python")
    assert len(bash) == 1 and len(python) == 1, "the Quickstart has one bash and one Python block"
    paragraphs = _paragraphs(bash[0])
    assert not any(ln.rstrip().endswith("\\") for p in paragraphs for _, ln in p), \
        "keep Quickstart commands on one line each"
    return paragraphs, python[0]


def quickstart() -> tuple[list[str], str]:
    """(bash lines, python source) of the README's Quickstart."""
    paragraphs, python = quickstart_paragraphs()
    return [ln for p in paragraphs for _, ln in p], python


def _expected_code(line: str) -> int:
    comment = line.partition(" # ")[2]
    return 1 if "exit 1:" in comment else 0  # "(exit 1: some do not fit)" marks an expected verdict


def _checked(n: int, line: str) -> str:
    code = _expected_code(line)
    return (f'{line}\nrc=$?; if [ $rc -ne {code} ]; then echo "Quickstart line {n} exited $rc, expected {code}" >&2; '
            'exit 100; fi')


ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=")
DEPLOY_OUT = re.compile(r"^edgeinfer deploy .* -o (\S+)")


@dataclass
class Paragraph:
    """One paragraph's variable assignments (run once, first) and its chains (each run in order)."""

    assignments: list[tuple[int, str]] = field(default_factory=list)
    chains: list[list[tuple[int, str]]] = field(default_factory=list)

    def prelude(self) -> str:
        """The assignments, checked, then ``declare -p`` of their variables (bash that sets them again)."""
        names = " ".join(ASSIGNMENT.match(ln).group(1) for _, ln in self.assignments)
        return _script(self.assignments) + f"declare -p {names}\n"


def _script(lines: list[tuple[int, str]], prefix: str = "") -> str:
    """A bash script running ``lines`` in order, each checked for its expected exit code."""
    return "\n".join(["set -u", prefix, *(_checked(n, ln) for n, ln in lines)]) + "\n"


def _schedule(paragraphs: list[list[tuple[int, str]]]) -> tuple[list[Paragraph], str | None]:
    """Each paragraph's assignments and chains (see the module docstring), and the serve line kept aside."""
    out, serve = [], None
    for lines in paragraphs:
        par, main, by_bundle = Paragraph(), [], {}
        for n, line in lines:
            if line.startswith(SKIPPED):
                continue
            if line.startswith("edgeinfer serve "):
                serve = line.partition(" # ")[0].strip()
                continue
            if ASSIGNMENT.match(line):
                par.assignments.append((n, line))
                continue
            words = line.partition(" # ")[0].split()
            deployed = DEPLOY_OUT.match(line.partition(" # ")[0])
            users = [name for name in by_bundle if name in words]
            if deployed:
                by_bundle[deployed.group(1)] = [(n, line)]
            elif users:
                by_bundle[users[-1]].append((n, line))
            else:
                main.append((n, line))
        par.chains = [c for c in [main, *by_bundle.values()] if c]
        out.append(par)
    return out, serve


def _run_chains(paragraphs: list[Paragraph], cwd: Path, env: dict[str, str], needs: set[str] = frozenset(),
                meanwhile: Callable[[], None] | None = None) -> None:
    """Every paragraph's prelude, then every chain, side by side; each failure is reported with its stderr.
    ``meanwhile()`` runs as soon as the chains naming a word of ``needs`` are done, while the others go on."""

    def bash(script: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)

    def failures(futures: list[Future]) -> list[str]:
        return [f.result().stderr[-3000:] for f in futures if f.result().returncode != 0]

    workers = max(3, os.cpu_count() or 1)
    with ThreadPoolExecutor(workers) as pool:
        preludes = list(pool.map(lambda p: bash(p.prelude()) if p.assignments else None, paragraphs))
        for pre in preludes:
            assert pre is None or pre.returncode == 0, pre.stderr[-3000:]
        chains = sorted([(chain, pre.stdout if pre else "") for par, pre in zip(paragraphs, preludes)
                         for chain in par.chains], key=_longest_first)
        jobs = [(chain, pool.submit(bash, _script(chain, prefix))) for chain, prefix in chains]
        if meanwhile is not None:
            needed = [f for chain, f in jobs if _names_any(chain, needs)]
            failed = failures(needed)
            assert not failed, "\n---\n".join(failed)
            meanwhile()
        failed = failures([f for _, f in jobs])
    assert not failed, "\n---\n".join(failed)


def _names_any(chain: list[tuple[int, str]], words: set[str]) -> bool:
    """Whether a line of ``chain`` has one of ``words`` as a word of its command (comments left out)."""
    return any(words & set(ln.partition(" # ")[0].split()) for _, ln in chain)


def _longest_first(chain_and_prefix: tuple[list[tuple[int, str]], str]) -> bool:
    """Sort key: the deploy chains first (they are the long ones: the RKNN simulator's rebuild alone takes over a
    minute), so the short chains fill the cores meanwhile instead of the longest one starting last."""
    first_line = chain_and_prefix[0][0][1]
    return not DEPLOY_OUT.match(first_line.partition(" # ")[0])


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
    paragraphs, serve = _schedule(quickstart_paragraphs()[0])
    assert serve is not None and serve.startswith("edgeinfer serve minilm-ov tiny-qwen3-ov --port 8000")
    chains = [[ln for _, ln in chain] for par in paragraphs for chain in par.chains]
    checked = [ln for par in paragraphs for _, ln in par.assignments] + [ln for chain in chains for ln in chain]
    assert sorted(checked) == sorted(ln for ln in lines if not ln.startswith((*SKIPPED, "edgeinfer serve ")))
    assert len(checked) == len(lines) - len(SKIPPED) - 1
    assert any("--quant int8 --calib examples/sentences.txt" in ln for ln in checked)
    # a bundle's users run after its deploy, in its chain; the calibrated board file's user after calibrate
    for first, later in (("-o minilm-rk", "run minilm-rk"), ("-o minilm-ov ", "golden minilm-ov"),
                         ("-o minilm-ov ", "bench minilm-ov"), ("-o tiny-qwen3-ov", "generate tiny-qwen3-ov"),
                         ("-o tiny-qwen3-rk-paged", "generate tiny-qwen3-rk-paged"),
                         ("calibrate ", "--board my-board.yaml"), ("m.path.rename('model.onnx')", "run model.onnx")):
        (chain,) = [c for c in chains if any(first in ln for ln in c)]
        (i,), (j,) = ([k for k, ln in enumerate(chain) if w in ln] for w in (first, later))
        assert i < j, (first, later)
    assert [p.prelude().splitlines()[-1] for p in paragraphs if p.assignments] == ["declare -p M", "declare -p L"]
    # serve and the Python block wait for exactly the chains writing their bundles, model.onnx and x.npy
    waited = [c[0] for par in paragraphs for c in par.chains
              if _names_any(c, {"minilm-ov", "tiny-qwen3-ov", "model.onnx", "x.npy"})]
    assert [ln.split()[0] for _, ln in waited] == ["python", "edgeinfer", "edgeinfer"], waited
    assert "-o minilm-ov " in waited[1][1] and "-o tiny-qwen3-ov" in waited[2][1], waited
    assert "edgeinfer.load(" in python and "edgeinfer.plan(" in python
    assert sum(1 for ln in (ROOT / "examples" / "sentences.txt").read_text().splitlines() if ln.strip()) == 100


@pytest.mark.slow
def test_the_readme_runs_as_written(tmp_path: Path) -> None:
    paragraphs, python = quickstart_paragraphs()
    scheduled, serve = _schedule(paragraphs)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = _env()

    top = _blocks(README.read_text(encoding="utf-8").split("\n## ")[0], "bash")[0]
    plan = "edgeinfer plan " + top.split(".venv/bin/edgeinfer plan ", 1)[1].splitlines()[0].strip()
    assert "\nmake test\n" in top + "\n", "the README's first block gives the test command too"
    first = subprocess.run(["bash", "-c", plan], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr

    bundles, python_files = set(serve.split()[2:serve.split().index("--port")]), {"model.onnx", "x.npy"}
    assert bundles == {"minilm-ov", "tiny-qwen3-ov"}
    codes = []

    def serve_and_snippet() -> None:
        """``edgeinfer serve`` and the Python block, once their bundles and files exist (other chains go on)."""
        x = np.load(tmp_path / "x.npy")
        (tmp_path / "snippet.py").write_text(python)
        port = _free_port()
        args = serve.replace("--port 8000", f"--port {port}").split()
        server = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        try:  # the Python block runs while serve loads its models
            snippet = subprocess.run([sys.executable, "snippet.py"], cwd=tmp_path, env=env, capture_output=True,
                                     text=True, timeout=300)
            assert snippet.returncode == 0, snippet.stderr
            assert snippet.stdout.splitlines() == [str((x.shape[0], 8)), "True"]
            _serve_answers(server, port)
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                codes.append(server.wait(timeout=60))
            except subprocess.TimeoutExpired:
                server.kill()
                raise

    _run_chains(scheduled, tmp_path, env, needs=bundles | python_files, meanwhile=serve_and_snippet)
    for bundle in ("minilm-ov", "minilm-rk", "minilm-ascend", "minilm-ov-int8", "tiny-qwen3-ov",
                   "tiny-qwen3-rk-paged"):
        assert (tmp_path / bundle / "manifest.json").is_file(), bundle
    paged = json.loads((tmp_path / "tiny-qwen3-rk-paged" / "manifest.json").read_text())["decoder"]["paging"]
    assert (paged["segments"], paged["window"]) == (2, 1)
    x = np.load(tmp_path / "x.npy")
    assert np.load(tmp_path / "out" / "y.npy").shape == (x.shape[0], 8)  # mlp: [batch, 16] -> [batch, 8]
    assert (tmp_path / "bench.png").stat().st_size > 1000
    assert codes == [0]


def _serve_answers(server: subprocess.Popen, port: int) -> None:
    _wait_ready(server, port)
    data = _post(port, "/v1/embeddings", {"model": "minilm-ov", "input": ["the same command on every bundle"]})
    assert len(data["data"]) == 1 and len(data["data"][0]["embedding"]) == 384  # all-MiniLM-L6-v2's width
    chat = _post(port, "/v1/chat/completions", {"model": "tiny-qwen3-ov", "max_tokens": 8, "temperature": 0,
                                                "messages": [{"role": "user", "content": "Hello"}]})
    assert chat["choices"][0]["message"]["content"] and 0 < chat["usage"]["completion_tokens"] <= 8


def _wait_ready(server: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + 180
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5) as r:
                assert r.status == 200
                break
        except OSError:
            assert server.poll() is None, server.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "serve was not ready (GET /ready) in 180 s"
            time.sleep(0.1)


def _post(port: int, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


CHAIN = "A retrieval chain on one board"


def chain_blocks() -> tuple[list[str], list[str]]:
    """(command lines, curl lines) of the README's retrieval-chain section."""
    commands, requests = _blocks(_section(README.read_text(encoding="utf-8"), CHAIN), "bash")
    return ([ln for p in _paragraphs(commands) for _, ln in p], [ln for p in _paragraphs(requests) for _, ln in p])


@pytest.mark.slow
def test_the_retrieval_chain_runs_as_written(tmp_path: Path) -> None:
    """The section's commands in order (one bash script: its variables carry over), serve on a free port, then
    each curl line as written against it; every answer is checked for what its endpoint promises."""
    commands, requests = chain_blocks()
    (serve,) = [ln for ln in commands if ln.startswith("edgeinfer serve ")]
    assert serve.partition(" # ")[0].split()[2:5] == ["emb", "reranker", "llm"]
    assert any(ln.startswith("edgeinfer plan $E $R $L --board host") for ln in commands)
    env = _env()
    script = _script([(n, ln) for n, ln in enumerate(commands, 1) if ln is not serve])
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    ranked = done.stdout  # `edgeinfer run reranker ...` prints the documents, best first
    assert "list.sort() sorts in place." in ranked and "A socket connects two hosts." in ranked
    port = _free_port()
    server = subprocess.Popen(serve.replace("--port 8000", f"--port {port}").split(), cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_ready(server, port)
        answers = {}
        for ln in requests:
            assert "localhost:8000/" in ln
            got = subprocess.run(["bash", "-c", ln.replace("localhost:8000/", f"localhost:{port}/")], env=env,
                                 capture_output=True, text=True, timeout=120)
            assert got.returncode == 0, got.stderr
            answers[ln.split()[2].split("/", 1)[1]] = json.loads(got.stdout)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            code = server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            raise
    assert code == 0
    assert len(answers["v1/embeddings"]["data"][0]["embedding"]) == 384  # all-MiniLM-L6-v2's width
    (best,) = answers["v1/rerank"]["results"]  # top_n 1
    assert best["index"] in (0, 1) and 0 < best["relevance_score"] < 1  # sigmoid of the cross-encoder's logit
    chat = answers["v1/chat/completions"]
    assert chat["choices"][0]["message"]["content"] and 0 < chat["usage"]["completion_tokens"] <= 16
