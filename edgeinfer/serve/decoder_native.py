"""Serving a decoder whose backend runs its own generation loop (a ``NativeDecoder``).

A runtime that batches continuously itself (a ``BatchingDecoder``, e.g. OpenVINO GenAI's
ContinuousBatchingPipeline) is driven request by request: a new sequence is added, and a cancelled
one dropped, between two of its steps, as :class:`~.decoder_scheduler.Scheduler` does over step
decoders. Any other native loop (a static NPU pipeline, one sequence at a time) runs its
``generate_native`` in a thread, one request after another (:class:`OneAtATime`).

Either way the text is the generation package's: EOS, stop strings and detokenizing go through the
same :class:`~edgeinfer.run.generation.stopping.Answer` as ``Generator``, so a served sequence
gives the text ``edgeinfer generate`` gives. Runs in the worker process; nothing here knows HTTP.
"""

from __future__ import annotations

import collections
import queue
import threading
from typing import Any

from edgeinfer.contract.decoder import BatchingDecoder, NativeDecoder, NativeStep
from edgeinfer.contract.generation import GenerationOptions
from edgeinfer.errors import EdgeInferError
from edgeinfer.run.generation.generator import Generator
from edgeinfer.run.generation.stopping import Answer
from edgeinfer.serve.decoder_scheduler import Event

#: how long one step of :class:`OneAtATime` waits for the runtime's next token before it lets the
#: worker read its pipe again (new requests, cancels)
TOKEN_WAIT_S = 0.05
NO_LOGPROBS = "logprobs: this model's backend runs its own generation loop and does not expose logprobs"


class OneAtATime:
    """A native loop that runs one sequence at a time, behind the ``BatchingDecoder`` API: each request's
    ``generate_native`` runs in a thread, the others wait their turn; a cancel stops it at its next token."""

    slots = 1

    def __init__(self, decoder: NativeDecoder):
        self.decoder = decoder
        self.pending: collections.deque[tuple[str, list[int], GenerationOptions]] = collections.deque()
        self.current: str | None = None
        self.cancelled: set[str] = set()
        self.tokens: queue.Queue[tuple[str, int | None, str | None]] = queue.Queue()  # id None: it ended

    def add_request(self, rid: str, prompt_ids: list[int], options: GenerationOptions) -> None:
        self.pending.append((rid, prompt_ids, options))
        self._start_next()

    def cancel_request(self, rid: str) -> None:
        for item in list(self.pending):
            if item[0] == rid:
                self.pending.remove(item)
        if rid == self.current:
            self.cancelled.add(rid)

    def step_requests(self) -> list[NativeStep]:
        """The tokens that arrived since the last call (waiting up to TOKEN_WAIT_S for the first one)."""
        if self.current is None:
            return []
        moved: dict[str, NativeStep] = {}
        try:
            item = self.tokens.get(timeout=TOKEN_WAIT_S)
            while True:
                self._take(item, moved)
                item = self.tokens.get_nowait()
        except queue.Empty:
            pass
        return list(moved.values())

    def _take(self, item: tuple[str, int | None, str | None], moved: dict[str, NativeStep]) -> None:
        rid, tok, error = item
        step = moved.setdefault(rid, NativeStep(rid, []))
        if tok is not None:
            step.token_ids.append(tok)
            return
        moved[rid] = step._replace(finished=True, error=error)
        self.cancelled.discard(rid)
        self.current = None
        self._start_next()

    def _start_next(self) -> None:
        if self.current is None and self.pending:
            rid, ids, options = self.pending.popleft()
            self.current = rid
            threading.Thread(target=self._run, args=(rid, ids, options), daemon=True,
                             name="edgeinfer-serve-native").start()

    def _run(self, rid: str, ids: list[int], options: GenerationOptions) -> None:
        def on_token(tok: int) -> bool:
            self.tokens.put((rid, int(tok), None))
            return rid not in self.cancelled

        error = None
        try:
            self.decoder.generate_native(ids, options, on_token)
        except Exception as e:  # noqa: BLE001 - this sequence fails; the worker keeps serving
            error = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
        self.tokens.put((rid, None, error))


class NativeScheduler:
    """The scheduler of a native-loop decoder, with :class:`~.decoder_scheduler.Scheduler`'s interface."""

    def __init__(self, generator: Generator):
        self.generator = generator
        d = generator.decoder
        self.runtime: BatchingDecoder | OneAtATime = d if isinstance(d, BatchingDecoder) else OneAtATime(d)
        self.slots = d.slots if isinstance(d, BatchingDecoder) else OneAtATime.slots
        self.chunk = d.prefill_chunk  # the runtime chunks its prefill itself
        self._answers: dict[str, Answer] = {}
        self._ended: list[Event] = []

    def add(self, rid: str, prompt_ids: list[int], options: GenerationOptions) -> None:
        if options.logprobs is not None:  # the HTTP side refuses these first (400); this holds for any caller
            self._ended.append(Event(rid, finish="error", error=NO_LOGPROBS))
            return
        try:
            self.runtime.add_request(rid, list(prompt_ids), options)
        except Exception as e:  # noqa: BLE001 - e.g. a prompt past the NPU's static prompt length
            self._ended.append(Event(rid, finish="error", error=f"{type(e).__name__}: {' '.join(str(e).split())}"))
            return
        self._answers[rid] = Answer(self.generator.codec, options)

    def cancel(self, rid: str) -> None:
        if self._answers.pop(rid, None) is not None:
            self.runtime.cancel_request(rid)
            self._ended.append(Event(rid, finish="cancelled"))

    @property
    def busy(self) -> bool:
        return bool(self._answers or self._ended)

    @property
    def running(self) -> int:
        return len(self._answers)

    def step(self) -> list[Event]:
        events, self._ended = self._ended, []
        if not self._answers:
            return events
        try:
            moved = self.runtime.step_requests()
        except Exception as e:  # noqa: BLE001 - every running sequence fails; the worker keeps serving
            message = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
            for rid in list(self._answers):
                self.runtime.cancel_request(rid)
            events += [Event(rid, finish="error", error=message) for rid in self._answers]
            self._answers.clear()
            return events
        for step in moved:
            event = self._event(step)
            if event is not None:
                events.append(event)
        return events

    def _event(self, step: NativeStep) -> Event | None:
        answer = self._answers.get(step.rid)
        if answer is None:
            return None  # cancelled meanwhile
        text, ids = "", []
        for tok in step.token_ids:
            try:
                self.generator.check_native_token(tok)
            except EdgeInferError as e:
                del self._answers[step.rid]
                if not step.finished:
                    self.runtime.cancel_request(step.rid)
                return Event(step.rid, text, ids, "error", e.one_line())
            text += answer.push(tok)
            ids.append(tok)
            if answer.done:
                break
        if step.error:
            del self._answers[step.rid]
            return Event(step.rid, text, ids, "error", step.error)
        ended = answer.done
        if ended and not step.finished:
            self.runtime.cancel_request(step.rid)  # a stop string: the runtime would go on
        if not (ended or step.finished):
            return Event(step.rid, text, ids) if ids else None
        if not ended:
            answer.finish = "stop"  # the runtime ended it early: its EOS, not always reported as a token
        text += answer.end(False)
        del self._answers[step.rid]
        return Event(step.rid, text, ids, answer.finish)

    def stats(self) -> dict[str, Any]:
        return {"running": self.running, "waiting": 0, "slots_used": self.running}
