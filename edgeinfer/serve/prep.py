"""The CPU work of a request — reading its JSON, tokenizing, building arrays, checking them, encoding the
answer — as plain functions, and :class:`Offload`, which runs the large ones in helper processes so the
event loop keeps answering other requests (``/health`` included) meanwhile.

Threads would not do for large bodies: ``json.loads``, ``np.array`` on nested lists and ``json.dumps`` hold
the GIL for their whole run, seconds for a body of a few MB. A chat template of a small body runs on a thread:
it is Python bytecode (jinja2), which hands the GIL to the event loop every switch interval (5 ms).
"""

from __future__ import annotations

import asyncio
import base64
import json
import multiprocessing as mp
import re
import sys
import threading
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable

from pydantic import BaseModel, ValidationError

from edgeinfer.contract.backend import TensorSpec, validate_feeds
from edgeinfer.errors import EdgeInferError, check_text
from edgeinfer.model.buckets import longest_seq
from edgeinfer.model.bundle import Bundle
from edgeinfer.run import bundle as run_bundle
from edgeinfer.serve.schemas import EmbeddingRequest, InferRequest
from edgeinfer.serve.workers import lower_priority

if TYPE_CHECKING:
    import numpy as np

OFFLOAD_BYTES = 64 * 1024  # request bodies above this are prepared in a helper process
OFFLOAD_VALUES = 64 * 1024  # answers with more numbers than this are encoded in a helper process


class ApiError(Exception):
    """An HTTP error answer: ``status`` and a message saying what is wrong and what to do."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}

    def __reduce__(self) -> tuple:  # raised in a helper process, re-raised here
        return (ApiError, (self.status, self.message, self.headers))


@dataclass
class ServedModel:
    name: str
    bundle: Bundle

    @property
    def inputs(self) -> list[TensorSpec]:
        return self.bundle.manifest.inputs

    @property
    def outputs(self) -> list[TensorSpec]:
        return self.bundle.manifest.outputs

    @property
    def embeds(self) -> bool:
        return self.bundle.manifest.text is not None and self.task is None

    @property
    def task(self) -> str | None:
        """``"rerank"`` or ``"classify"`` for a scoring bundle, else None."""
        task = self.bundle.manifest.task
        return task.kind if task is not None else None

    @property
    def longest_bucket(self) -> int | None:
        """Bucketed static bundles with an attention mask take any sequence up to their longest bucket."""
        return longest_seq(self.bundle.manifest.buckets, self.inputs)

    @cached_property
    def index_limits(self) -> dict[str, int]:
        """Integer inputs that index a table (token ids, token types) → its rows: the bundled tokenizer's
        vocabulary for ``input_ids``, the ONNX graph's embedding tables for the others (as ``run`` checks)."""
        from edgeinfer.run.once import token_id_limits

        limits = token_id_limits(self.bundle.path, self.bundle)
        if self.bundle.manifest.text is not None:
            limits["input_ids"] = run_bundle.tokenizer(self.bundle).get_vocab_size(with_added_tokens=True)
        return limits

    def to_json(self, created: int) -> dict[str, Any]:
        m = self.bundle.manifest
        return {
            "id": self.name, "object": "model", "created": created, "owned_by": "edgeinfer",
            "backend": m.backend, "board": m.board, "scheme": m.scheme, "target": m.target,
            "inputs": [s.to_json() for s in m.inputs], "outputs": [s.to_json() for s in m.outputs],
            "endpoints": [*TEXT_ENDPOINTS.get(self.task or ("embed" if self.embeds else ""), ()), "/v1/infer"],
        }


Models = dict[str, ServedModel]
TEXT_ENDPOINTS = {"embed": ("/v1/embeddings",), "rerank": ("/v1/rerank",), "classify": ("/v1/classify",)}


@dataclass
class Prepared:
    """A request ready for the batcher."""

    model: str
    kind: str  # "embed" | "infer" | "score"
    feeds: dict[str, np.ndarray]
    rows: int
    key: tuple  # requests merge only with requests of the same key
    tokens: int = 0
    encoding: str = "float"
    dimensions: int | None = None
    id: str | None = None
    answer: dict[str, Any] | None = None  # what shapes a scoring answer (top_n, documents, ...)


