"""Generation through the decoder contract on the transformers reference, checked against
calling transformers' own ``generate`` on the same model."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

import edgeinfer
from edgeinfer.errors import InputError
from edgeinfer.testing.cli import run_cli

PROMPTS = ("The licence grants", "Permission is hereby granted", "def main():")
N_TOKENS = 32


@pytest.fixture(scope="module")
def llm_dir() -> Path:
    from edgeinfer.testing.llm import model_dir

    return model_dir()


@pytest.fixture(scope="module")
def session(llm_dir):
    with edgeinfer.load(llm_dir, ctx=256) as s:
        yield s


@pytest.fixture(scope="module")
def hf_greedy(llm_dir):
    """transformers' own greedy generate: the reference the contract must reproduce."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(llm_dir)
    model = AutoModelForCausalLM.from_pretrained(llm_dir, dtype=torch.float32).eval()

    def run(text: str | None = None, ids: list[int] | None = None, n: int = N_TOKENS) -> list[int]:
        if ids is None:
            ids = tok(text)["input_ids"]
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                                 eos_token_id=model.generation_config.eos_token_id, pad_token_id=0)
        return out[0, len(ids):].tolist()

    return run


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_tokens_equal_transformers_generate(session, hf_greedy, prompt):
    r = session.generate(prompt, max_new_tokens=N_TOKENS)
    assert r.token_ids == hf_greedy(prompt)
    assert r.finish_reason in ("length", "stop")


def test_chat_prompt_goes_through_the_template_and_matches(session, hf_greedy, llm_dir):
    from transformers import AutoTokenizer

    messages = [{"role": "user", "content": "What does the licence allow?"}]
    ids = AutoTokenizer.from_pretrained(llm_dir).apply_chat_template(messages, add_generation_prompt=True)
    ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    r = session.generate(messages, max_new_tokens=16)
    assert r.prompt_ids == ids
    assert r.token_ids == hf_greedy(ids=ids, n=16)[: len(r.token_ids)]


def test_stream_pieces_join_to_the_generated_text(session):
    stream = session.stream(PROMPTS[0], max_new_tokens=N_TOKENS)
    pieces = list(stream)
    assert "".join(pieces) == stream.result.text
    assert stream.result.text == session.generate(PROMPTS[0], max_new_tokens=N_TOKENS).text


def test_seeded_sampling_is_deterministic(session):
    a = session.generate(PROMPTS[1], max_new_tokens=24, temperature=1.0, top_p=0.95, seed=11)
    b = session.generate(PROMPTS[1], max_new_tokens=24, temperature=1.0, top_p=0.95, seed=11)
    c = session.generate(PROMPTS[1], max_new_tokens=24, temperature=1.5, seed=12)
    assert a.token_ids == b.token_ids
    assert c.token_ids != a.token_ids


def test_stop_string_ends_the_text_before_it(session):
    full = session.generate(PROMPTS[0], max_new_tokens=N_TOKENS).text
    words = full.split()
    assert len(words) > 3, full
    stop = words[2]
    r = session.generate(PROMPTS[0], max_new_tokens=N_TOKENS, stop=[stop])
    assert r.finish_reason == "stop"
    assert r.text == full[: full.index(stop)]


def test_cancel_stops_the_stream(session):
    stream = session.stream(PROMPTS[2], max_new_tokens=N_TOKENS, ignore_eos=True)
    for i, _ in enumerate(stream):
        if i == 2:
            stream.cancel()
    assert stream.result.finish_reason == "cancelled"
    assert len(stream.result.token_ids) < N_TOKENS


