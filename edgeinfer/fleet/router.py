"""The Serve application of ``serve --ray``: one deployment per bundle (edgeinfer/fleet/replicas.py) behind a
router deployment, the HTTP ingress with the single-box server's paths and error shape. The router sends each
request to the deployment of the model it names, relays decoder streams chunk by chunk, and answers
``/metrics`` with its own counters and the replicas' pushed registries (edgeinfer/fleet/metrics.py)."""

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from edgeinfer import telemetry
from edgeinfer.fleet.replicas import APP, ROUTER, BundleReplica, DecoderReplica, error

REPLICA_CPUS = 0.5
ROUTER_CPUS = 0.25
# Serve's default (5 ongoing requests per replica) makes the router itself the queue: the proxy backs off and
# retries while all its slots are taken (bench/fleet.py measured 9 req/s at 32 clients, against 41 at 8). The
# router only awaits; the replicas keep a small queue each so that a request waits where it will run.
ROUTER_ONGOING = 4096
REFRESH_S = 5.0  # the longest a /metrics scrape waits for Ray's fleet state (Prometheus' default timeout: 10 s)
REPLICA_ONGOING = 8
# Autoscaling on queue length: Serve adds replicas when the requests per replica (running + queued) stay above
# the target. A decoder replica runs --slots sequences at once and holds as many more in its own queue; an
# embedding replica answers one request at a time, so a couple waiting is already a queue.
BUNDLE_TARGET_ONGOING = 2
UPSCALE_DELAY_S = 10.0
DOWNSCALE_DELAY_S = 120.0
# Serve's timing of the autoscaler, overridable for tests and tuning: a JSON object of these keys in
# EDGEINFER_RAY_AUTOSCALING, e.g. '{"upscale_delay_s": 1, "downscale_delay_s": 3, "look_back_period_s": 2,
# "metrics_interval_s": 0.5}' (metrics_interval_s is how often handles report queue lengths; Serve's default 10 s)
AUTOSCALING_ENV = "EDGEINFER_RAY_AUTOSCALING"
TIMING_KEYS = ("upscale_delay_s", "downscale_delay_s", "look_back_period_s", "metrics_interval_s")
# A request whose replica failed before anything reached the client is sent again (Serve routes it to a live
# replica: it marks a dead one as soon as a call to it fails), at most this many times more.
RETRIES = 2


def _model_name(body: bytes) -> str | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data.get("model") if isinstance(data, dict) and isinstance(data.get("model"), str) else None


def timing() -> dict[str, float]:
    """The autoscaler's delays: ours, and what ``EDGEINFER_RAY_AUTOSCALING`` sets (an InputError when it is not a
    JSON object of seconds under ``TIMING_KEYS`` within Serve's bounds: AutoscalingConfig in ray/serve/config.py)."""
    import os

    from edgeinfer.errors import InputError

    out = {"upscale_delay_s": UPSCALE_DELAY_S, "downscale_delay_s": DOWNSCALE_DELAY_S}
    text = os.environ.get(AUTOSCALING_ENV, "").strip()
    if not text:
        return out
    try:
        given = json.loads(text)
    except ValueError:
        given = None
    if not isinstance(given, dict) or not all(
            k in TIMING_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool)
            and (v > 0 or (v == 0 and k.endswith("delay_s"))) for k, v in given.items()):  # Serve's own bounds
        raise InputError(f"{AUTOSCALING_ENV}={text!r} is not a JSON object of seconds under {', '.join(TIMING_KEYS)} "
                         "(the delays >= 0, the others > 0)",
                         f'e.g. {AUTOSCALING_ENV}=\'{{"downscale_delay_s": 30}}\'')
    return {**out, **{k: float(v) for k, v in given.items()}}


def scaling(low: int, high: int | None, target: int) -> dict[str, Any]:
    """Serve deployment options: a fixed count, or (``high`` given) autoscaling between ``low`` and ``high``."""
    if high is None:
        return {"num_replicas": low}
    return {"autoscaling_config": {"min_replicas": low, "initial_replicas": low, "max_replicas": high,
                                   "target_ongoing_requests": target, **timing()}}


def deployment_name(model: str) -> str:
    return f"bundle-{model}"


