"""``edgeinfer deploy`` of a decoder: tiny-qwen3 for the host board (onnxruntime), deployed once per session
(the ``tiny_qwen3_host_bundle`` fixture), then loaded, generated from, golden-checked, tampered with; and
the deploys that must stop early (plan does not fit, golden fails, bad input) write nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from statistics import median

import numpy as np
import pytest
from helpers import edgeinfer as cli

import edgeinfer
from edgeinfer.errors import InputError
from edgeinfer.testing.fixtures import DECODER_BUNDLE_CTX
from edgeinfer.testing.llm import model_dir

PROMPTS = ("The licence grants", "Permission is hereby granted", "def main():")
N_TOKENS = 32


@pytest.fixture(scope="module")
def bundle(tiny_qwen3_host_bundle) -> Path:
    return tiny_qwen3_host_bundle


@pytest.fixture(scope="module")
def hf_greedy() -> dict[str, list[int]]:
    """transformers' own greedy ``generate`` on the source model: the tokens the bundle must reproduce."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir())
    model = AutoModelForCausalLM.from_pretrained(model_dir(), dtype=torch.float32).eval()
    out = {}
    with torch.inference_mode():
        for p in PROMPTS:
            ids = tok(p)["input_ids"]
            gen = model.generate(torch.tensor([ids]), max_new_tokens=N_TOKENS, do_sample=False,
                                 eos_token_id=model.generation_config.eos_token_id, pad_token_id=0)
            out[p] = gen[0, len(ids):].tolist()
    return out


