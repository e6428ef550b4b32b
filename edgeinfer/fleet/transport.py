"""Bundles through Ray's object store, for nodes that do not see the bundle's path (no shared storage).

The starting machine runs a small store actor on its own node (no CPU reserved) that lists a bundle's files and
reads them in pieces of ``CHUNK`` bytes on request; a replica that does not find the bundle's path (or, with
``--ship-bundles``, always) pulls them through Ray's object store, a few pieces in flight, into a node-local
directory named by the bundle's seals, reused by the node's other replicas. Neither end holds a whole bundle in
memory, and the object store holds a few pieces per fetch, however large the bundle (a whole 88 MB archive at
once filled a 100 MiB store to 88 % and made it spill, tests/test_fleet_ray.py). The replica then checks every
file against the seals the starting machine read (edgeinfer/fleet/replicas.py), as for a bundle found by path.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections import deque
from pathlib import Path
from typing import Any

NAMESPACE = "edgeinfer"


CHUNK = 8 * 2**20  # bytes a read returns at most
IN_FLIGHT = 2  # reads a fetch keeps asked for ahead of the one it writes


class BundleStore:
    """On the starting machine's node: each served bundle's files, read in pieces."""

    def __init__(self, paths: dict[str, str]):
        self.roots = {name: Path(path).resolve() for name, path in paths.items()}

    def listing(self, name: str) -> list[tuple[str, int]]:
        """Every file of bundle ``name``: its path relative to the bundle's directory, and its size."""
        root = self.roots[name]
        return sorted((p.relative_to(root).as_posix(), p.stat().st_size) for p in root.rglob("*") if p.is_file())

    def read(self, name: str, rel: str, offset: int) -> bytes:
        """Up to ``CHUNK`` bytes of ``rel`` (a path :meth:`listing` gave) from ``offset``."""
        root = self.roots[name]
        path = (root / rel).resolve()
        if not path.is_relative_to(root):
            raise ValueError(f"{rel!r} is outside bundle {name!r}")
        with path.open("rb") as f:
            f.seek(offset)
            return f.read(CHUNK)


def start_store(name: str, paths: dict[str, str]) -> Any:
    """The store actor ``name``, pinned to this (the driver's) node. Detached, and killed by the command on exit
    (``ray.kill``): owned by a driver that joined a cluster, the actor's creation was cancelled at once (GCS log:
    "Worker ... failed, destroying actor child"; seen in tests/test_fleet_ray.py, cause not found)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return ray.remote(BundleStore).options(name=name, namespace=NAMESPACE, num_cpus=0, lifetime="detached",
                                           scheduling_strategy=here).remote(paths)


def local_copy(name: str, files: dict[str, Any]) -> Path:
    """Where this node keeps the bundle ``name`` with these seals."""
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / "edgeinfer-fleet" / digest / name


def fetch(store: str, name: str, files: dict[str, Any]) -> Path:
    """The bundle unpacked on this node, fetched from the store unless a copy with the same seals is here."""
    import ray

    out = local_copy(name, files)
    if out.is_dir():
        return out
    actor = ray.get_actor(store, namespace=NAMESPACE)
    part = out.with_name(f".{name}.{os.getpid()}.part")
    shutil.rmtree(part, ignore_errors=True)
    try:
        for rel, size in ray.get(actor.listing.remote(name)):
            pull(actor, name, rel, size, part / rel)
    except BaseException:  # a fetch cut short (the store gone, the disk full) leaves no partial copy behind
        shutil.rmtree(part, ignore_errors=True)
        raise
    try:
        part.rename(out)
    except OSError:  # another replica of this node unpacked it first
        shutil.rmtree(part, ignore_errors=True)
        if not out.is_dir():
            raise
    return out


def pull(actor: Any, name: str, rel: str, size: int, dest: Path) -> None:
    """File ``rel`` of ``size`` bytes from the store ``actor`` into ``dest``, ``IN_FLIGHT`` reads asked ahead."""
    import ray

    if ".." in Path(rel).parts or Path(rel).is_absolute():
        raise ValueError(f"the bundle store listed {rel!r}, outside the bundle")
    dest.parent.mkdir(parents=True, exist_ok=True)
    asked: deque = deque()
    with dest.open("wb") as f:
        for offset in range(0, size, CHUNK):
            asked.append(actor.read.remote(name, rel, offset))
            if len(asked) > IN_FLIGHT:
                f.write(ray.get(asked.popleft()))
        while asked:
            f.write(ray.get(asked.popleft()))
