"""The FastAPI app and the uvicorn server behind ``edgeinfer serve``."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import json
import logging
import signal
import threading
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..backend import TensorSpec, validate_feeds
from ..bundle import Bundle
from ..errors import BackendError, EdgeInferError, InputError
from .batcher import Batcher, Item, QueueFull, RequestFailed
from .config import ServeConfig
from .metrics import ENDPOINTS, Metrics
from .workers import WorkerPool

log = logging.getLogger("edgeinfer.serve")
requests_log = logging.getLogger("edgeinfer.serve.requests")


# --- request / response schemas (these make the OpenAPI document) ------------------------------------


class EmbeddingRequest(BaseModel):
    """OpenAI-compatible embeddings request."""

    model_config = ConfigDict(extra="ignore")
    input: Union[str, list[str]] = Field(description="A string or a list of strings to embed.")
    model: str | None = Field(None, description="Model id from /v1/models (optional when one embedding model is served).")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, description="Must equal the model's dimension when given.")
    user: str | None = None


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: Union[list[float], str]


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: Usage


class InferRequest(BaseModel):
    """Named input tensors as (nested) JSON arrays; axis 0 is the batch. Dtypes follow the model's specs."""

    model_config = ConfigDict(extra="forbid")
    inputs: dict[str, Any] = Field(description="Input name → nested JSON array (axis 0 is the batch).")
    model: str | None = Field(None, description="Model id from /v1/models (optional when one model is served).")
    id: str | None = Field(None, max_length=200, description="Echoed back in the response.")


class Tensor(BaseModel):
    dtype: str
    shape: list[int]
    data: Any


class InferResponse(BaseModel):
    id: str
    model: str
    outputs: dict[str, Tensor]


class ErrorBody(BaseModel):
    message: str
    type: str
    code: int


class ErrorResponse(BaseModel):
    error: ErrorBody


ERRORS = {c: {"model": ErrorResponse} for c in (400, 401, 404, 413, 429, 500, 503, 504)}


class ApiError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "request_too_large", 429: "rate_limit_error", 500: "server_error",
          503: "service_unavailable", 504: "timeout"}


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": _TYPES.get(status, "error"), "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


def json_bytes(data: Any) -> Response:
    return Response(json.dumps(data, separators=(",", ":")).encode(), media_type="application/json")


# --- the served models ----------------------------------------------------------------------------


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
        return self.bundle.manifest.text is not None

    def to_json(self, created: int) -> dict[str, Any]:
        m = self.bundle.manifest
        return {
            "id": self.name, "object": "model", "created": created, "owned_by": "edgeinfer",
            "backend": m.backend, "board": m.board, "scheme": m.scheme, "target": m.target,
            "inputs": [s.to_json() for s in m.inputs], "outputs": [s.to_json() for s in m.outputs],
            "endpoints": (["/v1/embeddings"] if self.embeds else []) + ["/v1/infer"],
        }


def open_models(paths: list[Path]) -> dict[str, ServedModel]:
    """Open every bundle (manifest and artifacts checked here, before any worker starts)."""
    models: dict[str, ServedModel] = {}
    for p in paths:
        bundle = Bundle.open(p, verify="full")  # every file hashed once at start-up (docs/deploy.md)
        name = bundle.path.resolve().name
        if name in models:
            raise InputError(f"two bundles are both named {name!r}; serve bundles from directories with distinct names")
        if bundle.manifest.text is not None:
            bundle._tokenizer  # noqa: B018 - load it now: a broken tokenizer fails at start-up, not per request
        models[name] = ServedModel(name, bundle)
    return models


# --- the app ------------------------------------------------------------------------------------------


class State:
    def __init__(self) -> None:
        self.ready = False
        self.draining = False
        self.fatal: str | None = None
        self.started = int(time.time())
        self.server: Any = None


