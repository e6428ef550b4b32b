"""The Ray router's ``/metrics``: its own HTTP counters and every replica's pushed registry, in one Prometheus
exposition. Families of the same name are merged; each sample carries a ``replica`` label (``router`` for the
router's own, else Serve's replica id ``<deployment>#<id>``) and a ``node`` label (the Ray node id it runs on), so
every replica's device gauges (edgeinfer/serve/device_gauges.py) are series of their own. A replica that stopped
pushing for ``STALE_S`` seconds (gone, replaced by Serve) is dropped."""

from __future__ import annotations

import time
from typing import Any

STALE_S = 30.0


class ReplicaMetrics:
    """A Prometheus collector over the router's registry and the texts replicas pushed."""

    def __init__(self, own: Any, node: str = ""):
        self.own = own
        self.node = node
        self.pushed: dict[str, tuple[float, str, str]] = {}

    def push(self, replica: str, text: str, node: str = "") -> None:
        self.pushed[replica] = (time.monotonic(), node, text)

    def texts(self) -> dict[str, tuple[str, str]]:
        """replica → (node, exposition) of the replicas heard from within ``STALE_S`` seconds."""
        now = time.monotonic()
        self.pushed = {k: v for k, v in self.pushed.items() if now - v[0] < STALE_S}
        return {k: (node, text) for k, (_, node, text) in sorted(self.pushed.items())}

    def collect(self):
        from prometheus_client.metrics_core import Metric
        from prometheus_client.parser import text_string_to_metric_families
        from prometheus_client.samples import Sample

        merged: dict[str, Metric] = {}

        def add(family: Any, replica: str, node: str) -> None:
            out = merged.setdefault(family.name, Metric(family.name, family.documentation, family.type))
            # a sample about another node (the router's fleet gauges, edgeinfer/fleet/health.py) keeps its own
            out.samples += [Sample(s.name, {"node": node, **s.labels, "replica": replica}, s.value, s.timestamp)
                            for s in family.samples]

        for family in self.own.collect():
            add(family, "router", self.node)
        for replica, (node, text) in self.texts().items():
            for family in text_string_to_metric_families(text):
                add(family, replica, node)
        yield from merged.values()

    def exposition(self) -> bytes:
        from prometheus_client import CollectorRegistry, generate_latest

        registry = CollectorRegistry()
        registry.register(self)
        return generate_latest(registry)