def replica_resources(t: Any) -> dict[str, float]:
    """The Ray resources one replica of bundle ``t`` asks for besides its CPUs: the plan's share of one unit of
    its accelerator (edgeinfer/fleet/fit.py)."""
    from edgeinfer.fleet.fit import share

    return {t.resource: share(t.plan)} if t.resource else {}


def deployments(found: list[Any], config: Any, low: int, highs: dict[str, int | None]) -> dict[str, Any]:
    """One bound deployment per bundle; ``highs``: each bundle's autoscaling maximum (None: fixed ``low``)."""
    from ray import serve

    out = {}
    for t in found:
        actor = {"num_cpus": REPLICA_CPUS, "resources": replica_resources(t)}
        if t.decoder:
            cls, args = DecoderReplica, (t, config)
            ongoing, target = 2 * config.slots, config.slots  # its slots running, as many in its own queue
        else:
            cls, args = BundleReplica, (t, config.max_batch, config.max_inputs)
            ongoing, target = REPLICA_ONGOING, BUNDLE_TARGET_ONGOING
        out[t.name] = serve.deployment(cls).options(
            name=deployment_name(t.name), max_ongoing_requests=ongoing, ray_actor_options=actor,
            **scaling(low, highs[t.name], target)).bind(*args)
    return out


def this_node() -> dict[str, float]:
    """The router on the node that runs `serve --ray` (Ray's ``node:<address>`` resource, which every node has
    one unit of: https://docs.ray.io/en/latest/ray-core/scheduling/resources.html), not on a worker node whose loss
    would take the fleet's entry point with it: a node lost under load then fails only its own requests."""
    import ray

    me = ray.get_runtime_context().get_node_id()
    address = next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == me)
    return {f"node:{address}": 0.001}


