"""Layer-paged execution: :class:`PagedSession` runs a model larger than memory as a chain of
segments on any backend, keeping at most ``window`` segments loaded (an optional prefix pinned),
loading the next one on one background thread while the current one runs, and accounting
resident bytes and page-in times (``profile``). The schedule lives in :mod:`edgeinfer.run.schedule`,
the splitting in :mod:`edgeinfer.run.split`, the cost model in :mod:`edgeinfer.planning.paging`
(docs/paging.md).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported where arrays are made, so `edgeinfer plan --paging` stays light
    import numpy as np

from edgeinfer.contract.backend import Backend, Session, TensorSpec
from edgeinfer.contract.helpers import first_line
from edgeinfer.errors import BackendError, EdgeInferError, InputError
from edgeinfer.run.measure import current_rss_bytes
from edgeinfer.run.schedule import _Schedule


# ------------------------------------------------------------------------------------------------
# the paged session
# ------------------------------------------------------------------------------------------------
class PagingError(BackendError):
    """Loading a segment failed (in the background or in line)."""



class PagedSession(Session):
    """A segmented model run segment by segment with at most ``window`` segments loaded.

    ``resident_prefix`` first segments are loaded once and never evicted (they count within the
    window). With ``prefetch`` (needs window >= 2) one background thread loads the next segment
    while the current one runs. Resident bytes are the artifact bytes of loaded segments
    (:meth:`Backend.artifact_files`); ``profile_notes()`` reports them with page-in times per segment.
    """

    def __init__(
        self,
        backend: Backend,
        artifacts: Sequence[str | os.PathLike[str]],
        device: str | None = None,
        window: int = 1,
        prefetch: bool = True,
        resident_prefix: int | None = None,
        **options: Any,
    ):
        paths = [Path(a) for a in artifacts]
        if not paths:
            raise InputError("a paged model needs at least one segment artifact")
        for p in paths:
            if not p.exists():
                raise InputError(f"segment artifact not found: {p}")
        for name, v, lo in (("window", window, 1), ("resident_prefix", resident_prefix, 0)):
            if name == "resident_prefix" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise InputError(f"paging {name} must be an integer >= {lo}, got {v!r}")
        n = len(paths)
        self._notes: list[str] = []
        window = min(window, n)
        if resident_prefix is not None and resident_prefix >= window and window < n:
            raise InputError(f"resident_prefix {resident_prefix} leaves no room to page: it must be smaller than "
                             f"the window ({window})")
        self._backend, self._paths, self._device, self._options = backend, paths, device, options
        limit = backend.paging_limit(device)
        if limit is not None:
            max_window, background_ok, why = limit
            if max_window is not None and window > max_window:
                self._notes.append(f"window {window} reduced to {max_window}: {why}")
                window = max_window
                if resident_prefix is not None:
                    resident_prefix = min(resident_prefix, max(0, window - 1))
            if prefetch and not background_ok:
                self._notes.append(f"prefetch off: {why}")
                prefetch = False
        self._sched = _Schedule(n, window, prefetch, resident_prefix)
        if prefetch and not self._sched.prefetch and window < n:
            self._notes.append("prefetch needs two free slots in the window (the next segment loads while the "
                               "current one is resident): running without it")
        self.window, self.resident_prefix = window, self._sched.pinned
        self.prefetch = self._sched.prefetch
        self._sizes = [sum(_size(f) for f in backend.artifact_files(p)) for p in paths]
        self._sessions: dict[int, Session] = {}
        self._inflight: tuple[int, Future] | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgeinfer-prefetch") if self.prefetch \
            else None
        self._lock = threading.Lock()
        self.reset_stats()
        self.peak_resident_bytes = 0
        self.peak_resident_segments = 0
        self._seg_inputs: list[list[TensorSpec]] = []
        self._seg_outputs: list[list[TensorSpec]] = []
        try:
            self._learn_specs()
            for k in range(self.resident_prefix):
                self._ensure(k, pos=0)
        except BaseException:
            self.release()
            raise
        inputs, outputs = self._model_io()
        super().__init__(inputs, outputs, device=self._device_name())
        self.backend_name = backend.name

    @classmethod
    def from_artifacts(
        cls, backend: Backend, artifacts: Sequence[str | os.PathLike[str]], **options: Any
    ) -> PagedSession:
        """What :func:`edgeinfer.run.bundle.open_session` calls for a segmented bundle (``manifest.paging``
        spread into the keywords). Facts a manifest may record about the split (``segments``, ``cuts``) are not
        load options and are dropped here."""
        for informational in ("segments", "cuts", "index"):
            options.pop(informational, None)
        return cls(backend, artifacts, **options)

    # --- set-up ---------------------------------------------------------------------------------
    def _learn_specs(self) -> None:
        """Input/output specs of every segment: from the stamps when they record both, else by
        loading each segment once (the loads count as page-ins; the first ``window`` stay)."""
        from edgeinfer.contract import stamp

        stamps = [stamp.read(p) or {} for p in self._paths]
        if all(s.get("inputs") and s.get("outputs") for s in stamps):
            self._seg_inputs = [[TensorSpec.from_json(x) for x in s["inputs"]] for s in stamps]
            self._seg_outputs = [[TensorSpec.from_json(x) for x in s["outputs"]] for s in stamps]
            return
        for k in range(len(self._paths)):
            sess = self._ensure(k, pos=k)
            self._seg_inputs.append(list(sess.inputs))
            self._seg_outputs.append(list(sess.outputs))
        self._sched.running = None

    def _model_io(self) -> tuple[list[TensorSpec], list[TensorSpec]]:
        produced: dict[str, TensorSpec] = {}
        inputs: list[TensorSpec] = []
        seen: set[str] = set()
        for ins, outs in zip(self._seg_inputs, self._seg_outputs):
            for s in ins:
                if s.name not in produced and s.name not in seen:
                    seen.add(s.name)
                    inputs.append(s)
            for s in outs:
                produced[s.name] = s
        read_later: set[str] = set()
        outputs: list[TensorSpec] = []
        for k in range(len(self._paths) - 1, -1, -1):
            outputs = [s for s in self._seg_outputs[k] if s.name not in read_later] + outputs
            read_later |= {s.name for s in self._seg_inputs[k]}
        self._last_reader = {}
        for k, ins in enumerate(self._seg_inputs):
            for s in ins:
                self._last_reader[s.name] = k
        return inputs, outputs

    def _device_name(self) -> str:
        for s in self._sessions.values():
            return s.device
        return self._device or ""

    # --- loading --------------------------------------------------------------------------------
    def _load(self, k: int) -> tuple[Session, float, int | None]:
        rss0 = current_rss_bytes()
        t = time.perf_counter()
        sess = self._backend.load(self._paths[k], device=self._device, **self._options)
        dt = time.perf_counter() - t
        rss1 = current_rss_bytes()
        return sess, dt, (rss1 - rss0) if rss0 is not None and rss1 is not None else None

    def _record(self, k: int, seconds: float, rss_delta: int | None, background: bool) -> None:
        self.page_in_s[k].append(seconds)
        if rss_delta is not None and not background:  # a background load overlaps compute: no honest delta
            self.rss_delta_bytes[k] = rss_delta

    def _account(self) -> None:
        held = self._sched.resident
        b = sum(self._sizes[k] for k in held)
        self.peak_resident_bytes = max(self.peak_resident_bytes, b)
        self.peak_resident_segments = max(self.peak_resident_segments, len(held))
        if len(held) > self.window:  # pragma: no cover - the schedule asserts this too
            raise BackendError(f"paging: {len(held)} segments resident, more than the window {self.window}")

    def _evict(self) -> None:
        for v in self._sched.evicted:
            sess = self._sessions.pop(v, None)
            if sess is not None:
                sess.close()
                self.page_outs += 1

    def _ensure(self, k: int, pos: int) -> Session:
        """Segment ``k`` resident now: take it from the prefetch, or load it in line (a stall)."""
        if self._inflight is not None and self._inflight[0] == k:
            return self._wait_inflight()
        if k in self._sessions:
            self._sched.running = k
            return self._sessions[k]
        if self._inflight is not None:  # a prefetch of something else: let it land first
            self._wait_inflight()
        self._sched.acquire(k)
        self._evict()
        self._account()
        t = time.perf_counter()
        try:
            sess, dt, rss = self._load(k)
        except BaseException:
            self._sched.resident.discard(k)
            raise
        self.stall_s += time.perf_counter() - t
        self._sessions[k] = sess
        self._record(k, dt, rss, background=False)
        if not getattr(self, "device", ""):  # specs came from the stamps: the device is known now
            self.device = sess.device
        return sess

    def _wait_inflight(self) -> Session:
        assert self._inflight is not None
        k, fut = self._inflight
        t = time.perf_counter()
        try:
            sess, dt, rss = fut.result()
        except EdgeInferError as e:
            self._inflight = None
            self._sched.resident.discard(k)
            raise PagingError(f"paging: loading segment {k} ({self._paths[k].name}) in the background failed: "
                              f"{e.one_line()}") from e
        except BaseException as e:
            self._inflight = None
            self._sched.resident.discard(k)
            raise PagingError(f"paging: loading segment {k} ({self._paths[k].name}) in the background failed: "
                              f"{type(e).__name__}: {first_line(e)}") from e
        self.stall_s += time.perf_counter() - t
        self._inflight = None
        self._sessions[k] = sess
        self._record(k, dt, rss, background=True)
        self.prefetched += 1
        return sess

    def _prefetch_after(self, i: int) -> None:
        if self._pool is None or self._inflight is not None:
            return
        got = self._sched.prefetch_after(i)
        if not got:
            return
        self._evict()
        self._account()
        k = got[0]
        self._inflight = (k, self._pool.submit(self._load, k))

    # --- running --------------------------------------------------------------------------------
    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        env: dict[str, np.ndarray] = dict(feeds)
        out_names = {s.name for s in self.outputs}
        n = len(self._paths)
        with self._lock:
            t_run = time.perf_counter()
            for i in range(n):
                sess = self._ensure(i, pos=i)
                self._sched.running = i
                self._prefetch_after(i)
                sub = {s.name: env[s.name] for s in self._seg_inputs[i]}
                t = time.perf_counter()
                env.update(sess.run(sub))
                self.compute_s[i].append(time.perf_counter() - t)
                for name in [x for x in env if self._last_reader.get(x, -1) <= i and x not in out_names]:
                    del env[name]
            self._sched.running = None
            self.runs += 1
            self.run_s.append(time.perf_counter() - t_run)
        return {s.name: env[s.name] for s in self.outputs}

    def wait_prefetch(self) -> None:
        """Wait for a background load in flight (it stays resident); errors surface at its use."""
        if self._inflight is not None:
            self._inflight[1].exception()

    # --- reporting ------------------------------------------------------------------------------
    def reset_stats(self) -> None:
        n = len(self._paths)
        self.page_in_s: list[list[float]] = [[] for _ in range(n)]
        self.compute_s: list[list[float]] = [[] for _ in range(n)]
        self.rss_delta_bytes: list[int | None] = [None] * n
        self.stall_s = 0.0
        self.prefetched = 0
        self.page_outs = 0
        self.runs = 0
        self.run_s: list[float] = []

    @property
    def resident_segments(self) -> list[int]:
        return sorted(self._sched.resident)

    @property
    def resident_bytes(self) -> int:
        return sum(self._sizes[k] for k in self._sched.resident)

    @property
    def segment_bytes(self) -> list[int]:
        return list(self._sizes)

    def stats(self) -> dict[str, Any]:
        page_in = sum(sum(x) for x in self.page_in_s)
        return {
            "segments": len(self._paths),
            "window": self.window,
            "prefetch": self.prefetch,
            "resident_prefix": self.resident_prefix,
            "runs": self.runs,
            "page_ins": sum(len(x) for x in self.page_in_s),
            "prefetched": self.prefetched,
            "page_outs": self.page_outs,
            "page_in_ms_mean": [round(1e3 * sum(x) / len(x), 3) if x else None for x in self.page_in_s],
            "page_in_ms_total": round(1e3 * page_in, 3),
            "compute_ms_mean": [round(1e3 * sum(x) / len(x), 3) if x else None for x in self.compute_s],
            "stall_ms_total": round(1e3 * self.stall_s, 3),
            "hidden_fraction": round(max(0.0, 1 - self.stall_s / page_in), 4) if page_in > 0 else None,
            "resident_segments": self.resident_segments,
            "resident_bytes": self.resident_bytes,
            "peak_resident_bytes": self.peak_resident_bytes,
            "peak_resident_segments": self.peak_resident_segments,
            "segment_bytes": self.segment_bytes,
            "rss_delta_bytes": self.rss_delta_bytes,
            "accounting": "resident bytes = artifact bytes of loaded (and loading) segments; rss_delta_bytes "
                          "= process RSS change over in-line loads only (background loads overlap compute)",
            "notes": list(self._notes),
        }

    def profile_notes(self) -> dict[str, Any]:
        notes: dict[str, Any] = {"paging": self.stats()}
        for s in self._sessions.values():
            inner = s.profile_notes()
            if inner:
                notes["segment_notes"] = inner
            break
        return notes

    def release(self) -> None:
        if self._inflight is not None:
            k, fut = self._inflight
            self._inflight = None
            try:
                sess, _, _ = fut.result()
                sess.close()
            except BaseException:
                pass
            self._sched.resident.discard(k)
        for k in list(self._sessions):
            self._sessions.pop(k).close()
        self._sched.resident.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0