def _manifest(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


def _one_line_error(proc, code: int, *needles: str) -> None:
    assert proc.returncode == code, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


# --- the bundle -------------------------------------------------------------------------------------------


def test_bundle_holds_artifact_tokenizer_configs_and_reference_and_is_sealed(bundle):
    import jsonschema

    from edgeinfer.model import bundle as bundle_mod

    m = _manifest(bundle)
    files = set(m["files"])
    for rel in ("decoder/genai_config.json", "decoder/model.onnx", "decoder/model.onnx.data", "decoder.stamp.json",
                "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json", "tokenizer/generation_config.json",
                "tokenizer/config.json", "golden/reference.npz", "golden/prompts.json"):
        assert rel in files, rel
    assert m["backend"]["name"] == "onnxruntime" and m["board"] == "host" and m["scheme"] == "fp32"
    assert m["artifacts"] == ["decoder"]
    dec = m["decoder"]
    assert dec["kind"] == "causal_lm" and dec["architecture"] == "Qwen3ForCausalLM"
    assert dec["context"] == DECODER_BUNDLE_CTX and dec["vocab_size"] == 3072
    # the chat template travels in tokenizer_config.json, as the source model has it
    src_cfg = json.loads((model_dir() / "tokenizer_config.json").read_text())
    assert json.loads((bundle / "tokenizer/tokenizer_config.json").read_text())["chat_template"] == \
        src_cfg["chat_template"]
    schema = json.loads((Path(bundle_mod.__file__).parents[1] / "schemas" / "manifest.schema.json").read_text())
    jsonschema.validate(m, schema)
    report = bundle_mod.verify(bundle)
    assert report["ok"] and report["files"] == len(files)


def test_golden_report_in_the_manifest(bundle):
    from edgeinfer.run.generation.golden import THRESHOLDS

    g = _manifest(bundle)["decoder"]["golden"]
    assert g["passed"] is True and g["scheme"] == "fp32" and g["device"] == "CPU"
    assert g["prompts"] == 4 and g["new_tokens"] == N_TOKENS and len(g["rows"]) == 4
    assert g["thresholds"] == THRESHOLDS["fp32"].__dict__
    # fp32 weights with the host plan's fp16 KV cache against fp32 torch: the same tokens, logits equal up to
    # fp16 rounding of the cached keys and values (a near-tied fifth logit may swap: 0.998 measured)
    assert g["token_agreement"] == 1.0 and g["near_ties"] == 0
    assert 0.99999 < g["cosine_min"] <= g["cosine_mean"] <= 1.0 + 1e-12
    assert g["top5_overlap"] >= 0.99
    for row in g["rows"]:
        assert row["first_divergence"] is None and row["reference_margin_at_divergence"] is None
        assert row["problems"] == [] and row["finite"] is True


def test_greedy_tokens_from_the_bundle_equal_transformers_generate(bundle, hf_greedy):
    with edgeinfer.load(bundle) as gen:
        assert gen.context == DECODER_BUNDLE_CTX and gen.decoder.backend_name == "onnxruntime"
        for p in PROMPTS:
            assert gen.generate(p, max_new_tokens=N_TOKENS).token_ids == hf_greedy[p], p


def test_tensor_entry_points_refuse_a_decoder_bundle_in_one_line(bundle):
    from edgeinfer.model.bundle import Bundle
    from edgeinfer.run.bundle import open_session

    with pytest.raises(InputError, match="holds a decoder .*edgeinfer generate"):
        open_session(Bundle.open(bundle))


def test_a_smaller_context_loads_and_a_larger_one_is_refused(bundle):
    with edgeinfer.load(bundle, ctx=64) as gen:
        assert gen.context == 64
    with pytest.raises(InputError, match=f"built for a context of {DECODER_BUNDLE_CTX} tokens, not 512"):
        edgeinfer.load(bundle, ctx=512)


def test_generate_chat_and_golden_commands_on_the_bundle(bundle, hf_greedy):
    proc = cli("generate", str(bundle), "--prompt", PROMPTS[0], "--max-new-tokens", "12", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["token_ids"] == hf_greedy[PROMPTS[0]][:12] and out["context"] == DECODER_BUNDLE_CTX
    for args, stdin in (([PROMPTS[0]], None), (["-"], PROMPTS[0])):  # the prompt after MODEL; - reads stdin
        proc = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "generate", str(bundle), *args,
                               "--max-new-tokens", "12", "--json"], input=stdin, capture_output=True, text=True)
        assert proc.returncode == 0 and json.loads(proc.stdout)["token_ids"] == out["token_ids"], proc.stderr
    proc = cli("golden", str(bundle), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    before = _manifest(bundle)["decoder"]["golden"]
    assert report["passed"] and report["token_agreement"] == 1.0
    assert report["cosine_min"] == pytest.approx(before["cosine_min"], abs=1e-9)
    chat = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "chat", str(bundle), "--max-new-tokens", "8"],
                          input="What does the licence allow?\n", capture_output=True, text=True)
    assert chat.returncode == 0 and chat.stdout.startswith("> ") and len(chat.stdout) > 4, chat.stderr
    strict = cli("golden", str(bundle), "--threshold", "1.0")  # no float path reaches cosine 1 at every step
    assert strict.returncode == 1 and "decoder golden check FAILED" in strict.stdout


def test_the_golden_checks_decode_timing_is_what_deploy_compares_with_the_plan(bundle):
    """deploy's speed_check: the candidate's GenerationMetrics of each golden prompt reach speed_check, which
    plans at the positions the golden check reached and labels the host figure as the host board's."""
    from edgeinfer.contract import registry
    from edgeinfer.deploy.decoder import judge, speed_check
    from edgeinfer.model import decoder_bundle
    from edgeinfer.model.bundle import Bundle
    from edgeinfer.planning.boards import get_board
    from edgeinfer.planning.planner import plan
    from edgeinfer.run import bundle as run_bundle
    from edgeinfer.run.generation import golden

    b = Bundle.open(bundle)
    recorded = decoder_bundle.load_reference(b)
    metrics: list = []
    with run_bundle.open_generator(b, **registry.get_backend(b.manifest.backend).decoders.logits_options) as g:
        report = judge(g, recorded, 8, b.manifest.scheme, golden.thresholds_for(b.manifest.scheme), None, metrics)
    assert len(metrics) == len(recorded) and all(m.generated_tokens == 8 for m in metrics)
    p = plan(str(model_dir()), get_board("host"), quant="fp32", ctx=DECODER_BUNDLE_CTX)
    sc = speed_check((metrics, 40), report["device"], p, get_board("host"), "fp32", "onnxruntime", None)
    assert sc["decode_tokens_per_s"] == pytest.approx(median(m.decode_tokens_per_s for m in metrics), abs=0.01)
    assert (sc["ctx"], sc["ran_on"], sc["board_figure"]) == (40, "host CPU", True)
    pred = sc["predicted_decode_tokens_per_s"]  # None until host-cpu constants are fitted (bench/data/rows_host.yaml)
    assert sc["ratio"] == (None if pred is None else round(sc["decode_tokens_per_s"] / pred, 4))


