"""The HTTP process's CPU per streamed chunk on uvicorn's two HTTP/1.1 protocols: h11 (pure Python) and httptools
(llhttp, C), the one ``edgeinfer serve`` uses when it is installed (edgeinfer/serve/app.py ``_protocol_class``).

A Starlette app streams ``--chunks`` server-sent events of one completion chunk each (the size of one token's
``/v1/completions`` chunk) per request; ``--requests`` requests read to the end by one client, one after another.
The figure is the server process's CPU time (every thread's, ``_common.cpu_ms``) over those requests divided by
the chunks sent: what one token costs the HTTP process's framing and writing, without a model, a worker or the
OpenAI routes. The protocols alternate, ``--rounds`` times each, a fresh server process per run.

    python bench/http_protocol.py [--chunks 2000] [--requests 20] [--rounds 3] [--out http_protocol]

Writes bench/results/<out>.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
from _common import cpu_ms  # noqa: E402

SERVER = r"""
import asyncio, sys
import uvicorn
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route

proto, port, chunks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
CHUNK = (b'data: {"id":"cmpl-0","object":"text_completion","created":0,"model":"m",'
         b'"choices":[{"index":0,"text":" word","logprobs":null,"finish_reason":null}]}\n\n')

async def events():
    for _ in range(chunks):
        yield CHUNK
        await asyncio.sleep(0)

async def stream(request):
    return StreamingResponse(events(), media_type="text/event-stream")

if proto == "h11":
    from uvicorn.protocols.http.h11_impl import H11Protocol as Protocol
else:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Protocol
uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/s", stream)]), host="127.0.0.1", port=port, http=Protocol,
                              log_level="warning", lifespan="off")).run()
"""


def run(proto: str, chunks: int, requests: int) -> float:
    """Microseconds of the server's CPU per chunk."""
    from edgeinfer.testing.serve import free_port

    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, proto, str(port), str(chunks)])
    try:
        url = f"http://127.0.0.1:{port}/s"
        for _ in range(200):
            try:
                httpx.get(url, timeout=5)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        start = cpu_ms(server.pid)
        with httpx.Client(timeout=60) as client:
            for _ in range(requests):
                with client.stream("GET", url) as r:
                    for _ in r.iter_bytes():
                        pass
        return (cpu_ms(server.pid) - start) / (chunks * requests) * 1e3
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunks", type=int, default=2000)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="http_protocol")
    args = ap.parse_args()
    runs: dict[str, list[float]] = {"h11": [], "httptools": []}
    for _ in range(args.rounds):
        for proto in runs:
            runs[proto].append(round(run(proto, args.chunks, args.requests), 2))
            print(f"{proto}: {runs[proto][-1]} us CPU per chunk")
    _common.write(args.out, {"chunks": args.chunks, "requests": args.requests, "load_average": os.getloadavg(),
                             "us_cpu_per_chunk": runs,
                             "median_us_cpu_per_chunk": {p: statistics.median(v) for p, v in runs.items()}})


if __name__ == "__main__":
    main()
