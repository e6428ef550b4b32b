"""RKNN decoders: step primitives over static segment graphs, the KV cache in host buffers, layer paging.

The artifact (:mod:`.decoder_export`) holds, per segment of layers, decode graphs (1 token of each of B
sequences, for every built B in ``decode_batches``) and a prefill graph (``prefill_chunk`` tokens of one
sequence). The host looks up the embedding, takes the rotary rows of the positions, builds the additive
mask, feeds each segment its layers' past K/V straight from the cache and writes the new rows the graph
returns at the sequence's positions. The cache — ``slots × layers × 2 × kv_heads × context × head_dim``
float16, what the NPU computes in — is allocated once and stays whole for the run.

``decode(slots, ids)`` runs the smallest built B that holds ``len(slots)`` once per segment: row r is
slot ``slots[r]`` at its own position; the rows past ``len(slots)`` are padding (zero input, every cache
position masked) whose outputs are dropped and which write nothing. ``slots`` beyond the largest built B
is refused at load. Prefill runs one slot at a time, a chunk at a time; a short chunk is padded in front, so
that the prompt's last token is the graph's last row, the only one whose logits it computes.

Paging: at most ``window`` segments are resident (loaded for the NPU) at once; the schedule
(:class:`edgeinfer.contract.schedule.Schedule`, the one :class:`edgeinfer.run.paged.PagedSession` follows)
pins the first W−1 and streams the rest through the last slot; prefetch (W−2 pinned, next segment loaded
on a background thread) when the backend allows it — the simulator does not (``paging_limit``). A page-in
loads the graph of the phase that needs it (the other phase's graph joins the resident segment when used).
``resident_bytes`` counts segment weight bytes (measured on the exported graphs), ``peak_resident_bytes``
its maximum over the run.

In the simulator a page-in cannot load a file (the toolkit only simulates a model it builds, seconds per
graph): it takes the graph from :data:`SIMULATOR_POOL`, every segment graph this process has built, and
builds it only the first time. The schedule, evictions, page-in counts and resident bytes are the board's;
the page-in times are not (a board's page-in is a file load into NPU memory: :mod:`.board_decoder`, where
nothing is pooled).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.contract import Schedule, Session, StepDecoder
from edgeinfer.errors import InputError

from . import decoder_export as la
from .decoder_segments import MASKED


def step_inputs(tables: dict[str, np.ndarray], ids: Sequence[int], pos: int, tokens: int, context: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Host-side inputs of one call at positions ``pos..pos+len(ids)-1``, padded to ``tokens`` rows at the
    front, so that the last id is the last row (the only one whose logits the head computes): embeddings
    [1,T,H], rotary cos/sin [1,T,D], additive mask [1,T,context+T] (cache slots before ``pos`` and the
    call's own earlier rows are attended; padding rows never are by real ones)."""
    n = len(ids)
    pad = tokens - n
    embed = tables["embed"]
    hidden = np.zeros((1, tokens, embed.shape[1]), np.float32)
    hidden[0, pad:] = embed[np.asarray(ids, dtype=np.int64)]
    rows = np.clip(np.arange(pos - pad, pos - pad + tokens), 0, context - 1)
    cos, sin = tables["cos"][rows][None].astype(np.float32), tables["sin"][rows][None].astype(np.float32)
    mask = np.full((1, tokens, context + tokens), MASKED, np.float32)
    mask[0, :, :pos] = 0.0
    mask[0, :, context:] = np.triu(np.full((tokens, tokens), MASKED, np.float32), k=1)
    mask[0, pad:, context:context + pad] = MASKED
    return hidden, cos, sin, mask


def decode_inputs(tables: dict[str, np.ndarray], ids: Sequence[int], positions: Sequence[int], batch: int,
                  context: int) -> tuple[np.ndarray, ...]:
    """The inputs of one batched decode call: row r is token ``ids[r]`` at ``positions[r]``; rows past
    ``len(ids)`` are padding (no token, nothing in the cache attended)."""
    rows = [step_inputs(tables, [t], p, 1, context) for t, p in zip(ids, positions)]
    rows += [step_inputs(tables, [], 0, 1, context)] * (batch - len(rows))
    return tuple(np.concatenate(part) for part in zip(*rows))


