"""``edgeinfer serve BUNDLE... --ray auto|ADDRESS``: embedding / tensor bundles as Ray Serve deployments.

One deployment per bundle; each replica asks for one unit of the Ray custom resource of the bundle's board
(edgeinfer/contract/resources.py), opens the bundle from its path, checks every file against the manifest's
sha256 seals and against the seals the starting machine saw (the same bundle, not another one at that path),
and answers with the single-box server's own request parsing and encoding (edgeinfer/serve/prep.py). A router
deployment (no accelerator) is the HTTP ingress: it sends each request to the deployment of the model it names.
A deployment needing a resource the cluster lacks is refused before anything starts (exit 3).
"""

import json
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeinfer.errors import BackendUnavailableError, InputError
from edgeinfer.fleet.node import require_ray
from edgeinfer.serve.config import ServeConfig

REPLICA_CPUS = 0.5
ROUTER_CPUS = 0.25
# Serve's default (5 ongoing requests per replica) makes the router itself the queue: the proxy backs off and
# retries while all its slots are taken (bench/fleet.py measured 9 req/s at 32 clients, against 41 at 8). The
# router only awaits; the replicas keep a small queue each so that a request waits where it will run.
ROUTER_ONGOING = 4096
REPLICA_ONGOING = 8
AUTO_OBJECT_STORE_BYTES = 200 * 2**20  # Ray's minimum is ~75 MiB; requests and answers are small


@dataclass
class BundleTarget:
    name: str  # the model name clients use (the bundle directory's name, as in the single-box server)
    path: str
    resource: str | None  # None: a CPU bundle, placed anywhere
    files: dict[str, Any]  # the manifest's seals, as this machine read them
    embeds: bool


def bundle_resource(manifest: Any) -> str | None:
    """The resource the bundle's board needs: its board profile's backend names it from the board's target or
    family; a bundle for no known board (``host-cpu``) falls back to its own backend and target."""
    from edgeinfer.contract import registry as plugins
    from edgeinfer.errors import BoardError
    from edgeinfer.planning.boards import get_board

    backends = plugins.registry().backends
    try:
        board = get_board(manifest.board)
        backend, key = board.backend, board.target or board.family
    except BoardError:
        backend, key = manifest.backend, manifest.target
    entry = backends.get(backend)
    return entry.cls.resource_names.get(key.lower()) if entry and key else None


def targets(paths: list[Path]) -> list[BundleTarget]:
    from edgeinfer.run.bundle import Bundle

    out: dict[str, BundleTarget] = {}
    for p in paths:
        bundle = Bundle.open(p, verify="full")
        name = bundle.path.resolve().name
        if name in out:
            raise InputError(f"two bundles are both named {name!r}; serve bundles from directories with distinct "
                             "names")
        if bundle.manifest.decoder is not None:
            raise InputError(f"bundle {p} holds a decoder; serving decoders through Ray is not done yet "
                             "(docs/fleet.md): serve it with `edgeinfer serve` on one box")
        out[name] = BundleTarget(name, str(bundle.path.resolve()), bundle_resource(bundle.manifest),
                                 bundle.manifest.files, bundle.manifest.text is not None)
    return list(out.values())


def check_resources(found: list[BundleTarget], replicas: int, cluster: dict[str, float], where: str) -> None:
    """Refuse, in one line, a deployment whose replicas ask for more of a resource than the cluster has."""
    need: dict[str, int] = {}
    for t in found:
        if t.resource:
            need[t.resource] = need.get(t.resource, 0) + replicas
    for resource, count in sorted(need.items()):
        have = int(cluster.get(resource, 0))
        if have < count:
            users = ", ".join(t.name for t in found if t.resource == resource)
            offered = ", ".join(sorted(k for k in cluster if "_" in k and not k.startswith(("node:", "memory",
                                                                                            "object_store"))))
            raise BackendUnavailableError(
                f"{users} needs {count} × Ray resource {resource!r} ({replicas} replica(s) each), the cluster at "
                f"{where} has {have} (accelerators offered: {offered or 'none'})",
                "start `edgeinfer ray-node --address HEAD` on a board with that accelerator, or lower --replicas")


# --- inside Ray -----------------------------------------------------------------------------------------


