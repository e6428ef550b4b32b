"""serve's HTTP/1.1 protocol class: uvicorn's httptools protocol where httptools is installed, its h11 one
otherwise (edgeinfer/serve/app.py ``_protocol_class``), each answering a request it cannot parse with the same JSON
400, counted in /metrics. The end-to-end malformed requests are tests/test_serve_responsive.py's."""

from __future__ import annotations

import builtins
import json

import pytest

from edgeinfer.serve.app import _protocol_class
from edgeinfer.serve.metrics import Metrics


class Transport:
    def __init__(self):
        self.written, self.closed = b"", False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True


def _answer(protocol_cls, metrics: Metrics) -> tuple[bytes, bytes]:
    proto = protocol_cls.__new__(protocol_cls)  # no server config: only the 400 path runs
    proto.transport = Transport()
    proto.send_400_response("Invalid HTTP request received.")
    assert proto.transport.closed
    head, _, body = proto.transport.written.partition(b"\r\n\r\n")
    return head, body


@pytest.mark.parametrize("httptools", [True, False], ids=["httptools", "h11-fallback"])
def test_the_protocol_answers_malformed_http_with_a_json_400(monkeypatch, httptools):
    if httptools:
        pytest.importorskip("httptools")
    else:
        real = builtins.__import__

        def no_httptools(name, *args, **kwargs):
            if name == "uvicorn.protocols.http.httptools_impl":
                raise ImportError("No module named 'httptools'")
            return real(name, *args, **kwargs)

        monkeypatch.setattr(builtins, "__import__", no_httptools)
    metrics = Metrics()
    cls = _protocol_class(metrics)
    base = cls.__mro__[1].__name__
    assert base == ("HttpToolsProtocol" if httptools else "H11Protocol")
    head, body = _answer(cls, metrics)
    lines = head.decode().split("\r\n")
    assert lines[0] == "HTTP/1.1 400 Bad Request"
    headers = dict(line.split(": ", 1) for line in lines[1:])
    assert headers == {"content-type": "application/json", "content-length": str(len(body)), "connection": "close"}
    assert json.loads(body)["error"]["code"] == 400
    assert metrics.requests.labels("malformed", "400")._value.get() == 1
