"""A small Ray cluster of real nodes on this machine: a Linux bridge, one network namespace per worker node joined
to it by a veth pair with an address of its own, the Ray head in the root namespace on the bridge address (the
"starting machine", where `edgeinfer serve --ray` runs).

Each worker node runs ``ip netns exec NS unshare --mount --propagation private`` with a tmpfs mounted over every
``hide`` directory (the starting machine's bundle root: the node does not see it) and its own ``TMPDIR``, so a
bundle reaches it only through Ray's object store and its copy lives in that node's own temp directory. Names
(bridge, namespaces, veths, addresses, temp dirs) carry the pid, so parallel runs do not collide. ``close`` kills
every process it started (each node's whole namespace, the head's process group), deletes namespaces, veths and
the bridge, and raises when anything is left. Needs root and ``ip`` / ``unshare`` (``available()`` says why not).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

SMALL = ["--num-cpus=1", f"--object-store-memory={100 * 2**20}", "--disable-usage-stats"]
# For every process of the cluster and its drivers: the test cluster does not depend on a ~/.ray/auth_token that
# another Ray on this machine may write at any time (Ray 2.60 enables token mode when one exists, and `ray start
# --address` did not send it: its workers were refused)
ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
# The head's GCS declares a node dead after this many failed health checks, each waiting this long for an answer,
# this far apart (Ray's defaults: 5, 10 s, 3 s: ~65 s for a node gone silent, ~15 s for one whose processes died
# and whose kernel refuses connections). 5, 2 s, 1 s: ~15 s / ~5 s, without calling a node dead on a busy machine.
STARTED = "Ray runtime started"  # what `ray start` prints once the node registered
HEAD_ENV = {"RAY_health_check_failure_threshold": "5", "RAY_health_check_timeout_ms": "2000",
            "RAY_health_check_period_ms": "1000"}


def available() -> str | None:
    """None when namespaces can be made here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "unshare", "mount") if shutil.which(tool) is None]
    return f"missing {', '.join(missing)}" if missing else None


def sh(*cmd: str, check: bool = True) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip()}")
    return proc.stdout


