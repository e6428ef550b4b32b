"""Worker processes: one per device, each holding every served bundle loaded on its device.

The main process talks to a worker over a ``multiprocessing`` pipe (spawn start
method: no inherited runtime state). Messages, main → worker:
``("run", batch_id, model, kind, feeds, rows)`` and ``("stop",)``; worker → main:
``("ready", info)``, ``("fatal", message)`` and ``("result", batch_id, parts)``
where ``parts`` holds one ``("ok", outputs)`` or ``("err", message)`` per request
of the batch. A reader thread per worker turns these into asyncio futures; when the
pipe breaks (the worker died) the in-flight batch fails with :class:`WorkerCrashed`
and the worker is started again.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from edgeinfer.run import bundle as run_bundle
from edgeinfer.serve.placement import placement

log = logging.getLogger("edgeinfer.serve")

class WorkerCrashed(Exception):
    """The worker running a batch died before answering it."""


class Cancelled(Exception):
    """Every request of the running batch timed out: stop working on it."""


class NoWorkers(Exception):
    """Every worker has failed too often and was given up."""


# --- the worker process ------------------------------------------------------------------------------


SEQ_STEP = 16


def _length_groups(session: Any, feeds: dict[str, np.ndarray], min_group: int = 4) -> list[tuple[np.ndarray, int]]:
    """For text feeds on a model with a dynamic sequence axis: group rows by length (multiples of 16
    tokens, small groups merged upward) so each group is padded only to its own longest row. Returns
    ``(row indices, length)`` pairs; one group of every row at full length when the axis is static.
    Mean pooling ignores masked positions, so the embeddings do not change."""
    mask = feeds.get("attention_mask")
    n = len(next(iter(feeds.values())))
    full = mask.shape[1] if mask is not None and mask.ndim == 2 else None
    everything = [(np.arange(n), full or 0)]
    if full is None or any(len(s.shape) < 2 or isinstance(s.shape[1],
                                                          int) for s in session.inputs if s.name in feeds):
        return everything
    lengths = mask.sum(axis=1)
    buckets = np.minimum(full, np.maximum(SEQ_STEP, -(-lengths // SEQ_STEP) * SEQ_STEP))
    groups: list[tuple[np.ndarray, int]] = []
    carry = np.zeros(0, dtype=np.int64)
    for b in sorted(set(buckets.tolist())):
        rows = np.concatenate([carry, np.nonzero(buckets == b)[0]])
        if len(rows) < min_group and b != buckets.max():
            carry = rows  # too few to batch well: pad them up with the next group
            continue
        groups.append((rows, int(b)))
        carry = np.zeros(0, dtype=np.int64)
    return groups


def _run_embed(bundle: Any, session: Any, feeds: dict[str, np.ndarray], max_batch: int,
               stop: Callable[[], bool]) -> np.ndarray:
    n = len(next(iter(feeds.values())))
    out: np.ndarray | None = None
    for rows, length in _length_groups(session, feeds):
        if stop():
            raise Cancelled()
        f = {k: (np.ascontiguousarray(v[rows, :length]) if length and v.ndim == 2 else v[rows]) for k,
             v in feeds.items()}
        vec = run_bundle.embed(bundle, _run_rows(session, f, max_batch, stop), f).astype(np.float32)
        if out is None:
            out = np.empty((n, *vec.shape[1:]), dtype=np.float32)
        out[rows] = vec
    assert out is not None
    return out


def _run_rows(session: Any, feeds: dict[str, np.ndarray], max_batch: int,
              stop: Callable[[], bool] = lambda: False) -> dict[str, np.ndarray]:
    """Run in chunks of ``max_batch`` rows (a multiple of a static batch, the last chunk padded), checking
    ``stop`` between chunks so a batch nobody waits for any more ends early."""
    from edgeinfer.run.padding import run_padded, static_batch

    fixed = static_batch(session.inputs)
    step = max_batch if fixed is None else max(fixed, max_batch // fixed * fixed)
    n = len(next(iter(feeds.values())))
    if n <= step:
        return run_padded(session, feeds)
    parts = []
    for i in range(0, n, step):
        if stop():
            raise Cancelled()
        parts.append(run_padded(session, {k: v[i : i + step] for k, v in feeds.items()}))
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def run_batch(bundle: Any, session: Any, kind: str, feeds: dict[str, np.ndarray], rows: list[int], max_batch: int,
              stop: Callable[[], bool] = lambda: False):
    """Run a merged batch and split it back: one ``("ok", outputs)`` / ``("err", message)`` per request.
    When the merged run fails, each request is run alone so only the guilty one gets the error."""

    def once(f: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if kind == "embed":
            return {"embedding": _run_embed(bundle, session, f, max_batch, stop)}
        return _run_rows(session, f, max_batch, stop)

    offsets = np.cumsum([0, *rows])
    cancelled = [("err", "cancelled: every request of the batch timed out")] * len(rows)
    try:
        out = once(feeds)
        return [("ok", {k: v[a:b] for k, v in out.items()}) for a, b in zip(offsets[:-1], offsets[1:])]
    except Cancelled:
        return cancelled
    except Exception as e:  # noqa: BLE001 - reported to the callers, the worker keeps serving
        if len(rows) == 1:
            return [("err", one_line(e))]
    parts = []
    for a, b in zip(offsets[:-1], offsets[1:]):
        try:
            parts.append(("ok", once({k: v[a:b] for k, v in feeds.items()})))
        except Cancelled:
            return cancelled
        except Exception as e:  # noqa: BLE001
            parts.append(("err", one_line(e)))
    return parts


def one_line(e: BaseException) -> str:
    from edgeinfer.errors import EdgeInferError

    if isinstance(e, EdgeInferError):
        return e.one_line()
    text = " ".join(str(e).split()) or type(e).__name__
    return f"{type(e).__name__}: {text}"[:500]


def _warm_feeds(bundle: Any, session: Any) -> dict[str, np.ndarray]:
    if bundle.manifest.text is not None:
        return run_bundle.tokenize_texts(bundle, ["edgeinfer warms the model up."])
    feeds = {}
    for s in session.inputs:
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in s.shape]
        feeds[s.name] = np.zeros(shape, dtype=s.dtype)
    return feeds


BACKGROUND_NICE = 10


def lower_priority() -> None:
    """Run this process below the HTTP process's CPU priority: with few cores, bulk work (model runs,
    tokenizing a large request) must not delay the event loop answering everyone else."""
    try:
        os.nice(BACKGROUND_NICE)
    except OSError:  # not permitted here: run at the normal priority
        pass


def worker_main(conn: Any, index: int, entry: str | None, bundles: list[tuple[str, str]], max_batch: int,
                cancel: Any = None) -> None:
    """Entry point of a worker process. ``cancel`` (a shared integer) holds the id of a batch to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process decides when workers stop
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    lower_priority()
    from edgeinfer.model.bundle import Bundle

    loaded: dict[str, tuple[Any, Any]] = {}
    try:
        for name, path in bundles:
            bundle = Bundle.open(path)
            placed = placement(bundle.manifest.backend, entry)
            os.environ.update(placed.env)
            session = run_bundle.open_session(bundle, device=placed.device, **placed.options)
            session.run(_warm_feeds(bundle, session))
            loaded[name] = (bundle, session)
        conn.send(("ready", {"pid": os.getpid(), "devices": {n: s.device for n, (_, s) in loaded.items()}}))
    except Exception as e:  # noqa: BLE001
        try:
            conn.send(("fatal", one_line(e)))
        finally:
            return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            break
        if msg[0] == "stop":
            break
        if msg[0] == "run":
            _, batch_id, name, kind, feeds, rows = msg
            bundle, session = loaded[name]
            stop = (lambda b=batch_id: cancel.value == b) if cancel is not None else (lambda: False)
            parts = run_batch(bundle, session, kind, feeds, rows, max_batch, stop)
            try:
                conn.send(("result", batch_id, parts))
            except (OSError, ValueError):
                break
    for _, session in loaded.values():
        try:
            session.close()
        except Exception:  # noqa: BLE001
            pass


