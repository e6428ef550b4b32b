"""Every command line in docs/*.md fenced blocks is accounted for, as tests/test_readme.py does for the README.

- The lines: ``bash``/``sh`` blocks, every line but comments (a trailing ``\\`` joins the next); ``console``
  blocks, the lines after a ``$`` prompt; unlabelled blocks, the ``edgeinfer …`` lines (after a prompt such as
  ``head$``, if any). A line is keyed by its command, its ``# comment`` left out.
- Every ``edgeinfer`` line is parsed by the CLI itself (click: the command and each option exist, each value
  has its type; ``[optional]`` parts included, ``...`` left out, ``;`` separating two commands), run or not:
  this is what catches a documented option the command does not have.
- The cheap lines (RUN) run for real, in this process, with the placeholders below; each must exit 0, or 1
  where its comment says ``exit 1:`` (test_readme's rule).
- The others are in SKIP with the reason they are not run here.
A doc line in neither fails, as does a RUN or SKIP entry that no doc has any more.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
from test_readme import _expected_code, fenced

from edgeinfer.testing.cli import run_cli

DOCS = Path(__file__).resolve().parents[1] / "docs"
PROMPT = re.compile(r"^\s*[\w-]*\$\s+(.*)$")  # "$ cmd", "head$   cmd"
EDGEINFER_LINE = re.compile(r"^\s*(?:[\w-]*\$\s+)?(edgeinfer\s.*)$")

RUN = {
    "planner.md": [
        "edgeinfer plan Qwen/Qwen3-8B --board rk3588-16g --quant w8a8 --ctx 4096",
        "edgeinfer plan qwen3-0.6b --board host --quant fp16 --ctx 1024",
        "edgeinfer plan qwen3-8b --board rk3588-8g --quant w8a8 --ctx 4096 --paging 12 --segments 36 --storage nvme",
        "edgeinfer plan Qwen/Qwen3-8B --board rk3588-8g  --quant w8a8 --json",
        "edgeinfer plan qwen3-0.6b qwen3-8b --board all",
        "edgeinfer plan all-minilm-l6-v2 BAAI/bge-reranker-base qwen3-0.6b --board rk3588-8g",
        "edgeinfer boards [--json];  edgeinfer boards show rk3588-16g [--json]",
        "edgeinfer plan phi-3-mini-4k-instruct --board rk3588-16g --quant w8a8 --ctx 192",
        "edgeinfer plan qwen3-8b --board core-ultra-368h --runtime openvino-npu --ctx 1024",
        "edgeinfer plan qwen3-8b --board atlas-800i-a2 --runtime llama.cpp-cann --quant fp16 --ctx 1024",
        "edgeinfer plan qwen3-8b --board core-ultra-258v --runtime openvino-gpu --quant w4a16 --ctx 4096",
    ],
    "paging.md": [
        "edgeinfer plan Qwen/Qwen3-8B --board rk3588-8g --paging 12 --storage nvme",
        "edgeinfer plan Qwen/Qwen3-8B --board rk3588-16g --quant fp16 --runtime rknn",
    ],
    "generation.md": [
        "edgeinfer plan DIR --board rk3588-8g --runtime rknn",
        "edgeinfer generate tiny.bundle --prompt \"The licence grants\"",
        "edgeinfer golden tiny.bundle",
        "edgeinfer verify tiny.bundle",
        "edgeinfer profile model.onnx --top 5",
    ],
    "writing-a-backend.md": ["edgeinfer boards"],
    "deploy.md": [
        "edgeinfer golden OUT",
        "edgeinfer verify OUT [--json]",
    ],
}

BOARD = "needs the board (or its toolkit's minutes-long conversion): the RKNN simulator and the other plugins' tests "
TOOK = "takes tens of seconds to minutes"
SERVER = "starts a server; tests/test_serve*.py serve these models and send these requests"
SYNOPSIS = "a synopsis (placeholders for every option): parsed here; deploy's forms run in tests/test_deploy*.py"
DECODER = ("loads the decoder and generates (seconds each); tests/test_generate.py and test_decoder_bench.py run "
           "these forms on the same tiny model")
RKLLM = "needs a .rkllm file (Rockchip's RKLLM toolkit) and an RK3588 board to run it"
SKIP = {
    "deploy.md": {
        "edgeinfer deploy MODEL --board BOARD [--quant Q] [--calib PATH] [--golden-inputs PATH] "
        "[--shape NAME=1x128 ...] [--threshold T] [--force] [--no-cache] -o OUT [--json]": SYNOPSIS,
        "edgeinfer deploy MODEL --board BOARD [--quant Q] [--runtime R] [--ctx N] --dry-run [--json]": SYNOPSIS,
        "edgeinfer deploy $M --board rk3588-8g --quant int8 --calib examples/sentences.txt --option auto_hybrid=true "
        "--option auto_hybrid_cos_thresh=0.995 -o minilm-rk-int8": BOARD + "(an int8 RKNN build: minutes)",
        "edgeinfer run OUT --text \"one sentence\" --text \"another\"": "needs a text bundle (MiniLM); the README's "
                                                                      "Quickstart runs it",
        "edgeinfer run OUT --input input_ids=ids.npy ...": "a synopsis (`...`: more inputs); tests/test_cli_run.py",
        "edgeinfer run RERANKER --query \"a question\" --document \"a passage\" --documents more.txt --json":
            "needs a reranker bundle; tests/test_scoring.py runs the same options",
        "edgeinfer run CLASSIFIER --text \"one sentence\" --json":
            "needs a classifier bundle; tests/test_scoring.py runs the same options",
        "edgeinfer golden OUT --inputs new.txt --reference model.onnx": "needs a text bundle and its source model "
                                                                         "(a MiniLM conversion)",
        "edgeinfer bench OUT --batch 1,8,32 [--seq 64,128] --plot out.png --json": "a benchmark (" + TOOK + "); "
                                                                                  "tests/test_deploy.py",
        "PORT=8000 sh examples/firmware.sh model.onnx host work x=x.npy": "serves; tests/test_firmware.py runs it",
    },
    "fleet.md": {
        "edgeinfer ray-resources": "probes every backend's devices (seconds); tests/test_fleet_resources.py",
        "edgeinfer ray-node": "starts a Ray head node (`ray start --head`)",
        "edgeinfer ray-node --address HEAD:6379": "joins a Ray cluster at HEAD",
        "edgeinfer ray-node --dry-run": "probes every backend's devices (seconds); tests/test_fleet_resources.py",
        "edgeinfer serve minilm-rk --ray 10.0.0.1:6379 --replicas 2 --dry-run":
            "a bundle labelled for rk3588; tests/test_fleet_placement.py runs the dry run",
        "edgeinfer serve minilm-rk --ray 10.0.0.1:6379 --replicas 2 --host 0.0.0.0 --port 8000":
            "a three-board cluster; tests/test_fleet_nodes.py serves on namespaced nodes",
    },
    "generation.md": {
        "edgeinfer generate DIR --prompt \"The licence grants\" --max-new-tokens 32": DECODER,
        "edgeinfer generate DIR \"The licence grants\"": DECODER + " (test_deploy_decoder.py runs PROMPT and -)",
        "edgeinfer generate DIR --prompt \"Hi\" --chat --temperature 0.7 --seed 1 --json": DECODER,
        "edgeinfer generate DIR --prompt \"def main():\" --backend onnxruntime --ctx 512": DECODER + " (an "
                                                                                         "onnxruntime build first)",
        "edgeinfer generate DIR --prompt \"Hi\" --backend onnxruntime --threads 1":
            DECODER + " (tests/test_generate.py checks --threads)",
        "edgeinfer chat DIR --system \"You are terse.\"": "interactive (stdin); tests/test_generate.py drives chat",
        "edgeinfer generate MODEL.rkllm --prompt \"Hi\"": RKLLM,
        "edgeinfer deploy DIR --board host --ctx 256 -o tiny.bundle": "the session fixture tiny_qwen3_host_bundle "
                                                                      "is this deploy (the lines below use it)",
        "edgeinfer deploy DIR --board host --ctx 256 --quant w4a16 -o tiny-w4": "an int4 build and golden check: "
                                                                                "tests/test_deploy_decoder.py",
        "edgeinfer deploy DIR --board host --ctx 256 --quant w8a16 -o tiny-w8": "an int8 build and golden check: "
                                                                                "tests/test_host_decoder_schemes.py",
        "edgeinfer deploy DIR --board host --ctx 256 --quant w8a8 -o tiny-w8a8": "an int8 build and golden check: "
                                                                                 "tests/test_host_decoder_schemes.py",
        "edgeinfer deploy DIR --board host --ctx 256 --quant fp16 -o tiny-fp16": "an fp16 build and golden check: "
                                                                                 "tests/test_host_decoder_schemes.py",
        "edgeinfer deploy DIR --board host --ctx 256 --quant w4a8 -o tiny-w4a8": "a w4a8 build and golden check: "
                                                                                 "tests/test_host_decoder_schemes.py",
        "edgeinfer deploy DIR --board rk3588-8g --ctx 64 --paging 1 --segments 4 -o dir-paged": BOARD + "(paged)",
        "edgeinfer deploy DIR --board rk3588-8g --paging auto -o dir-rk": BOARD + "(RKNN decoder)",
        "edgeinfer generate dir-paged --prompt \"The licence grants\"": BOARD + "(a paged RKNN bundle)",
        "edgeinfer generate dir-paged --prompt \"The licence grants\" --window 2 --json": BOARD + "(paged bundle)",
        "edgeinfer bench dir-paged --json": BOARD + "(paged bundle)",
        "edgeinfer bench DIR": "a benchmark (" + TOOK + ")",
        "edgeinfer bench DIR --backend onnxruntime --ctx 1024 --threads 1 --plot decode.png -o decode.json":
            "a benchmark (" + TOOK + "); tests/test_decoder_bench.py",
        "edgeinfer bench DIR --prompt-lengths 8,16 --new-tokens 4 --repeat 5 --json": DECODER,
        "edgeinfer bench BUNDLE": "a benchmark; tests/test_selfcheck.py benches the host decoder bundle",
        "edgeinfer bench MODEL.rkllm --board rk3588-8g": RKLLM,
        "edgeinfer profile DIR --backend onnxruntime --ctx 512 --prompt-length 128 --json": "an onnxruntime decoder "
                                                                                            "build; tests/test_"
                                                                                            "decoder_bench.py",
    },
    "paging.md": {
        "edgeinfer run model.onnx --backend onnxruntime --paging 2 --segments 6 -i input_ids=ids.npy ... --json":
            "a synopsis (`...`: more inputs) on a layered model; tests/test_paging.py",
        "edgeinfer run model.onnx --backend openvino --paging 1 --cut /model/layers.15/Add_1_output_0 ...":
            "a synopsis on a 16-layer model; tests/test_paging.py",
        "L=$(python -c \"from edgeinfer.testing.llm import model_dir; print(model_dir())\")": "sets L for the lines "
                                                                                               "below",
        "edgeinfer deploy $L --board rk3588-8g --ctx 64 --paging 1 --segments 4 -o tiny-paged": BOARD + "(paged)",
        "edgeinfer deploy Qwen/Qwen3-8B --board rk3588-16g --quant fp16 --paging auto -o qwen3-8b-paged":
            "downloads and converts an 8B model (hours)",
        "edgeinfer generate tiny-paged --prompt \"THE SOFTWARE IS PROVIDED\" --max-new-tokens 8": BOARD + "(paged)",
        "edgeinfer generate tiny-paged --prompt \"THE SOFTWARE IS PROVIDED\" --window 2 --json": BOARD + "(paged)",
        "edgeinfer bench tiny-paged --prompt-lengths 8 --new-tokens 4 --repeat 1 --json": BOARD + "(paged)",
        "edgeinfer serve tiny-paged --slots 1 --port 8000": SERVER,
    },
    "planner.md": {
        "edgeinfer plan chain.yaml --board rk3588-8g [--json]": "needs the page's chain file on disk; "
        "tests/test_plan_chain.py plans chain files of the same form",
        "edgeinfer bench qwen3.rkllm --board rk3588-8g --prompt-lengths 128 --json": RKLLM,
        "edgeinfer plan     Qwen3-1.7B_W8A8_RK3588.rkllm --board rk3588-8g": RKLLM + " (a file of gigabytes)",
        "edgeinfer generate Qwen3-1.7B_W8A8_RK3588.rkllm --prompt \"Hello\" --ctx 4096": RKLLM,
        "edgeinfer serve    Qwen3-1.7B_W8A8_RK3588.rkllm --ctx 4096": RKLLM,
        "edgeinfer bench    Qwen3-1.7B_W8A8_RK3588.rkllm --board rk3588-8g": RKLLM,
    },
    "serve.md": {
        "edgeinfer serve bundles/minilm-ov": SERVER,
        "edgeinfer serve bundles/minilm bundles/reranker --devices 0,1 --api-key-file key.txt --port 9000": SERVER,
        "curl -s localhost:8000/v1/embeddings -H 'content-type: application/json' -d '{\"model\": \"minilm-ov\", "
        "\"input\": [\"first sentence\", \"second one\"]}'": SERVER,
        "edgeinfer serve edgeinfer/testing/data/tiny-qwen3 --slots 8 --ctx 512 --threads 1": SERVER,
        "curl -s localhost:8000/v1/chat/completions -H 'content-type: application/json' -d '{\"model\": "
        "\"tiny-qwen3\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}], \"max_tokens\": 20, "
        "\"temperature\": 0}'": SERVER,
        "curl -sN localhost:8000/v1/completions -H 'content-type: application/json' -d '{\"model\": \"tiny-qwen3\", "
        "\"prompt\": \"Once upon a time\", \"max_tokens\": 16, \"stream\": true}'": SERVER,
    },
    "writing-a-backend.md": {
        "pip install '.[testing]'": "an install; make dev installs the same packages for this suite",
        "pip install -e examples/edgeinfer-example-backend -e examples/edgeinfer-example-decoder":
            "an install; make dev installs both examples for this suite",
        "edgeinfer backends": "imports every plugin's SDK (seconds); tests/test_plugins.py",
        "pytest examples/edgeinfer-example-backend/tests": "the example's own tests run in this suite (examples/)",
        "pytest -m \"not slow\" examples/edgeinfer-example-backend/tests":
            "the example's own tests run in this suite (examples/)",
        "pytest -m \"not slow\" examples": "both examples' tests run in this suite (examples/)",
    },
    "architecture.md": {
        "pytest -n 2 --dist loadgroup -m \"not serial\" --durations=30": "the whole suite: make test runs it",
        "pytest -m serial --durations=30": "the whole suite's serial pass: make test runs it",
    },
}


def doc_lines(text: str) -> list[tuple[str, str]]:
    """(command, its comment) of every command line in the fenced blocks of ``text`` (see the docstring)."""
    out = []
    for lang, body in fenced(text):
        if lang not in ("bash", "sh", "console", ""):
            continue
        for ln in re.sub(r"\\\n\s*", "", body).splitlines():
            if lang == "console":
                m = PROMPT.match(ln)
                line = m.group(1) if m else ""
            elif lang == "":
                m = EDGEINFER_LINE.match(ln)
                line = m.group(1) if m else ""
            else:
                line = "" if ln.lstrip().startswith("#") else ln.strip()
            command, _, comment = line.partition(" # ")
            if command.strip():
                out.append((command.strip(), comment))
    return out


def all_doc_lines() -> dict[str, list[tuple[str, str]]]:
    return {p.name: doc_lines(p.read_text(encoding="utf-8")) for p in sorted(DOCS.glob("*.md"))}


def argvs(command: str, places: dict[str, str] | None = None) -> list[list[str]]:
    """The argument lists of an ``edgeinfer`` line: ``;`` separates commands, ``[optional]`` parts are included,
    ``...`` is left out, and words of ``places`` are replaced."""
    out = []
    for part in command.split(";"):
        words = [w for w in shlex.split(part.replace("[", " ").replace("]", " ")) if w != "..."]
        assert words[0] == "edgeinfer", command
        out.append([(places or {}).get(w, w) for w in words[1:]])
    return out


def test_every_doc_command_line_is_run_or_skipped_with_a_reason() -> None:
    found = all_doc_lines()
    missing = [f"{doc}: {cmd}" for doc, lines in found.items() for cmd, _ in lines
               if cmd not in RUN.get(doc, []) and cmd not in SKIP.get(doc, {})]
    assert not missing, "doc command lines neither run nor skipped (add them to RUN or SKIP):\n" + "\n".join(missing)
    stale = [f"{doc}: {cmd}" for table in (RUN, SKIP) for doc, cmds in table.items() for cmd in cmds
             if cmd not in {c for c, _ in found.get(doc, [])}]
    assert not stale, "RUN/SKIP entries no doc has any more:\n" + "\n".join(stale)
    assert all(reason.strip() for reasons in SKIP.values() for reason in reasons.values())
    assert not {c for cmds in RUN.values() for c in cmds} & {c for r in SKIP.values() for c in r}


def _parse(argv: list[str]) -> None:
    """Parse ``argv`` as the CLI would, without running it: unknown commands or options, bad values raise."""
    from edgeinfer.cli import cli

    ctx, cmd, rest = None, cli, list(argv)
    while isinstance(cmd, click.Group):  # a group's own options, then its subcommand (if any)
        ctx = click.Context(cmd, info_name=cmd.name, parent=ctx)
        rest = click.Command.parse_args(cmd, ctx, rest)
        if not rest:
            return
        _, cmd, rest = cmd.resolve_command(ctx, rest)
    cmd.make_context(cmd.name, rest, parent=ctx).close()


NUMBERS = {"N": "256", "T": "0.99"}  # synopsis placeholders of numeric options


def test_every_edgeinfer_doc_line_parses_with_the_cli() -> None:
    bad = []
    for doc, lines in all_doc_lines().items():
        for cmd, _ in lines:
            if not cmd.startswith("edgeinfer "):
                continue
            for argv in argvs(cmd, NUMBERS):
                try:
                    _parse(argv)
                except click.ClickException as e:
                    bad.append(f"{doc}: {cmd}\n    {e.format_message()}")
    assert not bad, "doc lines the CLI refuses:\n" + "\n".join(bad)


@pytest.fixture(scope="module")
def places(tiny_qwen3_host_bundle: Path, tmp_path_factory) -> dict[str, str]:
    """The docs' placeholders: the tiny test decoder and its host bundle (the session fixture), a tiny ONNX."""
    from edgeinfer.testing.llm import model_dir
    from edgeinfer.testing.models import mlp

    bundle = str(tiny_qwen3_host_bundle)
    return {"DIR": str(model_dir()), "tiny.bundle": bundle, "OUT": bundle,
            "model.onnx": str(mlp(tmp_path_factory.mktemp("docs")).path)}


RAN: dict[tuple[str, ...], object] = {}  # argv -> its CompletedProcess: one run per command line in two docs


@pytest.mark.parametrize("doc, command", [(doc, c) for doc, cmds in RUN.items() for c in cmds])
def test_the_cheap_doc_lines_run_as_written(doc: str, command: str, places: dict[str, str], capfd) -> None:
    (comment,) = {c for cmd, c in all_doc_lines()[doc] if cmd == command}
    expected = _expected_code(f"{command} # {comment}")
    for argv in argvs(command, places):
        p = RAN.get(tuple(argv)) or RAN.setdefault(tuple(argv), run_cli(capfd, *argv))
        assert p.returncode == expected, f"{doc}: `{command}` exited {p.returncode}, expected {expected}\n{p.stderr}"
        assert "Traceback" not in p.stderr and p.stdout.strip(), p.stderr