def free_port(host: str = "0.0.0.0") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def ray_start(*args: str) -> list[str]:
    return [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", *SMALL, *args]


@dataclass
class Node:
    ns: str
    ip: str
    tmpdir: Path
    resources: dict[str, float]
    log: Path
    link: str  # the veth end on the bridge
    proc: subprocess.Popen | None = None

    def pids(self) -> list[int]:
        """Every process in this node's namespace (all of them started here)."""
        return [int(p) for p in sh("ip", "netns", "pids", self.ns, check=False).split()]


@dataclass
class NetnsFleet:
    """``nodes``: the custom resources of each worker node; ``hide``: directories the worker nodes must not see."""

    nodes_resources: list[dict[str, float]]
    hide: list[Path]
    root: Path = field(default_factory=lambda: Path(f"/tmp/ei{os.getpid()}"))
    nodes: list[Node] = field(default_factory=list)
    links: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        pid = os.getpid()
        self.tag = f"ei{pid % 10**7}"
        self.bridge = f"{self.tag}b"
        self.net = f"10.{100 + pid % 100}.{pid // 100 % 250}"
        self.head_ip = f"{self.net}.1"
        self.port = free_port()
        self.address = f"{self.head_ip}:{self.port}"
        self.head: subprocess.Popen | None = None
        self.keep = False  # keep the logs under ``root`` (a failed start)

    # --- building ------------------------------------------------------------------------------------------

    def start(self, timeout_s: float = 120.0) -> NetnsFleet:
        if f" {self.net}." in sh("ip", "-4", "-o", "addr"):
            raise RuntimeError(f"{self.net}.0/24 is already in use here")
        for d in [self.root / "h", *self.hide]:
            d.mkdir(parents=True, exist_ok=True)
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        self.links.append(self.bridge)
        sh("ip", "addr", "add", f"{self.head_ip}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        self.head = self._spawn(ray_start("--head", f"--node-ip-address={self.head_ip}", f"--port={self.port}",
                                          "--include-dashboard=false", f"--temp-dir={self.root / 'h'}",
                                          f"--ray-client-server-port={free_port()}",
                                          f"--dashboard-agent-listen-port={free_port()}"), self.root / "head.log",
                                HEAD_ENV)
        for i, resources in enumerate(self.nodes_resources, start=1):
            ns, host_end, peer = f"{self.tag}n{i}", f"{self.tag}v{i}", f"{self.tag}p{i}"
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", peer)
            self.links.append(host_end)
            sh("ip", "link", "set", peer, "netns", ns)
            sh("ip", "link", "set", host_end, "master", self.bridge)
            sh("ip", "link", "set", host_end, "up")
            ip = f"{self.net}.{i + 1}"
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", peer)
            sh("ip", "-n", ns, "link", "set", peer, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", ns, "route", "add", "default", "via", self.head_ip)  # Ray probes a route to find its IP
            node = Node(ns, ip, self.root / f"n{i}", resources, self.root / f"n{i}.log", host_end)
            self.nodes.append(node)
            self.start_node(node)
        self.wait_nodes(1 + len(self.nodes), timeout_s)
        return self

    def _spawn(self, cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
        with open(log, "a") as out:
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                    env={**os.environ, **ENV, **(env or {})})

    def start_node(self, node: Node, timeout_s: float | None = None) -> None:
        """(Re)start the worker node's Ray in its namespace, with its own mounts and TMPDIR; with ``timeout_s``,
        wait until it registered with the head."""
        started = node.log.read_text().count(STARTED) if node.log.is_file() else 0
        node.tmpdir.mkdir(parents=True, exist_ok=True)
        sh("ip", "link", "set", node.link, "up")
        # Ray gives worker nodes the head's --temp-dir: each node gets a private one at that path (sockets, logs)
        mounts = " && ".join([f"mount -t tmpfs tmpfs {self.root / 'h'}",
                              *(f"mount -t tmpfs -o size=1m tmpfs {h}" for h in self.hide)])
        ray = " ".join(ray_start(f"--address={self.address}", f"--node-ip-address={node.ip}",
                                 f"--resources='{json.dumps(node.resources)}'"))
        script = f"{mounts} && TMPDIR={node.tmpdir} exec {ray}"
        node.proc = self._spawn(["ip", "netns", "exec", node.ns, "unshare", "--mount", "--propagation", "private",
                                 "sh", "-c", script], node.log)
        deadline = time.monotonic() + (timeout_s or 0)
        while timeout_s is not None and node.log.read_text().count(STARTED) == started:
            if node.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"node {node.ns} did not start again: {node.log.read_text()[-3000:]}")
            time.sleep(0.2)

    def wait_nodes(self, count: int, timeout_s: float) -> None:
        """Until ``count`` nodes (the head first) said "Ray runtime started" (a worker says it once registered)."""
        logs = [self.root / "head.log", *(n.log for n in self.nodes)][:count]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            started = [log for log in logs if log.is_file() and STARTED in log.read_text()]
            if len(started) == len(logs):
                return
            exited = [n.ns for n in self.nodes if n.proc is not None and n.proc.poll() is not None]
            if exited or (self.head is not None and self.head.poll() is not None):
                raise RuntimeError(f"a Ray node exited at start ({exited or 'head'}); logs in {self.root}")
            time.sleep(0.2)
        raise RuntimeError(f"the cluster did not start {count} nodes in {timeout_s:g} s; logs in {self.root}")

    # --- losing a node -------------------------------------------------------------------------------------

    def kill_node(self, node: Node, cut: bool = False) -> None:
        """The node is lost: SIGKILL every process in its namespace (its raylet, workers, replicas). ``cut``: its
        link goes down first, so no connection is closed cleanly (no FIN or RST reaches the others), as when a
        board loses power; ``start_node`` brings it up again."""
        if cut:
            sh("ip", "link", "set", node.link, "down")
        for pid in node.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if node.proc is not None:
            node.proc.wait(30)
        deadline = time.monotonic() + 30
        while node.pids() and time.monotonic() < deadline:
            time.sleep(0.1)

    # --- teardown ------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Kill everything started here, delete namespaces, veths and the bridge; raise when something is left."""
        for node in self.nodes:
            self.kill_node(node)
        left = self._stop_head()
        for node in self.nodes:
            sh("ip", "netns", "del", node.ns, check=False)
        for link in reversed(self.links):
            sh("ip", "link", "del", link, check=False)
        namespaces = [n for n in sh("ip", "netns", "list").split() if n.startswith(self.tag + "n")]
        links = [link for link in self.links if sh("ip", "link", "show", link, check=False)]
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)
        assert not (namespaces or links or left), f"left after teardown: {namespaces} {links} {left}"

    def _stop_head(self) -> list[int]:
        """SIGKILL the head's process group and its descendants (Ray's daemons and workers); those left after 10 s."""
        import psutil

        if self.head is None:
            return []
        procs = []
        for p in psutil.process_iter():
            try:
                if os.getpgid(p.pid) == self.head.pid:
                    procs.append(p)
            except (ProcessLookupError, psutil.Error):
                pass
        try:
            procs += psutil.Process(self.head.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        self.head.wait(10)
        _, alive = psutil.wait_procs(procs, timeout=10)
        return [p.pid for p in alive if p.status() != psutil.STATUS_ZOMBIE]

    def __enter__(self) -> NetnsFleet:
        try:
            return self.start()
        except BaseException:
            self.keep = True
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()