def test_a_tampered_bundle_fails_verify_golden_and_load(bundle, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(bundle, copy)
    data = copy / "decoder" / "model.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size: only the hash tells
    data.write_bytes(bytes(raw))
    proc = cli("verify", str(copy))
    assert proc.returncode == 2 and "decoder/model.onnx.data has changed" in proc.stdout
    _one_line_error(cli("golden", str(copy)), 2, "damaged")
    with open(data, "ab") as f:
        f.write(b"\0")
    with pytest.raises(InputError, match="damaged"):
        edgeinfer.load(copy)


# --- deploys that stop early and write nothing ----------------------------------------------------------


def test_a_broken_conversion_fails_golden_exits_1_and_writes_nothing(bundle, tmp_path, monkeypatch, capsys):
    """A backend whose conversion is wrong (a stand-in: the session's artifact with the later layers'
    weights sign-flipped, finite and wrong) fails the check: exit 1, no bundle, no leftovers."""
    from edgeinfer.cli import invoke
    from edgeinfer.contract import registry

    def broken(self, model, scheme, context, out, calibration=None, **options):
        shutil.copytree(bundle / "decoder", out, dirs_exist_ok=True)
        data = out / "model.onnx.data"
        w = np.frombuffer(data.read_bytes(), dtype=np.float32).copy()
        w[len(w) // 2 :] *= -1
        data.write_bytes(w.tobytes())
        return {"target": "cpu"}

    monkeypatch.setattr(type(registry.get_backend("onnxruntime")), "convert_decoder", broken)
    out = tmp_path / "out"
    code = invoke(["deploy", str(model_dir()), "--board", "host", "--ctx", str(DECODER_BUNDLE_CTX), "--no-cache",
                   "-o", str(out), "--json"])
    captured = capsys.readouterr()
    assert code == 1, captured.err
    assert "decoder golden check FAILED" in captured.err and "another token at" in captured.err
    assert "not written" in captured.err
    assert list(tmp_path.iterdir()) == []
    error = json.loads(captured.out)["error"]  # a script reads the report behind the verdict
    assert error["kind"] == "golden_failed"
    report = error["details"]["golden"]
    assert report["passed"] is False and report["scheme"] == "fp32"
    assert report["prompts"] == len(report["rows"]) == 4
    assert report["forced_agreement"] < report["thresholds"]["min_agreement"]
    assert any(row["clear_misses"] and row["problems"] for row in report["rows"])


def _board(tmp_path: Path, backend: str, gib: float, schemes: str = "fp32, w4a16") -> Path:
    p = tmp_path / "tiny-board.yaml"
    p.write_text(
        f"name: tiny-board\ntitle: a board for tests\nfamily: tiny\nbackend: {backend}\nmemory_kind: shared\n"
        f"memory_total_gib: {{value: {gib}, source: test}}\nos_reserve_gib: {{value: 0, source: test}}\n"
        f"runtimes:\n  onnxruntime: {{schemes: [{schemes}], source: test}}\ndefault_runtime: onnxruntime\n")
    return p


def test_plan_that_does_not_fit_exits_1_with_a_suggestion_and_no_bundle(tmp_path):
    from edgeinfer.planning.planner import plan

    # a board between tiny-qwen3 fp32's plans at ctx 128 and 1024: it fits at short contexts only
    roomy = _board(tmp_path, "onnxruntime", 64)
    short, long = (plan(str(model_dir()), str(roomy), ctx=c, suggest=False).total_bytes for c in (128, 1024))
    assert short < long
    board = _board(tmp_path, "onnxruntime", (short + long) / 2 / 2**30)
    out = tmp_path / "out"
    proc = cli("deploy", str(model_dir()), "--board", str(board), "--ctx", "1024", "-o", str(out))
    _one_line_error(proc, 1, "does not fit tiny-board", "try --ctx ")
    assert not out.exists()


def test_a_refusal_that_a_smaller_kv_cache_answers_names_it(tmp_path):
    """Qwen3-8B w4a16 at 32k positions on a board between its plans with a q8_0 and an fp16 KV cache: deploy's
    refusal names ``--option kv_dtype=q8_0`` among what to try."""
    from edgeinfer.deploy.decoder import suggestion
    from edgeinfer.planning.planner import plan

    roomy = _board(tmp_path, "onnxruntime", 64)
    q8, f16 = (plan("qwen3-8b", str(roomy), quant="w4a16", ctx=32768, kv_dtype=kv, suggest=False).total_bytes
               for kv in ("q8_0", "fp16"))
    p = plan("qwen3-8b", str(_board(tmp_path, "onnxruntime", (q8 + f16) / 2 / 2**30)), quant="w4a16", ctx=32768)
    assert not p.fits and p.suggestions.kv_cache["fits"] is True
    assert "--option kv_dtype=q8_0 (a smaller KV cache)" in suggestion(p)


def test_a_scheme_the_board_lists_but_the_backend_does_not_convert_decoders_to_exits_2(tmp_path):
    board = _board(tmp_path, "onnxruntime", 64, schemes="fp32, bf16, w4a16")
    out = tmp_path / "out"
    proc = cli("deploy", str(model_dir()), "--board", str(board), "--quant", "bf16", "-o", str(out))
    _one_line_error(proc, 2, "deploys decoders as fp32, w4a16 only")
    assert not out.exists()


def test_a_backend_without_convert_decoder_is_named(tmp_path):
    board = _board(tmp_path, "transformers", 64)
    proc = cli("deploy", str(model_dir()), "--board", str(board), "-o", str(tmp_path / "out"))
    _one_line_error(proc, 3, "'transformers'", "convert_decoder")


def _model_copy(tmp_path: Path, **changes: str) -> Path:
    d = tmp_path / "m"
    d.mkdir()
    for f in model_dir().iterdir():
        (d / f.name).symlink_to(f)
    for name, text in changes.items():
        (d / name).unlink()
        (d / name).write_text(text)
    return d


@pytest.mark.parametrize("args, needle", [
    (["--ctx", "0"], "--ctx must be a positive"),
    (["--ctx", "4096"], "max_position_embeddings (1024)"),
    (["--shape", "input_ids=1x8"], "--shape does not apply to decoder"),
    (["--paging", "1"], "backend onnxruntime cannot page decoders"),
    (["--paging", "two"], "--paging must be a positive window (segments resident) or auto"),
    (["--segments", "2"], "--segments goes with --paging W|auto"),
])
def test_bad_deploy_options_exit_2(tmp_path, args, needle):
    out = tmp_path / "out"
    _one_line_error(cli("deploy", str(model_dir()), "--board", "host", *args, "-o", str(out)), 2, needle)
    assert not out.exists()


@pytest.mark.parametrize("file, text, needle", [
    ("tokenizer.json", "{not json", "not a valid tokenizer.json"),
    ("tokenizer_config.json", json.dumps({"chat_template": "{% for m in messages %}"}), "chat template"),
])
def test_broken_tokenizer_or_chat_template_exit_2(tmp_path, file, text, needle):
    model = _model_copy(tmp_path, **{file: text})
    out = tmp_path / "out"
    _one_line_error(cli("deploy", str(model), "--board", "host", "-o", str(out)), 2, needle)
    assert not out.exists()


def _unexportable_copy(tmp_path: Path) -> Path:
    """tiny-qwen3 relabelled qwen3_moe: an architecture the planner reads but the host board's backend
    (onnxruntime-genai's model builder) does not export."""
    cfg = json.loads((model_dir() / "config.json").read_text())
    cfg.update(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], num_experts=4, num_experts_per_tok=2,
               moe_intermediate_size=128)
    return _model_copy(tmp_path, **{"config.json": json.dumps(cfg)})


def test_deploy_refuses_an_architecture_the_backend_does_not_export_before_converting(tmp_path):
    model, out, cache = _unexportable_copy(tmp_path), tmp_path / "out", tmp_path / "cache"
    proc = cli("deploy", str(model), "--board", "host", "--runtime", "onnxruntime", "-o", str(out),
               env={"EDGEINFER_CACHE_DIR": str(cache)})
    _one_line_error(proc, 2, "board host: backend 'onnxruntime' exports", "qwen2, qwen3,", "not 'qwen3_moe'")
    assert not out.exists() and not cache.exists(), "nothing may be converted"


def test_plan_refuses_an_architecture_the_backend_does_not_export(tmp_path):
    model = _unexportable_copy(tmp_path)
    proc = cli("plan", str(model), "--board", "host", "--runtime", "onnxruntime")
    _one_line_error(proc, 2, "board host: backend 'onnxruntime' exports", "qwen2, qwen3,", "not 'qwen3_moe'")
    # unasked, the plan takes the host's other decoder runtime where one is installed: llama.cpp converts it
    own = cli("plan", str(model), "--board", "host", "--json")
    if own.returncode == 0:
        assert json.loads(own.stdout)["options"]["runtime"] == "llama.cpp"
    else:
        _one_line_error(own, 2, "backend 'onnxruntime' exports")
    assert json.loads(cli("plan", str(model_dir()), "--board", "host", "--json").stdout)["model"]["architecture"] \
        == "qwen3"  # the architecture it exports is planned


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["chat"]])
def test_generate_and_chat_refuse_a_model_that_is_not_a_causal_lm(tmp_path, command):
    d = tmp_path / "bert"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["BertModel"], "model_type": "bert"}))
    _one_line_error(cli(command[0], str(d), *command[1:]), 2, "not a decoder")