def create_app(config: ServeConfig, models: dict[str, ServedModel] | None = None) -> FastAPI:
    models = models if models is not None else open_models(config.bundles)
    state = State()
    pool = WorkerPool([(m.name, m.bundle.path) for m in models.values()], config.devices, config.max_batch,
                      config.max_restarts, config.restart_window_s)
    batcher_box: dict[str, Batcher] = {}
    metrics = Metrics(pool, [m.bundle.manifest.backend for m in models.values()],
                      queue_depth=lambda: {m: b.depth_of(m) for b in batcher_box.values() for m in b.queues})
    pool.on_restart = lambda w: metrics.worker_restarts.labels(str(w.index)).inc()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        batcher = Batcher(pool, list(models), config.max_batch, config.batch_window_ms / 1000.0, config.max_queue,
                          observe=metrics.observe)
        batcher.start()
        batcher_box["b"] = batcher

        async def start_workers() -> None:
            try:
                await pool.start()
            except Exception as e:  # noqa: BLE001
                state.fatal = str(e)
                log.error("%s", e)
                if state.server is not None:
                    state.server.should_exit = True
                return
            state.ready = True
            log.info("ready: %s on http://%s:%s", ", ".join(models), config.host,
                     state.server.config.port if state.server else config.port)

        starter = asyncio.create_task(start_workers())
        try:
            yield
        finally:
            state.draining = True
            starter.cancel()
            await batcher.stop()
            await asyncio.to_thread(pool.stop)

    app = FastAPI(title="edgeinfer serve", version="1", lifespan=lifespan,
                  description="Embeddings and tensor inference on edge accelerators, with dynamic batching.")
    app.state.serve = state
    app.state.pool = pool
    app.state.metrics = metrics

    # --- middleware: auth, body limit, request id, metrics (one pure ASGI layer) -------------------
    key = config.api_key.encode() if config.api_key else None
    limit = config.max_body_bytes

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        first = errs[0] if errs else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body") or "body"
        msg = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            where, msg = "body", "not valid JSON" + (f" (at character {first['loc'][-1]})" if first.get("loc") else "")
        elif where == "body" and first.get("type") in ("model_attributes_type", "dict_type"):
            ctype = request.headers.get("content-type", "")
            msg = "send a JSON object" + ("" if "json" in ctype else " with 'Content-Type: application/json'")
        return error_response(400, f"{where}: {msg}" + (f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s", request.url.path)
        return error_response(500, f"internal error {type(exc).__name__}: {exc}")

    # --- helpers -----------------------------------------------------------------------------------
    def pick(model: str | None, embeds: bool) -> ServedModel:
        if model is not None:
            m = models.get(model)
            if m is None:
                raise ApiError(404, f"unknown model {model!r}; GET /v1/models lists: {', '.join(models)}")
            if embeds and not m.embeds:
                raise ApiError(400, f"model {model!r} has no tokenizer (not an embedding model); use /v1/infer")
            return m
        cands = [m for m in models.values() if m.embeds or not embeds]
        if len(cands) == 1:
            return cands[0]
        if not cands:
            raise ApiError(400, "no embedding model is served; use /v1/infer")
        raise ApiError(400, f"several models are served; name one in 'model' ({', '.join(m.name for m in cands)})")

    async def submit(m: ServedModel, kind: str, feeds: dict[str, np.ndarray], rows: int, key: tuple) -> dict:
        if state.fatal:
            raise ApiError(503, f"the models could not be loaded: {state.fatal}")
        batcher = batcher_box["b"]
        loop = asyncio.get_running_loop()
        item = Item(m.name, kind, feeds, rows, key, loop.create_future())
        try:
            batcher.submit(item)
        except QueueFull:
            raise ApiError(429, f"the queue is full ({config.max_queue} requests waiting); retry shortly",
                           {"Retry-After": "1"}) from None
        try:
            return await asyncio.wait_for(asyncio.shield(item.future), config.timeout_s)
        except asyncio.TimeoutError:
            item.cancelled = True
            raise ApiError(504, f"no answer within {config.timeout_s:g} s (server busy); retry or raise --timeout-s") from None
        except RequestFailed as e:
            raise ApiError(e.status, e.message) from None

    # --- endpoints ---------------------------------------------------------------------------------
    @app.post("/v1/embeddings", response_model=EmbeddingResponse, responses=ERRORS, tags=["inference"])
    async def embeddings(req: EmbeddingRequest):
        """Embed one string or a list of strings (OpenAI-compatible)."""
        m = pick(req.model, embeds=True)
        texts = [req.input] if isinstance(req.input, str) else list(req.input)
        if not texts:
            raise ApiError(400, "input: give at least one string")
        if len(texts) > config.max_inputs:
            raise ApiError(400, f"input: at most {config.max_inputs} strings per request, got {len(texts)}")
        try:
            feeds = m.bundle.tokenize(texts)
        except EdgeInferError as e:
            raise ApiError(400, e.one_line()) from None
        mask = feeds.get("attention_mask")
        tokens = int(mask.sum()) if mask is not None else int(sum(len(t.split()) for t in texts))
        out = await submit(m, "embed", feeds, len(texts), ("embed",))
        vecs = out["embedding"]
        if req.dimensions is not None and req.dimensions != vecs.shape[1]:
            raise ApiError(400, f"dimensions: model {m.name} gives {vecs.shape[1]}, not {req.dimensions}")
        if req.encoding_format == "base64":
            data = [base64.b64encode(np.ascontiguousarray(v, dtype="<f4").tobytes()).decode() for v in vecs]
        else:
            data = vecs.tolist()
        return json_bytes({
            "object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(data)],
            "model": m.name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        })

    @app.post("/v1/infer", response_model=InferResponse, responses=ERRORS, tags=["inference"])
    async def infer(req: InferRequest, request: Request):
        """Run named tensors (axis 0 is the batch; requests are merged along it)."""
        m = pick(req.model, embeds=False)
        feeds = parse_tensors(m, req.inputs, config.max_inputs)
        rows = len(next(iter(feeds.values())))
        key = ("infer",) + tuple((k, v.shape[1:]) for k, v in sorted(feeds.items()))
        out = await submit(m, "infer", feeds, rows, key)
        rid = req.id or request.headers.get("x-request-id") or uuid.uuid4().hex
        return json_bytes({
            "id": rid, "model": m.name,
            "outputs": {k: {"dtype": v.dtype.name, "shape": list(v.shape), "data": v.tolist()} for k, v in out.items()},
        })

    @app.get("/v1/models", tags=["service"])
    async def list_models():
        """The served models with their backend, scheme and tensor specs."""
        return {"object": "list", "data": [m.to_json(state.started) for m in models.values()]}

    @app.get("/health", tags=["service"])
    async def health():
        """Alive (no authentication)."""
        return {"status": "ok"}

    @app.get("/ready", tags=["service"], responses={503: {"description": "loading, failed or shutting down"}})
    async def ready():
        """Models loaded and warmed up on at least one worker, and not shutting down."""
        ok = state.ready and pool.ready() and not state.draining
        body = {"ready": ok, "draining": state.draining, "error": state.fatal,
                "models": list(models), "workers": [w.to_json() for w in pool.workers]}
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics", tags=["service"], response_class=Response)
    def prometheus():
        """Prometheus metrics."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        metrics.refresh_queue()
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(GuardMiddleware, key=key, limit=limit, metrics=metrics)
    return app


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
    relaxed = [TensorSpec(s.name, ("__rows__", *s.shape[1:]) if s.shape else s.shape, s.dtype) for s in m.inputs]
    try:
        feeds = validate_feeds(relaxed, arrays)
    except EdgeInferError as e:
        raise ApiError(400, e.one_line().replace("'__rows__'", "the batch (axis 0)")) from None
    rows = {len(v) if v.ndim else 0 for v in feeds.values()}
    n = rows.pop() if len(rows) == 1 else 0
    if n < 1:
        raise ApiError(400, "inputs: every input needs a batch axis (axis 0) of at least one row")
    if n > max_rows:
        raise ApiError(400, f"inputs: at most {max_rows} rows per request, got {n}")
    return feeds


def to_array(name: str, value: Any, spec: TensorSpec) -> np.ndarray:
    try:
        raw = np.array(value)
    except (ValueError, TypeError, OverflowError):
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


# --- pure ASGI middleware: auth, body limit, request id, metrics ---------------------------------------


class GuardMiddleware:
    def __init__(self, app: Any, key: bytes | None, limit: int, metrics: Metrics):
        self.app, self.key, self.limit, self.metrics = app, key, limit, metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        path = scope.get("path", "")
        endpoint = path if path in ENDPOINTS else "other"
        headers = {k.decode("latin-1").lower(): v for k, v in scope.get("headers", [])}
        rid = headers.get("x-request-id", b"").decode("latin-1")[:200] or uuid.uuid4().hex
        status_box = {"status": 500}
        requests_log.debug("accepted %s %s id=%s", scope.get("method"), path, rid)

        async def send_wrapped(message: dict) -> None:
            if message["type"] == "http.response.start":
                status_box["status"] = message["status"]
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + [(b"x-request-id", rid.encode("latin-1"))]
            await send(message)

        async def reply(resp: Response) -> None:
            await resp(scope, receive, send_wrapped)

        try:
            if self.key is not None and path != "/health":
                auth = headers.get("authorization", b"")
                scheme, _, given = auth.partition(b" ")
                if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.key):
                    return await reply(error_response(401, "missing or wrong API key: send 'Authorization: Bearer KEY'",
                                                      {"WWW-Authenticate": "Bearer"}))
            if scope.get("method") in ("POST", "PUT", "PATCH"):
                declared = headers.get("content-length")
                if declared is not None:
                    try:
                        too_big = int(declared) > self.limit
                    except ValueError:
                        return await reply(error_response(400, "bad Content-Length header"))
                    if too_big:
                        return await reply(error_response(413, f"the body is larger than {self.limit} bytes"))
                body = bytearray()
                more = True
                while more:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return
                    body += message.get("body", b"")
                    more = message.get("more_body", False)
                    if len(body) > self.limit:
                        return await reply(error_response(413, f"the body is larger than {self.limit} bytes"))
                sent = False

                async def replay() -> dict:
                    nonlocal sent
                    if not sent:
                        sent = True
                        return {"type": "http.request", "body": bytes(body), "more_body": False}
                    return await receive()

                return await self.app(scope, replay, send_wrapped)
            return await self.app(scope, receive, send_wrapped)
        finally:
            self.metrics.requests.labels(endpoint, str(status_box["status"])).inc()
            self.metrics.latency.labels(endpoint).observe(time.perf_counter() - t0)
            requests_log.debug("answered %s id=%s status=%s", path, rid, status_box["status"])


# --- server ---------------------------------------------------------------------------------------------


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, but SIGTERM/SIGINT end with exit 0 after the graceful drain
        (uvicorn re-raises the signal after shutdown, which would kill the process with it)."""

        draining_hook: Any = None

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            originals = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, h in originals.items():
                    signal.signal(s, h)

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.draining_hook is not None:
                self.draining_hook()
            super().handle_exit(sig, frame)

    return Server


def serve(config: ServeConfig, log_level: str = "info") -> None:
    """Run the service until SIGTERM/SIGINT; raise BackendError when the models cannot be loaded."""
    import uvicorn

    logging.basicConfig(level=getattr(logging, log_level.upper()), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    models = open_models(config.bundles)
    app = create_app(config, models)
    uv = uvicorn.Config(app, host=config.host, port=config.port, log_level=log_level, lifespan="on",
                        access_log=log_level == "debug", timeout_graceful_shutdown=None,
                        h11_max_incomplete_event_size=config.max_body_bytes + 65536)
    server = _server_class()(uv)
    state: State = app.state.serve
    state.server = server

    def draining() -> None:
        state.draining = True

    server.draining_hook = draining
    server.run()
    if state.fatal:
        raise BackendError(state.fatal, "run `edgeinfer doctor` and check the bundle with `edgeinfer run`")
