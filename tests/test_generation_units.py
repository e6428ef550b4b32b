"""The core's generation pieces on their own: options, sampling, stop strings, streaming
detokenization and the chat template. Expected values are worked out by hand in each test."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.contract.generation import GenerationOptions
from edgeinfer.errors import InputError, ModelError
from edgeinfer.run.generation.sampling import Sampler, penalize, softmax, top2_margin, top_k, top_p
from edgeinfer.run.generation.stopping import ContextExceeded, StopStrings, context_room, eos_ids, length_reached
from edgeinfer.run.generation.text import TextCodec
from edgeinfer.testing.llm import TEMPLATE_BOMB

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MULTIBYTE = "Grüße aus München, 你好世界 🙂 naïve café"


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> Path:
    """A byte-level BPE tokenizer trained on a few lines, with a ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    d = tmp_path_factory.mktemp("tok")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 50, trainer)
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "chat_template": CHATML}))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 2]}))
    return d


# --- options --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, word",
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": -3}, "max_new_tokens"),
        ({"max_new_tokens": 2.5}, "max_new_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"seed": -1}, "seed"),
        ({"stop": ("",)}, "stop"),
    ],
)
def test_bad_options_are_input_errors(kw, word):
    with pytest.raises(InputError, match=word):
        GenerationOptions(**kw)


def test_a_single_stop_string_becomes_a_tuple():
    assert GenerationOptions(stop="END").stop == ("END",)


# --- sampling -------------------------------------------------------------------------------------


def test_greedy_takes_the_argmax():
    assert Sampler(GenerationOptions())(np.array([0.1, 2.0, -1.0, 1.9])) == 1


def test_repetition_penalty_divides_positive_and_multiplies_negative_scores():
    out = penalize(np.array([2.0, -1.0, 3.0]), [0, 1], 2.0)
    assert out.tolist() == [1.0, -2.0, 3.0]


def test_penalty_changes_the_greedy_choice():
    opts = GenerationOptions(repetition_penalty=2.0)
    # token 0 (4.0) was already generated: 4.0 / 2 = 2.0 < 3.0 → token 1
    assert Sampler(opts)(np.array([4.0, 3.0, 0.0]), history=[0]) == 1


def test_top_k_keeps_k_scores():
    out = top_k(np.array([1.0, 5.0, 3.0, 4.0]), 2)
    assert np.isinf(out[[0, 2]]).all() and out[1] == 5.0 and out[3] == 4.0


def test_top_p_keeps_the_smallest_set_reaching_p():
    scores = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    kept = np.isfinite(top_p(scores, 0.75))
    assert kept.tolist() == [True, True, False, False]  # 0.5 < 0.75 ≤ 0.5 + 0.3
    assert np.isfinite(top_p(scores, 0.1)).tolist() == [True, False, False, False]  # the top token always stays


def test_softmax_sums_to_one_and_margin_is_top1_minus_top2():
    assert softmax(np.array([1.0, 2.0, 3.0])).sum() == pytest.approx(1.0)
    assert top2_margin(np.array([0.5, 3.0, 2.25])) == pytest.approx(0.75)


def test_same_seed_same_samples_and_the_distribution_is_followed():
    logits = np.log(np.array([0.7, 0.2, 0.1]))
    opts = GenerationOptions(temperature=1.0, seed=7)
    a = [Sampler(opts)(logits) for _ in range(1)]
    s1, s2 = Sampler(opts), Sampler(opts)
    draws1 = [s1(logits) for _ in range(2000)]
    draws2 = [s2(logits) for _ in range(2000)]
    assert draws1 == draws2 and a[0] == draws1[0]
    freq = np.bincount(draws1, minlength=3) / 2000
    assert abs(freq[0] - 0.7) < 0.05 and abs(freq[2] - 0.1) < 0.03
    other = Sampler(GenerationOptions(temperature=1.0, seed=8))
    assert [other(logits) for _ in range(2000)] != draws1


def test_temperature_sharpens_or_flattens_the_distribution():
    logits = np.array([1.0, 0.8, 0.0])
    # p(0) = e^(1/T) / Σ: T=0.05 → 1/(1 + e^-4 + e^-20) ≈ 0.982; T=1 → e/(e + e^0.8 + 1) ≈ 0.457
    for temperature, low, high in ((0.05, 0.96, 1.0), (1.0, 0.42, 0.50)):
        s = Sampler(GenerationOptions(temperature=temperature, seed=0))
        freq = np.mean([s(logits) == 0 for _ in range(3000)])
        assert low <= freq <= high, (temperature, freq)


# --- stop strings ---------------------------------------------------------------------------------