def build(found: list[Any], config: Any, low: int, highs: dict[str, int | None]) -> Any:
    """The Serve application (pass it to ``serve.run(..., name=APP)``)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import Response, StreamingResponse
    from ray import serve

    app = FastAPI(title="edgeinfer serve (Ray)", **telemetry.fastapi_options(FastAPI))
    if config.api_key is not None:
        guard(app, config.api_key.encode())
    names = [t.name for t in found]
    decoders = {t.name for t in found if t.decoder}
    # the bundles each replica ``run`` kind takes (edgeinfer/fleet/replicas.py); "infer": any but a decoder
    among_of = {"embed": {t.name for t in found if t.embeds}, "infer": {t.name for t in found if not t.decoder},
                "rerank": {t.name for t in found if t.task == "rerank"},
                "classify": {t.name for t in found if t.task == "classify"}}

    def pick(body: bytes, among: set[str]) -> str | None:
        name = _model_name(body)
        return next(iter(among)) if name is None and len(among) == 1 else name if name in among else None

    @serve.deployment(name=ROUTER, ray_actor_options={"num_cpus": ROUTER_CPUS, "resources": this_node()},
                      max_ongoing_requests=ROUTER_ONGOING)
    @serve.ingress(app)
    class Router:
        def __init__(self, handles: dict[str, Any]):
            import ray

            from edgeinfer.fleet.health import FleetState
            from edgeinfer.fleet.metrics import ReplicaMetrics
            from edgeinfer.serve.metrics import Metrics

            self.handles = handles
            self.started = int(time.time())
            self.metrics = Metrics()
            self.merged = ReplicaMetrics(self.metrics.registry, ray.get_runtime_context().get_node_id())
            self.fleet = FleetState(APP)
            self.reading: asyncio.Future | None = None  # the fleet state being read for /metrics
            self.metrics.registry.register(self.fleet)

        def count(self, endpoint: str, status: int, t0: float) -> None:
            self.metrics.requests.labels(endpoint, str(status)).inc()
            self.metrics.latency.labels(endpoint).observe(time.perf_counter() - t0)

        def missing(self, among: set[str]) -> tuple[int, bytes]:
            return error(404, f"unknown or missing model; GET /v1/models lists: {', '.join(sorted(among) or names)}")

        async def forward(self, request: Request, kind: str, endpoint: str) -> Response:
            t0, body = time.perf_counter(), await request.body()
            name = pick(body, among_of[kind])
            if name is None:
                status, data = self.missing(among_of[kind])
            else:
                status, data = await self.run(name, kind, body, request.headers.get("content-type", ""))
            self.count(endpoint, status, t0)
            return Response(data, status_code=status, media_type="application/json")

        async def generate(self, request: Request, chat: bool, endpoint: str) -> Response:
            t0, body = time.perf_counter(), await request.body()
            name = pick(body, decoders)
            if name is None:
                status, data = self.missing(decoders)
                self.count(endpoint, status, t0)
                return Response(data, status_code=status, media_type="application/json")
            stream, (status, media, data) = await self.opened(name, chat, body,
                                                              request.headers.get("content-type", ""))
            self.count(endpoint, status, t0)
            if data is not None:
                return Response(data, status_code=status, media_type=media)
            return StreamingResponse(relay(stream, config.timeout_s), media_type=media,
                                     headers={"Cache-Control": "no-cache"})

        async def run(self, name: str, kind: str, body: bytes, content_type: str) -> tuple[int, bytes]:
            """A replica's answer; one whose replica died is sent again (RETRIES), then a 503. ``--timeout-s``
            bounds it as on one box (504), so a replica whose node went silent holds nothing else up."""
            deadline = time.monotonic() + config.timeout_s
            for _ in range(RETRIES + 1):
                answer = self.handles[name].run.remote(kind, body, content_type)
                try:
                    return await asyncio.wait_for(answer, max(deadline - time.monotonic(), 0.001))
                except TimeoutError:
                    cancel(answer)
                    return error(504, f"no answer within {config.timeout_s:g} s (replica busy, or its node lost); "
                                      "retry or raise --timeout-s")
                except Exception as e:  # noqa: BLE001 - the replica died mid-request; Serve replaces it
                    failed = e
            return lost(failed)

        async def opened(self, name: str, chat: bool, body: bytes, content_type: str) -> tuple[Any, tuple]:
            """A decoder replica's stream and its first item ``(status, media, body)``. A decoder replica sends
            that first item once its sequence has produced output (DecoderReplica.generate), so a stream whose
            replica died before (queued, prefilling) sent the client nothing and is sent again (RETRIES). The
            replica ends a generation at ``--generation-timeout-s``; one silent for ``--timeout-s`` more (its node
            lost) is a 504, as in ``run``."""
            bound = config.generation_timeout_s + config.timeout_s
            deadline = time.monotonic() + bound
            for _ in range(RETRIES + 1):
                stream = self.handles[name].options(stream=True).generate.remote(chat, body, content_type)
                try:
                    async with asyncio.timeout_at(asyncio.get_running_loop().time() + deadline - time.monotonic()):
                        return stream, await stream.__anext__()
                except TimeoutError:
                    cancel(stream)
                    return stream, (504, "application/json", error(504, f"no answer within {bound:g} s (the "
                                    "replica's node silent or lost); retry or raise --generation-timeout-s")[1])
                except Exception as e:  # noqa: BLE001 - the replica died before answering
                    cancel(stream)
                    failed = e
            return stream, (503, "application/json", lost(failed)[1])

        @app.post("/v1/embeddings")
        async def embeddings(self, request: Request) -> Response:
            return await self.forward(request, "embed", "/v1/embeddings")

        @app.post("/v1/rerank")
        @app.post("/v2/rerank")
        async def rerank(self, request: Request) -> Response:
            return await self.forward(request, "rerank", request.url.path)

        @app.post("/v1/classify")
        async def classify(self, request: Request) -> Response:
            return await self.forward(request, "classify", "/v1/classify")

        @app.post("/v1/infer")
        async def infer(self, request: Request) -> Response:
            return await self.forward(request, "infer", "/v1/infer")

        @app.post("/v1/chat/completions")
        async def chat_completions(self, request: Request) -> Response:
            return await self.generate(request, True, "/v1/chat/completions")

        @app.post("/v1/completions")
        async def completions(self, request: Request) -> Response:
            return await self.generate(request, False, "/v1/completions")

        @app.get("/v1/models")
        async def models(self) -> dict[str, Any]:
            return {"object": "list", "data": [await h.describe.remote(self.started) for h in self.handles.values()]}

        @app.get("/health")
        async def health(self) -> dict[str, str]:
            return {"status": "ok"}

        @app.get("/ready")
        async def ready(self) -> dict[str, Any]:
            return {"ready": True, "models": names}  # Serve routes here only once every replica is up

        @app.get("/metrics")
        async def prometheus(self) -> Response:
            from prometheus_client import CONTENT_TYPE_LATEST

            # one reading at a time, awaited REFRESH_S at most: while Ray declares a node dead its GCS and Serve's
            # controller can take longer than a scrape's timeout, and the last reading then stays
            if self.reading is None or self.reading.done():
                self.reading = asyncio.ensure_future(asyncio.to_thread(self.fleet.refresh))
            try:
                await asyncio.wait_for(asyncio.shield(self.reading), REFRESH_S)
            except Exception:  # noqa: BLE001 - GCS or controller slow or unreachable: the last reading stays
                pass
            return Response(self.merged.exposition(), media_type=CONTENT_TYPE_LATEST)

        def push_metrics(self, replica: str, text: str, node: str = "") -> None:
            """Called by every replica (replicas.MetricsPush) with its registry's exposition and its node id."""
            self.merged.push(replica, text, node)

        def refused(self, bundle: str, node: str, address: str, reason: str) -> None:
            """Called by a replica that refused its node's copy of ``bundle`` (replicas.arrive)."""
            self.fleet.refused(bundle, node, address, reason)

    return Router.bind(deployments(found, config, low, highs))


