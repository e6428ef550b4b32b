"""The generator's two loops — the core's step loop and a backend's native loop — turn the same new
tokens into the same answer: text, ids, finish reason, stop strings held back and cut, EOS, cancel.

Both decoders here replay a fixed token script (the step one as one-hot logits, which greedy
sampling follows); the text is the committed tiny-qwen3 tokenizer's, and the expected strings are
written out by hand."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from edgeinfer.contract.decoder import NativeDecoder, StepDecoder
from edgeinfer.contract.generation import GenerationOptions
from edgeinfer.run.generation.generator import Generator
from edgeinfer.run.generation.text import TextCodec
from edgeinfer.testing.llm import model_dir

TEXT = "The cat sat on the mat. STOP and more"


@pytest.fixture(scope="module")
def codec() -> TextCodec:
    return TextCodec(model_dir())


class ScriptedSteps(StepDecoder):
    """Logits that make greedy sampling pick ``script[n]`` at the n-th new token."""

    def __init__(self, script: Sequence[int], vocab: int):
        super().__init__(context=512, vocab_size=vocab, kv_cache_bytes=0)
        self.script, self.n = list(script), 0

    def _next(self) -> np.ndarray:
        row = np.zeros(self.vocab_size, np.float32)
        row[self.script[self.n]] = 1.0
        self.n += 1
        return row

    def reset(self, slot: int) -> None:
        self.n = 0

    def prefill(self, slot: int, token_ids: np.ndarray) -> np.ndarray:
        return self._next()

    def decode(self, slots: Sequence[int], token_ids: np.ndarray) -> np.ndarray:
        return self._next()[None]


class ScriptedNative(NativeDecoder):
    """A runtime that runs its own loop: sends ``script`` until told to stop or max_new_tokens."""

    def __init__(self, script: Sequence[int], vocab: int):
        super().__init__(context=512, vocab_size=vocab, kv_cache_bytes=0)
        self.script = list(script)

    def generate_native(self, prompt_ids: Sequence[int], options: GenerationOptions,
                        on_token: Callable[[int], bool]) -> dict[str, Any]:
        for tok in self.script[: options.max_new_tokens]:
            if not on_token(tok):
                break
        return {}


LOOPS = {"steps": ScriptedSteps, "native": ScriptedNative}


def _generate(codec: TextCodec, loop: str, script: list[int], **options: Any):
    gen = Generator(LOOPS[loop](script, codec.tokenizer.get_vocab_size()), codec)
    stream = gen.stream_ids(codec.encode("Hi"), GenerationOptions(**options))
    pieces = list(stream)
    return stream.result, pieces


@pytest.mark.parametrize("loop", LOOPS)
def test_a_stop_string_cuts_the_text_and_is_never_streamed(codec, loop):
    script = codec.encode(TEXT)
    result, pieces = _generate(codec, loop, script, max_new_tokens=len(script), stop=("STOP",))
    assert result.finish_reason == "stop"
    assert result.text == "The cat sat on the mat. " and "".join(pieces) == result.text
    assert "ST" not in "".join(pieces)
    assert len(result.token_ids) < len(script)


@pytest.mark.parametrize("loop", LOOPS)
def test_eos_ends_the_answer_and_the_held_back_text_is_released(codec, loop):
    eos = codec.eos_token_ids[0]
    script = [*codec.encode("The cat sat"), eos, *codec.encode(" never seen")]
    result, pieces = _generate(codec, loop, script, max_new_tokens=len(script), stop=("sat on",))
    assert result.finish_reason == "stop"
    assert result.text == "The cat sat" == "".join(pieces)  # "sat" was held back (it may start "sat on")
    assert result.token_ids[-1] == eos and result.token_ids == script[: script.index(eos) + 1]


@pytest.mark.parametrize("loop", LOOPS)
def test_max_new_tokens_is_a_length_finish(codec, loop):
    script = codec.encode(TEXT)
    result, pieces = _generate(codec, loop, script, max_new_tokens=3)
    assert result.finish_reason == "length"
    assert result.token_ids == script[:3]
    assert result.text == codec.tokenizer.decode(script[:3]) == "".join(pieces)


@pytest.mark.parametrize("loop", LOOPS)
def test_cancel_after_the_first_piece_ends_as_cancelled_without_a_tail(codec, loop):
    script = codec.encode(TEXT)
    gen = Generator(LOOPS[loop](script, codec.tokenizer.get_vocab_size()), codec)
    stream = gen.stream_ids(codec.encode("Hi"), GenerationOptions(max_new_tokens=len(script)))
    first = next(stream)
    stream.cancel()
    rest = list(stream)
    assert stream.result.finish_reason == "cancelled"
    assert stream.result.text == first + "".join(rest)
    assert len(stream.result.token_ids) < len(script)
    assert TEXT.startswith(stream.result.text) and stream.result.text != TEXT
