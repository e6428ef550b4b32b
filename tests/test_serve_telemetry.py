"""edgeinfer's HTTP servers record no FastAPI telemetry: FastAPI 0.142 and later trace every request into the
process's global OpenTelemetry providers unless told not to. ``serve`` runs on Starlette alone (nothing to turn
off); ``serve --ray``'s router is a FastAPI app, made with edgeinfer/telemetry.py ``fastapi_options``.

Each case runs in a subprocess: a global tracer provider can be set once per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = """
import json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
spans = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(spans))
trace.set_tracer_provider(provider)

from fastapi import FastAPI
from fastapi.testclient import TestClient
from edgeinfer import telemetry
from edgeinfer.serve.app import create_app
from edgeinfer.serve.config import ServeConfig

plain = FastAPI()
plain.get("/health")(lambda: {})
router = FastAPI(**telemetry.fastapi_options(FastAPI))  # as edgeinfer/fleet/router.py makes its app
router.get("/health")(lambda: {})
serve = create_app(ServeConfig(bundles=[]), {}, {})
counts = {}
for name, app in (("plain", plain), ("router", router), ("serve", serve)):
    spans.clear()
    status = TestClient(app).get("/health").status_code
    counts[name] = [status, len(spans.get_finished_spans())]
print(json.dumps(counts))
"""


def spans_per_request(env: dict[str, str]) -> dict[str, list[int]]:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120,
                         env={**os.environ, **env})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def fastapi_traces() -> bool:
    import inspect

    from fastapi import FastAPI

    return "telemetry" in inspect.signature(FastAPI.__init__).parameters


def test_servers_record_no_spans_where_fastapi_would():
    pytest.importorskip("opentelemetry.sdk")
    if not fastapi_traces():
        pytest.skip("this FastAPI has no telemetry of its own")
    counts = spans_per_request({"DO_NOT_TRACK": "1"})
    assert counts["plain"][0] == 200 and counts["plain"][1] > 0  # FastAPI's default: the request is traced
    assert counts["router"] == [200, 0] and counts["serve"] == [200, 0]


def test_do_not_track_0_leaves_fastapis_telemetry_on_and_serve_has_none():
    pytest.importorskip("opentelemetry.sdk")
    if not fastapi_traces():
        pytest.skip("this FastAPI has no telemetry of its own")
    counts = spans_per_request({"DO_NOT_TRACK": "0"})
    assert counts["router"][0] == 200 and counts["router"][1] == counts["plain"][1] > 0
    assert counts["serve"] == [200, 0]
