"""The paging schedule: which segments are resident, what is loaded (or prefetched) before each
segment runs. :class:`~edgeinfer.run.paged.PagedSession` follows it; :func:`simulate` replays it
without loading anything for the planner's cost model (docs/paging.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def next_use(k: int, pos: int, n: int) -> int:
    """Steps from position ``pos`` (the segment running now) until segment ``k`` runs again, cyclic."""
    return (k - pos) % n if k != pos else 0


def simulate(segment_bytes: Sequence[int], window: int, prefetch: bool, resident_prefix: int | None = None,
             runs: int = 3) -> dict[str, Any]:
    """The schedule :class:`PagedSession` follows, without loading anything: loads per run and
    bytes paged in during the last (steady-state) run, peak resident bytes and segments."""
    n = len(segment_bytes)
    st = Schedule(n, window, prefetch, resident_prefix)
    loads: list[list[int]] = []
    for _ in range(runs):
        this: list[int] = []
        for i in range(n):
            this += st.acquire(i)
            this += st.prefetch_after(i)
        loads.append(this)
        st.running = None
    peak_bytes = max(sum(segment_bytes[k] for k in s) for s in st.history) if st.history else 0
    return {"loads_per_run": [len(x) for x in loads], "steady_loads": loads[-1],
            "steady_bytes": sum(segment_bytes[k] for k in loads[-1]),
            "peak_resident_bytes": peak_bytes, "peak_resident_segments": max(len(s) for s in st.history),
            "prefetch_effective": st.prefetch, "pinned": st.pinned}


class Schedule:
    """Which segments are resident, which to evict (farthest next use; pinned prefix never),
    which to prefetch. Pure bookkeeping, shared by PagedSession and :func:`simulate`."""

    def __init__(self, n: int, window: int, prefetch: bool, resident_prefix: int | None):
        window = min(window, n)
        self.n, self.window = n, window
        self.prefetch = prefetch and window < n and window - (resident_prefix or 0) >= 2
        if resident_prefix is None:  # fill the window: 1 slot streams (2 with prefetch), the rest stay
            resident_prefix = max(0, window - (2 if self.prefetch else 1)) if window < n else 0
        self.pinned = resident_prefix
        self.resident: set[int] = set()  # loaded or being loaded
        self.running: int | None = None
        self.history: list[frozenset[int]] = []

    def _room(self, target: int, pos: int, strict: bool) -> int | None | bool:
        """Make room for ``target``; return the victim (or True when no eviction is needed, None when impossible)."""
        if len(self.resident) < self.window:
            return True
        cands = [k for k in self.resident if k >= self.pinned and k != self.running and k != target]
        if not cands:
            return None
        victim = max(cands, key=lambda k: next_use(k, pos, self.n))
        if strict and next_use(victim, pos, self.n) <= next_use(target, pos, self.n):
            return None
        return victim

    def _admit(self, k: int, victim: int | bool) -> list[int]:
        if victim is not True:
            self.resident.discard(victim)  # type: ignore[arg-type]
            self.evicted.append(victim)  # type: ignore[arg-type]
        self.resident.add(k)
        self.history.append(frozenset(self.resident))
        assert len(self.resident) <= self.window
        return [k]

    evicted: list[int]

    def acquire(self, i: int) -> list[int]:
        """Segment ``i`` is about to run: load it in line if it is not resident (or in flight)."""
        self.evicted = []
        self.running = i
        if i in self.resident:
            return []
        victim = self._room(i, i, strict=False)
        if victim is None:  # pragma: no cover - window >= 1 and nothing else running
            raise RuntimeError("no segment can be evicted")
        return self._admit(i, victim)

    def prefetch_after(self, i: int) -> list[int]:
        """While ``i`` runs: the next segment that is not resident, if there is room for it."""
        self.evicted = []
        if not self.prefetch:
            return []
        for step in range(1, self.n):
            k = (i + step) % self.n
            if k not in self.resident:
                break
        else:
            return []
        victim = self._room(k, i, strict=True)
        if victim is None:
            return []
        return self._admit(k, victim)

