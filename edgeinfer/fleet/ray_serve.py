"""``edgeinfer serve BUNDLE... --ray auto|ADDRESS``: bundles (embedding, scoring, tensor, decoder) as Ray Serve
deployments behind one router (edgeinfer/fleet/router.py, edgeinfer/fleet/replicas.py).

One deployment per bundle; each replica asks for the plan's share of one unit of the Ray custom resource of the
bundle's board (edgeinfer/contract/resources.py, edgeinfer/fleet/fit.py). ``--dry-run`` prints that placement
and starts nothing. Before anything is deployed: a decoder bundle of which not one replica fits its
board by the planner is refused (exit 1, edgeinfer/fleet/fit.py); after joining the cluster, replicas needing more
of a resource than the cluster has are refused (exit 3), and more replicas than the nodes hold by the plan
(exit 1). ``--replicas auto`` / ``--max-replicas N`` scale each deployment on its queue length, at most to what
the fleet holds.
"""

import signal
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeinfer.errors import BackendUnavailableError, InputError
from edgeinfer.fleet.node import require_ray
from edgeinfer.serve.config import ServeConfig

AUTO_OBJECT_STORE_BYTES = 200 * 2**20  # Ray's minimum is ~75 MiB; requests and answers are small


@dataclass
class BundleTarget:
    name: str  # the model name clients use (the bundle directory's name, as in the single-box server)
    path: str
    resource: str | None  # None: a CPU bundle, placed anywhere
    files: dict[str, Any]  # the manifest's seals, as this machine read them
    embeds: bool
    decoder: bool = False
    plan: Any = None  # edgeinfer.planning.fleet.Placement of a decoder bundle on its board; None: not planned
    store: str = ""  # the bundle store actor (edgeinfer/fleet/transport.py) for nodes without the path
    ship: bool = False  # always fetch through the object store (--ship-bundles)
    task: str | None = None  # "rerank" / "classify": a scoring bundle (its manifest's task section)


@dataclass
class Scale:
    low: int  # replicas at start, and the autoscaler's minimum
    high: int | None  # the autoscaler's maximum; None: the fleet's bound
    auto: bool  # False: ``low`` replicas, fixed

    @property
    def wanted(self) -> int:
        """Replicas the cluster must be able to hold for the deployment to be accepted."""
        return self.high if self.high is not None else self.low


def parse_scale(replicas: str, max_replicas: int | None) -> Scale:
    """``--replicas N|auto`` and ``--max-replicas M``: fixed N, or autoscaling from N (auto: 1) to M (auto
    without M: as many as the fleet holds)."""
    auto = replicas.strip().lower() == "auto"
    try:
        low = 1 if auto else int(replicas)
    except ValueError:
        raise InputError(f"--replicas takes a number or 'auto', got {replicas!r}") from None
    if low < 1:
        raise InputError(f"--replicas must be at least 1, got {low}")
    if max_replicas is not None and max_replicas < low:
        raise InputError(f"--max-replicas {max_replicas} is below --replicas {low}; give a maximum >= the minimum")
    return Scale(low, max_replicas, auto or max_replicas is not None)


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


def target(path: Path, config: ServeConfig) -> BundleTarget:
    """One bundle, every file checked, with the planner's verdict on its board for a decoder."""
    from edgeinfer.fleet.fit import check_fits, replica_plan
    from edgeinfer.model.bundle import Bundle, not_a_bundle
    from edgeinfer.model.kind import Kind, kind
    from edgeinfer.serve.decoder_engine import open_served_decoder

    match kind(path, "bundle"):
        case Kind.DECODER_DIR:
            raise InputError(f"{path} is a Hugging Face directory; serve --ray takes bundles",
                             f"deploy it first: edgeinfer deploy {path} --board BOARD")
        case Kind.DECODER_BUNDLE | Kind.ENCODER_BUNDLE as k:
            decoder = k is Kind.DECODER_BUNDLE
        case _:
            raise not_a_bundle(path)
    bundle = Bundle.open(path, verify="full")
    name, resource = bundle.path.resolve().name, bundle_resource(bundle.manifest)
    if decoder:
        open_served_decoder(bundle.path, bundle, config.ctx)  # a --ctx beyond the bundle's is refused here
    plan = replica_plan(bundle, resource, config.slots, config.ctx)
    check_fits(name, plan)
    task = bundle.manifest.task.kind if bundle.manifest.task is not None else None
    embeds = bundle.manifest.text is not None and task is None
    return BundleTarget(name, str(bundle.path.resolve()), resource, bundle.manifest.files, embeds, decoder, plan,
                        task=task)


