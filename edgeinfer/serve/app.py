"""The Starlette app and the uvicorn server behind ``edgeinfer serve``."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import json
import logging
import os
import signal
import socket
import threading
import time
import uuid
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edgeinfer.contract import remote_code
from edgeinfer.errors import BackendError, EdgeInferError, InputError
from edgeinfer.model import decoder_bundle
from edgeinfer.model.bundle import Bundle, not_a_bundle
from edgeinfer.model.kind import Kind, kind
from edgeinfer.run import bundle as run_bundle
from edgeinfer.serve import child
from edgeinfer.serve.api import Api
from edgeinfer.serve.batcher import Batcher
from edgeinfer.serve.budget import check_budget
from edgeinfer.serve.config import KEY_REFUSAL, ServeConfig, authorized
from edgeinfer.serve.decoder_engine import Engine, ServedDecoder, open_served_decoder
from edgeinfer.serve.decoder_routes import add_routes as add_decoder_routes
from edgeinfer.serve.encoder_routes import add_routes as add_encoder_routes
from edgeinfer.serve.metrics import ENDPOINTS, Metrics
from edgeinfer.serve.placement import check_devices
from edgeinfer.serve.prep import ApiError, Offload, ServedModel
from edgeinfer.serve.workers import WorkerPool

log = logging.getLogger("edgeinfer.serve")
requests_log = logging.getLogger("edgeinfer.serve.requests")


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": ERROR_TYPES.get(status, "error"), "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "request_too_large", 429: "rate_limit_error", 500: "server_error",
          503: "service_unavailable", 504: "timeout"}


def open_models(paths: list[Path], ctx: int | None = None, slots: int = 1
                ) -> tuple[dict[str, ServedModel], dict[str, ServedDecoder]]:
    """Open every bundle (manifest and artifacts checked here, before any worker starts): embedding and
    tensor bundles, and decoders (decoder bundles, Hugging Face decoder directories) with ``slots``
    sequences at once."""
    models: dict[str, ServedModel] = {}
    decoders: dict[str, ServedDecoder] = {}
    for p in paths:
        match kind(p, "bundle"):
            case Kind.DECODER_DIR | Kind.DECODER_FILE:
                remote_code.allowed(p)  # serve never runs a model directory's own code (docs/security.md)
                llm = open_served_decoder(p, ctx=ctx)
            case Kind.DECODER_BUNDLE | Kind.ENCODER_BUNDLE as k:
                bundle = Bundle.open(p, verify="full")  # every file hashed once at start-up (docs/deploy.md)
                llm = open_served_decoder(p, bundle, ctx) if k is Kind.DECODER_BUNDLE else None
                if llm is not None:
                    decoder_bundle.check_slots(bundle, slots)
            case _:
                raise not_a_bundle(p)
        name = llm.name if llm is not None else bundle.path.resolve().name
        if name in models or name in decoders:
            raise InputError(f"two bundles are both named {name!r}; serve bundles from directories with distinct "
                             "names")
        if llm is not None:
            decoders[name] = llm
            continue
        if bundle.manifest.text is not None:
            load_tokenizer_now(bundle)
        models[name] = ServedModel(name, bundle)
        models[name].index_limits  # noqa: B018 - read once at start-up, before the helper processes copy it
    child.return_freed_heap()  # what parsing the tokenizers freed
    return models, decoders


def load_tokenizer_now(bundle: Bundle) -> None:
    """A broken tokenizer fails at start-up (exit 2), not on every request."""
    try:
        run_bundle.tokenizer(bundle)
    except EdgeInferError:
        raise
    except Exception as e:  # noqa: BLE001 - the tokenizers library raises plain Exceptions on bad files
        text = " ".join(str(e).split())[:160] or type(e).__name__
        raise InputError(f"bundle {bundle.path}: its tokenizer cannot be read ({text})",
                         "deploy the model again") from None


# --- the app ------------------------------------------------------------------------------------------


class State:
    def __init__(self) -> None:
        self.ready = False
        self.draining = False
        self.fatal: str | None = None
        self.started = int(time.time())
        self.server: Any = None
        self.engines: dict[str, Engine] = {}


def create_app(config: ServeConfig, models: dict[str, ServedModel] | None = None,
               decoders: dict[str, ServedDecoder] | None = None) -> Starlette:
    if models is None:
        models, decoders = open_models(config.bundles, config.ctx, config.slots)
    decoders = decoders or {}
    state = State()
    pool = WorkerPool([(m.name, m.bundle.path) for m in models.values()], config.devices, config.max_batch,
                      config.max_restarts, config.restart_window_s, stop_grace_s=config.timeout_s)
    metrics = Metrics(pool, [m.bundle.manifest.backend for m in models.values()],
                      queue_depth=lambda: {m: batcher.depth_of(m) for m in batcher.queues})
    batcher = Batcher(pool, list(models), config.max_batch, config.batch_window_ms / 1000.0, config.max_queue,
                      observe=metrics.observe)
    pool.on_restart = lambda w: metrics.worker_restarts.labels(str(w.index)).inc()
    cpus = os.cpu_count() or 1
    spin_wait = config.spin_wait(len(decoders), cpus)
    if spin_wait is False:
        log.info("%d decoders share %d CPUs: their runtimes' idle threads will not busy-wait (for cores of their own "
                 "instead: --threads N with N x %d <= %d)", len(decoders), cpus, len(decoders), cpus)
    engines = {n: Engine(m, config.slots, config.max_queue, config.prefill_chunk,
                         config.devices[0] if config.devices else None, config.max_restarts, config.restart_window_s,
                         observe=metrics.observe, threads=config.threads, in_process=config.in_process,
                         spin_wait=spin_wait)
               for n, m in decoders.items()}
    state.engines = engines

    offload = Offload(models, config.request_helpers, decoders)
    endpoints = {**{n: " and ".join(m.to_json(0)["endpoints"]) for n, m in models.items()},
                 **{n: "/v1/chat/completions and /v1/completions" for n in decoders}}

    def starting() -> ApiError:
        ready = (len(models) if pool.ready() else 0) + sum(e.ready() for e in engines.values())
        return ApiError(503, f"starting: {ready} of {len(models) + len(engines)} models ready; retry in a moment",
                        {"Retry-After": "2"})

    def refusal(model: str) -> ApiError | None:
        """None when decoder ``model`` takes requests now (also while it restarts after a crash: they wait)."""
        if state.draining:
            return ApiError(503, "the server is shutting down; retry elsewhere", {"Retry-After": "5"})
        if state.fatal:
            return ApiError(503, f"the models could not be loaded: {state.fatal}")
        if not (state.ready or engines[model].ready()):
            return starting()
        return None

    @asynccontextmanager
    async def lifespan(app: Starlette):
        batcher.start()
        offload.start()

        async def start_workers() -> None:
            try:
                await asyncio.gather(*([pool.start()] if models else []), *(e.start() for e in engines.values()))
            except Exception as e:  # noqa: BLE001
                state.fatal = str(e)
                log.error("%s", e)
                if state.server is not None:
                    state.server.should_exit = True
                return
            state.ready = True
            log.info("ready: %s on http://%s:%s", ", ".join([*models, *engines]), config.host,
                     state.server.config.port if state.server else config.port)

        starter = asyncio.create_task(start_workers())
        try:
            yield
        finally:
            state.draining = True
            starter.cancel()
            await batcher.stop()
            # together, so the whole stop takes at most one grace period (supervisor.STOP_GRACE_S)
            await asyncio.gather(asyncio.to_thread(pool.stop), *(asyncio.to_thread(e.stop) for e in engines.values()))
            await asyncio.to_thread(offload.stop)

    api = Api("edgeinfer serve", "1", "Embeddings, scoring, tensor inference and OpenAI-compatible generation on "
              "edge accelerators, with dynamic batching.")
    key = config.api_key.encode() if config.api_key else None

    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.headers)

    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), exc.headers)

    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s", request.url.path)
        return error_response(500, f"internal error {type(exc).__name__}: {exc}")

    add_encoder_routes(api, batcher, offload, config, state, starting, endpoints, metrics.observe)

    @api.get("/v1/models", tag="service")
    async def list_models(request: Request) -> JSONResponse:
        """The served models with their backend, scheme and tensor specs."""
        return JSONResponse({"object": "list", "data": [m.to_json(state.started) for m in models.values()]
                             + [e.llm.to_json(state.started, e.slots) for e in engines.values()]})

    @api.get("/health", tag="service")
    async def health(request: Request) -> JSONResponse:
        """Alive (no authentication)."""
        return JSONResponse({"status": "ok"})

    @api.get("/ready", tag="service", responses={503: "loading, failed or shutting down"})
    async def ready(request: Request) -> JSONResponse:
        """Models loaded and warmed up on at least one worker, and not shutting down."""
        ok = (state.ready and (pool.ready() or not models) and all(e.ready() for e in engines.values())
              and not state.draining)
        body = {"ready": ok, "draining": state.draining, "error": state.fatal, "models": [*models, *engines],
                "workers": [w.to_json() for w in pool.workers] if models else [],
                "decoders": [e.to_json() for e in engines.values()]}
        return JSONResponse(body, status_code=200 if ok else 503)

    @api.get("/metrics", tag="service")
    def prometheus(request: Request) -> Response:
        """Prometheus metrics."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        metrics.refresh_queue()
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    if engines:  # the generation endpoints exist when a decoder is served
        add_decoder_routes(api, engines, config.generation_timeout_s, refusal, metrics.observe,
                   functools.partial(offload.prepare, table="decoders"), endpoints)
    app = Starlette(routes=api.routes(), lifespan=lifespan,
                    exception_handlers={ApiError: _api_error, HTTPException: _http, Exception: _internal})
    app.state.serve = state
    app.state.pool = pool
    app.state.metrics = metrics
    app.add_middleware(GuardMiddleware, key=key, limit=config.max_body_bytes, metrics=metrics)
    return app


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
            if not authorized(self.key, path, headers.get("authorization", b"")):
                return await reply(error_response(401, KEY_REFUSAL, {"WWW-Authenticate": "Bearer"}))
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