STOP_GRACE_S = 10.0  # how long a worker told to stop may take before it is killed (docs/serve.md, Shutdown)


def stop_process(process: Any, grace: float) -> None:
    """Wait up to ``grace`` s for ``process`` to exit, then SIGKILL it: workers ignore SIGTERM (the main
    process decides when they stop), so ``terminate()`` would not end one."""
    if process is None:
        return
    process.join(max(0.0, grace))
    if process.is_alive():
        process.kill()
        process.join(5)


# --- the main-process side ---------------------------------------------------------------------------


@dataclass
class Worker:
    index: int
    entry: str | None
    process: Any = None
    conn: Any = None
    generation: int = 0
    state: str = "starting"  # starting | idle | busy | dead | failed
    pid: int | None = None
    info: dict[str, Any] = field(default_factory=dict)
    inflight: tuple[int, asyncio.Future] | None = None
    crashes: collections.deque = field(default_factory=collections.deque)
    restarts: int = 0
    batches: int = 0
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    cancel: Any = None  # shared integer: the id of a batch the worker should stop
    killed: bool = False  # stopped by the pool (a timed-out batch it would not give up), not a crash

    @property
    def label(self) -> str:
        return f"{self.index}" + (f":{self.entry}" if self.entry is not None else "")

    def to_json(self) -> dict[str, Any]:
        return {"worker": self.index, "device": self.entry, "pid": self.pid, "state": self.state,
                "restarts": self.restarts, "batches": self.batches, "devices": self.info.get("devices", {})}


