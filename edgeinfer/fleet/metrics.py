"""The Ray router's ``/metrics``: its own HTTP counters and every replica's pushed registry, in one Prometheus
exposition. Families of the same name are merged; each sample carries a ``replica`` label (``router`` for the
router's own, else Serve's replica id ``<deployment>#<id>``). A replica that stopped pushing for ``STALE_S``
seconds (gone, replaced by Serve) is dropped."""

from __future__ import annotations

import time
from typing import Any

STALE_S = 30.0


class ReplicaMetrics:
    """A Prometheus collector over the router's registry and the texts replicas pushed."""

    def __init__(self, own: Any):
        self.own = own
        self.pushed: dict[str, tuple[float, str]] = {}

    def push(self, replica: str, text: str) -> None:
        self.pushed[replica] = (time.monotonic(), text)

    def texts(self) -> dict[str, str]:
        now = time.monotonic()
        self.pushed = {k: v for k, v in self.pushed.items() if now - v[0] < STALE_S}
        return {k: text for k, (_, text) in sorted(self.pushed.items())}

    def collect(self):
        from prometheus_client.metrics_core import Metric
        from prometheus_client.parser import text_string_to_metric_families
        from prometheus_client.samples import Sample

        merged: dict[str, Metric] = {}

        def add(family: Any, replica: str) -> None:
            out = merged.setdefault(family.name, Metric(family.name, family.documentation, family.type))
            out.samples += [Sample(s.name, {**s.labels, "replica": replica}, s.value, s.timestamp)
                            for s in family.samples]

        for family in self.own.collect():
            add(family, "router")
        for replica, text in self.texts().items():
            for family in text_string_to_metric_families(text):
                add(family, replica)
        yield from merged.values()

    def exposition(self) -> bytes:
        from prometheus_client import CollectorRegistry, generate_latest

        registry = CollectorRegistry()
        registry.register(self)
        return generate_latest(registry)
