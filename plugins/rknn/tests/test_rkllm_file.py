"""A bare ``.rkllm`` file (as Rockchip's RKLLM toolkit writes it, not in an edgeinfer bundle) through the CLI:
``plan``, ``generate``, ``bench`` (with its self-check) and ``serve``.

No RK3588 here and the real runtime is aarch64-only: the model is a text file the STAND-IN ``librkllmrt.so``
(``rkllm_standin.c``, built by conftest's ``standin_lib``) loads, next to tiny-qwen3's tokenizer and
config.json, as a user keeps a downloaded ``.rkllm`` with its source model's tokenizer. Expected tokens follow
the stand-in's documented rule, derived here; expected sizes come from the file system.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from edgeinfer_rknn import rkllm

from edgeinfer.testing.cli import in_process_cli
from edgeinfer.testing.llm import model_dir

cli, _bind_capfd = in_process_cli()
VOCAB = 3072  # the stand-in's vocabulary (written into the model file below)
PROMPT = "The licence grants"
CTX = "256"


@pytest.fixture(scope="module")
def rkllm_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("rkllm-file")
    (d / "qwen3-tiny_W8A8_RK3588.rkllm").write_text(f"RKLLM-STANDIN vocab={VOCAB} eos=-1 delay_us=0")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model_dir() / name, d / name)
    return d


@pytest.fixture
def model(rkllm_dir, standin_lib, monkeypatch) -> Path:
    monkeypatch.setenv(rkllm.LIB_ENV, str(standin_lib))
    return rkllm_dir / "qwen3-tiny_W8A8_RK3588.rkllm"


def _stream(prompt_ids: list[int], n: int) -> list[int]:
    """rkllm_standin.c: t1 = (Σ prompt ids · 31 + 7) mod V, t_k+1 = (t_k · 31 + 7) mod V."""
    out, t = [], (sum(prompt_ids) * 31 + 7) % VOCAB
    for _ in range(n):
        out.append(t)
        t = (t * 31 + 7) % VOCAB
    return out


def _one_line(proc, code: int, *needles: str) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == code and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert all(n in lines[0] for n in needles), lines[0]
    return lines[0]


def test_a_rkllm_file_is_a_decoder_artifact_of_the_rknn_backend(model):
    from edgeinfer.contract import registry
    from edgeinfer.model.kind import Kind, find

    assert find(model) is Kind.DECODER_FILE and Kind.DECODER_FILE.decoder
    assert registry.decoder_file(model) == ("rknn", "rkllm")


def test_plan_takes_the_files_size_as_weights_on_the_rkllm_runtime_and_says_what_it_assumed(model):
    proc = cli("plan", str(model), "--board", "rk3588-8g", "--ctx", CTX, "--json")
    assert proc.returncode == 0, proc.stderr
    p = json.loads(proc.stdout)
    assert p["options"]["runtime"] == "rkllm" and p["options"]["quant"] == "w8a8"  # rk3588's RKLLM default
    weights = p["memory"]["details"]["weights"]
    assert p["memory"]["breakdown"]["weights"] == weights["file_bytes"] == model.stat().st_size
    assert "w8a8 assumed" in weights["basis"]
    assert any("does not record its scheme" in w for w in p["warnings"])
    assert p["model"]["layers"] == json.loads((model_dir() / "config.json").read_text())["num_hidden_layers"]


@pytest.mark.parametrize("args, needles", [
    (("--board", "host"), ("board host has no runtime 'rkllm'",)),
    (("--board", "rk3588-8g", "--runtime", "rknn"), ("runs in runtime rkllm only", "omit --runtime")),
])
def test_plan_refuses_a_runtime_that_cannot_run_the_file(model, args, needles):
    _one_line(cli("plan", str(model), *args), 2, *needles)


def test_plan_without_the_source_config_names_what_to_pass(tmp_path, model):
    lone = tmp_path / model.name
    shutil.copy(model, lone)
    _one_line(cli("plan", str(lone), "--board", "rk3588-8g"), 2, "config.json", "--runtime rkllm")


def test_generate_runs_the_file_through_the_runtime_binding(model):
    from edgeinfer.run.generation.text import TextCodec

    proc = cli("generate", str(model), "--prompt", PROMPT, "--max-new-tokens", "6", "--ctx", CTX, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["token_ids"] == _stream(TextCodec(model_dir()).encode(PROMPT), 6)
    assert out["backend"] == "rknn" and "stand-in" in out["device"]  # never "npu" off an aarch64 board


def test_generate_without_a_tokenizer_next_to_the_file_says_where_to_put_it(tmp_path, model):
    lone = tmp_path / model.name
    shutil.copy(model, lone)
    _one_line(cli("generate", str(lone), "--prompt", PROMPT), 2, "no tokenizer.json next to it", str(tmp_path))


def test_bench_compares_with_the_plan_labelled_as_a_stand_in_figure(model):
    proc = cli("bench", str(model), "--board", "rk3588-8g", "--prompt-lengths", "8", "--new-tokens", "4",
               "--repeat", "1", "--ctx", CTX, "--json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    sc = r["self_check"]
    assert (sc["board"], sc["runtime"], sc["scheme"]) == ("rk3588-8g", "rkllm", "w8a8")
    assert sc["ran_on"] == "stand-in library" and sc["board_figure"] is False and sc["rows"] == []
    (c,) = sc["comparisons"]
    assert c["decode_tokens_per_s"] == r["results"][0]["decode_tokens_per_s"]
    assert c["predicted_decode_tokens_per_s"] > 0  # rk3588/rkllm/w8a8 has fitted constants
    assert c["decode_ratio"] == pytest.approx(c["decode_tokens_per_s"] / c["predicted_decode_tokens_per_s"],
                                              rel=1e-3)
    assert any("says nothing about the board's speed constants" in n for n in sc["notes"])
    text = cli("bench", str(model), "--prompt-lengths", "8", "--new-tokens", "2", "--repeat", "1", "--ctx", CTX)
    assert text.returncode == 0 and "records no board: pass --board" in text.stdout, text.stderr


def test_serve_streams_the_file_through_the_official_openai_client(model, tmp_path):
    openai = pytest.importorskip("openai")
    from edgeinfer.testing.serve import ServerProc

    want = json.loads(cli("generate", str(model), "--prompt", PROMPT, "--max-new-tokens", "8", "--ctx", CTX,
                          "--json").stdout)["text"]
    with ServerProc([model], "--ctx", CTX, log=tmp_path / "serve.log") as s:  # the environment names the stand-in
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        assert [m.id for m in c.models.list().data] == [model.name]
        chunks = c.completions.create(model=model.name, prompt=PROMPT, max_tokens=8, stream=True)
        assert "".join(ch.choices[0].text or "" for ch in chunks) == want and want