def test_a_failed_golden_check_suggests_the_options_the_backend_declares_closer() -> None:
    from types import SimpleNamespace

    from edgeinfer.contract.records import Decoders
    from edgeinfer.deploy.decoder import retry_hint

    blocks = SimpleNamespace(decoders=Decoders(convert_options=("target", "group_size", "keep"),
                                               closer={"group_size": "smaller blocks: --option group_size=N",
                                                       "keep": "more in fp16: --option keep=0.99"}))
    plain = SimpleNamespace(decoders=Decoders(convert_options=("target", "group_size")))
    assert retry_hint(blocks, "w8a16", {}) == ("try a less lossy --quant, or smaller blocks: --option group_size=N, "
                                               "or more in fp16: --option keep=0.99, "
                                               "or check the backend's conversion")
    assert "--option group_size" not in retry_hint(blocks, "w8a16", {"group_size": 64})  # the user chose one
    assert "--option keep=0.99" in retry_hint(blocks, "w8a16", {"group_size": 64})
    assert "--option" not in retry_hint(blocks, "fp16", {})  # nothing quantized
    assert retry_hint(plain, "w8a16", {}) == "try a less lossy --quant, or check the backend's conversion"


@pytest.mark.parametrize(("backend", "option"), [("openvino", "group_size"), ("ascend", "group_size")])
def test_what_the_plugins_call_closer_are_convert_options_they_take(backend, option):
    d = edgeinfer.backend(backend).decoders
    assert option in d.closer and set(d.closer) <= set(d.convert_options), d.closer