def test_stop_string_split_across_pieces_is_held_back_and_cut():
    s = StopStrings(["END"])
    assert s.feed("hello E") == "hello "
    assert s.feed("N") == ""
    assert s.feed("D and more") == ""
    assert s.stopped and s.flush() == ""


def test_held_text_is_released_when_it_cannot_become_a_stop_string():
    s = StopStrings(["END"])
    assert s.feed("an E") == "an "
    assert s.feed("gg") == "Egg"
    assert s.feed(" E") == " "
    assert s.flush() == "E"  # the sequence ended: what was held is text after all


def test_first_of_several_stop_strings_wins():
    s = StopStrings(["world", "lo w"])
    assert s.feed("hello world") == "hel"


def test_the_max_new_tokens_stop_and_the_eos_ids_of_a_request():
    opts = GenerationOptions(max_new_tokens=3)
    assert [length_reached(n, opts) for n in (0, 2, 3, 4)] == [False, False, True, True]
    assert eos_ids(opts, (7, 9)) == {7, 9}  # the model's
    assert eos_ids(opts.with_(eos_token_ids=(5,)), (7, 9)) == {5}  # the request's instead
    assert eos_ids(opts.with_(eos_token_ids=(5,), ignore_eos=True), (7, 9)) == frozenset()


def test_the_context_room_a_prompt_leaves():
    assert context_room(10, 16, 6) == 6  # exactly fits
    assert context_room(10, 16) == 6  # no max: all the room left
    with pytest.raises(ContextExceeded, match=r"prompt \(10 tokens\) \+ max_new_tokens \(7\) exceed the context "
                                              "of 16 tokens .*; lower max_new_tokens to 6") as e:
        context_room(10, 16, 7)
    assert (e.value.prompt, e.value.context, e.value.wanted, e.value.room) == (10, 16, 7, 6)
    with pytest.raises(ContextExceeded, match="shorten the prompt") as e:
        context_room(16, 16)
    assert e.value.room == 0 and isinstance(e.value, InputError)


# --- tokenizer, template, streaming ---------------------------------------------------------------


def test_detokenizer_never_splits_a_multibyte_character(tok_dir):
    codec = TextCodec(tok_dir)
    ids = codec.encode(MULTIBYTE)
    assert len(ids) > len(MULTIBYTE.encode()) // 3  # rarely-seen text: mostly single bytes, so splits happen
    d = codec.stream()
    pieces = [d.push(i) for i in ids]
    pieces.append(d.flush())
    assert "".join(pieces) == MULTIBYTE
    assert all("\ufffd" not in p for p in pieces)
    assert "" in pieces  # at least one token was held back mid-character


def _byte_ids(codec: TextCodec, data: bytes) -> list[int]:
    """The single-byte tokens of a byte-level vocabulary spelling ``data``."""
    from edgeinfer.run.generation.text import _UNICODE_TO_BYTE

    char = {b: c for c, b in _UNICODE_TO_BYTE.items()}
    return [codec.tokenizer.token_to_id(char[b]) for b in data]


def test_detokenizer_releases_bytes_no_character_can_follow_at_once(tok_dir):
    """Bytes that are not UTF-8 (continuation bytes with no lead, as a random model makes) come out as U+FFFD
    with the token that made them, not held until a valid character follows; a character cut after its lead
    byte is still held, and the whole text is what decoding all the ids gives."""
    codec = TextCodec(tok_dir)
    garbage = _byte_ids(codec, b"\x80\x9f\xbf")
    d = codec.stream()
    assert [d.push(i) for i in garbage] == ["\ufffd"] * 3
    cut = _byte_ids(codec, "中".encode()) + codec.encode("ok")
    pieces = [d.push(i) for i in cut] + [d.flush()]
    assert pieces[:2] == ["", ""] and "".join(pieces) == "中ok"
    assert "\ufffd" * 3 + "".join(pieces) == codec.decode(garbage + cut)


def test_detokenizer_module_keeps_utf8_rules():
    from edgeinfer.run.generation.detokenize import ends_inside_a_character as inside

    assert inside(b"A\xe4") and inside(b"\xe4\xb8") and inside(b"\xf0\x9f\x98") and inside(b"\xc3")
    assert not inside(b"\xe4\xb8\xad") and not inside(b"\x80\x80") and not inside(b"\xff") and not inside(b"")