def guard(app: Any, key: bytes) -> None:
    """The single-box server's API key rule (edgeinfer/serve/config.py ``authorized``) on every router path."""
    from fastapi import Request
    from fastapi.responses import Response

    from edgeinfer.serve.config import KEY_REFUSAL, authorized

    @app.middleware("http")
    async def check_key(request: Request, call_next: Any) -> Response:
        if authorized(key, request.url.path, request.headers.get("authorization", "").encode("latin-1")):
            return await call_next(request)
        status, data = error(401, KEY_REFUSAL)
        return Response(data, status_code=status, media_type="application/json",
                        headers={"WWW-Authenticate": "Bearer"})


def lost(e: Exception) -> tuple[int, bytes]:
    return error(503, f"the replica running this request failed ({type(e).__name__}); retry")


SILENT = "the replica sent nothing for {:g} s (its node silent or lost) and this answer is incomplete; retry"


def cancel(response: Any) -> None:
    """Cancel a Serve handle call without blocking the event loop. With Serve's router in its own loop (its
    default, ``RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP``), ``DeploymentResponse.cancel`` waits synchronously for the
    request's replica assignment and then calls ``ray.cancel`` (``ray/serve/handle.py``): for a request bound for a
    node just lost, that could hold every other request, ``/metrics`` included, so it runs in a thread. Without the
    separate loop its futures are the event loop's own, and cancel is called here."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not in a loop: nothing to hold up
        loop = None
    if loop is None or not getattr(response, "_is_router_running_in_separate_loop", False):
        response.cancel()
        return
    done = loop.run_in_executor(None, response.cancel)
    done.add_done_callback(lambda f: f.cancelled() or f.exception())  # best effort, as Serve's cancel is


async def relay(stream: Any, idle_s: float) -> AsyncIterator[bytes]:
    """A decoder replica's chunks as they come; a replica lost mid-stream, or silent for ``idle_s`` between
    chunks (``--timeout-s``: its node gone silent, which Ray declares dead only after its health checks fail,
    about a minute by default), ends it with an error event and ``data: [DONE]`` (the single-box server's shape
    for a failed sequence, edgeinfer/serve/decoder_routes.py); a client that went away or a silent replica
    cancels the generation on the replica."""
    done = False
    try:
        while True:
            try:
                async with asyncio.timeout(idle_s):  # in this task, as ``async for`` would await it
                    chunk = await stream.__anext__()
            except StopAsyncIteration:
                break
            except TimeoutError:
                yield b"data: " + error(504, SILENT.format(idle_s))[1] + b"\n\ndata: [DONE]\n\n"
                return
            yield chunk
        done = True
    except Exception as e:  # noqa: BLE001 - the replica died mid-stream
        yield b"data: " + lost(e)[1] + b"\n\ndata: [DONE]\n\n"
        done = True
    finally:
        if not done:
            cancel(stream)
