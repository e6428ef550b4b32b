"""Bundles through Ray's object store, for nodes that do not see the bundle's path (no shared storage).

The starting machine runs a small store actor on its own node (no CPU reserved) that archives a bundle on
request; a replica that does not find the bundle's path (or, with ``--ship-bundles``, always) fetches the
archive through Ray's object store and unpacks it into a node-local directory named by the bundle's seals,
reused by the node's other replicas. The replica then checks every file against the seals the starting
machine read (edgeinfer/fleet/replicas.py), as for a bundle found by path.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

NAMESPACE = "edgeinfer"


class BundleStore:
    """On the starting machine's node: each served bundle's directory as a tar archive."""

    def __init__(self, paths: dict[str, str]):
        self.paths = paths

    def archive(self, name: str) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(self.paths[name], arcname=".")
        return buf.getvalue()


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
    data = ray.get(ray.get_actor(store, namespace=NAMESPACE).archive.remote(name))
    part = out.with_name(f".{name}.{os.getpid()}.part")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(part, filter="data")
    try:
        part.rename(out)
    except OSError:  # another replica of this node unpacked it first
        shutil.rmtree(part, ignore_errors=True)
    return out
