"""The main-process side of a served decoder: KV admission, the bounded waiting queue, one worker
process running the scheduler (restarted when it dies), and a stream of events per request.

Admission: the worker's decoder holds ``slots`` sequences of ``context`` positions, allocated once
when it loads; a request takes a slot or waits in the queue (``max_queue`` deep, then 429), and it
leaves its slot when it ends, is cancelled (client gone, timeout, shutdown) or its worker dies.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.run.generation.stopping import Answer
from edgeinfer.run.generation.text import spelled_logprob
from edgeinfer.serve.decoder_worker import decoder_worker_main
from edgeinfer.serve.supervisor import STOP_GRACE_S, Supervisor

if TYPE_CHECKING:
    from edgeinfer.contract.generation import GenerationOptions
    from edgeinfer.run.decoder_load import DecoderLoad

log = logging.getLogger("edgeinfer.serve")


class QueueFull(Exception):
    pass


@dataclass
class ServedDecoder:
    """A decoder bundle or Hugging Face decoder directory, as the HTTP side sees it."""

    name: str
    path: Path
    backend: str
    context: int
    codec: Any  # TextCodec: prompts are tokenized (and checked against the context) before admission
    board: str = ""
    scheme: str = ""
    kv_bytes_per_element: float = 4.0  # what the deploy's plan counted (fp32: the reference's and HF dirs')
    load: DecoderLoad | None = None  # a bundle's: the worker loads it without reading the manifest

    def to_json(self, created: int, slots: int) -> dict[str, Any]:
        return {"id": self.name, "object": "model", "created": created, "owned_by": "edgeinfer",
                "backend": self.backend, "board": self.board, "scheme": self.scheme, "context": self.context,
                "slots": slots, "endpoints": ["/v1/chat/completions", "/v1/completions"]}


def open_served_decoder(path: Path, bundle: Any = None, ctx: int | None = None) -> ServedDecoder:
    """A decoder bundle (``bundle``, already opened and verified), an HF decoder dir or a decoder file
    (``path``: ``.rkllm``, run by the backend that declares its suffix)."""
    from edgeinfer.contract import registry
    from edgeinfer.contract.names import DECODER_REFERENCE
    from edgeinfer.model.decoder_bundle import loaded_context, tokenizer_dir
    from edgeinfer.run.bundle import decoder_load
    from edgeinfer.run.generation.text import TextCodec
    from edgeinfer.run.loading import decoder_file_codec, decoder_file_scheme, default_context, file_default_context

    if bundle is not None:
        m = bundle.manifest
        context = loaded_context(bundle, ctx)
        codec = TextCodec(tokenizer_dir(bundle))
        kv = ((m.plan or {}).get("memory") or {}).get("details", {}).get("kv_cache", {}).get("bytes_per_element")
        return ServedDecoder(bundle.path.resolve().name, bundle.path, m.backend, context, codec, m.board, m.scheme,
                             float(kv or 4.0), decoder_load(bundle, context))
    if path.is_file():
        backend, runtime = registry.decoder_file(path) or (DECODER_REFERENCE, "")
        context = ctx or file_default_context(path)
        return ServedDecoder(path.resolve().name, path, backend, context, decoder_file_codec(path), "",
                             decoder_file_scheme(path), file_kv_bytes_per_element(runtime))
    context = ctx or default_context(path)
    return ServedDecoder(path.resolve().name, path, DECODER_REFERENCE, context, TextCodec(path), "", "fp32")


def planned_kv_bytes(llm: ServedDecoder, slots: int) -> int | None:
    """The planner's KV figure for ``slots`` × ``context``, at the bytes per element of the bundle's plan
    (fp16 for an RKNN bundle; fp32 where no plan says otherwise); a decoder file (a ``.gguf``) as the planner
    reads it, at its runtime's KV dtype."""
    from edgeinfer.planning.models import resolve
    from edgeinfer.planning.models.hf import spec_from_config
    from edgeinfer.planning.planner import kv_bytes

    cfg_path = llm.codec.directory / "config.json"
    try:
        spec = (resolve(llm.path) if llm.path.is_file() else
                spec_from_config(json.loads(cfg_path.read_text()), llm.name, str(cfg_path)))
    except Exception:  # noqa: BLE001 - the figure is informative only
        return None
    return kv_bytes(spec, llm.context, slots, llm.kv_bytes_per_element)


def file_kv_bytes_per_element(runtime: str) -> float:
    """What the plan of a decoder file counts per KV element: its runtime's KV dtype (runtimes.yaml; llama.cpp
    f16), fp32 where the runtime names none."""
    from edgeinfer.planning.planner import runtime_profile
    from edgeinfer.planning.quant import kv_bytes_per_element

    kv = runtime_profile(runtime).get("kv_dtype") if runtime else None
    return kv_bytes_per_element(kv) if kv and kv != "scheme" else 4.0


