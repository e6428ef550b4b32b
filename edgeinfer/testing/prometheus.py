"""A real Prometheus server on loopback for the serve tests and the docs screenshot: a temporary config that
scrapes given targets every second, a temporary TSDB, and the HTTP API's instant queries.

Needs the ``prometheus`` binary (Debian/Ubuntu: ``apt-get install --no-install-recommends prometheus``;
``make dev`` installs it where it can); :func:`binary` is None without it.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Self

from edgeinfer.testing.serve import free_port


def binary() -> str | None:
    return shutil.which("prometheus")


def config(targets: list[str], interval_s: float = 1.0) -> str:
    """A Prometheus config scraping ``targets`` (``host:port``) at ``/metrics`` as job ``edgeinfer``."""
    listed = ", ".join(f"'{t}'" for t in targets)
    return (f"global:\n  scrape_interval: {interval_s:g}s\n  evaluation_interval: {interval_s:g}s\n"
            f"scrape_configs:\n  - job_name: edgeinfer\n    metrics_path: /metrics\n"
            f"    static_configs:\n      - targets: [{listed}]\n")


class PrometheusProc:
    """``prometheus`` on 127.0.0.1 and a free port, scraping ``targets``; files under ``workdir``."""

    def __init__(self, targets: list[str], workdir: Path, interval_s: float = 1.0):
        exe = binary()
        if exe is None:
            raise RuntimeError("prometheus is not installed (apt-get install --no-install-recommends prometheus)")
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "prometheus.yml").write_text(config(targets, interval_s))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "prometheus.log"
        self._log_file = open(self.log, "w")
        self.proc = subprocess.Popen(
            [exe, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self._log_file, stderr=subprocess.STDOUT,
        )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if httpx.get(self.url + "/-/ready", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"prometheus not ready within {timeout} s:\n{self.log.read_text()}")

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The result vector of an instant query; AssertionError with Prometheus's message on a bad query."""
        import httpx

        body = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=30).json()
        if body.get("status") != "success":
            raise AssertionError(f"query {expr!r}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]["result"]

    def value(self, expr: str) -> float | None:
        """The single value an instant query returns (None for an empty result)."""
        result = self.query(expr)
        if not result:
            return None
        assert len(result) == 1, f"query {expr!r} returned {len(result)} series"
        return float(result[0]["value"][1])

    def wait_value(self, expr: str, ok: Callable[[float], bool], timeout: float = 30.0) -> float:
        """Poll ``expr`` until its value satisfies ``ok``; the last value in the AssertionError otherwise."""
        deadline, v = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            v = self.value(expr)
            if v is not None and not math.isnan(v) and ok(v):
                return v
            time.sleep(0.25)
        raise AssertionError(f"{expr!r} was {v} after {timeout} s")

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()

    def __enter__(self) -> PrometheusProc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate()


class _Load:
    """``clients`` closed-loop client threads, each sending :meth:`_send` from :meth:`start` until :meth:`stop`;
    each request's status and round-trip seconds are kept."""

    def __init__(self, url: str, clients: int):
        self.url, self._stop = url, threading.Event()
        self.statuses: list[int] = []
        self.latencies: list[float] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]

    def _send(self, c: Any, k: int) -> int:
        """One request on the ``httpx.Client`` ``c`` (``k`` counts this client's requests); its status."""
        raise NotImplementedError

    def _client(self, i: int) -> None:
        import httpx

        with httpx.Client(timeout=60) as c:
            k = i
            while not self._stop.is_set():
                t0 = time.perf_counter()
                status = self._send(c, k)
                with self._lock:
                    self.statuses.append(status)
                    self.latencies.append(time.perf_counter() - t0)
                k += 1

    def start(self) -> Self:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()

    def run(self, seconds: float) -> Self:
        self.start()
        time.sleep(seconds)
        self.stop()
        return self


class EmbeddingLoad(_Load):
    """Closed-loop clients posting one-sentence ``/v1/embeddings`` requests."""

    SENTENCES = ("edge boxes serve embeddings", "a scrape every second", "counters read back through the API")

    def __init__(self, url: str, clients: int = 4):
        super().__init__(url, clients)

    def _send(self, c: Any, k: int) -> int:
        body = {"input": [self.SENTENCES[k % len(self.SENTENCES)]]}
        return c.post(self.url + "/v1/embeddings", json=body).status_code


class DecoderLoad(_Load):
    """Closed-loop clients streaming ``/v1/completions`` of ``max_tokens`` tokens each (EOS ignored) from
    ``model``; ``completion_tokens`` keeps each finished stream's ``usage.completion_tokens``."""

    PROMPTS = ("The city", "Once upon a time", "Rivers flow into")

    def __init__(self, url: str, model: str, clients: int = 2, max_tokens: int = 12):
        super().__init__(url, clients)
        self.model, self.max_tokens = model, max_tokens
        self.completion_tokens: list[int] = []

    def _send(self, c: Any, k: int) -> int:
        body = {"model": self.model, "prompt": self.PROMPTS[k % len(self.PROMPTS)], "max_tokens": self.max_tokens,
                "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        with c.stream("POST", self.url + "/v1/completions", json=body) as r:
            chunks = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: {")]
        usage = [ch["usage"] for ch in chunks if ch.get("usage")]
        if r.status_code == 200 and usage and not any("error" in ch for ch in chunks):
            with self._lock:
                self.completion_tokens.append(usage[-1]["completion_tokens"])
            return 200
        return r.status_code if r.status_code != 200 else 500  # a stream that ended with an error event
