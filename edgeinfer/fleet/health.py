"""What the router's ``/metrics`` says about the fleet itself: its nodes (alive or lost), its accelerator units,
each model's replicas by Serve state, and the bundle copies nodes refused (edgeinfer/fleet/replicas.py ``arrive``).

Nodes, units and replicas are read from Ray's GCS and Serve's controller when Prometheus scrapes (``refresh``, in
a thread: both are blocking calls); refusals are counted as replicas report them (``refused``).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("ray.serve")


class FleetState:
    """A Prometheus collector for the router's registry."""

    def __init__(self, app: str):
        self.app = app
        self.nodes: list[dict[str, Any]] = []
        self.units: dict[str, float] = {}
        self.replicas: dict[str, dict[str, int]] = {}
        self.refusals: dict[tuple[str, str], int] = {}

    def refused(self, bundle: str, node: str, address: str, reason: str) -> None:
        """A replica on ``node`` refused its copy of ``bundle``: counted, and one line in the router's log."""
        self.refusals[(node, bundle)] = self.refusals.get((node, bundle), 0) + 1
        log.warning("node %s (%s) refused its copy of bundle %s: %s", node, address, bundle, reason)

    def refresh(self) -> None:
        import ray
        from ray import serve

        self.nodes = [{"node": n["NodeID"], "address": n["NodeManagerAddress"], "alive": n["Alive"]}
                      for n in ray.nodes()]
        self.units = {k: v for k, v in ray.cluster_resources().items() if accelerator(k)}
        try:
            deployments = serve.status().applications[self.app].deployments
        except KeyError:  # the application is (re)deploying
            deployments = {}
        self.replicas = {name: dict(d.replica_states) for name, d in deployments.items()
                         if name.startswith("bundle-")}

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        up = GaugeMetricFamily("edgeinfer_fleet_node_up", "Ray nodes of the cluster: 1 alive, 0 lost.",
                               labels=["node", "address"])
        for n in self.nodes:
            up.add_metric([n["node"], n["address"]], 1.0 if n["alive"] else 0.0)
        units = GaugeMetricFamily("edgeinfer_fleet_resource_units", "Accelerator units on the alive nodes.",
                                  labels=["resource"])
        for resource, count in sorted(self.units.items()):
            units.add_metric([resource], count)
        replicas = GaugeMetricFamily("edgeinfer_fleet_replicas", "Replicas of each model's deployment by Serve "
                                     "state (RUNNING, STARTING, PENDING_ALLOCATION, ...).", labels=["model", "state"])
        for deployment, states in sorted(self.replicas.items()):
            for state, count in sorted(states.items()):
                replicas.add_metric([deployment.removeprefix("bundle-"), str(state)], count)
        refusals = CounterMetricFamily("edgeinfer_fleet_bundle_refusals", "Replicas that refused their node's copy "
                                       "of a bundle (it failed verification against the seals).",
                                       labels=["node", "bundle"])
        for (node, bundle), count in sorted(self.refusals.items()):
            refusals.add_metric([node, bundle], count)
        yield from (up, units, replicas, refusals)


def accelerator(resource: str) -> bool:
    """A custom accelerator resource (edgeinfer/contract/resources.py names them ``<vendor>_<unit>``), not one of
    Ray's own (CPU, memory, object_store_memory, node:..., accelerator_type:...)."""
    return "_" in resource and not resource.startswith(("node:", "memory", "object_store", "accelerator_type"))