class WorkerPool:
    """Starts, feeds, watches and restarts the worker processes."""

    def __init__(self, bundles: list[tuple[str, Path]], devices: list[str], max_batch: int,
                 max_restarts: int = 5, restart_window_s: float = 60.0, on_restart: Any = None,
                 stop_grace_s: float = 30.0):
        self.bundles = [(n, str(p)) for n, p in bundles]
        self.max_batch = max_batch
        self.max_restarts = max_restarts
        self.restart_window_s = restart_window_s
        self.on_restart = on_restart
        self.stop_grace_s = stop_grace_s
        self.workers = [Worker(i, e) for i, e in enumerate(devices or [None])] if bundles else []
        self._ctx = mp.get_context("spawn")
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._free: asyncio.Condition | None = None
        self._ready_waiters: dict[int, asyncio.Future] = {}
        self._rr = 0
        self.stopping = False

    # lifecycle
    async def start(self) -> None:
        """Start every worker and wait until each has loaded and warmed up its models."""
        self._loop = asyncio.get_running_loop()
        self._free = asyncio.Condition()
        waits = [self._spawn(w) for w in self.workers]
        results = await asyncio.gather(*waits, return_exceptions=True)
        for w, r in zip(self.workers, results):
            if isinstance(r, BaseException):
                raise r

    def _spawn(self, w: Worker) -> asyncio.Future:
        assert self._loop is not None
        parent, child = self._ctx.Pipe()
        if w.cancel is None:
            w.cancel = self._ctx.Value("q", 0, lock=False)
        proc = self._ctx.Process(
            target=worker_main, args=(child, w.index, w.entry, self.bundles, self.max_batch, w.cancel),
            name=f"edgeinfer-serve-worker-{w.index}", daemon=True,
        )
        w.generation += 1
        w.state, w.pid, w.info, w.inflight = "starting", None, {}, None
        proc.start()
        child.close()
        w.process, w.conn = proc, parent
        ready = self._loop.create_future()
        self._ready_waiters[w.index] = ready
        threading.Thread(target=self._reader, args=(w, w.generation, parent), daemon=True,
                         name=f"edgeinfer-serve-reader-{w.index}").start()
        return ready

    def _reader(self, w: Worker, generation: int, conn: Any) -> None:
        loop = self._loop
        assert loop is not None
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break
            except Exception as e:  # noqa: BLE001 - an unpicklable answer: treat as a crash
                log.error("worker %s sent an unreadable message: %s", w.label, e)
                break
            loop.call_soon_threadsafe(self._on_message, w, generation, msg)
        loop.call_soon_threadsafe(self._on_exit, w, generation)

    def _on_message(self, w: Worker, generation: int, msg: tuple) -> None:
        if generation != w.generation:
            return
        kind = msg[0]
        if kind == "ready":
            w.state, w.info, w.pid = "idle", msg[1], msg[1].get("pid")
            log.info("worker %s ready (pid %s, %s)", w.label, w.pid, w.info.get("devices"))
            self._resolve_ready(w, None)
            self._notify()
        elif kind == "fatal":
            w.state = "failed"
            self._resolve_ready(w, RuntimeError(f"worker {w.label} could not load the models: {msg[1]}"))
        elif kind == "result" and w.inflight and w.inflight[0] == msg[1]:
            fut = w.inflight[1]
            w.inflight = None
            if not fut.done():
                fut.set_result(msg[2])

    def _resolve_ready(self, w: Worker, error: Exception | None) -> None:
        fut = self._ready_waiters.pop(w.index, None)
        if fut is not None and not fut.done():
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(error)

    def _on_exit(self, w: Worker, generation: int) -> None:
        if generation != w.generation:
            return
        code = w.process.exitcode if w.process is not None else None
        was = w.state
        if w.inflight is not None:
            fut = w.inflight[1]
            w.inflight = None
            if not fut.done():
                fut.set_exception(WorkerCrashed(f"worker {w.label} (pid {w.pid}) died while running the batch"))
        if self.stopping:
            w.state = "dead"
            self._notify()
            return
        if was == "failed" or (was == "starting" and w.index in self._ready_waiters):
            w.state = "failed"
            self._resolve_ready(w, RuntimeError(f"worker {w.label} exited (code {code}) before loading the models"))
            self._notify()
            return
        if w.killed:  # not a crash: does not count towards giving the worker up
            w.killed = False
        else:
            now = time.monotonic()
            w.crashes.append(now)
            while w.crashes and now - w.crashes[0] > self.restart_window_s:
                w.crashes.popleft()
            if len(w.crashes) > self.max_restarts:
                log.error("worker %s crashed %d times in %.0f s; giving it up", w.label, len(w.crashes),
                          self.restart_window_s)
                w.state = "failed"
                self._notify()
                return
            log.warning("worker %s (pid %s) exited with code %s; restarting it", w.label, w.pid, code)
        w.restarts += 1
        if self.on_restart:
            self.on_restart(w)
        ready = self._spawn(w)
        ready.add_done_callback(lambda f: f.exception() and log.error("%s", f.exception()))

    def _notify(self) -> None:
        async def _n() -> None:
            assert self._free is not None
            async with self._free:
                self._free.notify_all()

        if self._loop is not None:
            self._loop.create_task(_n())

    # dispatch
    def alive(self) -> bool:
        return any(w.state not in ("failed", "dead") for w in self.workers)

    def ready(self) -> bool:
        return any(w.state in ("idle", "busy") for w in self.workers)

    async def acquire(self) -> Worker:
        """The next idle worker (round robin among idle ones); waits while all are busy or restarting."""
        assert self._free is not None
        async with self._free:
            while True:
                if not self.alive():
                    raise NoWorkers("every worker failed; see the server log")
                n = len(self.workers)
                for k in range(n):
                    w = self.workers[(self._rr + k) % n]
                    if w.state == "idle":
                        self._rr = (w.index + 1) % n
                        w.state = "busy"
                        return w
                await self._free.wait()

    def cancel(self, w: Worker) -> None:
        """Ask ``w`` to stop its running batch between two chunks (its callers are gone); when one chunk
        alone outlasts ``stop_grace_s`` (a hung device, a huge chunk), restart the worker instead."""
        if w.inflight is None or w.cancel is None or self._loop is None:
            return
        w.cancel.value = w.inflight[0]
        self._loop.call_later(self.stop_grace_s, self._kill_stuck, w, w.generation, w.inflight[0])

    def _kill_stuck(self, w: Worker, generation: int, batch_id: int) -> None:
        if w.generation == generation and w.inflight is not None and w.inflight[0] == batch_id and w.process:
            log.warning("worker %s (pid %s) still runs a batch nobody waits for, %g s after it was cancelled; "
                        "restarting it", w.label, w.pid, self.stop_grace_s)
            w.killed = True
            w.process.kill()

    def release(self, w: Worker) -> None:
        if w.state == "busy":
            w.state = "idle"
            self._notify()

    async def run(self, w: Worker, model: str, kind: str, feeds: dict[str, np.ndarray], rows: list[int]) -> list:
        assert self._loop is not None
        if w.state != "busy" or w.conn is None:
            raise WorkerCrashed(f"worker {w.label} is not running")
        batch_id = next(self._ids)
        w.batches += 1
        fut = self._loop.create_future()
        w.inflight = (batch_id, fut)
        conn = w.conn

        def send() -> None:
            with w.send_lock:
                conn.send(("run", batch_id, model, kind, feeds, rows))

        try:
            await asyncio.to_thread(send)
        except (OSError, ValueError) as e:
            if not fut.done():
                w.inflight = None
                raise WorkerCrashed(f"worker {w.label} could not take the batch: {e}") from None
        return await fut

    def stop(self, timeout: float = STOP_GRACE_S) -> None:
        """Ask every worker to stop; one still loading (it reads no messages until it is loaded) or still
        running after ``timeout`` s is killed (workers ignore SIGTERM)."""
        self.stopping = True
        for w in self.workers:
            if w.state == "starting":
                stop_process(w.process, 0)
            elif w.conn is not None:
                try:
                    with w.send_lock:
                        w.conn.send(("stop",))
                except (OSError, ValueError):
                    pass
        deadline = time.monotonic() + timeout
        for w in self.workers:
            stop_process(w.process, deadline - time.monotonic())
            w.state = "dead"