class GraphPool:
    """Simulator only: the segment graphs this process has built, kept in host memory by graph file content
    while no decoder has them resident, so that a page-in takes one instead of rebuilding it. By content, not
    path: a bundle's graphs are byte-equal to those its deploy's golden check built in a temporary folder (and
    to another bundle's converted alike, from the conversion cache), and a built graph no longer reads its
    file."""

    def __init__(self) -> None:
        self._held: dict[str, Session] = {}
        self._lock = threading.Lock()  # decoders of several serve workers share the pool

    @staticmethod
    def key(art: Path) -> str:
        from edgeinfer.contract import stamp

        return stamp.sha256_file(art)

    def take(self, key: str) -> Session | None:
        with self._lock:
            return self._held.pop(key, None)

    def give(self, key: str, sess: Session) -> None:
        with self._lock:
            kept = self._held.setdefault(key, sess)
        if kept is not sess:  # another decoder of the same file gave one back first
            sess.close()


SIMULATOR_POOL = GraphPool()  # one per process: what a page-in takes in the simulator
SIMULATOR_PAGE_IN = ("simulator figures: a page-in takes the segment graph this process has built (from host memory; "
                     "building it the first time), so its ms are not a board's page-in (a file load into NPU memory)")


class SegmentPager:
    """Which segments are loaded: the paging schedule, page-in times and resident weight bytes. With a
    ``graph_pool`` (the simulator) evicted graphs go back to it and page-ins take them from it."""

    def __init__(self, backend: Any, folder: Path, segments: list[dict[str, Any]], window: int, device: str | None,
                 prefetch: bool, loader: Any = None, graph_pool: GraphPool | None = None):
        self.backend, self.folder, self.segments, self.device = backend, folder, segments, device
        self.loader = loader or (lambda art: backend.load(art, device=device))
        self.graph_pool = graph_pool
        self._keys: dict[tuple[int, str], str] = {}  # the graph files do not change while loaded
        n = len(segments)
        self.notes: list[str] = []
        limit = backend.paging_limit(device)
        if prefetch and limit is not None and not limit.background:
            if window < n:
                self.notes.append(f"prefetch off: {limit.why}")
            prefetch = False
        self.sched = Schedule(n, min(window, n), prefetch, None)
        self.window, self.prefetch = self.sched.window, self.sched.prefetch
        self.weight_bytes = [int(s["weight_bytes"]) for s in segments]
        self.loaded: dict[int, dict[str, Session]] = {}
        self.page_in_s: list[list[float]] = [[] for _ in range(n)]
        self.page_ins = self.page_outs = 0
        self.peak_resident_bytes = 0
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="edgeinfer-prefetch") if self.prefetch else None
        self._inflight: tuple[int, str, Future] | None = None

    @property
    def resident_bytes(self) -> int:
        return sum(self.weight_bytes[k] for k in self.sched.resident)

    def _load(self, k: int, phase: str) -> tuple[Session, float]:
        art = self.folder / self.segments[k][phase]
        if self.graph_pool is not None:
            key = self._key(k, phase)
            t = time.perf_counter()
            sess = self.graph_pool.take(key)
            if sess is not None:
                return sess, time.perf_counter() - t
        la.hand_over(art)
        t = time.perf_counter()
        sess = self.loader(art)
        return sess, time.perf_counter() - t

    def _key(self, k: int, phase: str) -> str:
        if (k, phase) not in self._keys:
            self._keys[k, phase] = GraphPool.key(self.folder / self.segments[k][phase])
        return self._keys[k, phase]

    def _unload(self, k: int) -> None:
        """Segment ``k``'s graphs leave the NPU: closed, or (simulator) back into the pool."""
        for phase, sess in self.loaded.pop(k, {}).items():
            if self.graph_pool is not None:
                self.graph_pool.give(self._key(k, phase), sess)
            else:
                sess.close()

    def _land(self, k: int, phase: str, got: tuple[Session, float]) -> Session:
        sess, seconds = got
        self.loaded.setdefault(k, {})[phase] = sess
        self.page_in_s[k].append(seconds)
        self.page_ins += 1
        return sess

    def _evict(self) -> None:
        for v in self.sched.evicted:
            self._unload(v)
            self.page_outs += 1
        self.peak_resident_bytes = max(self.peak_resident_bytes, self.resident_bytes)

    def session(self, k: int, phase: str) -> Session:
        """Segment ``k``'s graph for ``phase``, resident now (loaded in line when it is not)."""
        if self._inflight is not None:
            self._wait()
        if k not in self.sched.resident:
            self.sched.acquire(k)
            self._evict()
        self.sched.running = k
        sess = self.loaded.get(k, {}).get(phase)
        if sess is None:
            sess = self._land(k, phase, self._load(k, phase))
        if self._pool is not None:
            self._prefetch_after(k, phase)
        return sess

    def _prefetch_after(self, k: int, phase: str) -> None:
        got = self.sched.prefetch_after(k)
        if got:
            self._evict()
            self._inflight = (got[0], phase, self._pool.submit(self._load, got[0], phase))

    def _wait(self) -> None:
        k, phase, fut = self._inflight
        self._inflight = None
        self._land(k, phase, fut.result())

    def release(self) -> None:
        if self._inflight is not None:
            self._wait()
        for k in list(self.loaded):
            self._unload(k)
        self.sched.resident.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)


