"""The generation loop: prompt → tokens → prefill → decode steps → sampling → stop →
text, streamed. Owned once by the core; a backend only gives a :class:`Decoder`."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeinfer.contract.boundary import plugin_call, plugin_error
from edgeinfer.contract.decoder import Decoder, NativeDecoder
from edgeinfer.contract.generation import GenerationOptions
from edgeinfer.contract.measure import cpu_sample, peak_rss_bytes
from edgeinfer.errors import InputError, ModelError
from edgeinfer.run.generation.metrics import GenerationMetrics, summarize
from edgeinfer.run.generation.sampling import Sampler, checked_logits
from edgeinfer.run.generation.stopping import Answer, context_room
from edgeinfer.run.generation.text import Message, TextCodec

Prompt = str | Sequence[Message]


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]  # the generated ids only (an EOS that ended the answer included)
    finish_reason: str  # "stop" (EOS or stop string), "length" (max_new_tokens), "cancelled"
    metrics: GenerationMetrics
    prompt_ids: list[int] = field(default_factory=list)
    logits: list[Any] | None = None  # per new token, when asked for (golden checks)

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "prompt_tokens": len(self.prompt_ids),
            "metrics": self.metrics.to_json(),
        }


class GenerationStream:
    """Text pieces as they are produced; ``result`` once exhausted; ``cancel()`` from any thread."""

    def __init__(self, run: Callable[[GenerationStream], Iterator[str]]):
        self.result: GenerationResult | None = None
        self._cancel = threading.Event()
        self._it = run(self)

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        return next(self._it)

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def close(self) -> None:
        self.cancel()
        self._it.close()


class Generator:
    """Generates text with ``decoder`` and ``codec``; one sequence at a time on slot 0. ``name`` is the
    model's name in errors (default: the tokenizer directory's)."""

    def __init__(self, decoder: Decoder, codec: TextCodec, name: str | None = None):
        self.decoder = decoder
        self.codec = codec
        self.name = name or Path(codec.directory).name
        self._lock = threading.Lock()  # one sequence at a time through this generator

    @property
    def context(self) -> int:
        return self.decoder.context

    @property
    def kv_cache_bytes(self) -> int:
        return self.decoder.kv_cache_bytes

    def close(self) -> None:
        self.decoder.close()

    def __enter__(self) -> Generator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- public API ---------------------------------------------------------------------------
    def prompt_ids(self, prompt: Prompt, chat: bool | None = None) -> list[int]:
        """Token ids of a plain prompt, or of messages through the chat template."""
        as_chat = chat if chat is not None else not isinstance(prompt, str)
        if as_chat:
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
            ids = self.codec.encode_chat(messages)
        else:
            if not isinstance(prompt, str):
                raise InputError("a plain prompt must be text; pass chat=True for messages")
            ids = self.codec.encode(prompt)
        if not ids:
            raise InputError("the prompt is empty; give some text to continue")
        return ids

    def generate(self, prompt: Prompt, options: GenerationOptions | None = None, chat: bool | None = None,
                 record_logits: bool = False, forced: Sequence[int] | None = None, **kw: Any) -> GenerationResult:
        return self.generate_ids(self.prompt_ids(prompt, chat), _options(options, kw), record_logits, forced)

    def stream(self, prompt: Prompt, options: GenerationOptions | None = None, chat: bool | None = None,
               record_logits: bool = False, **kw: Any) -> GenerationStream:
        opts = _options(options, kw)
        ids = self.prompt_ids(prompt, chat)
        return self.stream_ids(ids, opts, record_logits=record_logits)

    def generate_ids(self, prompt_ids: Sequence[int], options: GenerationOptions,
                     record_logits: bool = False, forced: Sequence[int] | None = None) -> GenerationResult:
        """``forced``: tokens fed back in place of the sampled ones (teacher forcing, for golden checks: each
        step then sees the reference's context); the result's ids are these, the logits the model's own."""
        if isinstance(self.decoder, NativeDecoder) and not record_logits:
            ids = [int(i) for i in prompt_ids]
            self._check_ids(ids, options)
            return self._run_native_inline(ids, options)
        stream = self.stream_ids(prompt_ids, options, record_logits=record_logits, forced=forced)
        for _ in stream:
            pass
        assert stream.result is not None
        return stream.result

    def stream_ids(self, prompt_ids: Sequence[int], options: GenerationOptions,
                   record_logits: bool = False, forced: Sequence[int] | None = None) -> GenerationStream:
        ids = [int(i) for i in prompt_ids]
        self._check_ids(ids, options)
        if isinstance(self.decoder, NativeDecoder):
            if record_logits or forced is not None:
                raise InputError(f"backend {self.decoder.backend_name!r} runs its own loop and gives no logits")
            return GenerationStream(lambda s: self._run_native(s, ids, options))
        return GenerationStream(lambda s: self._run_steps(s, ids, options, record_logits, forced))

    # --- checks ------------------------------------------------------------------------------
    def _check_ids(self, ids: list[int], options: GenerationOptions) -> None:
        if not ids:
            raise InputError("the prompt is empty; give some text to continue")
        vocab = self.decoder.vocab_size
        bad = next((i for i in ids if i < 0 or i >= vocab), None)
        if bad is not None:
            raise InputError(f"token id {bad} is outside the model's vocabulary (0..{vocab - 1})")
        context_room(len(ids), self.decoder.context, options.max_new_tokens)

    def in_vocab(self, tok: int) -> bool:
        return 0 <= tok < self.decoder.vocab_size

    def check_native_token(self, tok: int) -> None:
        """A native loop gives token ids, not logits: NaN logits cannot be seen there (the runtime samples
        them into some token), but an id outside the vocabulary is a broken runtime or model."""
        if not self.in_vocab(tok):
            raise ModelError(f"model {self.name}: the {self.decoder.backend_name or 'backend'} runtime generated "
                             f"token id {tok}, outside the vocabulary (0..{self.decoder.vocab_size - 1}); its "
                             "artifact is broken: deploy or convert it again")

    # --- the step loop -----------------------------------------------------------------------
    def _run_steps(self, s: GenerationStream, ids: list[int], options: GenerationOptions,
                   record_logits: bool, forced: Sequence[int] | None = None) -> Iterator[str]:
        import numpy as np

        d = self.decoder
        with self._lock:
            cpu, start = cpu_sample(), time.perf_counter()  # the sample first: not in the timings
            sampler, answer = Sampler(options), Answer(self.codec, options)
            times: list[float] = []
            logits_seen: list[Any] | None = [] if record_logits else None
            _call(d.reset, 0)
            logits = None
            chunk = d.prefill_chunk or len(ids)
            for i in range(0, len(ids), chunk):
                logits = _call(d.prefill, 0, np.asarray(ids[i : i + chunk], dtype=np.int64))
            prefill_end = time.perf_counter()
            history = list(ids)
            while not (cancelled := s.cancelled):
                if forced is not None and len(history) - len(ids) >= len(forced):
                    break  # the reference ended here (its own length limit)
                row = checked_logits(logits, d.vocab_size, self.name, len(history) - len(ids), not record_logits)
                if logits_seen is not None:
                    logits_seen.append(row)
                tok = sampler(row, history) if forced is None else int(forced[len(history) - len(ids)])
                times.append(time.perf_counter())
                history.append(tok)
                piece = answer.push(tok)
                if piece:
                    yield piece
                if answer.done:
                    break
                logits = _call(d.decode, [0], np.asarray([tok], dtype=np.int64))[0]
            tail = answer.end(cancelled)
            if tail:
                yield tail
            metrics = summarize(len(ids), times, start, prefill_end, peak_rss_bytes(), d.kv_cache_bytes, cpu)
            s.result = _result(answer, metrics, ids, logits_seen)

    # --- a backend's native loop -----------------------------------------------------------
    def _run_native(self, s: GenerationStream, ids: list[int], options: GenerationOptions) -> Iterator[str]:
        d = self.decoder
        with self._lock:
            events: queue.Queue[tuple[str, Any]] = queue.Queue()
            halt = threading.Event()  # EOS or a stop string was seen: ask the runtime to stop
            cpu, start = cpu_sample(), time.perf_counter()
            times: list[float] = []

            def on_token(tok: int) -> bool:
                times.append(time.perf_counter())
                events.put(("token", int(tok)))
                return not (s.cancelled or halt.is_set())

            def work() -> None:
                try:
                    events.put(("done", d.generate_native(ids, options, on_token)))
                except BaseException as e:  # re-raised in the consumer
                    events.put(("error", e))

            worker = threading.Thread(target=work, name="edgeinfer-native-generate", daemon=True)
            worker.start()
            answer = Answer(self.codec, options)
            native, completed = {}, False
            try:
                while True:
                    kind, value = events.get()
                    if kind == "error":
                        _reraise(d, value)
                    if kind == "done":
                        native, completed = value or {}, True
                        break
                    if s.cancelled or halt.is_set():
                        continue  # drain what the runtime still sends after we asked it to stop
                    self.check_native_token(value)
                    piece = answer.push(value)
                    if piece:
                        yield piece
                    if answer.stopped:
                        halt.set()
            finally:
                if not completed:  # the consumer went away: stop the runtime
                    s.cancel()
                worker.join()
            tail = answer.end(s.cancelled)
            if tail:
                yield tail
            s.result = self._native_result(answer, ids, native, times, start, cpu)

    def _run_native_inline(self, ids: list[int], options: GenerationOptions) -> GenerationResult:
        """A native loop nobody reads piece by piece: the bookkeeping runs in the runtime's callback, with
        no hand-off to a consumer thread per token. Without stop strings, nothing needs the text until
        the end, so the callback only watches for EOS and the same detokenizer runs afterwards: on a
        small model each millisecond token carried ~20 µs of per-token text work otherwise."""
        d = self.decoder
        with self._lock:
            cpu, start = cpu_sample(), time.perf_counter()
            times: list[float] = []
            answer = Answer(self.codec, options)
            later: list[int] = []
            bad: list[int] = []  # an id outside the vocabulary, raised after the runtime returns

            def on_token(tok: int) -> bool:
                if answer.stopped or bad:
                    return False
                if not self.in_vocab(tok):
                    bad.append(int(tok))
                    return False
                times.append(time.perf_counter())
                if options.stop:
                    answer.push(int(tok))
                    return not answer.stopped
                later.append(int(tok))
                return later[-1] not in answer.eos

            try:
                native = d.generate_native(ids, options, on_token) or {}
            except Exception as e:
                _reraise(d, e)
            if bad:
                self.check_native_token(bad[0])
            for tok in later:
                answer.push(tok)
            answer.end(False)
            return self._native_result(answer, ids, native, times, start, cpu)

    def _native_result(self, answer: Answer, ids: list[int], native: dict[str, Any], times: list[float],
                       start: float, cpu: tuple[float, float, float] | None) -> GenerationResult:
        """The result of a native loop: edgeinfer's timings, with the runtime's own where it reports them."""
        metrics = summarize(len(ids), times[: len(answer.ids)], start, None, peak_rss_bytes(),
                            self.decoder.kv_cache_bytes, cpu)
        for key in ("ttft_ms", "tpot_ms_p50", "tpot_ms_p99", "decode_tokens_per_s", "prefill_tokens_per_s"):
            if isinstance(native.get(key), (int, float)):
                setattr(metrics, key, float(native[key]))
        return _result(answer, metrics, ids)


def _result(answer: Answer, metrics: GenerationMetrics, prompt_ids: list[int],
            logits: list[Any] | None = None) -> GenerationResult:
    return GenerationResult("".join(answer.text), answer.ids, answer.finish, metrics, list(prompt_ids), logits)


def _options(options: GenerationOptions | None, kw: dict[str, Any]) -> GenerationOptions:
    base = options or GenerationOptions()
    if not kw:
        return base
    unknown = sorted(set(kw) - set(GenerationOptions.__dataclass_fields__))
    if unknown:
        raise InputError(f"unknown generation option {unknown[0]!r}; known: "
                         + ", ".join(sorted(GenerationOptions.__dataclass_fields__)))
    return base.with_(**kw)


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    owner = getattr(fn, "__self__", None)
    return plugin_call(getattr(owner, "backend_name", ""), f"decoder {fn.__name__}", fn, *args)


def _reraise(d: Decoder, e: BaseException) -> None:
    raised = plugin_error(d.backend_name, "generate", e)
    if raised is e:
        raise e
    raise raised from e