def test_chat_template_renders_chatml_and_encodes_special_tokens(tok_dir):
    codec = TextCodec(tok_dir)
    text = codec.render_chat([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = codec.encode_chat([{"role": "user", "content": "hi"}])
    assert ids[0] == 1 and 2 in ids  # <|im_start|> and <|im_end|> as their own ids
    assert codec.eos_token_ids == (0, 2)


@pytest.mark.parametrize(
    "messages", [[], "hi", [{"role": "user"}], [{"role": 1, "content": "x"}], [{"content": "x"}], [["user", "x"]]]
)
def test_bad_messages_are_input_errors(tok_dir, messages):
    with pytest.raises(InputError, match="message"):
        TextCodec(tok_dir).render_chat(messages)


def test_a_model_without_chat_template_says_so(tok_dir, tmp_path):
    (tmp_path / "tokenizer.json").write_text((tok_dir / "tokenizer.json").read_text())
    with pytest.raises(InputError, match="no chat template"):
        TextCodec(tmp_path).render_chat([{"role": "user", "content": "hi"}])


def test_a_template_cannot_reach_python_internals(tok_dir, tmp_path):
    (tmp_path / "tokenizer.json").write_text((tok_dir / "tokenizer.json").read_text())
    evil = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": evil}))
    with pytest.raises(InputError, match="chat template"):
        TextCodec(tmp_path).render_chat([{"role": "user", "content": "hi"}])


# Template bombs: each would run for hours or allocate gigabytes unbounded; each must stop within the bounds.
BOMBS = {
    "nested-range": TEMPLATE_BOMB,
    "nested-range-no-output": "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
    "loop-over-string": "{% for a in 'x' * 60000 %}{% for b in 'y' * 60000 %}{% endfor %}{% endfor %}",
    "repeat": "{{ 'x' * 1000000000 }}",
    "repeat-list": "{{ ([0] * 1000000000)|length }}",
    "power-tower": "{{ 10 ** (10 ** 12) }}",
    "squaring": "{% set n = namespace(v=3) %}{% for i in range(60) %}{% set n.v = n.v * n.v %}{% endfor %}{{ n.v }}",
    "doubling-tilde": "{% set n = namespace(v='xx') %}{% for i in range(60) %}{% set n.v = n.v ~ n.v %}{% endfor %}",
    "doubling-plus": "{% set n = namespace(v='xx') %}{% for i in range(60) %}{% set n.v = n.v + n.v %}{% endfor %}",
    "doubling-replace": "{% set n = namespace(v='xx') %}{% for i in range(60) %}"
                        "{% set n.v = n.v|replace('x', 'xx') %}{% endfor %}",
    "center": "{{ 'x'|center(1000000000) }}",
    "percent-width": "{{ '%0999999999d' % 1 }}",
    "format-width": "{{ '{:>999999999}'.format(1) }}",
    "format-filter": "{{ '%0999999999d'|format(1) }}",
    "slice": "{{ range(10)|slice(1000000000)|list|length }}",
}


@pytest.mark.parametrize("template", BOMBS.values(), ids=BOMBS.keys())
def test_a_template_bomb_stops_at_the_bounds_with_one_line(tok_dir, tmp_path, template):
    import time

    (tmp_path / "tokenizer.json").write_text((tok_dir / "tokenizer.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    start = time.monotonic()
    with pytest.raises(InputError, match="chat template of") as e:
        TextCodec(tmp_path).render_chat([{"role": "user", "content": "hi"}])
    assert str(tmp_path) in str(e.value) and "\n" not in e.value.one_line()
    assert time.monotonic() - start < 30  # 10 s is the time bound; the step bound ends loops well before


def test_the_bounds_leave_ordinary_templates_alone(tok_dir):
    """Many messages, a large message and the arithmetic real templates do all render."""
    codec = TextCodec(tok_dir)
    many = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(2000)]
    text = codec.render_chat(many)
    assert text.count("<|im_start|>") == 2001 and "turn 1999" in text
    assert len(codec.render_chat([{"role": "user", "content": "y" * 5_000_000}])) > 5_000_000
    from edgeinfer.run.generation.text import render_bounded

    assert render_bounded("{{ 2 ** 64 }} {{ 'ab' * 3 }} {{ '%5d|%-3s' % (42, 'x') }} {{ '{:>4}'.format(7) }}"
                          "{{ 'a-b'|replace('-', '+') }}") == "18446744073709551616 ababab    42|x      7a+b"


def test_the_step_tracer_gives_back_the_previous_trace_function(tok_dir):
    import sys

    def tracer(frame, event, arg):
        return None

    sys.settrace(tracer)
    try:
        TextCodec(tok_dir).render_chat([{"role": "user", "content": "hi"}])
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(None)


@pytest.mark.parametrize("content, error", [("{not json", ModelError), ("not a tokenizer", ModelError)])
def test_garbage_tokenizer_files_are_model_errors(tmp_path, content, error):
    (tmp_path / "tokenizer.json").write_text(content)
    with pytest.raises(error):
        TextCodec(tmp_path)


def test_a_directory_without_tokenizer_is_a_model_error(tmp_path):
    with pytest.raises(ModelError, match="tokenizer.json"):
        TextCodec(tmp_path)
