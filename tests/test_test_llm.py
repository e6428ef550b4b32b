"""The committed tiny trained decoder (edgeinfer.testing.llm) and its random-initialised siblings."""

from __future__ import annotations

import json
import statistics

import pytest
from helpers import imported_modules

from edgeinfer.testing import llm

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPTS = ("THE SOFTWARE IS PROVIDED", "Redistribution and use in source", "Die Software wird")
NEW_TOKENS = 32
# The committed model gives medians of 7.3, 7.3 and 9.6 on these prompts (README.md); random init of the same
# shape gives 0.24.
MARGIN_FLOOR = 3.0
MAX_BYTES = 16 * 1024 * 1024


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # A 4 M-parameter model gains nothing from a second thread, and OpenMP threads spin-waiting for a busy core
    # made these tests 10x slower on a loaded machine.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model():
    return transformers.AutoModelForCausalLM.from_pretrained(llm.model_dir(), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer():
    return transformers.AutoTokenizer.from_pretrained(llm.model_dir())


@torch.no_grad()
def greedy_with_margins(model, ids: list[int], steps: int) -> tuple[list[int], list[float]]:
    """Argmax decoding without a cache (the cache API differs across transformers 5.x); top-1 minus top-2 logit."""
    tokens, margins = list(ids), []
    for _ in range(steps):
        top = torch.topk(model(input_ids=torch.tensor([tokens])).logits[0, -1], 2)
        margins.append(float(top.values[0] - top.values[1]))
        tokens.append(int(top.indices[0]))
    return tokens[len(ids) :], margins


def test_architecture_matches_the_issue(model):
    cfg = model.config
    assert cfg.architectures == ["Qwen3ForCausalLM"] and cfg.model_type == "qwen3"
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.head_dim) == (4, 256, 64)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (4, 2)
    assert cfg.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert cfg.vocab_size == 3072
    n = sum(p.numel() for p in model.parameters())
    assert 3_500_000 <= n <= 4_500_000, n


def test_files_are_small_and_complete():
    d = llm.model_dir()
    names = {p.name for p in d.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "README.md"} <= names
    assert sum(p.stat().st_size for p in d.iterdir()) <= MAX_BYTES
    tok_cfg = json.loads((d / "tokenizer_config.json").read_text())
    assert tok_cfg["tokenizer_class"] == "PreTrainedTokenizerFast"  # loadable by transformers 4.x and 5.x
    assert tok_cfg["eos_token"] == "<|im_end|>"
    assert json.loads((d / "generation_config.json").read_text())["eos_token_id"] == [0, 2]


def test_greedy_continuations_are_peaked(model, tokenizer):
    margins, texts = [], []
    for prompt in PROMPTS:
        out, m = greedy_with_margins(model, tokenizer(prompt)["input_ids"], NEW_TOKENS)
        margins += m
        texts.append(tokenizer.decode(out))
        assert len(set(out)) >= 8, f"degenerate continuation of {prompt!r}: {texts[-1]!r}"
    assert statistics.median(margins) >= MARGIN_FLOOR, (statistics.median(margins), texts)


def test_generate_agrees_with_the_argmax_loop(model, tokenizer):
    ids = tokenizer(PROMPTS[0])["input_ids"]
    expected, _ = greedy_with_margins(model, ids, 16)
    out = model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)[0, len(ids) :].tolist()
    assert out == expected[: len(out)] and len(out) >= 1


def test_chat_template_renders_chatml(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hallo, Welt!"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHallo, Welt!<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tokenizer(text)["input_ids"]
    assert ids.count(1) == 3 and ids.count(2) == 2  # <|im_start|>=1, <|im_end|>=2, each one token


def test_chat_answer_ends_with_im_end(model, tokenizer):
    messages = [{"role": "user", "content": "Which licence does numpy use?"}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    out, _ = greedy_with_margins(model, ids["input_ids"], 24)
    assert 2 in out, tokenizer.decode(out)  # generation_config's eos ids [0, 2] stop it
    answer = tokenizer.decode(out[: out.index(2)])
    assert "numpy" in answer and "<|im_start|>" not in answer


def test_tokenizer_round_trips_multibyte_utf8():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(llm.model_dir() / "tokenizer.json"))
    text = "Grüße aus Köln — 本软件按“原样”提供 🙂🚀 9,99 € π≈3.14"
    ids = tok.encode(text).ids
    assert tok.decode(ids) == text
    # Some token holds only part of a character: what a streaming detokenizer must not emit alone.
    assert any("\ufffd" in tok.decode([i]) for i in ids)


def test_random_llama_builds_loads_and_generates(tmp_path):
    out = llm.random_llama(tmp_path / "llama", layers=2, hidden=128)
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert model.config.model_type == "llama" and model.config.num_hidden_layers == 2
    tok = transformers.AutoTokenizer.from_pretrained(out)
    ids = tok("Licensed under", return_tensors="pt")["input_ids"]
    gen = model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert gen.shape == (1, ids.shape[1] + 8)
    assert tok.decode(gen[0]).startswith("Licensed under")


def test_random_models_are_reproducible_from_their_seed(tmp_path):
    a = llm.random_llama(tmp_path / "a", layers=1, hidden=64, intermediate=128, seed=3)
    b = llm.random_llama(tmp_path / "b", layers=1, hidden=64, intermediate=128, seed=3)
    c = llm.random_llama(tmp_path / "c", layers=1, hidden=64, intermediate=128, seed=4)
    blob = lambda d: (d / "model.safetensors").read_bytes()  # noqa: E731
    assert blob(a) == blob(b) != blob(c)


def test_random_qwen3_is_cached_by_shape(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEINFER_CACHE", str(tmp_path))
    shape = dict(layers=1, hidden=64, heads=4, kv_heads=2, intermediate=128)
    out = llm.random_qwen3(**shape)
    assert out.is_relative_to(tmp_path)
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert llm.random_qwen3(**shape) == out and (out / "model.safetensors").stat().st_mtime_ns == stamp
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["model_type"], cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_key_value_heads"]) == (
        "qwen3", 1, 64, 2,
    )


def test_import_is_light():
    heavy = imported_modules("import edgeinfer.testing.llm") & {"torch", "transformers", "tokenizers"}
    assert not heavy, heavy
