"""``edgeinfer serve``'s scheduler over a native-loop decoder that runs one sequence at a time
(:class:`~edgeinfer.serve.decoder_native.OneAtATime`), on a scripted stand-in runtime: the text is the
committed tiny-qwen3 tokenizer's, the expected strings are written out by hand."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from edgeinfer.contract.decoder import NativeDecoder
from edgeinfer.contract.generation import GenerationOptions
from edgeinfer.run.generation.generator import Generator
from edgeinfer.run.generation.text import TextCodec
from edgeinfer.serve.decoder_native import NativeScheduler
from edgeinfer.testing.llm import model_dir


class ScriptedNativeStandIn(NativeDecoder):
    """A runtime with its own loop: sends ``script`` until told to stop; a prompt of [0] makes it fail."""

    def __init__(self, script: Sequence[int], vocab: int):
        super().__init__(context=512, vocab_size=vocab, kv_cache_bytes=0, slots=4)
        self.script, self.sent = list(script), 0

    def generate_native(self, prompt_ids: Sequence[int], options: GenerationOptions,
                        on_token: Callable[[int], bool]) -> dict[str, Any]:
        if list(prompt_ids) == [0]:
            raise RuntimeError("device lost")
        for tok in self.script[: options.max_new_tokens]:
            self.sent += 1
            if not on_token(tok):
                break
        return {}


@pytest.fixture(scope="module")
def codec() -> TextCodec:
    return TextCodec(model_dir())


def _run(sched: NativeScheduler) -> tuple[dict[str, str], dict[str, tuple[str, str | None]], dict[str, int]]:
    texts: dict[str, str] = {}
    ends: dict[str, tuple[str, str | None]] = {}
    tokens: dict[str, int] = {}
    while sched.busy:
        for e in sched.step():
            texts[e.rid] = texts.get(e.rid, "") + e.text
            tokens[e.rid] = tokens.get(e.rid, 0) + e.tokens
            if e.finish:
                ends[e.rid] = (e.finish, e.error)
    return texts, ends, tokens


def test_one_at_a_time_a_stop_string_stops_the_runtime_and_a_failure_spares_the_next(codec):
    script = codec.encode("The cat sat on the mat. STOP and more")
    runtime = ScriptedNativeStandIn(script, codec.tokenizer.get_vocab_size())
    sched = NativeScheduler(Generator(runtime, codec))
    assert sched.slots == 1  # not a BatchingDecoder: one sequence at a time, whatever the decoder holds
    opts = GenerationOptions(max_new_tokens=len(script))
    sched.add("a", codec.encode("Hi"), opts.with_(stop=("STOP",)))
    sched.add("b", [0], opts)
    sched.add("c", codec.encode("Hi"), opts.with_(max_new_tokens=3))
    texts, ends, tokens = _run(sched)
    assert texts["a"] == "The cat sat on the mat. " and ends["a"] == ("stop", None)
    assert tokens["a"] < len(script)  # what the runtime sent past the stop string is not counted
    assert ends["b"] == ("error", "RuntimeError: device lost")
    assert texts["c"] == codec.tokenizer.decode(script[:3]) and ends["c"] == ("length", None) and tokens["c"] == 3
    assert sched.running == 0


def test_one_at_a_time_cancel_of_a_waiting_request_never_runs_it(codec):
    script = codec.encode("The cat sat on the mat.")
    runtime = ScriptedNativeStandIn(script, codec.tokenizer.get_vocab_size())
    sched = NativeScheduler(Generator(runtime, codec))
    opts = GenerationOptions(max_new_tokens=4)
    sched.add("a", codec.encode("Hi"), opts)
    sched.add("b", codec.encode("Hi"), opts)
    sched.cancel("b")
    texts, ends, _ = _run(sched)
    assert ends == {"a": ("length", None), "b": ("cancelled", None)}
    assert runtime.sent == 4 and texts.get("b", "") == ""


def test_a_native_loop_gives_no_logprobs_the_scheduler_ends_such_a_request_and_the_api_says_400(codec):
    """The runtime's own loop never shows its logits: the HTTP side refuses ``logprobs`` for a decoder its
    worker reported as a native loop (400 naming the backend), and the scheduler ends one that got through."""
    from edgeinfer.serve.decoder_engine import Engine, ServedDecoder
    from edgeinfer.serve.decoder_native import NO_LOGPROBS
    from edgeinfer.serve.decoder_routes import ChatRequest, CompletionRequest, check_logprobs
    from edgeinfer.serve.generation_prep import prompt_and_options
    from edgeinfer.serve.prep import ApiError

    runtime = ScriptedNativeStandIn(codec.encode("The cat"), codec.tokenizer.get_vocab_size())
    sched = NativeScheduler(Generator(runtime, codec))
    sched.add("a", codec.encode("Hi"), GenerationOptions(max_new_tokens=2, logprobs=0))
    _, ends, _ = _run(sched)
    assert ends == {"a": ("error", NO_LOGPROBS)} and runtime.sent == 0

    llm = ServedDecoder("tiny-ov", model_dir(), "openvino", 256, codec)
    eng = Engine(llm, slots=1, max_queue=1, prefill_chunk=None)
    eng.info = {"native_loop": True}
    msgs = [{"role": "user", "content": "hi"}]
    for chat, body in ((True, ChatRequest.model_validate({"messages": msgs, "logprobs": True})),
                       (False, CompletionRequest.model_validate({"prompt": "hi", "logprobs": 0}))):
        ids, options = prompt_and_options(llm, body, chat)
        assert ids and options.logprobs == 0
        with pytest.raises(ApiError, match="openvino backend of tiny-ov .* does not expose logprobs") as e:
            check_logprobs(eng, options.logprobs)
        assert e.value.status == 400
        plain = body.model_copy(update={"logprobs": None if not chat else False})
        check_logprobs(eng, prompt_and_options(llm, plain, chat)[1].logprobs)  # no logprobs asked: served
    eng.info = {"native_loop": False}
    check_logprobs(eng, 0)


def test_a_token_id_outside_the_vocabulary_from_a_native_loop_fails_the_request(codec):
    """A native loop gives ids, not logits (NaN cannot be seen there): an id the vocabulary does not hold
    ends the request with an error in serve, and is a ModelError for generate and stream, never garbage."""
    from edgeinfer.errors import ModelError

    vocab = codec.tokenizer.get_vocab_size()
    good = codec.encode("The cat sat on the mat")
    runtime = ScriptedNativeStandIn([*good[:2], vocab + 7, *good[2:]], vocab)
    gen = Generator(runtime, codec, "scripted")
    sched = NativeScheduler(gen)
    sched.add("a", [5, 6], GenerationOptions(max_new_tokens=16))
    texts, ends, tokens = _run(sched)
    assert ends["a"][0] == "error" and f"token id {vocab + 7}, outside the vocabulary" in ends["a"][1]
    assert "model scripted" in ends["a"][1] and tokens["a"] == 2
    for run in (lambda o: gen.generate_ids([5, 6], o), lambda o: list(gen.stream_ids([5, 6], o))):
        for opts in (GenerationOptions(max_new_tokens=16), GenerationOptions(max_new_tokens=16, stop=("zzz",))):
            with pytest.raises(ModelError, match=f"token id {vocab + 7}, outside the vocabulary"):
                run(opts)