# --- reading requests -----------------------------------------------------------------------------------


def elsewhere_error(model: str, endpoint: str, elsewhere: dict[str, str] | None) -> ApiError | None:
    """The 400 for a model that is served, but by other endpoints than ``endpoint`` (``elsewhere``: model
    name → the endpoints it serves)."""
    if elsewhere and model in elsewhere:
        return ApiError(400, f"model {model!r} is served on {elsewhere[model]}, not on {endpoint}; "
                             "send the request there")
    return None


def pick(models: Models, model: str | None, embeds: bool, elsewhere: dict[str, str] | None = None) -> ServedModel:
    if model is not None:
        m = models.get(model)
        if m is None:
            other = elsewhere_error(model, "/v1/embeddings" if embeds else "/v1/infer", elsewhere)
            if other is not None:
                raise other
            raise ApiError(404, f"unknown model {model!r}; GET /v1/models lists: {', '.join(models)}")
        if embeds and m.task is not None:
            raise ApiError(400, f"model {model!r} is a {m.task} model, served on /v1/{m.task}; send the request "
                                "there")
        if embeds and not m.embeds:
            raise ApiError(400, f"model {model!r} has no tokenizer (not an embedding model); use /v1/infer")
        return m
    cands = [m for m in models.values() if m.embeds or not embeds]
    if len(cands) == 1:
        return cands[0]
    if not cands:
        raise ApiError(400, "no embedding model is served; use /v1/infer")
    raise ApiError(400, f"several models are served; name one in 'model' ({', '.join(m.name for m in cands)})")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def read_json(body: bytes, content_type: str) -> Any:
    """The JSON document of a body; 400 on anything that is not strict JSON."""
    if content_type and "json" not in content_type.lower():
        raise ApiError(400, "body: send a JSON object with 'Content-Type: application/json'")
    if not body.strip():
        raise ApiError(400, "body: send a JSON object")
    try:
        data = json.loads(body, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise ApiError(400, f"body: not valid JSON (at character {e.pos})") from None
    except (ValueError, RecursionError) as e:  # bad UTF-8, NaN/Infinity, huge integers, deep nesting
        raise ApiError(400, f"body: not valid JSON ({' '.join(str(e).split())[:120] or 'nested too deep'})") from None
    if _SURROGATE_ESCAPE.search(body):  # rare: only then look at every string
        _check_unicode(data)
    return data


#: JSON may spell a UTF-16 surrogate (``\ud800``); json.loads keeps a lone one, which no tokenizer,
#: encoder or answer can take
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _check_unicode(data: Any) -> None:
    """400 naming the first string (value or key) of ``data`` that is not valid Unicode."""
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        value, where = stack.pop()
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for k, v in items:
            at = f"{where}.{k}" if where else str(k)
            try:
                if isinstance(k, str):
                    check_text(k, f"body: the key {at!r}")
                if isinstance(v, str):
                    check_text(v, at)
            except EdgeInferError as e:
                raise ApiError(400, e.one_line()) from None
            if isinstance(v, (dict, list)):
                stack.append((v, at))


def validated(schema: type[BaseModel], data: Any) -> Any:
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise ApiError(400, validation_message(exc.errors(include_url=False))) from None


CUSTOM_ERRORS = ("not_implemented", "top_logprobs")  # request-model checks whose message names the field


def validation_message(errs: list[Any]) -> str:
    """One line for pydantic's validation errors of a request body: where, what, and how many more."""
    first = errs[0] if errs else {}
    where = ".".join(str(x) for x in first.get("loc", ()) if x != "body") or "body"
    msg = first.get("msg", "invalid request")
    if first.get("type") == "json_invalid":
        where, msg = "body", "not valid JSON"
    elif where == "body" and first.get("type") in ("model_type", "model_attributes_type", "dict_type"):
        msg = "send a JSON object"
    elif first.get("type") == "extra_forbidden":
        msg = "not a field this endpoint takes (docs/serve.md lists them); remove it"
    if where == "body" and first.get("type") in CUSTOM_ERRORS:
        where, msg = "", msg  # the message names its field itself
    return (f"{where}: " if where else "") + msg + (f" (and {len(errs) - 1} more)" if len(errs) > 1 else "")


def prepare_embeddings(models: Models, body: bytes, content_type: str, max_inputs: int,
                       elsewhere: dict[str, str] | None = None) -> Prepared:
    req = validated(EmbeddingRequest, read_json(body, content_type))
    m = pick(models, req.model, embeds=True, elsewhere=elsewhere)
    texts = [req.input] if isinstance(req.input, str) else list(req.input)
    if not texts:
        raise ApiError(400, "input: give at least one string")
    if len(texts) > max_inputs:
        raise ApiError(400, f"input: at most {max_inputs} strings per request (--max-inputs), got {len(texts)}")
    try:
        feeds = run_bundle.tokenize_texts(m.bundle, texts)
    except EdgeInferError as e:
        raise ApiError(400, e.one_line()) from None
    mask = feeds.get("attention_mask")
    tokens = int(mask.sum()) if mask is not None else int(sum(len(t.split()) for t in texts))
    return Prepared(m.name, "embed", feeds, len(texts), ("embed",), tokens=tokens,
                    encoding=req.encoding_format, dimensions=req.dimensions)


def prepare_infer(models: Models, body: bytes, content_type: str, max_rows: int,
                  elsewhere: dict[str, str] | None = None) -> Prepared:
    req = validated(InferRequest, read_json(body, content_type))
    m = pick(models, req.model, embeds=False, elsewhere=elsewhere)
    feeds = parse_tensors(m, req.inputs, max_rows)
    check_indices(m, feeds)
    rows = len(next(iter(feeds.values())))
    key = ("infer",) + tuple((k, v.shape[1:]) for k, v in sorted(feeds.items()))
    return Prepared(m.name, "infer", feeds, rows, key, id=req.id)


INDEX_WORDS = {"input_ids": ("token id", "the vocabulary"), "token_type_ids": ("token type", "the token types")}


def check_indices(m: ServedModel, feeds: dict[str, np.ndarray]) -> None:
    """Token ids and token types must index the model's tables (a model may not check, or may crash)."""
    for name, rows in m.index_limits.items():
        arr = feeds.get(name)
        if arr is None or not arr.size:
            continue
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= rows:
            what, of = INDEX_WORDS.get(name, ("index", "the embedding table"))
            raise ApiError(400, f"input {name!r}: {what} {lo if lo < 0 else hi} is outside {of} of {m.name} "
                                f"(0..{rows - 1})")


def parse_tensors(m: ServedModel, inputs: dict[str, Any], max_rows: int) -> dict[str, np.ndarray]:
    """JSON arrays → arrays of the model's dtypes, checked against its specs (axis 0 free). 400 on anything odd."""

    if not inputs:
        raise ApiError(400, f"inputs: give the model's inputs ({', '.join(s.name for s in m.inputs)})")
    specs = {s.name: s for s in m.inputs}
    arrays: dict[str, np.ndarray] = {}
    for name, value in inputs.items():
        spec = specs.get(name)
        if spec is None:
            raise ApiError(400, f"unknown input {name!r}; the model's inputs are: {', '.join(specs)}")
        arrays[name] = to_array(name, value, spec)
    longest = m.longest_bucket
    relaxed = [TensorSpec(s.name, ("__rows__", *(("__seq__",) if longest and len(s.shape) > 1 else ()),
                                   *s.shape[1 + bool(longest and len(s.shape) > 1):]) if s.shape else s.shape,
                          s.dtype) for s in m.inputs]
    try:
        feeds = validate_feeds(relaxed, arrays)
    except EdgeInferError as e:
        raise ApiError(400, e.one_line().replace("'__rows__'", "the batch (axis 0)")
                       .replace("'__seq__'", "the sequence (axis 1)")) from None
    seq = max((v.shape[1] for v in feeds.values() if v.ndim > 1), default=0)
    if longest and seq > longest:
        raise ApiError(400, f"inputs: sequences of {seq} tokens are longer than the longest bucket of {m.name} "
                            f"({longest}); send at most {longest}")
    rows = {len(v) if v.ndim else 0 for v in feeds.values()}
    n = rows.pop() if len(rows) == 1 else 0
    if n < 1:
        raise ApiError(400, "inputs: every input needs a batch axis (axis 0) of at least one row")
    if n > max_rows:
        raise ApiError(400, f"inputs: at most {max_rows} rows per request (--max-inputs), got {n}")
    return feeds


def to_array(name: str, value: Any, spec: TensorSpec) -> np.ndarray:
    import numpy as np

    try:
        raw = np.array(value)
    except (ValueError, TypeError, OverflowError, RecursionError):
        raise ApiError(400, f"input {name!r}: not a rectangular array of numbers") from None
    if raw.dtype.kind not in "biuf":
        raise ApiError(400, f"input {name!r}: not a rectangular array of numbers within the {spec.dtype} range")
    want = np.dtype(spec.dtype)
    if want.kind in "iu" and raw.dtype.kind == "f":
        if not np.all(np.isfinite(raw)) or not np.all(raw == np.round(raw)):
            raise ApiError(400, f"input {name!r}: the model takes {spec.dtype}; send whole numbers")
    if want.kind in "iu" and raw.size:
        info = np.iinfo(want)
        lo, hi = raw.min().item(), raw.max().item()  # Python numbers: uint64 vs int64 compares exactly
        if lo < info.min or hi > info.max:
            raise ApiError(400, f"input {name!r}: values outside the {spec.dtype} range")
    if want.kind == "b" and raw.dtype.kind != "b":
        raise ApiError(400, f"input {name!r}: the model takes booleans; send true/false")
    try:
        with np.errstate(all="ignore"):
            return raw.astype(want)
    except (ValueError, TypeError, OverflowError):
        raise ApiError(400, f"input {name!r}: cannot be read as {spec.dtype}") from None


# --- encoding answers -----------------------------------------------------------------------------------


def check_finite(model: str, outputs: dict[str, np.ndarray]) -> None:
    """JSON has no NaN or Infinity: an answer holding them is a failed request (500), never invalid JSON."""
    import numpy as np

    for name, v in outputs.items():
        if v.dtype.kind in "fc" and not np.isfinite(v).all():
            raise ApiError(500, f"output {name!r} of model {model} holds NaN or Inf for this request; the model "
                                "produced non-numbers (check the bundle with `edgeinfer golden`)")


def dumps(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":"), allow_nan=False).encode()


