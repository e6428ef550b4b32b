"""The worker process that holds one decoder and runs its scheduler: :class:`~.decoder_scheduler.Scheduler`
over step decoders, :class:`~.decoder_native.NativeScheduler` over a backend's own loop.

Messages, main → worker: ``("add", rid, prompt_ids, options)`` (the GenerationOptions the HTTP side
validated), ``("cancel", rid)``, ``("stop",)``;
worker → main: ``("ready", info)``, ``("fatal", message)``, ``("events", [event tuples])`` once per
scheduler step that produced any (:class:`~.decoder_scheduler.Event`: token ids, no text: the worker loads
no tokenizer, the HTTP side detokenizes and watches the stop strings, ``Engine._text``). Between two steps
the worker takes every message waiting on the pipe, so a new sequence joins and a cancelled one leaves at the
next step boundary; while nothing runs it blocks on the pipe.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from edgeinfer.errors import one_line
from edgeinfer.serve.placement import placement


def load_generator(what: Any, backend: str, entry: str | None, context: int, slots: int,
                   threads: int | None = None, facts: Any = None, spin_wait: bool | None = None) -> Any:
    """The Generator of a decoder bundle (``what``: its :class:`~edgeinfer.run.decoder_load.DecoderLoad`, or its
    path), decoder file or Hugging Face decoder directory (its path), with ``slots`` KV slots (and ``threads``
    CPU threads, and ``spin_wait``, where the backend takes those options); with ``facts``, the tokenizer's
    :class:`~edgeinfer.run.generation.text.TokenFacts` instead of the tokenizer (it gives token ids only)."""
    from edgeinfer.run.decoder_load import DecoderLoad, open_load
    from edgeinfer.run.loading import load, spin_wait_option, threads_option

    placed = placement(backend, entry)
    os.environ.update(placed.env)
    options = {**placed.options, **threads_option(backend, threads), **spin_wait_option(backend, spin_wait)}
    if isinstance(what, DecoderLoad):
        return open_load(what, facts, placed.device, slots, **options)
    if facts:
        options["codec"] = facts
    return load(what, device=placed.device, ctx=context, slots=slots, **options)


def decoder_worker_main(conn: Any, path: str, backend: str, entry: str | None, context: int, slots: int,
                        prefill_chunk: int | None, threads: int | None = None, facts: Any = None,
                        spin_wait: bool | None = None) -> None:
    """Loads the decoder (with ``facts``: no tokenizer; the HTTP process holds it and turns the token ids of the
    events into text) and runs its scheduler until told to stop."""
    if threading.current_thread() is threading.main_thread():  # a worker process, not serve --in-process
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process decides when workers stop
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # not lowered like the embedding workers (workers.lower_priority): every stream waits on this process's
    # steps, and a step is short, so the HTTP process gets the CPU between two of them anyway
    from edgeinfer.contract.decoder import NativeDecoder
    from edgeinfer.serve.decoder_native import NativeScheduler
    from edgeinfer.serve.decoder_scheduler import Scheduler

    try:
        gen = load_generator(path, backend, entry, context, slots, threads, facts, spin_wait)
        d = gen.decoder
        native = isinstance(d, NativeDecoder)
        sched = NativeScheduler(gen) if native else Scheduler(gen, prefill_chunk)
        conn.send(("ready", {"pid": os.getpid(), "device": d.device, "slots": sched.slots, "context": d.context,
                             "kv_cache_bytes": d.kv_cache_bytes, "kv_dtype": d.kv_dtype, "prefill_chunk": sched.chunk,
                             "native_loop": native, "caveat": d.caveat, "threads": d.threads}))
    except Exception as e:  # noqa: BLE001
        try:
            conn.send(("fatal", one_line(e)))
        finally:
            return
    try:
        _loop(conn, sched)
    finally:
        gen.close()


def _loop(conn: Any, sched: Any) -> None:
    while True:
        try:
            wait = 0 if sched.busy else None  # block on the pipe only while nothing runs
            while conn.poll(wait):
                msg = conn.recv()
                if msg[0] == "stop":
                    return
                if msg[0] == "add":
                    _, rid, ids, options = msg  # GenerationOptions, validated by the HTTP side
                    sched.add(rid, ids, options)
                elif msg[0] == "cancel":
                    sched.cancel(msg[1])
                wait = 0
        except (EOFError, OSError, KeyboardInterrupt):
            return
        events = sched.step()
        if events:
            try:
                conn.send(("events", [e.to_tuple() for e in events]))
            except (OSError, ValueError):
                return
