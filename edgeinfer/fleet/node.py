"""``edgeinfer ray-node``: start a Ray node (head or worker) that advertises this machine's accelerators."""

from __future__ import annotations

import json
import subprocess
import sys

from edgeinfer.errors import BackendUnavailableError
from edgeinfer.fleet.resources import NodeResources, labels_arg

INSTALL_HINT = "pip install 'edgeinfer[fleet]' (Ray Serve; see docs/fleet.md)"


def require_ray() -> None:
    """Ray importable, or exit 3 with the install line."""
    try:
        import ray  # noqa: F401
    except ImportError as e:
        raise BackendUnavailableError(f"Ray is not installed ({e})", INSTALL_HINT, kind="package_missing") from None


def start_command(node: NodeResources, address: str | None, port: int, num_cpus: int | None,
                  block: bool) -> list[str]:
    """The ``ray start`` command line for this node: a head unless ``address`` names one to join."""
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start"]
    cmd += [f"--address={address}"] if address else ["--head", f"--port={port}", "--include-dashboard=false"]
    cmd += [f"--resources={json.dumps(node.resources, sort_keys=True)}", f"--labels={labels_arg(node.labels)}"]
    if num_cpus is not None:
        cmd.append(f"--num-cpus={num_cpus}")
    if block:
        cmd.append("--block")
    return cmd


def start(cmd: list[str]) -> int:
    """Run ``ray start``; its own output says where the node joined and how to stop it (``ray stop``)."""
    require_ray()
    return subprocess.call(cmd)