def _protocol_class(metrics: Metrics):
    """uvicorn's HTTP/1.1 protocol on httptools (llhttp, C) where it is installed, else on h11 (pure Python):
    every streamed token is one chunk through it, and h11 frames each chunk in Python (bench/README.md,
    "HTTP protocol")."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Base
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol as Base

    class Protocol(Base):
        """A request it cannot parse (e.g. a non-numeric Content-Length) gets a JSON error like every other
        answer, and is counted in /metrics."""

        def send_400_response(self, msg: str) -> None:
            metrics.requests.labels("malformed", "400").inc()
            body = json.dumps({"error": {"message": "malformed HTTP request (request line, a header or "
                                         "Content-Length); send valid HTTP/1.1", "type": ERROR_TYPES[400],
                                         "code": 400}}).encode()
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
                                 b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))
            self.transport.close()

    return Protocol


def listen(host: str, port: int) -> socket.socket:
    """Bind the listening socket before anything starts, so a busy port or a bad host is a one-line error."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise InputError(f"--host {host!r}: not an address of this machine ({e})",
                         "use 127.0.0.1, 0.0.0.0 or an address of a local interface") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as e:
        sock.close()
        busy = e.errno == errno.EADDRINUSE
        raise InputError(f"cannot listen on {host}:{port}: {e.strerror or e}",
                         "choose another --port (0: any free port) or --host",
                         kind="port_in_use" if busy else "bad_input") from None
    return sock