def test_kv_cache_is_allocated_for_the_context(llm_dir):
    cfg = json.loads((llm_dir / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    with edgeinfer.load(llm_dir, ctx=96) as s:
        # layers × (K and V) × KV heads × head_dim × positions × 4 bytes (fp32)
        assert s.kv_cache_bytes == cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * head_dim * 96 * 4
        r = s.generate(PROMPTS[0], max_new_tokens=8)
        assert r.metrics.kv_cache_bytes == s.kv_cache_bytes
        assert r.metrics.generated_tokens == len(r.token_ids) > 0
        assert r.metrics.ttft_ms > 0 and r.metrics.peak_rss_bytes > 0


def test_prompt_plus_new_tokens_over_the_context_is_an_input_error(llm_dir):
    with edgeinfer.load(llm_dir, ctx=16) as s:
        with pytest.raises(InputError, match="exceed the context of 16"):
            s.generate("word " * 20, max_new_tokens=4)
        with pytest.raises(InputError, match="lower max_new_tokens"):
            s.generate(PROMPTS[0], max_new_tokens=16)


# --- the command line -----------------------------------------------------------------------------


@pytest.fixture
def cli(capfd):
    """``edgeinfer ARGS`` in this process (edgeinfer.testing.cli.run_cli): no interpreter start-up per call."""
    return functools.partial(run_cli, capfd)


def test_generate_json_reports_text_ids_and_metrics(llm_dir, hf_greedy, cli):
    p = cli("generate", str(llm_dir), "--prompt", PROMPTS[0], "--max-new-tokens", "16", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["token_ids"] == hf_greedy(PROMPTS[0], n=16)[: len(out["token_ids"])]
    for key in ("ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s", "peak_rss_bytes", "kv_cache_bytes"):
        assert out["metrics"][key] > 0, key


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--prompt", ""], "prompt is empty"),
        (["--prompt", "x", "--max-new-tokens", "0"], "max_new_tokens must be at least 1"),
        (["--prompt", "x", "--max-new-tokens", "-5"], "max_new_tokens must be at least 1"),
        (["--prompt", "x", "--temperature", "-1"], "temperature"),
        (["--prompt", "word " * 40, "--ctx", "16", "--max-new-tokens", "4"], "exceed the context"),
        (["--prompt", "x", "--ctx", "0"], "context must be a positive integer"),
        (["--prompt", "x", "--backend", "example"], "does not run decoder"),  # the tensors-only example plugin
        (["--prompt", "x", "--threads", "0"], "--threads must be at least 1"),
    ],
)
def test_generate_bad_input_is_one_line_exit_2(llm_dir, args, needle, cli):
    p = cli("generate", str(llm_dir), *args)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2, p.stderr
    assert needle in lines[-1] and lines[-1].startswith("error:")
    assert "Traceback" not in p.stderr and p.stdout == ""


def test_threads_reach_the_decoder_as_for_bench_and_serve(llm_dir, cli):
    """generate/chat take --threads as bench and serve do (run.loading.threads_option): the transformers
    reference sets torch's threads; a backend whose decoders take no threads option gets none."""
    import torch

    from edgeinfer.run.loading import threads_option

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        p = cli("generate", str(llm_dir), "--prompt", PROMPTS[0], "--max-new-tokens", "2", "--threads", "1", "--json")
        assert p.returncode == 0, p.stderr
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert threads_option("onnxruntime", 3) == {"threads": 3}
    assert threads_option("rknn", 3) == {}  # an NPU decoder: no CPU threads to set
    assert "--threads" in cli("chat", "--help").stdout


def test_generate_refuses_models_that_are_not_language_models(tmp_path, cli):
    from edgeinfer.testing.minilm import model_dir

    for target in (model_dir(), tmp_path):
        p = cli("generate", str(target), "--prompt", "hi")
        assert p.returncode == 2 and "not a decoder" in p.stderr and "Traceback" not in p.stderr


def test_a_decoder_directory_without_weights_is_one_line_exit_2(llm_dir, tmp_path, cli):
    """An exported runtime directory keeps the model's config.json but none of its safetensors: without
    --backend the transformers reference would fail inside its plugin ("report it to the plugin's authors")."""
    import shutil

    export = tmp_path / "export"
    shutil.copytree(llm_dir, export, ignore=shutil.ignore_patterns("*.safetensors"))
    p = cli("generate", str(export), "--prompt", "hi", "--max-new-tokens", "2")
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert "holds no weights the transformers reference reads" in lines[0] and "--backend" in lines[0]
    assert "plugin" not in lines[0] and p.stdout == ""


def test_chat_flag_without_a_template_is_one_line_exit_2(llm_dir, tmp_path, cli):
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(llm_dir, bare)
    cfg = json.loads((bare / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(cfg))
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    p = cli("generate", str(bare), "--prompt", "hi", "--chat")
    assert p.returncode == 2 and "no chat template" in p.stderr and "Traceback" not in p.stderr


def test_the_generation_doc_example_runs(tmp_path, monkeypatch, capfd):
    """docs/generation.md's Python block, as written (executed in a fresh namespace, in-process)."""
    import re

    doc = (Path(__file__).resolve().parents[1] / "docs" / "generation.md").read_text()
    block = re.search(r"```python\n(.*?)```", doc, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "docs/generation.md", "exec"), {"__name__": "__main__"})
    out, _ = capfd.readouterr()
    assert out.strip()


@pytest.mark.parametrize("encoding", ["utf-8:surrogateescape", "utf-8:strict"])
def test_chat_with_bytes_that_are_not_utf8_on_stdin_is_one_line_exit_2(llm_dir, encoding):
    """How stdin decodes depends on the locale (surrogate escapes under C/POSIX, an error under strict
    UTF-8): either way one line and exit 2, not an internal error."""
    import os

    p = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "chat", str(llm_dir), "--max-new-tokens", "2"],
                       input=b"hi \xff\xfe there\n", capture_output=True, timeout=300,
                       env={**os.environ, "PYTHONIOENCODING": encoding})
    err = p.stderr.decode()
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert p.returncode == 2, err
    assert len(errors) == 1 and "stdin is not valid UTF-8" in errors[0] and "0xff" in errors[0], err
    assert "Traceback" not in err and "internal error" not in err


def test_a_template_bomb_is_one_line_exit_2_not_a_hang(llm_dir, tmp_path, cli):
    """A chat template of nested range loops (10**10 iterations) stops at the render bounds."""
    from edgeinfer.testing.llm import with_template_bomb

    bomb = with_template_bomb(tmp_path / "bomb", llm_dir)
    p = cli("generate", str(bomb), "--prompt", "hi", "--chat", "--max-new-tokens", "2")
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2, p.stderr
    assert lines[-1].startswith("error:") and "chat template of" in lines[-1] and str(bomb) in lines[-1]
    assert "Traceback" not in p.stderr and p.stdout == ""
