"""Dynamic batching: queue requests per model, merge those of one shape within the window up to the
maximum batch, run them once on a free worker, and split the outputs back to their callers."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from edgeinfer.serve.workers import NoWorkers, WorkerCrashed, WorkerPool

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger("edgeinfer.serve")


class QueueFull(Exception):
    pass


class RequestFailed(Exception):
    """A request that reached the model but could not be answered: ``status`` is the HTTP status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Item:
    model: str
    kind: str  # "embed" | "infer" | "score"
    feeds: dict[str, np.ndarray]
    rows: int
    key: tuple  # requests merge only with requests of the same key (kind and non-batch shapes)
    future: asyncio.Future
    enqueued: float = field(default_factory=time.monotonic)
    attempts: int = 0
    cancelled: bool = False
    running: tuple[Any, list[Item]] | None = None  # (worker, batch) while its batch runs


class Batcher:
    def __init__(self, pool: WorkerPool, models: list[str], max_batch: int, window_s: float, max_queue: int,
                 observe: Callable[..., None] | None = None):
        self.pool = pool
        self.max_batch = max_batch
        self.window_s = window_s
        self.max_queue = max_queue
        self.observe = observe or (lambda *a, **k: None)
        self.queues: dict[str, collections.deque[Item]] = {m: collections.deque() for m in models}
        self.events: dict[str, asyncio.Event] = {}
        self.inflight: dict[str, int] = {m: 0 for m in models}  # rows accepted and not yet answered
        self.seen: dict[str, collections.deque[tuple[float, int]]] = {m: collections.deque() for m in models}
        self.tasks: list[asyncio.Task] = []
        self.running: set[asyncio.Task] = set()

    def start(self) -> None:
        for m in self.queues:
            self.events[m] = asyncio.Event()
            self.tasks.append(asyncio.create_task(self._loop(m), name=f"batcher-{m}"))

    @property
    def depth(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def depth_of(self, model: str) -> int:
        return len(self.queues[model])

    def submit(self, item: Item) -> None:
        if self.depth >= self.max_queue:
            raise QueueFull()
        self.queues[item.model].append(item)
        self.inflight[item.model] += item.rows
        self.seen[item.model].append((time.monotonic(), self.inflight[item.model]))
        item.future.add_done_callback(lambda _f, m=item.model, n=item.rows: self._answered(m, n))
        self.events[item.model].set()

    def _answered(self, model: str, rows: int) -> None:
        self.inflight[model] -= rows

    def cancel(self, item: Item) -> None:
        """A request nobody waits for any more (timed out): drop it from its queue, and stop its running
        batch when no other request of that batch is still waiting, so later requests are not held up."""
        item.cancelled = True
        item.future.cancel()
        if item.running is not None:
            worker, batch = item.running
            if all(it.future.done() for it in batch):
                self.pool.cancel(worker)

    async def _loop(self, model: str) -> None:
        q, ev = self.queues[model], self.events[model]
        while True:
            while not q or q[0].cancelled:
                if q:
                    q.popleft()
                    continue
                ev.clear()
                await ev.wait()
            first = q[0]
            deadline = first.enqueued + self.window_s
            # wait for as many rows as were in flight at once lately: a lone client (one request in flight)
            # is never held back by the window, a crowd of clients fills the batch
            target = min(self.max_batch, max(1, self._recent(model)))
            while self._rows(q, first.key) < target:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                ev.clear()
                try:
                    await asyncio.wait_for(ev.wait(), remaining)
                except asyncio.TimeoutError:
                    break
            try:
                worker = await self.pool.acquire()
            except NoWorkers as e:
                for it in list(q):
                    _fail(it, 503, f"no worker can run the model: {e}")
                q.clear()
                continue
            batch = self._take(q, first.key)
            if not batch:
                self.pool.release(worker)
                continue
            task = asyncio.create_task(self._run(worker, model, batch))
            self.running.add(task)
            task.add_done_callback(self.running.discard)

    def _recent(self, model: str) -> int:
        """The most rows in flight at once over the last quarter second (or 20 windows)."""
        seen = self.seen[model]
        horizon = time.monotonic() - max(0.25, 20 * self.window_s)
        while seen and seen[0][0] < horizon:
            seen.popleft()
        return max((n for _, n in seen), default=1)

    def _rows(self, q: collections.deque[Item], key: tuple) -> int:
        return sum(it.rows for it in q if it.key == key and not it.cancelled)

    def _take(self, q: collections.deque[Item], key: tuple) -> list[Item]:
        batch: list[Item] = []
        keep: list[Item] = []
        rows = 0
        for it in q:
            if it.cancelled or it.future.done():
                continue
            if it.key == key and (not batch or rows + it.rows <= self.max_batch):
                batch.append(it)
                rows += it.rows
            else:
                keep.append(it)
        q.clear()
        q.extend(keep)
        return batch

    async def _run(self, worker: Any, model: str, batch: list[Item]) -> None:
        import numpy as np

        t0 = time.perf_counter()
        rows = [it.rows for it in batch]
        for it in batch:
            it.running = (worker, batch)
        try:
            feeds = {k: np.concatenate([it.feeds[k] for it in batch]) for k in batch[0].feeds}
            self.observe("batch", model=model, rows=sum(rows), requests=len(batch))
            parts = await self.pool.run(worker, model, batch[0].kind, feeds, rows)
        except WorkerCrashed as e:
            if all(it.cancelled for it in batch):  # stopped on purpose: nobody waits for it
                return
            log.warning("%s; retrying its %d request(s) once", e, len(batch))
            self.observe("crash", model=model)
            retry = []
            for it in batch:
                it.attempts += 1
                if it.attempts < 2 and not it.cancelled:
                    retry.append(it)
                else:
                    _fail(it, 500, f"the worker crashed while running this request (retried once): {e}")
            q = self.queues[model]
            for it in reversed(retry):  # to the front, in order, past the queue limit: they were accepted
                q.appendleft(it)
            self.events[model].set()
            return
        except Exception as e:  # noqa: BLE001 - never let one batch take the loop down
            log.exception("batch of %s failed", model)
            for it in batch:
                _fail(it, 500, f"the batch failed: {type(e).__name__}: {e}")
            return
        finally:
            self.pool.release(worker)
            for it in batch:
                it.running = None
        self.observe("batch_done", model=model, seconds=time.perf_counter() - t0)
        for it, (status, payload) in zip(batch, parts):
            if it.future.done():
                continue
            if status == "ok":
                it.future.set_result(payload)
            else:
                self.observe("batch_error", model=model)
                _fail(it, 500, f"the model failed on this request: {payload}")

    async def stop(self) -> None:
        if self.running:
            await asyncio.gather(*list(self.running), return_exceptions=True)
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for q in self.queues.values():
            for it in q:
                _fail(it, 503, "the server is shutting down")
            q.clear()


def _fail(it: Item, status: int, message: str) -> None:
    if not it.future.done():
        it.future.set_exception(RequestFailed(status, message))