def encode_embeddings(p: Prepared, vecs: np.ndarray) -> bytes:
    import numpy as np

    check_finite(p.model, {"embedding": vecs})
    if p.dimensions is not None and p.dimensions != vecs.shape[1]:
        raise ApiError(400, f"dimensions: model {p.model} gives {vecs.shape[1]}, not {p.dimensions}")
    if p.encoding == "base64":
        data: list[Any] = [base64.b64encode(np.ascontiguousarray(v, dtype="<f4").tobytes()).decode() for v in vecs]
    else:
        data = vecs.tolist()
    return dumps({
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(data)],
        "model": p.model,
        "usage": {"prompt_tokens": p.tokens, "total_tokens": p.tokens},
    })


def encode_infer(rid: str, model: str, outputs: dict[str, np.ndarray]) -> bytes:
    check_finite(model, outputs)
    return dumps({
        "id": rid, "model": model,
        "outputs": {k: {"dtype": v.dtype.name, "shape": list(v.shape), "data": v.tolist()}
                    for k, v in outputs.items()},
    })


# --- running it off the event loop ------------------------------------------------------------------------


_TABLES: dict[str, Any] = {}  # in a helper process: what the preparing functions take first


def _init(tables: dict[str, Any]) -> None:
    from edgeinfer.serve.child import return_freed_heap

    _TABLES.update(tables)
    return_freed_heap()  # what unpickling the tokenizers (a parse of each tokenizer.json) freed
    lower_priority()


