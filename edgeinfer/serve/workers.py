"""Worker processes: one per device, each holding every served bundle loaded on its device.

The main process talks to a worker over a ``multiprocessing`` pipe (spawn start
method: no inherited runtime state). Messages, main → worker:
``("run", batch_id, model, kind, feeds, rows)`` and ``("stop",)``; worker → main:
``("ready", info)``, ``("fatal", message)`` and ``("result", batch_id, parts)``
where ``parts`` holds one ``("ok", outputs)`` or ``("err", message)`` per request
of the batch. Each worker is a :class:`~edgeinfer.serve.supervisor.Supervisor`
(reader thread, readiness, restart, stop); when its pipe breaks (the worker died) the
in-flight batch fails with :class:`WorkerCrashed` and the worker is started again.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from edgeinfer.errors import one_line
from edgeinfer.run import bundle as run_bundle
from edgeinfer.run.buckets import BucketedSession
from edgeinfer.serve.placement import placement
from edgeinfer.serve.supervisor import STOP_GRACE_S, Supervisor, stop_process

if TYPE_CHECKING:
    import numpy as np

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
    import numpy as np

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
    return _run_grouped(session, feeds, max_batch, stop, lambda out, f: run_bundle.embed(bundle, out, f))


def _run_logits(bundle: Any, session: Any, feeds: dict[str, np.ndarray], max_batch: int,
                stop: Callable[[], bool]) -> np.ndarray:
    """A reranker's or classifier's logits per row (scores are made from them in the HTTP process)."""
    from edgeinfer.run.scoring import logits

    return _run_grouped(session, feeds, max_batch, stop, lambda out, _f: logits(bundle, out))


def _run_grouped(session: Any, feeds: dict[str, np.ndarray], max_batch: int, stop: Callable[[], bool],
                 per_row: Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], np.ndarray]) -> np.ndarray:
    """Text feeds run in length groups (:func:`_length_groups`); ``per_row(outputs, feeds)`` makes one row of
    the answer per text (masked positions do not change it)."""
    import numpy as np

    n = len(next(iter(feeds.values())))
    out: np.ndarray | None = None
    for rows, length in _length_groups(session, feeds):
        if stop():
            raise Cancelled()
        f = {k: (np.ascontiguousarray(v[rows, :length]) if length and v.ndim == 2 else v[rows]) for k,
             v in feeds.items()}
        vec = per_row(_run_rows(session, f, max_batch, stop), f).astype(np.float32)
        if out is None:
            out = np.empty((n, *vec.shape[1:]), dtype=np.float32)
        out[rows] = vec
    assert out is not None
    return out


def _run_rows(session: Any, feeds: dict[str, np.ndarray], max_batch: int,
              stop: Callable[[], bool] = lambda: False) -> dict[str, np.ndarray]:
    """Run in chunks of ``max_batch`` rows (a multiple of a static batch, the last chunk padded), checking
    ``stop`` between chunks so a batch nobody waits for any more ends early."""
    import numpy as np

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
    import numpy as np

    def once(f: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if kind == "embed":
            return {"embedding": _run_embed(bundle, session, f, max_batch, stop)}
        if kind == "score":
            return {"logits": _run_logits(bundle, session, f, max_batch, stop)}
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


def _warm_feeds(bundle: Any, session: Any) -> dict[str, np.ndarray]:
    import numpy as np

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
            if isinstance(session, BucketedSession):
                session.load_all()  # every bucket compiled before the first request, not during it
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


# --- the main-process side ---------------------------------------------------------------------------


class Worker(Supervisor):
    """One worker process of the pool, holding every served bundle loaded on its device ``entry``."""

    def __init__(self, pool: WorkerPool, index: int, entry: str | None):
        super().__init__(f"edgeinfer-serve-worker-{index}", pool.max_restarts, pool.restart_window_s)
        self.pool, self.index, self.entry = pool, index, entry
        self.state = "starting"  # starting | idle | busy | dead | failed
        self.inflight: tuple[int, asyncio.Future] | None = None
        self.batches = 0
        self.cancel: Any = None  # shared integer: the id of a batch the worker should stop

    @property
    def label(self) -> str:
        return f"{self.index}" + (f":{self.entry}" if self.entry is not None else "")

    def to_json(self) -> dict[str, Any]:
        return {"worker": self.index, "device": self.entry, "pid": self.pid, "state": self.state,
                "restarts": self.restarts, "batches": self.batches, "devices": self.info.get("devices", {})}

    def target(self) -> tuple[Any, tuple]:
        if self.cancel is None:
            self.cancel = self._mp.Value("q", 0, lock=False)
        p = self.pool
        return worker_main, (self.index, self.entry, p.bundles, p.max_batch, self.cancel)

    def spawn(self) -> asyncio.Future:
        self.state, self.info, self.inflight = "starting", {}, None
        return super().spawn()

    def on_message(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "ready":
            self.state = "idle"
            log.info("worker %s ready (pid %s, %s)", self.label, self.pid, self.info.get("devices"))
            self.settle()
            self.pool._notify()
        elif kind == "fatal":
            self.state = "failed"
            self.settle(RuntimeError(f"worker {self.label} could not load the models: {msg[1]}"))
        elif kind == "result" and self.inflight and self.inflight[0] == msg[1]:
            fut = self.inflight[1]
            self.inflight = None
            if not fut.done():
                fut.set_result(msg[2])

    def on_exit(self, code: int | None, outcome: str) -> None:
        if self.inflight is not None:
            fut = self.inflight[1]
            self.inflight = None
            if not fut.done():
                fut.set_exception(WorkerCrashed(f"worker {self.label} (pid {self.pid}) died while running the batch"))
        if outcome == "stopped":
            self.state = "dead"
        elif outcome == "failed":
            self.state = "failed"
            self.settle(RuntimeError(f"worker {self.label} exited (code {code}) before loading the models"))
        elif outcome == "gave up":
            log.error("worker %s crashed %d times in %.0f s; giving it up", self.label, len(self.crashes),
                      self.restart_window_s)
            self.state = "failed"
        else:
            log.warning("worker %s (pid %s) exited with code %s; restarting it", self.label, self.pid, code)
            if self.pool.on_restart:
                self.pool.on_restart(self)
        self.pool._notify()


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
        self.workers = [Worker(self, i, e) for i, e in enumerate(devices or [None])] if bundles else []
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._free: asyncio.Condition | None = None
        self._rr = 0

    # lifecycle
    async def start(self) -> None:
        """Start every worker and wait until each has loaded and warmed up its models."""
        self._loop = asyncio.get_running_loop()
        self._free = asyncio.Condition()
        results = await asyncio.gather(*(w.spawn() for w in self.workers), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r

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
            w.kill()

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
        sent = await asyncio.to_thread(w.send, ("run", batch_id, model, kind, feeds, rows))
        if not sent and not fut.done():
            w.inflight = None
            raise WorkerCrashed(f"worker {w.label} could not take the batch: its pipe is closed")
        return await fut

    def stop(self, timeout: float = STOP_GRACE_S) -> None:
        """Ask every worker to stop; one still loading (it reads no messages until it is loaded) or still
        running after ``timeout`` s is killed (workers ignore SIGTERM)."""
        for w in self.workers:
            w.request_stop()
        deadline = time.monotonic() + timeout
        for w in self.workers:
            stop_process(w.process, deadline - time.monotonic())
            w.state = "dead"
