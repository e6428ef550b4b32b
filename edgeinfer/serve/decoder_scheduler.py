"""Continuous batching over one step decoder: iteration-level scheduling (Orca, Yu et al., OSDI 2022,
https://www.usenix.org/conference/osdi22/presentation/yu).

Each :meth:`Scheduler.step` is one iteration: one batched ``decode`` call for every sequence that is
generating, then one ``prefill_batch`` call (:class:`~edgeinfer.contract.decoder.StepDecoder`) with
prompt tokens up to a budget of one prefill chunk, oldest sequence first (several whole prompts
together, or one chunk of a long one, as in vLLM's chunked prefill). New
sequences join the decode batch at the next step boundary after their prefill; finished and cancelled
ones leave it and free their KV slot at once. Sampling, EOS, stop strings and detokenizing are the
generation package's (:class:`~edgeinfer.run.generation.sampling.Sampler`,
:class:`~edgeinfer.run.generation.stopping.Answer`), so a sequence here gives the tokens
``Generator`` gives alone.

Runs in the worker process that holds the decoder; nothing here knows about HTTP or pipes.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeinfer.contract.generation import GenerationOptions
from edgeinfer.errors import EdgeInferError
from edgeinfer.run.generation.generator import Generator
from edgeinfer.run.generation.sampling import Sampler, checked_logits, token_logprobs
from edgeinfer.run.generation.stopping import Answer
from edgeinfer.run.generation.text import TokenFacts, spelled_logprob

DEFAULT_PREFILL_CHUNK = 128


@dataclass
class Event:
    """What one step did for one sequence: the text it released, how many tokens it generated (``ids``), and
    ``finish`` ("stop", "length", "cancelled", "error") when the sequence ended; ``logprobs``, one entry
    per generated token, when the request asked for them. A generator loaded with
    :class:`~edgeinfer.run.generation.text.TokenFacts` (serve's workers) releases no text and ends at EOS and
    ``max_new_tokens`` only; its logprob entries name token ids (``id``) instead of spelling them."""

    rid: str
    text: str = ""
    ids: list[int] = field(default_factory=list)
    finish: str | None = None
    error: str | None = None
    logprobs: list[dict[str, Any]] | None = None

    @property
    def tokens(self) -> int:
        return len(self.ids)

    def to_tuple(self) -> tuple:
        return (self.rid, self.text, self.ids, self.finish, self.error, self.logprobs)


@dataclass
class Sequence:
    rid: str
    prompt: list[int]
    options: GenerationOptions
    slot: int
    sampler: Sampler
    answer: Answer
    history: list[int] = field(default_factory=list)
    fed: int = 0  # prompt tokens prefilled so far
    next_token: int = -1  # sampled, not yet fed to the decoder
    cancelled: bool = False


class Scheduler:
    """Sequences over the decoder's static KV slots (``decoder.slots`` of them)."""

    def __init__(self, generator: Generator, prefill_chunk: int | None = None):
        self.generator = generator
        self.decoder = generator.decoder
        own = self.decoder.prefill_chunk
        chunk = prefill_chunk or DEFAULT_PREFILL_CHUNK
        self.chunk = min(own, chunk) if own else chunk
        self.slots = self.decoder.slots
        self.free = list(range(self.slots))
        self.waiting: collections.deque[tuple[str, list[int], GenerationOptions]] = collections.deque()
        self.prefilling: collections.deque[Sequence] = collections.deque()
        self.decoding: list[Sequence] = []
        self._by_id: dict[str, Sequence] = {}
        self._ended: list[Event] = []

    # --- requests ----------------------------------------------------------------------------
    def add(self, rid: str, prompt_ids: list[int], options: GenerationOptions) -> None:
        """Queue a sequence; it takes a slot at the next step boundary (it waits while none is free)."""
        self.waiting.append((rid, list(prompt_ids), options))

    def cancel(self, rid: str) -> None:
        seq = self._by_id.get(rid)
        if seq is not None:
            seq.cancelled = True
            return
        for item in list(self.waiting):
            if item[0] == rid:
                self.waiting.remove(item)
                self._ended.append(Event(rid, finish="cancelled"))

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.prefilling or self.decoding or self._ended)

    @property
    def running(self) -> int:
        return len(self._by_id)

    # --- one iteration -------------------------------------------------------------------------
    def step(self) -> list[Event]:
        events, self._ended = self._ended, []
        self._admit()
        events += self._drop_cancelled()
        if self.decoding:
            events += self._decode()
        if self.prefilling:
            events += self._prefill()
        return events

    def _admit(self) -> None:
        while self.waiting and self.free:
            rid, ids, options = self.waiting.popleft()
            slot = self.free.pop(0)
            answer = Answer(self.generator.codec, options)
            seq = Sequence(rid, ids, options, slot, Sampler(options), answer, list(ids))
            self._by_id[rid] = seq
            self.decoder.reset(slot)
            self.prefilling.append(seq)

    def _drop_cancelled(self) -> list[Event]:
        gone = [s for s in (*self.prefilling, *self.decoding) if s.cancelled]
        for s in gone:
            self._end(s)
        return [Event(s.rid, finish="cancelled") for s in gone]

    def _decode(self) -> list[Event]:
        seqs = list(self.decoding)
        slots = [s.slot for s in seqs]
        ids = np.asarray([s.next_token for s in seqs], dtype=np.int64)
        try:
            logits = np.asarray(self.decoder.decode(slots, ids), dtype=np.float32)
        except Exception as e:  # noqa: BLE001 - every sequence of the batch fails; the worker keeps serving
            return self._fail(seqs, e)
        return [self._sample(s, logits[i]) for i, s in enumerate(seqs)]

    def _prefill(self) -> list[Event]:
        """At most ``chunk`` prompt tokens this step, oldest sequence first, in one ``prefill_batch`` call:
        several whole prompts, or one chunk of a long one. A prompt that does not fit beside others waits
        for the next step rather than being cut: its rest would carry a past, which a backend may not batch
        with new prompts (onnxruntime runs it alone: one more pass over the weights)."""
        batch: list[tuple[Sequence, list[int]]] = []
        budget = self.chunk
        for seq in self.prefilling:
            part = seq.prompt[seq.fed : seq.fed + budget]
            if batch and len(part) < len(seq.prompt) - seq.fed:
                break
            batch.append((seq, part))
            budget -= len(part)
            if budget <= 0:
                break
        seqs = [seq for seq, _ in batch]
        try:
            logits = self.decoder.prefill_batch([s.slot for s in seqs],
                                                [np.asarray(part, dtype=np.int64) for _, part in batch])
        except Exception as e:  # noqa: BLE001 - every sequence of the batch fails; the worker keeps serving
            return self._fail(seqs, e)
        events: list[Event] = []
        for (seq, part), row in zip(batch, logits):
            seq.fed += len(part)
            if seq.fed < len(seq.prompt):
                continue
            self.prefilling.remove(seq)
            self.decoding.append(seq)
            events.append(self._sample(seq, row))
        return events

    def _sample(self, seq: Sequence, logits: np.ndarray) -> Event:
        try:
            row = checked_logits(logits, self.decoder.vocab_size, self.generator.name, len(seq.answer.ids))
        except EdgeInferError as e:  # NaN logits: this sequence fails (500), never an empty "stop"
            self._end(seq)
            return Event(seq.rid, finish="error", error=e.one_line())
        tok = seq.sampler(row, seq.history)
        seq.history.append(tok)
        piece = seq.answer.push(tok)
        logprobs = None if seq.options.logprobs is None else [self._logprob(row, tok, seq.options.logprobs)]
        if seq.answer.done:
            tail = seq.answer.end(False)
            self._end(seq)
            return Event(seq.rid, piece + tail, [tok], seq.answer.finish, logprobs=logprobs)
        seq.next_token = tok
        return Event(seq.rid, piece, [tok], logprobs=logprobs)

    def _logprob(self, row: np.ndarray, tok: int, top: int) -> dict[str, Any]:
        """The entry for one sampled token: OpenAI's (``choices[].logprobs.content[]`` of a chat completion)
        where the generator holds the tokenizer, else token ids for the HTTP side to spell."""
        codec = self.generator.codec
        logprob, best = token_logprobs(row, tok, top)
        entry = {"id": tok, "logprob": logprob, "top_logprobs": [{"id": i, "logprob": lp} for i, lp in best]}
        return entry if isinstance(codec, TokenFacts) else spelled_logprob(codec, entry)

    def _fail(self, seqs: list[Sequence], e: Exception) -> list[Event]:
        message = " ".join(str(e).split())[:300] or type(e).__name__
        for s in seqs:
            self._end(s)
        return [Event(s.rid, finish="error", error=f"{type(e).__name__}: {message}") for s in seqs]

    def _end(self, seq: Sequence) -> None:
        self._by_id.pop(seq.rid, None)
        if seq in self.decoding:
            self.decoding.remove(seq)
        if seq in self.prefilling:
            self.prefilling.remove(seq)
        try:
            self.decoder.reset(seq.slot)
        finally:
            self.free.append(seq.slot)
            self.free.sort()

    def stats(self) -> dict[str, Any]:
        return {"running": self.running, "waiting": len(self.waiting), "slots_used": len(self._by_id)}