def targets(paths: list[Path], config: ServeConfig) -> list[BundleTarget]:
    out: dict[str, BundleTarget] = {}
    for p in paths:
        t = target(p, config)
        if t.name in out:
            raise InputError(f"two bundles are both named {t.name!r}; serve bundles from directories with distinct "
                             "names")
        out[t.name] = t
    return list(out.values())


def check_resources(found: list[BundleTarget], replicas: int, cluster: dict[str, float], where: str) -> None:
    """Refuse, in one line, a deployment whose replicas ask for more of a resource than the cluster has."""
    from edgeinfer.fleet.fit import share
    from edgeinfer.fleet.health import accelerator

    need: dict[str, float] = {}
    for t in found:
        if t.resource:
            need[t.resource] = need.get(t.resource, 0) + replicas * share(t.plan)
    for resource, count in sorted(need.items()):
        have = cluster.get(resource, 0)
        if have < count - 1e-9:
            users = ", ".join(t.name for t in found if t.resource == resource)
            offered = ", ".join(sorted(k for k in cluster if accelerator(k)))
            raise BackendUnavailableError(
                f"{users} needs {count:g} × Ray resource {resource!r} ({replicas} replica(s) each), the cluster at "
                f"{where} has {have:g} (accelerators offered: {offered or 'none'})",
                "start `edgeinfer ray-node --address HEAD` on a board with that accelerator, or lower --replicas")


def bounds(found: list[BundleTarget], scale: Scale, nodes: list[dict[str, Any]]) -> dict[str, int | None]:
    """Each bundle's autoscaling maximum (None: fixed replicas): ``--max-replicas``, or (auto) the replicas
    the alive nodes hold; more than the plan lets the nodes hold is refused (exit 1)."""
    from edgeinfer.fleet.fit import capacity, check_capacity
    from edgeinfer.fleet.router import REPLICA_CPUS

    out: dict[str, int | None] = {}
    for t in found:
        held = capacity(t.resource, t.plan, nodes, REPLICA_CPUS)
        check_capacity(t.name, t.plan, scale.wanted, held, t.resource or "CPU")
        out[t.name] = None if not scale.auto else scale.high if scale.high is not None else max(scale.low, held)
    return out


def placement(found: list[BundleTarget], scale: Scale, highs: dict[str, int | None]) -> list[dict[str, Any]]:
    """What ``serve --ray`` asks Ray Serve for, per bundle (``--dry-run`` prints it): the deployment, the resources
    of one replica, the replica bounds (max None: as many as the fleet holds) and the nodes that can hold them."""
    from edgeinfer.fleet.router import REPLICA_CPUS, deployment_name, replica_resources

    out = []
    for t in found:
        p = t.plan
        out.append({"deployment": deployment_name(t.name), "model": t.name, "decoder": t.decoder,
                    "resources": {"CPU": REPLICA_CPUS, **replica_resources(t)},
                    "replicas": {"min": scale.low, "max": highs.get(t.name) if scale.auto else scale.low,
                                 "autoscaling": scale.auto},
                    "nodes": {"resource": t.resource, "board": p.board if p else None,
                              "replicas_per_node": p.replicas_per_node if p else None,
                              "per_replica_bytes": p.per_replica_bytes if p else None}})
    return out