def _call(fn: Callable[..., Any], args: tuple, table: str | None) -> Any:
    return fn(_TABLES[table], *args) if table is not None else fn(*args)


def _kill_late_helpers(broken: ProcessPoolExecutor) -> None:
    """Kills the helpers a broken pool still has. CPython's ``submit`` can start a helper while the pool's
    manager thread tears the broken pool down (it terminates the helpers it listed before the new one was
    added); that helper would wait on a closed queue for ever, holding its memory. ``_processes`` is the
    pool's own table of its helpers (private: there is no public one)."""
    for helper in list((broken._processes or {}).values()):
        if helper.is_alive():
            helper.kill()
            helper.join(5)


def _handing_back_the_gil(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` with a 1 ms switch interval: the event loop gets the GIL back from a template's Python steps
    that often (5 ms held /health's p99 at 25-60 ms; process-wide, 1 ms slowed --in-process decoders: serve.md)."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    try:
        return fn(*args)
    finally:
        sys.setswitchinterval(old)


class Offload:
    """Runs request work inline when it is small (or on one thread, ``threaded``: a chat template) and in up
    to ``processes`` helper processes (spawned) when it is large. The helpers start when a large request first
    needs one, so a server that only gets small requests never pays their ~70 MiB each; ``processes=0`` runs
    everything here (threaded work on the thread). A helper that dies (e.g. out of memory) fails its request
    with 500; the pool is renewed on the next large request. The helpers hold the served models (``models``:
    embedding and tensor bundles, ``decoders``: decoder engines, whose tokenizer and chat template they run)."""

    def __init__(self, models: Models, processes: int = 2, decoders: dict[str, Any] | None = None):
        self.tables = {"models": models, "decoders": decoders or {}}
        self.processes = processes
        self._open = False
        self._pool: ProcessPoolExecutor | None = None
        self._threads: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        self._open = True

    def _inline(self, heavy: bool) -> bool:
        return not heavy or not self._open or self.processes == 0

    async def prepare(self, heavy: bool, fn: Callable[..., Any], *args: Any, table: str = "models",
                      threaded: bool = False) -> Any:
        """``fn(models, *args)`` (``fn(decoders, *args)`` with ``table="decoders"``); ``threaded``: where it is
        not sent to a helper, on this server's one preparing thread instead of the event loop (a chat template)."""
        if not self._inline(heavy):
            return await self._submit(fn, args, table)
        if threaded:
            return await asyncio.get_running_loop().run_in_executor(self._thread(), _handing_back_the_gil, fn,
                                                                    self.tables[table], *args)
        return fn(self.tables[table], *args)

    def _thread(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(1, thread_name_prefix="edgeinfer-prepare")
            return self._threads

    async def encode(self, heavy: bool, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``."""
        return fn(*args) if self._inline(heavy) else await self._submit(fn, args, None)

    def _submit_now(self, fn: Callable[..., Any], args: tuple, table: str | None) -> tuple[Any, Any]:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(self.processes, mp_context=mp.get_context("spawn"),
                                                 initializer=_init, initargs=(self.tables,))
            pool = self._pool
        try:
            return pool, pool.submit(_call, fn, args, table)
        except BrokenProcessPool:  # a helper died since the last call
            self._renew(pool)
            raise

    def _renew(self, broken: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is broken:
                self._pool = None  # the next large request starts new helpers
        _kill_late_helpers(broken)

    async def _submit(self, fn: Callable[..., Any], args: tuple, table: str | None) -> Any:
        try:
            # submit() may start a helper process (slow): never on the event loop
            pool, future = await asyncio.to_thread(self._submit_now, fn, args, table)
            try:
                return await asyncio.wrap_future(future)
            except BrokenProcessPool:
                await asyncio.to_thread(self._renew, pool)
                raise
        except BrokenProcessPool:
            raise ApiError(500, "the helper process working on this request died (out of memory?); "
                                "retry, or send a smaller request") from None

    def stop(self) -> None:
        self._open = False
        with self._lock:
            pool, self._pool = self._pool, None
            threads, self._threads = self._threads, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        if threads is not None:
            threads.shutdown(wait=False, cancel_futures=True)  # a running template ends by its own bound
