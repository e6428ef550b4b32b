"""This machine's accelerators as Ray custom resources and node labels, from every backend's probe.

Each backend turns its own probe into :class:`~edgeinfer.contract.resources.Accelerator` s; this module
merges them (the same chips seen by two backends count once: the larger count wins) and adds the labels a
scheduler or an operator reads: the host's memory and each accelerator's own memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from edgeinfer.contract.resources import Accelerator

LABEL_PREFIX = "edgeinfer.io/"
MIB = 2**20


@dataclass
class NodeResources:
    resources: dict[str, int]  # Ray custom resource -> count
    labels: dict[str, str]  # Ray node labels (Kubernetes label syntax)
    accelerators: list[dict[str, Any]] = field(default_factory=list)  # each with the backend that found it
    problems: list[str] = field(default_factory=list)  # backends whose probe or accelerators() failed

    def to_json(self) -> dict[str, Any]:
        return {"resources": self.resources, "labels": self.labels, "accelerators": self.accelerators,
                "problems": self.problems}


def merge(found: Iterable[tuple[str, Accelerator]], host_memory_bytes: int) -> NodeResources:
    """Resources and labels from (backend, accelerator) pairs and the host's total memory."""
    best: dict[str, tuple[str, Accelerator]] = {}
    for backend, acc in found:
        if acc.resource not in best or acc.count > best[acc.resource][1].count:
            best[acc.resource] = (backend, acc)
    labels = {f"{LABEL_PREFIX}memory-mb": str(host_memory_bytes // MIB)}
    for name, (_backend, acc) in sorted(best.items()):
        if acc.memory_bytes:
            labels[f"{LABEL_PREFIX}{name}-memory-mb"] = str(acc.memory_bytes // MIB)
    return NodeResources(
        resources={name: acc.count for name, (_b, acc) in sorted(best.items())},
        labels=labels,
        accelerators=[{"backend": b, **acc.to_json()} for _n, (b, acc) in sorted(best.items())],
    )


def probe_accelerators() -> tuple[list[tuple[str, Accelerator]], list[str]]:
    """(backend, accelerator) for every installed backend's probe; the backends that failed, one line each."""
    from edgeinfer.contract import registry as plugins

    found, problems = [], []
    for name, entry in sorted(plugins.registry().backends.items()):
        backend = entry.cls()
        try:
            found += [(name, acc) for acc in backend.accelerators(backend.probe())]
        except Exception as e:  # one broken backend must not hide the others' hardware
            problems.append(f"{name}: {type(e).__name__}: {e}")
    return found, problems


def node_resources() -> NodeResources:
    """What ``edgeinfer ray-resources`` prints and ``ray-node`` advertises."""
    from edgeinfer.planning.boards import meminfo

    found, problems = probe_accelerators()
    node = merge(found, meminfo()[0])
    node.problems = problems
    return node


def labels_arg(labels: dict[str, str]) -> str:
    """``ray start --labels`` form: ``k1=v1,k2=v2``."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
