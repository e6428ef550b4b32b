"""The Ray Serve replicas of ``serve --ray`` (they run inside Ray worker processes on the fleet's nodes).

A replica opens its bundle from its path, checks every file against the manifest's sha256 seals and against the
seals the starting machine saw (the same bundle, not another one at that path), and answers with the single-box
server's own code: request parsing and encoding (edgeinfer/serve/prep.py, scoring_prep.py) for the other bundles, the
decoder engine (one worker process with KV slots, edgeinfer/serve/decoder_engine.py) and the OpenAI generation
answers (edgeinfer/serve/decoder_routes.py) for decoders. Each replica keeps the single-box server's Prometheus
metrics and device gauges (its backend's ``device_readings`` and the memory of its own and its worker's process)
and pushes them to the router every ``PUSH_S`` seconds (the router's ``/metrics`` merges them, labelled by node
and replica).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from edgeinfer.errors import InputError

APP = "edgeinfer"  # the Serve application's name
ROUTER = "router"  # the ingress deployment's name
PUSH_S = 2.0
RESEND_S = 10.0  # an unchanged registry is sent again this often, so the router (STALE_S) keeps the replica


def error(status: int, message: str) -> tuple[int, bytes]:
    from edgeinfer.serve.app import ERROR_TYPES

    body = {"error": {"message": message, "type": ERROR_TYPES.get(status, "error"), "code": status}}
    return status, json.dumps(body).encode()


async def arrive(target: Any) -> Any:
    """The bundle at ``target.path`` on this node, or (not there, or ``--ship-bundles``) fetched through Ray's
    object store (edgeinfer/fleet/transport.py); every file checked. A copy that fails (a file changed, or not
    the bundle the command was started with) is refused: reported to the router (``refused``), a fetched copy
    deleted so that the next replica here fetches it again, and an InputError raised (the replica does not start,
    Serve starts another)."""
    from pathlib import Path

    from edgeinfer.model.bundle import Bundle

    path, fetched = target.path, target.ship or not Path(target.path).is_dir()
    if fetched:
        from edgeinfer.fleet.transport import fetch

        path = str(fetch(target.store, target.name, target.files))
    try:
        bundle = Bundle.open(path, verify="full")  # every file against the manifest's sha256
        if bundle.manifest.files != target.files:
            raise InputError(f"bundle {path} is not the one `edgeinfer serve` was started with (its seals differ); "
                             "copy the same bundle there")
    except InputError as e:
        await refuse(target.name, path if fetched else None, str(e))
        raise
    return bundle


async def refuse(name: str, copy: str | None, reason: str, timeout_s: float = 30.0) -> None:
    """Tell the router that this node refused its copy of bundle ``name`` (one line in its log, a counter on its
    /metrics), and delete ``copy`` (a fetched one, never the operator's path). Serve deploys the router and the
    bundle replicas at once, so a replica that refuses at start may find no router yet: it asks again every
    0.5 s, for ``timeout_s`` at most."""
    import shutil

    import ray
    from ray import serve

    if copy is not None:
        shutil.rmtree(copy, ignore_errors=True)
    ctx = ray.get_runtime_context()
    address = ray.util.get_node_ip_address()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            router = serve.get_deployment_handle(ROUTER, APP)
            await asyncio.wait_for(router.refused.remote(name, ctx.get_node_id(), address, reason),
                                   max(deadline - loop.time(), 0.1))
            return
        except Exception:  # noqa: BLE001 - no router (yet): ask again until the deadline
            if loop.time() >= deadline:  # the refusal still shows in `serve status` and this replica's log
                return
            await asyncio.sleep(0.5)


def device_gauges(registry: Any, backend: str, processes: Any = None) -> None:
    """The single-box server's device gauges in a replica's registry: ``backend``'s readings of its default
    device (Ray places a replica by resource, not by ``--devices`` entry) and the replica's process memory."""
    from edgeinfer.serve.device_gauges import DeviceGauges, backend_readers

    registry.register(DeviceGauges(backend_readers([backend], [""]), processes))


class MetricsPush:
    """Pushes this replica's registry to the router when it changes, and every ``RESEND_S`` seconds anyway (the
    router cannot reach each replica of a deployment through a handle: a handle picks one)."""

    def __init__(self, registry: Any):
        import ray
        from ray import serve

        self.registry = registry
        rid = serve.get_replica_context().replica_id
        self.name = f"{rid.deployment_id.name}#{rid.unique_id}"
        self.node = ray.get_runtime_context().get_node_id()
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        from prometheus_client import generate_latest
        from ray import serve

        router, last, sent = None, b"", 0.0
        while True:
            await asyncio.sleep(PUSH_S)
            text = generate_latest(self.registry)
            if text == last and time.monotonic() - sent < RESEND_S:
                continue
            try:
                router = router or serve.get_deployment_handle(ROUTER, APP)
                await router.push_metrics.remote(self.name, text.decode(), self.node)
                last, sent = text, time.monotonic()
            except Exception:  # noqa: BLE001 - the router is (re)starting: the next round sends it again
                router = None


def codec(kind: str) -> tuple[Any, Any]:
    """The single-box server's (prepare, encode) for a request ``kind``: embed, infer, rerank or classify."""
    from edgeinfer.serve import prep, scoring_prep

    return {"embed": (prep.prepare_embeddings, lambda p, out: prep.encode_embeddings(p, out["embedding"])),
            "infer": (prep.prepare_infer,
                      lambda p, out: prep.encode_infer(p.id or f"ray-{time.time_ns()}", p.model, out)),
            "rerank": (scoring_prep.prepare_rerank, lambda p, out: scoring_prep.encode_rerank(p, out["logits"])),
            "classify": (scoring_prep.prepare_classify,
                         lambda p, out: scoring_prep.encode_classify(p, out["logits"]))}[kind]


class BundleReplica:
    """One replica of one embedding / reranker / classifier / tensor bundle: loaded once, run per request."""

    async def __init__(self, target: Any, max_batch: int, max_inputs: int):
        import ray

        from edgeinfer.run import bundle as run_bundle
        from edgeinfer.serve.metrics import Metrics
        from edgeinfer.serve.prep import ServedModel

        bundle = await arrive(target)
        self.models = {target.name: ServedModel(target.name, bundle)}
        self.name, self.bundle, self.max_batch, self.max_inputs = target.name, bundle, max_batch, max_inputs
        self.session = run_bundle.open_session(bundle)
        self.placement = {"node_id": ray.get_runtime_context().get_node_id(), "resource": target.resource,
                          "bundle": str(bundle.path)}
        self.metrics = Metrics()
        device_gauges(self.metrics.registry, bundle.manifest.backend)
        self.push = MetricsPush(self.metrics.registry)
        self.push.start()

    def run(self, kind: str, body: bytes, content_type: str) -> tuple[int, bytes]:
        """``kind``: embed, infer, rerank or classify, read and answered as the single-box server does
        (edgeinfer/serve/prep.py, scoring_prep.py)."""
        from edgeinfer.serve.prep import ApiError
        from edgeinfer.serve.workers import run_batch

        prepare, encode = codec(kind)
        try:
            p = prepare(self.models, body, content_type, self.max_inputs)
            t0 = time.perf_counter()
            [(status, out)] = run_batch(self.bundle, self.session, p.kind, p.feeds, [p.rows], self.max_batch)
            self.metrics.observe("batch", model=self.name, rows=p.rows, requests=1)
            self.metrics.observe("batch_done", model=self.name, seconds=time.perf_counter() - t0)
            if status != "ok":
                self.metrics.observe("batch_error", model=self.name)
                return error(500, out)
            return 200, encode(p, out)
        except ApiError as e:
            return error(e.status, e.message)

    def describe(self, created: int) -> dict[str, Any]:
        return {**next(iter(self.models.values())).to_json(created), "placement": self.placement}


async def opening(chunks: AsyncIterator[bytes], n: int) -> AsyncIterator[bytes]:
    """The first ``n`` chunks of ``chunks`` (fewer if it ends), leaving the rest to be read."""
    for _ in range(n):
        try:
            yield await chunks.__anext__()
        except StopAsyncIteration:
            return


class DecoderReplica:
    """One replica of one decoder bundle: the single-box server's decoder engine (one worker process holding
    ``slots`` KV slots) and its OpenAI answers, streamed back through Ray as they are produced."""

    async def __init__(self, target: Any, config: Any):
        import ray

        from edgeinfer.serve.decoder_engine import Engine, open_served_decoder
        from edgeinfer.serve.metrics import Metrics

        bundle = await arrive(target)
        self.llm = open_served_decoder(bundle.path, bundle, config.ctx)
        self.metrics = Metrics()
        self.engine = Engine(self.llm, config.slots, config.max_queue, config.prefill_chunk,
                             max_restarts=config.max_restarts, restart_window_s=config.restart_window_s,
                             observe=self.metrics.observe, threads=config.threads)
        self.timeout_s = config.generation_timeout_s
        self.placement = {"node_id": ray.get_runtime_context().get_node_id(), "resource": target.resource,
                          "bundle": str(bundle.path)}
        self.started = int(time.time())
        await self.engine.start()  # Serve routes here once the decoder worker is loaded
        device_gauges(self.metrics.registry, self.llm.backend,
                      lambda: {"decoder": self.engine.pid} if self.engine.pid else {})
        self.push = MetricsPush(self.metrics.registry)
        self.push.start()

    async def generate(self, chat: bool, body: bytes, content_type: str) -> AsyncIterator[Any]:
        """First ``(status, media_type, body)``; a stream's body is None and its chunks follow one by one."""
        from fastapi.responses import StreamingResponse

        from edgeinfer.serve.decoder_routes import respond
        from edgeinfer.serve.prep import ApiError

        try:
            answer = await respond({self.llm.name: self.engine}, body, content_type, chat, self.timeout_s,
                                   self._refusal, self.metrics.observe)
        except ApiError as e:
            status, data = error(e.status, e.message)
            yield status, "application/json", data
            return
        if isinstance(answer, StreamingResponse):
            chunks = answer.body_iterator
            # held back until the sequence has produced something (chat opens with its role chunk before it
            # runs): a replica lost while the request waits in its queue has then sent the router nothing,
            # and the router sends the request to another replica (edgeinfer/fleet/router.py, ``opened``)
            held = [chunk async for chunk in opening(chunks, 2 if chat else 1)]
            yield 200, answer.media_type, None
            for chunk in held:
                yield chunk
            async for chunk in chunks:
                yield chunk
        else:
            yield answer.status_code, "application/json", bytes(answer.body)

    def _refusal(self, model: str) -> Any:
        from edgeinfer.serve.prep import ApiError

        if self.engine.ready():
            return None
        return ApiError(503, f"the decoder {model} is not loaded (starting, restarting or failed); retry in a moment",
                        {"Retry-After": "2"})

    def describe(self, created: int) -> dict[str, Any]:
        return {**self.llm.to_json(created, self.engine.slots), "placement": self.placement}

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.stop(timeout=5.0)
