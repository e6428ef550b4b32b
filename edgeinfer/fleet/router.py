"""The Serve application of ``serve --ray``: one deployment per bundle (edgeinfer/fleet/replicas.py) behind a
router deployment, the HTTP ingress with the single-box server's paths and error shape. The router sends each
request to the deployment of the model it names, relays decoder streams chunk by chunk, and answers
``/metrics`` with its own counters and the replicas' pushed registries (edgeinfer/fleet/metrics.py)."""

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from edgeinfer.fleet.replicas import ROUTER, BundleReplica, DecoderReplica, error

REPLICA_CPUS = 0.5
ROUTER_CPUS = 0.25
# Serve's default (5 ongoing requests per replica) makes the router itself the queue: the proxy backs off and
# retries while all its slots are taken (bench/fleet.py measured 9 req/s at 32 clients, against 41 at 8). The
# router only awaits; the replicas keep a small queue each so that a request waits where it will run.
ROUTER_ONGOING = 4096
REPLICA_ONGOING = 8
# Autoscaling on queue length: Serve adds replicas when the requests per replica (running + queued) stay above
# the target. A decoder replica runs --slots sequences at once and holds as many more in its own queue; an
# embedding replica answers one request at a time, so a couple waiting is already a queue.
BUNDLE_TARGET_ONGOING = 2
UPSCALE_DELAY_S = 10.0
DOWNSCALE_DELAY_S = 120.0


def _model_name(body: bytes) -> str | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data.get("model") if isinstance(data, dict) and isinstance(data.get("model"), str) else None


def scaling(low: int, high: int | None, target: int) -> dict[str, Any]:
    """Serve deployment options: a fixed count, or (``high`` given) autoscaling between ``low`` and ``high``."""
    if high is None:
        return {"num_replicas": low}
    return {"autoscaling_config": {"min_replicas": low, "initial_replicas": low, "max_replicas": high,
                                   "target_ongoing_requests": target, "upscale_delay_s": UPSCALE_DELAY_S,
                                   "downscale_delay_s": DOWNSCALE_DELAY_S}}


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


def build(found: list[Any], config: Any, low: int, highs: dict[str, int | None]) -> Any:
    """The Serve application (pass it to ``serve.run(..., name=APP)``)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import Response, StreamingResponse
    from ray import serve

    app = FastAPI(title="edgeinfer serve (Ray)")
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

    @serve.deployment(name=ROUTER, ray_actor_options={"num_cpus": ROUTER_CPUS}, max_ongoing_requests=ROUTER_ONGOING)
    @serve.ingress(app)
    class Router:
        def __init__(self, handles: dict[str, Any]):
            import ray

            from edgeinfer.fleet.metrics import ReplicaMetrics
            from edgeinfer.serve.metrics import Metrics

            self.handles = handles
            self.started = int(time.time())
            self.metrics = Metrics()
            self.merged = ReplicaMetrics(self.metrics.registry, ray.get_runtime_context().get_node_id())

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
                try:
                    status, data = await self.handles[name].run.remote(kind, body,
                                                                       request.headers.get("content-type", ""))
                except Exception as e:  # noqa: BLE001 - a replica died mid-request: this one fails, Serve restarts it
                    status, data = error(503, f"the replica running this request failed ({type(e).__name__}); "
                                              "retry")
            self.count(endpoint, status, t0)
            return Response(data, status_code=status, media_type="application/json")

        async def generate(self, request: Request, chat: bool, endpoint: str) -> Response:
            t0, body = time.perf_counter(), await request.body()
            name = pick(body, decoders)
            if name is None:
                status, data = self.missing(decoders)
                self.count(endpoint, status, t0)
                return Response(data, status_code=status, media_type="application/json")
            stream = self.handles[name].options(stream=True).generate.remote(
                chat, body, request.headers.get("content-type", ""))
            try:
                status, media, data = await stream.__anext__()
            except Exception as e:  # noqa: BLE001 - the replica died before answering
                stream.cancel()
                status, media, data = 503, "application/json", error(
                    503, f"the replica running this request failed ({type(e).__name__}); retry")[1]
            self.count(endpoint, status, t0)
            if data is not None:
                return Response(data, status_code=status, media_type=media)
            return StreamingResponse(relay(stream), media_type=media, headers={"Cache-Control": "no-cache"})

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

            return Response(self.merged.exposition(), media_type=CONTENT_TYPE_LATEST)

        def push_metrics(self, replica: str, text: str, node: str = "") -> None:
            """Called by every replica (replicas.MetricsPush) with its registry's exposition and its node id."""
            self.merged.push(replica, text, node)

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


async def relay(stream: Any) -> AsyncIterator[bytes]:
    """A decoder replica's chunks as they come; a replica lost mid-stream ends it with an error event (the
    single-box server's shape); a client that went away cancels the generation on the replica."""
    done = False
    try:
        async for chunk in stream:
            yield chunk
        done = True
    except Exception as e:  # noqa: BLE001 - the replica died mid-stream
        body = {"error": {"message": f"the replica running this request failed ({type(e).__name__}); retry",
                          "type": "service_unavailable", "code": 503}}
        yield b"data: " + json.dumps(body).encode() + b"\n\n"
        done = True
    finally:
        if not done:
            stream.cancel()