@dataclass
class Request:
    """One admitted generation: its prompt ids and options, and the events the worker sends for it."""

    prompt_ids: list[int]
    options: GenerationOptions
    rid: str = ""
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    arrived: float = field(default_factory=time.perf_counter)
    state: str = "new"  # new | waiting | running | done
    logprobs: list[dict[str, Any]] = field(default_factory=list)  # per generated token, when asked for
    answer: Any = None  # its Answer (text, stop strings), from when it runs: the worker sends token ids


class Engine(Supervisor):
    """One decoder model served by one worker process (``in_process``: a thread) with ``slots`` KV slots."""

    read_in_loop = True  # one small message per step

    def __init__(self, llm: ServedDecoder, slots: int, max_queue: int, prefill_chunk: int | None,
                 entry: str | None = None, max_restarts: int = 5, restart_window_s: float = 60.0,
                 observe: Any = None, threads: int | None = None, in_process: bool = False,
                 spin_wait: bool | None = None):
        super().__init__(f"edgeinfer-serve-llm-{llm.name}", max_restarts, restart_window_s)
        self.threads, self.in_process, self.spin_wait = threads, in_process, spin_wait
        self.llm, self.slots, self.max_queue, self.prefill_chunk = llm, slots, max_queue, prefill_chunk
        self.entry = entry
        self.observe = observe or (lambda *a, **k: None)
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: dict[str, Request] = {}
        self.state = "starting"  # starting | ready | restarting | failed | stopped
        self._ids = itertools.count(1)
        self._counted: tuple[int, int, int] | None = None  # the sequence gauges last observed

    # --- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        await self.spawn()
        kv, plan = self.info.get("kv_cache_bytes"), planned_kv_bytes(self.llm, self.slots)
        threads = self.info.get("threads")
        log.info("%s: %d slots × %d positions reserved at start: KV cache %s (planner: %s)%s", self.llm.name,
                 self.slots, self.llm.context, _mib(kv), _mib(plan),
                 f"; {threads} CPU thread{'s' if threads > 1 else ''} of {os.cpu_count()} CPUs (--threads)"
                 if threads else "")

    def target(self) -> tuple[Any, tuple]:
        from edgeinfer.run.generation.text import TokenFacts

        # the worker gets the tokenizer's facts, not the tokenizer: its text is made here (see on_message); and a
        # bundle's load read from its manifest here, not the manifest
        what = self.llm.load or str(self.llm.path)
        return decoder_worker_main, (what, self.llm.backend, self.entry, self.llm.context, self.slots,
                                     self.prefill_chunk, self.threads, TokenFacts.of(self.llm.codec), self.spin_wait)

    def spawn(self) -> asyncio.Future:
        self.state = "restarting" if self.generation else "starting"
        return super().spawn()

    def launch(self, fn: Any, args: tuple) -> tuple[Any, Any]:
        """Not multiprocessing's spawn: its resource tracker would be one more process (:mod:`.child`); with
        ``in_process``, a thread of this process."""
        from edgeinfer.serve import child

        return child.start(fn, args, self.name, self.in_process)

    def on_message(self, msg: tuple) -> None:
        if msg[0] == "ready":
            self.state = "ready"
            self.slots = int(msg[1].get("slots") or self.slots)  # what the backend's decoder really holds
            log.info("%s: decoder worker ready (pid %s)", self.llm.name, self.pid)
            if self.info.get("caveat") and not self.restarts:  # once, not at every restart
                log.warning("%s: %s", self.llm.name, self.info["caveat"])
            self.settle()
            self._dispatch()
        elif msg[0] == "fatal":
            self.state = "failed"
            self.settle(RuntimeError(f"{self.llm.name}: the decoder could not be loaded: {msg[1]}"))
            self._fail_waiting(f"{self.llm.name}: the decoder could not be loaded: {msg[1]}")
        elif msg[0] == "events":
            for rid, _, ids, finish, error, logprobs in msg[1]:
                req = self.running.get(rid)
                if req is None:
                    continue  # ended here already (a stop string), or cancelled
                text, n, finish = self._text(req, ids, finish)
                if logprobs:
                    req.logprobs.extend(spelled_logprob(self.llm.codec, e) for e in logprobs[:n])
                if finish is not None:
                    self._finish(req)
                req.events.put_nowait((text, n, finish, error))
            self._dispatch()

    def _text(self, req: Request, ids: list[int], finish: str | None) -> tuple[str, int, str | None]:
        """The text the worker's new token ids release, how many of them count, and how the answer ended:
        EOS and ``max_new_tokens`` as the worker saw them, a stop string here (the worker, which has no text,
        is told to stop the sequence: the tokens it made meanwhile are dropped)."""
        answer, text, n = req.answer, "", 0
        for tok in ids:
            if answer.done:
                break
            text += answer.push(tok)
            n += 1
        if answer.done:
            if finish is None:
                self.send(("cancel", req.rid))
            return text + answer.end(False), n, answer.finish
        if finish in ("stop", "length"):  # a native runtime's own end (its EOS, not always given as a token)
            answer.finish = finish
            return text + answer.end(False), n, finish
        if finish == "cancelled":
            answer.end(True)
        return text, n, finish

    def on_exit(self, code: int | None, outcome: str) -> None:
        if outcome == "stopped":
            return
        for req in list(self.running.values()):
            self._finish(req)
            req.events.put_nowait(("", 0, "error", f"the decoder worker (pid {self.pid}) died (exit code {code}); "
                                                   "retry the request"))
        if outcome == "failed":
            self.state = "failed"
            self.settle(RuntimeError(f"{self.llm.name}: the decoder worker exited (code {code}) before it was "
                                     "ready"))
        elif outcome == "gave up":
            log.error("%s: decoder worker crashed %d times in %.0f s; giving it up", self.llm.name,
                      len(self.crashes), self.restart_window_s)
            self.state = "failed"
            self._fail_waiting("the decoder worker failed too often; see the server log")
        else:
            log.warning("%s: decoder worker (pid %s) exited with code %s; restarting it", self.llm.name, self.pid,
                        code)
            self.observe("restart", model=self.llm.name)

    def _fail_waiting(self, message: str) -> None:
        while self.waiting:
            req = self.waiting.popleft()
            req.state = "done"
            req.events.put_nowait(("", 0, "error", message))
        self._gauges()

    def stop(self, timeout: float = STOP_GRACE_S) -> None:
        """Stop the worker: at once while it is loading (it reads no messages until it is loaded), else
        after its current step, killing it when it has not exited within ``timeout`` s."""
        self.state = "stopped"
        super().stop(timeout)

    # --- requests ----------------------------------------------------------------------------------
    def submit(self, req: Request) -> None:
        """Admit ``req`` now (a free slot) or queue it; QueueFull when the queue is at its bound."""
        if self.state == "failed":
            raise RuntimeError("the decoder worker failed; see the server log")
        if len(self.running) >= self.slots and len(self.waiting) >= self.max_queue:
            raise QueueFull()
        req.rid = f"{next(self._ids)}"
        req.state = "waiting"
        self.waiting.append(req)
        self._dispatch()

    def cancel(self, req: Request) -> None:
        """The client is gone or timed out: drop ``req`` from the queue, or stop its sequence (the worker
        frees the slot at its next step and reports the end)."""
        if req.state == "waiting":
            self.waiting.remove(req)
            req.state = "done"
            self._gauges()
        elif req.state == "running":
            self.send(("cancel", req.rid))

    def cancel_all(self) -> None:
        """The shutdown's end of every request: running sequences are cancelled in the worker (it reports
        them "cancelled"), queued ones are told so here, so that no reader waits for a worker that stops."""
        for req in list(self.waiting) + list(self.running.values()):
            queued = req.state == "waiting"
            self.cancel(req)
            if queued:
                req.events.put_nowait(("", 0, "cancelled", None))

    def _dispatch(self) -> None:
        while self.state == "ready" and self.waiting and len(self.running) < self.slots:
            req = self.waiting.popleft()
            req.state = "running"
            req.answer = Answer(self.llm.codec, req.options)
            self.running[req.rid] = req
            if not self.send(("add", req.rid, req.prompt_ids, req.options)):
                break  # the reader sees the worker gone and fails the running requests
        self._gauges()

    def _finish(self, req: Request) -> None:
        req.state = "done"
        self.running.pop(req.rid, None)
        self._gauges()

    def _gauges(self) -> None:
        counts = (len(self.running), len(self.waiting), self.slots)
        if counts == self._counted:  # called at every worker message (once per token at one stream)
            return
        self._counted = counts
        self.observe("sequences", model=self.llm.name, running=counts[0], waiting=counts[1], slots=counts[2])

    def ready(self) -> bool:
        return self.state == "ready"

    def to_json(self) -> dict[str, Any]:
        return {"model": self.llm.name, "pid": self.pid, "state": self.state, "slots": self.slots,
                "running": len(self.running), "waiting": len(self.waiting), "restarts": self.restarts,
                "kv_cache_bytes": self.info.get("kv_cache_bytes"), "kv_dtype": self.info.get("kv_dtype") or None,
                **({"notes": [self.info["caveat"]]} if self.info.get("caveat") else {})}


def _mib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / 2**20:.1f} MiB"
