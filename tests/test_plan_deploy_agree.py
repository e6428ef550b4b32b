"""What ``plan`` says is what ``deploy`` builds (edgeinfer/planning/decision.py): for every shipped board
profile and ``host``, for a decoder (the committed tiny-qwen3) and an encoder (all-MiniLM-L6-v2's directory),
``plan --json`` and ``deploy --dry-run --json`` decide the same runtime, scheme and context, and refuse the
same things with the same line. In-process CLI; ``--dry-run`` converts nothing, so the whole module takes
seconds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from edgeinfer.testing import llm, minilm
from edgeinfer.testing.cli import in_process_cli

cli, _bind_capfd = in_process_cli()

ROOT = Path(__file__).resolve().parents[1]
BOARDS = sorted(p.stem for p in (ROOT / "boards").glob("*.yaml")) + ["host"]
# what each backend builds by default here, written down from its declarations (Decoders.schemes first in the
# board's list; encoders fp16): the RKLLM toolkit is not installed, so every board builds its backend runtime
DECODER_SCHEME = {"rknn": "fp16", "ascend": "fp16", "openvino": "fp16", "onnxruntime": "fp32"}
MODELS = {"decoder": llm.model_dir, "encoder": minilm.model_dir}
LIMITS = {"decoder": 1024, "encoder": 512}  # max_position_embeddings in their config.json files


def _profile(board: str) -> dict:
    if board == "host":
        return {"backend": "onnxruntime", "default_runtime": "onnxruntime"}
    return yaml.safe_load((ROOT / "boards" / f"{board}.yaml").read_text())


def _both(model: Path, board: str, *opts: str) -> tuple[dict, dict, int]:
    planned = cli("plan", str(model), "--board", board, *opts, "--json")
    dry = cli("deploy", str(model), "--board", board, *opts, "--dry-run", "--json")
    assert planned.returncode in (0, 1) and dry.returncode == planned.returncode, (planned.stderr, dry.stderr)
    p, d = json.loads(planned.stdout), json.loads(dry.stdout)
    assert d["dry_run"] is True and d["fits"] == p["fits"]
    assert d["plan"]["build"] == p["build"] and d["plan"]["options"] == p["options"]
    model_parts = ("weights", "kv_cache", "activations", "runtime")  # host's reserve is measured at each call
    assert [d["plan"]["memory"]["breakdown"][k] for k in model_parts] == [p["memory"]["breakdown"][k]
                                                                         for k in model_parts]
    return p, d, planned.returncode


@pytest.mark.parametrize("kind", ["decoder", "encoder"])
@pytest.mark.parametrize("board", BOARDS)
def test_plan_and_deploy_dry_run_decide_alike_by_default(board, kind):
    p, _, code = _both(MODELS[kind](), board)
    prof = _profile(board)
    own = prof.get("backend_runtime") or prof["default_runtime"]
    build = p["build"]
    assert (build["kind"], build["runtime"], build["backend"], build["buildable"]) == (kind, own, prof["backend"],
                                                                                      True)
    assert build["scheme"] == (DECODER_SCHEME[prof["backend"]] if kind == "decoder" else "fp16")
    cap = 2048 if kind == "decoder" else 128
    assert build["ctx"] == p["options"]["ctx"] == min(LIMITS[kind], cap)
    assert p["options"]["runtime"] == own and p["options"]["quant"] == build["scheme"]
    assert code == (0 if p["fits"] else 1)
    # the board's preferred runtime is named when deploy builds another one here
    preferred = prof["default_runtime"]
    takes = kind in (prof.get("runtimes", {}).get(preferred, {}).get("kinds") or ["decoder", "encoder"])
    if preferred != own and takes:
        assert build["board_best"]["runtime"] == preferred and not build["board_best"]["buildable"]
        assert build["board_best"]["cannot_build"]
    else:
        assert build["board_best"] is None


@pytest.mark.parametrize("board, kind, opts, expected", [
    ("rk3588-8g", "decoder", ["--runtime", "rknn", "--quant", "w8a8"], ("rknn", "w8a8", 1024)),
    ("rk3576-8g", "decoder", ["--quant", "w4a16", "--ctx", "512"], ("rknn", "w4a16", 512)),
    ("core-ultra-155h", "decoder", ["--runtime", "openvino-npu", "--quant", "w4a16"],
     ("openvino-npu", "w4a16", 1024)),
    ("core-ultra-258v", "decoder", ["--runtime", "openvino-gpu", "--quant", "w4a16"],
     ("openvino-gpu", "w4a16", 1024)),
    ("core-ultra-155h", "decoder", ["--runtime", "openvino-cpu", "--quant", "w8a16"],
     ("openvino-cpu", "w8a16", 1024)),
    ("atlas-300i-pro", "decoder", ["--runtime", "torch-npu", "--quant", "w8a16"], ("torch-npu", "w8a16", 1024)),
    ("host", "decoder", ["--quant", "w4a16", "--ctx", "256"], ("onnxruntime", "w4a16", 256)),
    ("host", "decoder", ["--runtime", "openvino-cpu", "--quant", "w8a16", "--ctx", "256"],
     ("openvino-cpu", "w8a16", 256)),
    ("rk3588-8g", "encoder", ["--quant", "w8a8"], ("rknn", "w8a8", 128)),
    ("host", "encoder", ["--quant", "fp32"], ("onnxruntime", "fp32", 128)),
])
def test_explicit_runtime_and_quant_give_the_same_plan(board, kind, opts, expected):
    p, _, _ = _both(MODELS[kind](), board, *opts)
    assert (p["build"]["runtime"], p["build"]["scheme"], p["build"]["ctx"]) == expected
    assert p["build"]["buildable"] and p["build"]["ctx_chosen_by"] == ("--ctx" if "--ctx" in opts else
                                                                       "the model's limit, capped")


def _one_line(proc, code: int) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == code and proc.stdout == "" and len(lines) == 1, (proc.returncode, proc.stderr)
    return lines[0]


def _refusals(model: Path, board: str, *opts: str, code: int = 2) -> str:
    planned = _one_line(cli("plan", str(model), "--board", board, *opts), code)
    dry = _one_line(cli("deploy", str(model), "--board", board, *opts, "--dry-run"), code)
    deployed = _one_line(cli("deploy", str(model), "--board", board, *opts, "-o", "/nonexistent/never-written"),
                         code)
    assert planned == dry == deployed
    return planned


@pytest.mark.parametrize("board", ["rk3588-8g", "host"])
def test_a_context_past_the_model_is_refused_alike(board):
    line = _refusals(llm.model_dir(), board, "--ctx", "4096")
    assert line == ("error: --ctx 4096 exceeds the model's max_position_embeddings (1024); use --ctx 1024 or less")


def test_a_board_without_a_runtime_for_the_kind_is_refused_alike(tmp_path):
    board = tmp_path / "llm-only.yaml"
    board.write_text(
        "name: llm-only\ntitle: decoders only\nfamily: rk3588\nbackend: rknn\nmemory_kind: shared\n"
        "memory_total_gib: {value: 8, source: test}\nos_reserve_gib: {value: 1, source: test}\n"
        "runtimes:\n  rkllm: {schemes: [w8a8], kinds: [decoder], source: test}\ndefault_runtime: rkllm\n")
    line = _refusals(minilm.model_dir(), str(board))
    assert line.startswith("error: board llm-only has no runtime for encoder models")


def test_a_runtime_the_installation_cannot_build_is_planned_and_named_but_not_deployed():
    planned = cli("plan", str(llm.model_dir()), "--board", "rk3588-8g", "--runtime", "rkllm", "--json")
    build = json.loads(planned.stdout)["build"]
    assert planned.returncode == 0 and build["runtime"] == "rkllm" and build["scheme"] == "w8a8"
    assert not build["buildable"] and build["backend"] is None
    assert "rkllm-toolkit" in build["cannot_build"] and build["cannot_build"].endswith("or pass --runtime rknn")
    for out in (["--dry-run"], ["-o", "/nonexistent/never-written"]):
        line = _one_line(cli("deploy", str(llm.model_dir()), "--board", "rk3588-8g", "--runtime", "rkllm", *out), 3)
        assert line == f"error: board rk3588-8g: cannot build decoder models for runtime rkllm here: " \
                       f"{build['cannot_build']}"


def test_the_bundle_records_the_plan_it_was_built_for(tiny_qwen3_host_bundle):
    from edgeinfer.testing.fixtures import DECODER_BUNDLE_CTX

    manifest = json.loads((tiny_qwen3_host_bundle / "manifest.json").read_text())
    planned = cli("plan", str(llm.model_dir()), "--board", "host", "--ctx", str(DECODER_BUNDLE_CTX), "--json")
    assert manifest["plan"]["build"] == json.loads(planned.stdout)["build"]
    assert manifest["plan"]["options"]["runtime"] == manifest["decoder"]["runtime"] == "onnxruntime"
    assert manifest["plan"]["options"]["quant"] == manifest["scheme"] == "fp32"
    assert manifest["plan"]["options"]["ctx"] == manifest["decoder"]["context"] == DECODER_BUNDLE_CTX


def test_the_opened_decoder_runs_prompts_in_the_plans_prefill_chunk(tiny_qwen3_host_bundle):
    """The onnxruntime plugin's decoders take at most 512 prompt tokens a run (docs/generation.md, "Long prompts
    in runs of 512"), which `generate`, `bench` and `serve` split prompts by; the plan budgets the same run."""
    from edgeinfer.run.loading import load

    planned = json.loads(cli("plan", str(llm.model_dir()), "--board", "host", "--ctx", "1024", "--json").stdout)
    with load(tiny_qwen3_host_bundle) as gen:
        assert gen.decoder.prefill_chunk == planned["options"]["prefill_chunk"] == 512
    assert planned["memory"]["details"]["activations"]["tokens_per_step"] == 512


@pytest.mark.parametrize("board", BOARDS)
def test_a_decoder_is_told_to_page_only_where_deploy_builds_it_paged(board):
    """Qwen3-32B fits no board below 48 GB unpaged. ``plan`` suggests ``--paging`` for it only where the board's
    backend converts decoder segments (rknn): elsewhere ``deploy --paging`` refuses (every board suggested it
    until the fourteenth session of 2026-12-06)."""
    planned = cli("plan", "Qwen/Qwen3-32B", "--board", board, "--json")
    p = json.loads(planned.stdout)
    paging = p["suggestions"]["paging"]
    if _profile(board)["backend"] != "rknn":
        assert paging is None, paging
    elif board in ("rk3588-16g", "rk3588-32g"):
        assert paging["window"] >= 1 and "needs" in paging["why"], paging


def test_deploy_refuses_paging_a_decoder_where_the_backend_does_not_page_decoders():
    dry = cli("deploy", str(llm.model_dir()), "--board", "host", "--paging", "2", "--dry-run", "--json")
    assert dry.returncode == 2
    assert json.loads(dry.stdout)["error"]["kind"] == "not_supported"