def _error(status: int, message: str) -> tuple[int, bytes]:
    from edgeinfer.serve.app import _TYPES

    body = {"error": {"message": message, "type": _TYPES.get(status, "error"), "code": status}}
    return status, json.dumps(body).encode()


class BundleReplica:
    """One replica of one bundle: verified on arrival, loaded once, run per request."""

    def __init__(self, target: BundleTarget, max_batch: int, max_inputs: int):
        import ray

        from edgeinfer.run.bundle import Bundle
        from edgeinfer.serve.prep import ServedModel

        bundle = Bundle.open(target.path, verify="full")  # every file against the manifest's sha256
        if bundle.manifest.files != target.files:
            raise InputError(f"bundle {target.path} on node {ray.get_runtime_context().get_node_id()} is not the "
                             "one `edgeinfer serve` was started with (its seals differ); copy the same bundle there")
        self.models = {target.name: ServedModel(target.name, bundle)}
        self.bundle, self.max_batch, self.max_inputs = bundle, max_batch, max_inputs
        self.session = bundle.load()
        self.placement = {"node_id": ray.get_runtime_context().get_node_id(), "resource": target.resource}

    def run(self, kind: str, body: bytes, content_type: str) -> tuple[int, bytes]:
        from edgeinfer.serve.prep import ApiError, encode_embeddings, encode_infer, prepare_embeddings, prepare_infer
        from edgeinfer.serve.workers import run_batch

        try:
            prepare = prepare_embeddings if kind == "embed" else prepare_infer
            p = prepare(self.models, body, content_type, self.max_inputs)
            [(status, out)] = run_batch(self.bundle, self.session, kind, p.feeds, [p.rows], self.max_batch)
            if status != "ok":
                return _error(500, out)
            if kind == "embed":
                return 200, encode_embeddings(p, out["embedding"])
            return 200, encode_infer(p.id or f"ray-{time.time_ns()}", p.model, out)
        except ApiError as e:
            return _error(e.status, e.message)

    def describe(self, created: int) -> dict[str, Any]:
        return {**next(iter(self.models.values())).to_json(created), "placement": self.placement}


def _model_name(body: bytes) -> str | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data.get("model") if isinstance(data, dict) and isinstance(data.get("model"), str) else None


def build(found: list[BundleTarget], replicas: int, max_batch: int, max_inputs: int) -> Any:
    """The Serve application: one deployment per bundle behind a FastAPI router with the single-box server's
    paths and error shape."""
    from fastapi import FastAPI, Request
    from fastapi.responses import Response
    from ray import serve

    app = FastAPI(title="edgeinfer serve (Ray)")
    names = [t.name for t in found]

    def pick(body: bytes, embeds: bool) -> str | None:
        name = _model_name(body)
        cands = [t.name for t in found if t.embeds or not embeds]
        return cands[0] if name is None and len(cands) == 1 else name

    @serve.deployment(name="router", ray_actor_options={"num_cpus": ROUTER_CPUS}, max_ongoing_requests=ROUTER_ONGOING)
    @serve.ingress(app)
    class Router:
        def __init__(self, handles: dict[str, Any]):
            self.handles = handles
            self.started = int(time.time())

        async def forward(self, request: Request, kind: str) -> Response:
            body = await request.body()
            handle = self.handles.get(pick(body, kind == "embed"))
            if handle is None:
                status, data = _error(404, f"unknown or missing model; GET /v1/models lists: {', '.join(names)}")
            else:
                try:
                    status, data = await handle.run.remote(kind, body, request.headers.get("content-type", ""))
                except Exception as e:  # noqa: BLE001 - a replica died mid-request: this one fails, Serve restarts it
                    status, data = _error(503, f"the replica running this request failed ({type(e).__name__}); "
                                               "retry")
            return Response(data, status_code=status, media_type="application/json")

        @app.post("/v1/embeddings")
        async def embeddings(self, request: Request) -> Response:
            return await self.forward(request, "embed")

        @app.post("/v1/infer")
        async def infer(self, request: Request) -> Response:
            return await self.forward(request, "infer")

        @app.get("/v1/models")
        async def models(self) -> dict[str, Any]:
            return {"object": "list", "data": [await h.describe.remote(self.started) for h in self.handles.values()]}

        @app.get("/health")
        async def health(self) -> dict[str, str]:
            return {"status": "ok"}

        @app.get("/ready")
        async def ready(self) -> dict[str, Any]:
            return {"ready": True, "models": names}  # Serve routes here only once every replica is up

    deployment = serve.deployment(BundleReplica)
    handles = {}
    for t in found:
        handles[t.name] = deployment.options(
            name=f"bundle-{t.name}", num_replicas=replicas, max_ongoing_requests=REPLICA_ONGOING,
            ray_actor_options={"num_cpus": REPLICA_CPUS, "resources": {t.resource: 1} if t.resource else {}},
        ).bind(t, max_batch, max_inputs)
    return Router.bind(handles)