def dry_run(config: ServeConfig, address: str, replicas: str, max_replicas: int | None, as_json: bool) -> None:
    """Print the placement ``serve --ray`` would choose; nothing is started or joined. With ``auto`` the cluster
    is this machine (its probed accelerators and CPUs), checked as the real start checks it; with an address the
    cluster is not read, so ``--replicas auto`` without ``--max-replicas`` shows no maximum."""
    import json
    import os

    scale = parse_scale(replicas, max_replicas)
    check_options(config)
    found = targets(config.bundles, config)
    highs: dict[str, int | None] = {t.name: scale.high for t in found}
    if address == "auto":
        from edgeinfer.fleet.resources import node_resources

        here = {"CPU": float(os.cpu_count() or 1), **node_resources().resources}
        check_resources(found, scale.wanted, here, "auto (this machine)")
        highs = bounds(found, scale, [{"Alive": True, "Resources": here}])
    out = placement(found, scale, highs)
    if as_json:
        sys.stdout.write(json.dumps({"kind": "edgeinfer.ray_placement", "address": address, "deployments": out},
                                    indent=2) + "\n")
        return
    for d in out:
        sys.stdout.write(placement_line(d) + "\n")


def placement_line(d: dict[str, Any]) -> str:
    asks = " + ".join(f"{v:g} {k}" for k, v in d["resources"].items())
    r, n = d["replicas"], d["nodes"]
    count = f"{r['min']}-{r['max'] if r['max'] is not None else 'fleet'} (autoscaling)" if r["autoscaling"] \
        else str(r["min"])
    where = f"nodes with {n['resource']}" if n["resource"] else "any node"
    if n["replicas_per_node"] is not None:
        where += f", at most {n['replicas_per_node']} per {n['board']} node by the plan"
    return f"{d['deployment']}: {count} replica(s), each {asks}; on {where}"


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
        # "local": a new instance even where a `ray start` cluster wrote /tmp/ray/ray_current_cluster, which
        # ray.init() without an address would join (https://docs.ray.io/en/latest/ray-core/api/doc/ray.init.html)
        ray.init(address="local", resources=node.resources, labels=node.labels, include_dashboard=False,
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


def check_options(config: ServeConfig) -> None:
    """Options of the single-box server that the Ray path does not honour are refused, not ignored."""
    from edgeinfer.fleet.router import timing

    if config.devices:
        raise InputError("--devices does not go with --ray: Ray places replicas by accelerator (--replicas N)")
    timing()  # a bad EDGEINFER_RAY_AUTOSCALING is refused before anything starts


def describe(scale: Scale, highs: dict[str, int | None]) -> str:
    if not scale.auto:
        return f"{scale.low} replica(s) each"
    return "autoscaling " + ", ".join(f"{name} {scale.low}-{high}" for name, high in highs.items())


def serve_on_ray(config: ServeConfig, address: str, replicas: str = "1", max_replicas: int | None = None,
                 ship: bool = False) -> None:
    """Deploy, print where it answers, and run until Ctrl-C / SIGTERM; then remove what was started."""
    scale = parse_scale(replicas, max_replicas)
    check_options(config)
    require_ray()
    import ray

    from edgeinfer.fleet.router import build

    host, port = config.host, config.port
    found = targets(config.bundles, config)
    ours = signal.getsignal(signal.SIGTERM)  # Ray's core worker installs its own; keep the CLI's (exit 143)
    if port == 0:  # Serve needs the number up front
        import socket

        with socket.socket() as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
    started, owner, deployed, store = connect(address), False, False, ""
    name = f"edgeinfer-bundles-{uuid.uuid4().hex[:12]}"  # named before it starts: stop() looks it up by name
    signal.signal(signal.SIGTERM, ours)
    try:
        check_resources(found, scale.wanted, ray.cluster_resources(), address)
        highs = bounds(found, scale, ray.nodes())
        owner = not serve_running()  # before Serve starts: a Ctrl-C or SIGTERM while it starts still stops it
        start_serve(host, port, owner)
        store = name  # from here on the store may exist: stop() looks for it
        ship_from_here(found, ship, name)
        deployed = True
        deploy(build(found, config, scale.low, highs))
        sys.stderr.write(f"ready: {', '.join(t.name for t in found)} on http://{host}:{port} (Ray Serve, "
                         f"{describe(scale, highs)})\n")
        sys.stderr.flush()
        while True:
            time.sleep(1.0)
    finally:
        stop(started, owner, deployed, store)


def deploy(app: Any) -> None:
    """``serve.run`` the application; a deployment Serve gave up on is reported with Serve's own reason (the last
    line of its message: a replica's constructor error, say), not as an internal error."""
    from ray import serve

    from edgeinfer.fleet.replicas import APP

    try:
        serve.run(app, name=APP, route_prefix="/")
    except RuntimeError as e:
        if "Deploying application" not in str(e):
            raise
        try:
            deployments = serve.status().applications[APP].deployments
        except Exception:  # noqa: BLE001 - the controller may be gone too: say what is known
            deployments = {}
        raise BackendUnavailableError(f"Ray Serve could not deploy {not_deployed(deployments)}",
                                      "see `serve status` and the replicas' logs on their nodes "
                                      "(<ray temp dir>/session_latest/logs/serve/)") from e


def not_deployed(deployments: dict[str, Any]) -> str:
    """The deployments (Serve's status overviews by name) that are not up, each with the last line of Serve's
    message about it."""
    failed = []
    for name, d in deployments.items():
        if str(d.status).rsplit(".", 1)[-1] in ("HEALTHY", "UPSCALING", "DOWNSCALING"):
            continue
        lines = [line.strip() for line in (d.message or "").splitlines() if line.strip()]
        failed.append(f"{name} ({lines[-1][:300] if lines else str(d.status).rsplit('.', 1)[-1]})")
    return ", ".join(failed) or "the application"


def ship_from_here(found: list[BundleTarget], ship: bool, name: str) -> None:
    """The bundle store ``name`` on this node, for replicas on nodes that do not see a bundle's path (or all,
    ``ship``)."""
    from edgeinfer.fleet.transport import start_store

    for t in found:
        t.store, t.ship = name, ship
    start_store(name, {t.name: t.path for t in found})


def serve_running() -> bool:
    """Ray Serve already runs on the joined cluster (another command's, or someone else's)."""
    import ray
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    try:
        ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    except ValueError:
        return False
    return True


def start_serve(host: str, port: int, fresh: bool) -> None:
    """Serve's HTTP proxies on ``host:port``; ``fresh``: Serve does not run yet (this command starts it, and so
    shuts it down). A Serve already running keeps its HTTP options (Serve ignores new ones with a warning): one
    listening elsewhere, or already serving an edgeinfer application, is refused rather than answering on another
    port."""
    from ray import serve

    from edgeinfer.fleet.replicas import APP

    serve.start(http_options={"host": host, "port": port})
    if fresh:
        return
    http = serve.context._get_global_client().http_config
    if (http.host, http.port) != (host, port):
        raise BackendUnavailableError(f"Ray Serve already runs on this cluster on {http.host}:{http.port}, and "
                                      "its address cannot change while it runs",
                                      f"pass --host {http.host} --port {http.port}, or stop it (`serve shutdown`)")
    if APP in serve.status().applications:
        raise BackendUnavailableError(f"an {APP!r} application already runs on this cluster's Ray Serve",
                                      "stop the other `edgeinfer serve --ray` first (one per cluster)")


def kill_store(name: str, wait_s: float = 2.0) -> None:
    """Kill the store actor ``name``. Its creation may have been interrupted mid-call and still be registering:
    looked up again for ``wait_s`` before it counts as never started (a detached actor would outlive the command)."""
    import ray

    from edgeinfer.fleet.transport import NAMESPACE

    deadline = time.monotonic() + wait_s
    while True:
        try:
            actor = ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            if time.monotonic() >= deadline:
                return
            time.sleep(0.1)
            continue
        ray.kill(actor)
        return


def stop(started: bool, owner: bool, deployed: bool, store: str = "") -> None:
    """Remove what this command started: the local Ray of ``--ray auto``, Serve on a joined cluster when it
    started it there, else its application, and the bundle store ``store`` (its name, once its creation began);
    the joined cluster itself keeps running."""
    import ray
    from ray import serve

    from edgeinfer.fleet.replicas import APP

    try:
        if store and ray.is_initialized():
            kill_store(store)
        if started or owner:
            serve.shutdown()
        elif deployed and ray.is_initialized():
            serve.delete(APP)
    finally:
        ray.shutdown()
