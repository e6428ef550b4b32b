"""Nothing in edgeinfer phones home: the telemetry of every library it uses is off in its processes and children.

Called once at ``import edgeinfer`` (so in the CLI, the API and every worker process) and again by the CLI with
``offline=True`` before anything imports the Hugging Face libraries. Environment switches are set with
``setdefault``: a value the user set wins, and child processes inherit them. Standard library only.
"""

from __future__ import annotations

import os
import sys

SWITCHES = {
    # huggingface_hub (under transformers, optimum): no usage headers or telemetry requests
    # https://huggingface.co/docs/huggingface_hub/package_reference/environment_variables#hfhubdisabletelemetry
    "HF_HUB_DISABLE_TELEMETRY": "1",
    # the cross-tool opt-out (https://consoledonottrack.com/); huggingface_hub honours it too
    "DO_NOT_TRACK": "1",
    # Ray's usage stats (`ray-node`, `serve --ray`): https://docs.ray.io/en/latest/cluster/usage-stats.html
    "RAY_USAGE_STATS_ENABLED": "0",
}
# the CLI loads local files only: no request to the Hugging Face Hub at all
# https://huggingface.co/docs/huggingface_hub/package_reference/environment_variables#hfhuboffline
OFFLINE = {"HF_HUB_OFFLINE": "1"}
# OpenVINO's telemetry (openvino-telemetry) sends to Google Analytics from a forked child unless a consent
# file in the user's home says no, and has no switch of its own but CI=true. Its users (openvino.tools.ovc,
# which optimum-intel's export runs, and NNCF) import it in a try block and use a no-op stub when the import
# fails; a None entry in sys.modules makes the import fail (https://docs.python.org/3/reference/import.html#the-module-cache)
OPENVINO_TELEMETRY = "openvino_telemetry"
# FastAPI (0.142 and later) records OpenTelemetry traces, metrics and logs of every request into the process's
# global providers (Ray sets some in `serve --ray` replicas) and, with FASTAPI_OTEL_AUTO_CONFIGURE=true, adds
# OTLP exporters from the environment (https://fastapi.tiangolo.com/advanced/opentelemetry/); edgeinfer's
# servers record none of it. Prometheus metrics on /metrics are edgeinfer's own.
FASTAPI_OFF = {"tracing": False, "metrics": False, "logs": False, "operation_spans": False, "auto_configure": False}


def off(offline: bool = False) -> None:
    for name, value in {**SWITCHES, **(OFFLINE if offline else {})}.items():
        os.environ.setdefault(name, value)
    if not tracking_allowed():
        sys.modules.setdefault(OPENVINO_TELEMETRY, None)  # type: ignore[arg-type]


def tracking_allowed() -> bool:
    """DO_NOT_TRACK=0 (or false): the user's own choice to leave the libraries' telemetry on."""
    return os.environ.get("DO_NOT_TRACK") in ("0", "false", "False")


def fastapi_options(fastapi: type) -> dict:
    """The keyword arguments that turn a FastAPI application's own telemetry off (``FastAPI(**these)``): none
    for a FastAPI without it, or when the user set DO_NOT_TRACK=0."""
    import inspect

    if tracking_allowed() or "telemetry" not in inspect.signature(fastapi.__init__).parameters:
        return {}
    return {"telemetry": dict(FASTAPI_OFF)}