class RknnDecoder(StepDecoder):
    backend_name = "rknn"

    def __init__(self, backend: Any, folder: Path, manifest: dict[str, Any], device: str | None, context: int,
                 slots: int, window: int, prefetch: bool, page_from: str = "storage"):
        shape = manifest["shape"]
        self.built_context = int(manifest["context"])
        self.layers, self.kv_heads, self.head_dim = shape["layers"], shape["kv_heads"], shape["head_dim"]
        self.chunk = int(manifest["prefill_chunk"])
        self.scheme = manifest["scheme"]
        self.segments = [tuple(s["layers"]) for s in manifest["segments"]]
        built = [int(b) for b in manifest.get("decode_batches", [1])]
        if slots > built[-1]:
            raise InputError(f"{folder.name} decodes at most {built[-1]} sequence(s) at once (decode graphs for "
                             f"{', '.join(map(str, built))}), not {slots}: use {built[-1]} slots or fewer "
                             f"(serve --slots), or convert again with decode_batches={','.join(map(str, built))},"
                             f"{slots}")
        # the built batches a call of at most ``slots`` sequences can use: up to the smallest holding them all
        self.batches = [b for b in built if b < slots] + [min(b for b in built if b >= slots)]
        with np.load(folder / "host.npz") as host:
            self.tables = {k: host[k] for k in ("embed", "cos", "sin")}
        kv_shape = (slots, self.layers, 2, self.kv_heads, self.built_context, self.head_dim)
        self.lengths = [0] * slots
        self.shared, loader = self._board(backend, folder, manifest, device, slots, page_from)
        self.kv = np.zeros(kv_shape if self.shared is None else (0,), np.float16)
        self.pager = SegmentPager(backend, folder, manifest["segments"], window, device, prefetch, loader,
                                  SIMULATOR_POOL if self.shared is None else None)
        super().__init__(context=context, vocab_size=int(shape["vocab"]), kv_cache_bytes=int(np.prod(kv_shape)) * 2,
                         slots=slots, prefill_chunk=self.chunk,
                         device="simulator" if self.shared is None else f"npu:{manifest['target']}")
        try:  # unpaged (or a window that holds them all): every graph is loaded now, none later
            if self.pager.window >= len(self.segments):
                for k in range(len(self.segments)):
                    for key in [*map(la.decode_key, self.batches), "prefill"]:
                        self.pager.session(k, key)
        except BaseException:
            self.pager.release()
            raise
        self.load_page_ins = self.pager.page_ins

    def _board(self, backend: Any, folder: Path, manifest: dict[str, Any], device: str | None, slots: int,
               page_from: str) -> tuple[Any, Any]:
        """On a board: the KV cache in NPU shared memory and zero-copy graphs (.board_decoder, WRITTEN FOR
        THE BOARD, NEVER RUN HERE); elsewhere (None, None): numpy buffers and the backend's sessions."""
        if device == "simulator" or backend.mode() != "board":
            return None, None
        from . import board_decoder
        from . import device as hw

        if slots != 1:
            raise InputError("the zero-copy board decoder runs one slot; load with slots=1")
        lib = board_decoder.library(hw.runtime_library())
        first = folder / manifest["segments"][0]["decode"]
        shared = board_decoder.SharedKV(lib, first, self.layers, self.kv_heads, self.built_context, self.head_dim)
        held = {}  # page_from="memory": every graph's bytes in host RAM, page-ins never touch storage
        if page_from == "memory":
            held = {folder / s[p]: (folder / s[p]).read_bytes() for s in manifest["segments"] for p in la.PHASES}
        return shared, lambda art: board_decoder.ZeroCopyGraph(lib, art, shared, held.get(art))

    def _past(self, slot: int, i: int, kind: int) -> np.ndarray:
        if self.shared is not None:  # bound to the graph's input: read in place by the NPU
            return self.shared.views[f"past_{'kv'[kind]}_{i}"][0]
        return self.kv[slot, i, kind]

    # --- measured figures ---------------------------------------------------------------------
    @property
    def window(self) -> int:
        return self.pager.window

    @property
    def segment_bytes(self) -> list[int]:
        return list(self.pager.weight_bytes)

    @property
    def resident_bytes(self) -> int:
        return self.pager.resident_bytes

    @property
    def peak_resident_bytes(self) -> int:
        return self.pager.peak_resident_bytes

    def paging_stats(self) -> dict[str, Any]:
        p = self.pager
        notes = list(p.notes) + ([SIMULATOR_PAGE_IN] if p.graph_pool is not None else [])
        # ms to the ns: a page-in from the simulator's pool takes microseconds
        return {"segments": len(self.segments), "window": p.window, "prefetch": p.prefetch,
                "pinned": p.sched.pinned, "page_ins": p.page_ins, "page_outs": p.page_outs,
                "page_in_ms_mean": [round(1e3 * sum(x) / len(x), 6) if x else None for x in p.page_in_s],
                "segment_bytes": self.segment_bytes, "peak_resident_bytes": p.peak_resident_bytes,
                "kv_cache_bytes": self.kv_cache_bytes, "notes": notes}

    # --- step primitives ----------------------------------------------------------------------
    def _check(self, slot: int, n: int) -> None:
        if not 0 <= slot < self.slots:
            raise InputError(f"slot {slot} is out of range: this decoder has {self.slots} slot(s)")
        if self.lengths[slot] + n > self.context:
            raise InputError(f"slot {slot} holds {self.lengths[slot]} tokens; {n} more exceed the context of "
                             f"{self.context}: reset it or load with a larger context")

    def _call(self, slot: int, ids: Sequence[int]) -> np.ndarray:
        """One pass through every segment for ``ids`` at the slot's next positions; the last logits."""
        pos, n = self.lengths[slot], len(ids)
        phase, tokens = ("decode", 1) if n == 1 else ("prefill", self.chunk)
        hidden, cos, sin, mask = step_inputs(self.tables, ids, pos, tokens, self.built_context)
        for k, (a, b) in enumerate(self.segments):
            feeds = {f"hidden_{a}": hidden, "cos": cos, "sin": sin, "mask": mask}
            if self.shared is None:  # the simulator takes float32 copies; the board reads the shared cache
                for i in range(a, b):
                    feeds[f"past_k_{i}"] = self._past(slot, i, 0)[None].astype(np.float32)
                    feeds[f"past_v_{i}"] = self._past(slot, i, 1)[None].astype(np.float32)
            out = self.pager.session(k, phase).run(feeds)
            for i in range(a, b):
                self._past(slot, i, 0)[:, pos:pos + n] = out[f"new_k_{i}"][0, :, tokens - n:]
                self._past(slot, i, 1)[:, pos:pos + n] = out[f"new_v_{i}"][0, :, tokens - n:]
            hidden = out["logits"] if b == self.layers else out[f"hidden_{b}"]
        self.lengths[slot] = pos + n
        return np.asarray(hidden[0, -1], dtype=np.float32)  # [1,1,V]; a graph converted before gives [1,T,V]

    def prefill(self, slot: int, token_ids: np.ndarray) -> np.ndarray:
        ids = [int(t) for t in np.asarray(token_ids).reshape(-1)]
        if not ids:
            raise InputError("prefill needs at least one token")
        self._check(slot, len(ids))
        for start in range(0, len(ids), self.chunk):
            logits = self._call(slot, ids[start:start + self.chunk])
        return logits

    def decode(self, slots: Sequence[int], token_ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(token_ids).reshape(-1)
        if len(ids) != len(slots):
            raise InputError(f"decode got {len(ids)} tokens for {len(slots)} slots")
        if len(set(slots)) != len(slots):
            raise InputError(f"decode got slot(s) twice in one call: {list(slots)}")
        for s in slots:
            self._check(s, 1)
        if len(slots) == 1:
            return self._call(slots[0], [int(ids[0])])[None]
        return self._decode_rows(list(slots), [int(t) for t in ids])

    def _decode_rows(self, slots: list[int], ids: list[int]) -> np.ndarray:
        """One pass of the smallest built batch graph holding ``slots``: one token each, at each one's position."""
        batch = min(b for b in self.batches if b >= len(slots))
        positions = [self.lengths[s] for s in slots]
        hidden, cos, sin, mask = decode_inputs(self.tables, ids, positions, batch, self.built_context)
        pad = np.zeros((batch - len(slots), self.kv_heads, self.built_context, self.head_dim), np.float32)
        for k, (a, b) in enumerate(self.segments):
            feeds = {f"hidden_{a}": hidden, "cos": cos, "sin": sin, "mask": mask}
            for i in range(a, b):
                for kind in (0, 1):
                    past = self.kv[slots, i, kind].astype(np.float32)
                    feeds[f"past_{'kv'[kind]}_{i}"] = np.concatenate([past, pad])
            out = self.pager.session(k, la.decode_key(batch)).run(feeds)
            for i in range(a, b):
                for r, (s, pos) in enumerate(zip(slots, positions)):  # padding rows write nothing
                    self.kv[s, i, 0][:, pos] = out[f"new_k_{i}"][r, :, 0]
                    self.kv[s, i, 1][:, pos] = out[f"new_v_{i}"][r, :, 0]
            hidden = out["logits"] if b == self.layers else out[f"hidden_{b}"]
        for s in slots:
            self.lengths[s] += 1
        return np.asarray(hidden[: len(slots), 0], dtype=np.float32)

    def reset(self, slot: int) -> None:
        if not 0 <= slot < self.slots:
            raise InputError(f"slot {slot} is out of range: this decoder has {self.slots} slot(s)")
        self.lengths[slot] = 0  # stale rows past the length are masked, then overwritten

    def release(self) -> None:
        self.pager.release()
        if self.shared is not None:
            self.shared.release()


def _flag(name: str, value: Any, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if str(value).strip().lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return str(value).strip().lower() in ("1", "true", "yes", "on")
    raise InputError(f"{name} must be true or false, got {value!r}")


def converted_dir(backend: Any, model: Path, scheme: str, context: int, options: dict[str, Any]) -> Path:
    """The artifact for a Hugging Face directory opened directly: converted once into the cache."""
    from edgeinfer.contract import cache, stamp

    wanted = {k: options[k] for k in ("segments", "prefill_chunk", "target") if options.get(k) is not None}
    if options.get("decode_batches") is not None:
        wanted["decode_batches"] = la.parse_batches(options["decode_batches"])
    facts = {"model": stamp.sha256_file(model), "scheme": scheme, "context": context, **wanted,
             **cache.made_by(backend), "format": la.FORMAT,
             "defaults": la.CONVERSION_DEFAULTS}
    entry = cache.area("artifacts") / "rknn-decoders" / cache.key(facts)
    return cache.fill(entry, lambda d: la.convert_decoder(backend, model, scheme, context, d, None, **wanted))


def open_decoder(backend: Any, model: Path, device: str | None, context: int, slots: int,
                 **options: Any) -> RknnDecoder:
    dev = (device or "auto").lower()
    if dev not in ("auto", "simulator", "npu", "board"):
        raise InputError(f"unknown rknn device {device!r}; use auto, simulator or npu")
    manifest = la.read_manifest(model)
    if manifest is None:  # a Hugging Face directory: convert (cached), then open the artifact
        scheme = str(options.get("scheme") or backend.decoders.schemes[0])
        la.check_scheme(scheme, str(options.get("target") or "rk3588").lower())
        if options.get("decode_batches") is None and slots > 1:  # the decode graphs the asked slots need
            options = {**options, "decode_batches": [1, slots]}
        model = converted_dir(backend, model, scheme, context, options)
        manifest = la.read_manifest(model)
    else:
        if options.get("decode_batches") is not None:
            options = {**options, "decode_batches": ",".join(map(str, la.parse_batches(options["decode_batches"])))}
        for key in ("segments", "prefill_chunk", "scheme", "target", "decode_batches"):
            have = len(manifest["segments"]) if key == "segments" else manifest.get(key)
            if key == "decode_batches":
                have = ",".join(map(str, manifest.get(key, [1])))
            if options.get(key) is not None and str(options[key]) != str(have):
                raise InputError(f"{model.name} was converted with {key}={have}, not {options[key]}; convert again "
                                 f"with {key}={options[key]} or drop the option")
    if context > int(manifest["context"]):
        raise InputError(f"{model.name} was converted for a context of {manifest['context']} tokens, not {context}")
    n = len(manifest["segments"])
    window = la.positive("window", options.get("window"), n)
    prefetch = _flag("prefetch", options.get("prefetch"), True)
    page_from = str(options.get("page_from") or "storage")
    if page_from not in ("storage", "memory"):
        raise InputError(f"page_from must be storage or memory, got {page_from!r}")
    return RknnDecoder(backend, model, manifest, None if dev == "auto" else dev, context, slots, window, prefetch,
                       page_from)