# --- the command ----------------------------------------------------------------------------------------


def reach(address: str, timeout_s: float = 5.0) -> None:
    """A quick TCP check of a ``host:port`` head first: ``ray.init`` waits minutes for an absent one."""
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return  # a ray:// client address or a name Ray resolves itself
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise BackendUnavailableError(f"cannot reach the Ray head at {address}: {e.strerror or e}",
                                      "start it with `edgeinfer ray-node`, or pass --ray auto") from None


def use_token_auth() -> None:
    """Ray 2.60 heads started by ``ray start`` require the token in ``~/.ray/auth_token`` (or ``RAY_AUTH_TOKEN``)
    when one exists, but ``ray.init(address=...)`` sends it only in token mode: turn that mode on as ``ray start``
    itself does (https://docs.ray.io/en/latest/ray-security/token-auth.html). Ray's function is private, so a
    Ray without it is left as it is."""
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def connect(address: str) -> bool:
    """Join the cluster at ``address``, or (``auto``) start a local one with this machine's resources;
    True when this process started it (and so stops it)."""
    import ray

    if address == "auto":
        from edgeinfer.fleet.resources import node_resources

        node = node_resources()
        ray.init(resources=node.resources, labels=node.labels, include_dashboard=False,
                 object_store_memory=AUTO_OBJECT_STORE_BYTES, log_to_driver=False)
        return True
    reach(address)
    use_token_auth()
    try:
        ray.init(address=address, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise BackendUnavailableError(f"cannot join the Ray cluster at {address}: {' '.join(str(e).split())[:200]}",
                                      "start one with `edgeinfer ray-node`, or pass --ray auto") from None
    return False


def check_options(config: ServeConfig, replicas: int) -> None:
    """Options of the single-box server that the Ray path does not honour are refused, not ignored."""
    if replicas < 1:
        raise InputError(f"--replicas must be at least 1, got {replicas}")
    if config.api_key is not None:
        raise InputError("--api-key / --api-key-file / EDGEINFER_API_KEY are not supported with --ray yet "
                         "(docs/fleet.md): put an authenticating proxy in front, or serve on one box")
    if config.devices:
        raise InputError("--devices does not go with --ray: Ray places replicas by accelerator (--replicas N)")


def serve_on_ray(config: ServeConfig, address: str, replicas: int) -> None:
    """Deploy, print where it answers, and run until Ctrl-C / SIGTERM; then remove what was started."""
    check_options(config, replicas)
    require_ray()
    import ray
    from ray import serve

    host, port, max_batch, max_inputs = config.host, config.port, config.max_batch, config.max_inputs
    found = targets(config.bundles)
    ours = signal.getsignal(signal.SIGTERM)  # Ray's core worker installs its own; keep the CLI's (exit 143)
    if port == 0:  # Serve needs the number up front
        import socket

        with socket.socket() as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
    started = connect(address)
    signal.signal(signal.SIGTERM, ours)
    try:
        check_resources(found, replicas, ray.cluster_resources(), address)
        serve.start(http_options={"host": host, "port": port})
        serve.run(build(found, replicas, max_batch, max_inputs), name="edgeinfer", route_prefix="/")
        sys.stderr.write(f"ready: {', '.join(t.name for t in found)} on http://{host}:{port} (Ray Serve, "
                         f"{replicas} replica(s) each)\n")
        sys.stderr.flush()
        while True:
            time.sleep(1.0)
    finally:
        stop(started)


def stop(started: bool) -> None:
    import ray
    from ray import serve

    try:
        if started:
            serve.shutdown()
        elif ray.is_initialized():
            serve.delete("edgeinfer")
    finally:
        ray.shutdown()