def serve(config: ServeConfig, log_level: str = "info") -> None:
    """Run the service until SIGTERM/SIGINT; raise BackendError when the models cannot be loaded."""
    import uvicorn

    logging.basicConfig(level=getattr(logging, log_level.upper()),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    sock = listen(config.host, config.port)  # a busy port is a one-line error before bundles are hashed
    try:
        models, decoders = open_models(config.bundles, config.ctx, config.slots)
        check_devices([m.bundle.manifest.backend for m in models.values()] + [m.backend for m in decoders.values()],
                      config.devices)
        check_budget(models, decoders, config)  # before any worker loads a model
    except BaseException:
        sock.close()
        raise
    config.port = sock.getsockname()[1]
    app = create_app(config, models, decoders)
    uv = uvicorn.Config(app, host=config.host, port=config.port, log_level=log_level, lifespan="on",
                        access_log=log_level == "debug", timeout_graceful_shutdown=None,
                        http=_protocol_class(app.state.metrics), ws="none",  # no WebSocket route: not imported
                        h11_max_incomplete_event_size=config.max_body_bytes + 65536)
    server = _server_class()(uv)
    state: State = app.state.serve
    state.server = server

    def draining() -> None:
        """SIGTERM: no new requests; running generations get ``timeout_s`` to finish, then are cancelled."""
        state.draining = True
        loop = asyncio.get_event_loop()
        for e in state.engines.values():
            loop.call_soon_threadsafe(loop.call_later, config.timeout_s, e.cancel_all)

    server.draining_hook = draining
    server.run(sockets=[sock])
    if state.fatal:
        raise BackendError(state.fatal, "run `edgeinfer doctor` and check the bundle with `edgeinfer run`")
