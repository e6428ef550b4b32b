"""``edgeinfer serve --in-process``: the decoder on a thread of the HTTP process (one process, no worker),
answering what the worker process answers; the options it cannot go with are refused."""

from __future__ import annotations

import concurrent.futures as cf
import json
import signal
import threading
from pathlib import Path

import httpx
import pytest

from edgeinfer.serve.child import ChildThread
from edgeinfer.testing.cli import run_cli
from edgeinfer.testing.serve import ServerProc, runtime_libraries

PROMPTS = ["The licence grants", "Redistribution and use in source", "THE SOFTWARE IS PROVIDED"]


def children(pid: int) -> list[int]:
    return [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]


def complete(url: str, model: str, prompt: str, **kw) -> str:
    body = {"model": model, "prompt": prompt, "max_tokens": 24, "temperature": 0, **kw}
    r = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_one_process_serves_the_bundles_own_greedy_text(tiny_qwen3_host_bundle, tmp_path):
    """The bundle's decoder runs in the server process itself (its pid in /ready, the runtime library mapped
    there, no child process); concurrent completions equal the bundle's own generator, one prompt at a time.
    SIGTERM mid-stream lets the stream finish and the server exit 0."""
    import edgeinfer
    from edgeinfer.contract.generation import GenerationOptions

    with edgeinfer.load(tiny_qwen3_host_bundle, threads=1) as g:
        expected = [g.generate(p, GenerationOptions(max_new_tokens=24, temperature=0.0)).text for p in PROMPTS]
    assert all(expected)
    with ServerProc([tiny_qwen3_host_bundle], "--in-process", "--slots", "2", "--threads", "1",
                    log=tmp_path / "log") as server:
        ready = httpx.get(server.url + "/ready", timeout=10).json()
        model = ready["decoders"][0]["model"]
        assert ready["decoders"][0]["pid"] == server.proc.pid, ready
        assert children(server.proc.pid) == [], server.output()
        assert any("onnxruntime" in p for p in runtime_libraries(server.proc.pid))
        with cf.ThreadPoolExecutor(len(PROMPTS)) as ex:  # 3 requests on 2 slots: one waits for a free slot
            got = list(ex.map(lambda p: complete(server.url, model, p), PROMPTS))
        assert got == expected

        lines: list[str] = []
        first = threading.Event()

        def stream() -> None:
            body = {"model": model, "prompt": PROMPTS[0], "max_tokens": 60, "temperature": 0, "stream": True,
                    "ignore_eos": True}
            with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        lines.append(line)
                        first.set()

        t = threading.Thread(target=stream)
        t.start()
        assert first.wait(60), server.output()
        server.proc.send_signal(signal.SIGTERM)
        t.join(60)
        assert server.terminate() == 0, server.output()[-2000:]
        assert lines[-1] == "data: [DONE]", lines[-3:]
        assert json.loads(lines[-2][len("data:"):])["choices"][0]["finish_reason"] == "length", lines[-3:]


@pytest.mark.parametrize("extra", [["--devices", "0"], ["--ray", "auto"]])
def test_in_process_with_devices_or_ray_is_refused_in_one_line(capfd, tiny_qwen3_host_bundle, extra):
    out = run_cli(capfd, "serve", str(tiny_qwen3_host_bundle), "--in-process", *extra)
    assert out.returncode == 2, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--in-process" in lines[0] and "Traceback" not in out.stderr, out.stderr


def test_a_worker_thread_reports_its_end_as_a_worker_process_would():
    """ChildThread: exit code 0 when the worker returns, 1 when it raises, and the parent's end of the pipe
    reads the end of the worker (EOF); kill() is a stop message the worker reads."""

    def worker(conn, fail: bool) -> None:
        conn.send(("ready", {}))
        msg = conn.recv()
        if fail:
            raise RuntimeError("the runtime failed")
        conn.send(("got", msg))

    for fail, code in ((False, 0), (True, 1)):
        t = ChildThread(worker, (fail,), "test-worker")
        assert t.conn.recv() == ("ready", {})
        t.kill()
        if not fail:
            assert t.conn.recv() == ("got", ("stop",))
        with pytest.raises(EOFError):
            t.conn.recv()
        t.join(10)
        assert not t.is_alive() and t.exitcode == code
