"""For the serve tests and benchmark: MiniLM bundles (until ``edgeinfer deploy`` writes them) and a real
``edgeinfer serve`` subprocess on a free loopback port.

Not a stand-in: these are real bundles of the real model, converted by a real backend.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from edgeinfer.model.bundle import Manifest, TextSpec, write
from edgeinfer.model.kind import Kind, find


def minilm_bundle(onnx: Path, out: Path, backend: str = "openvino", text: bool = True) -> Path:
    """Convert the MiniLM ONNX file ``onnx`` with ``backend`` (fp32) into a bundle at ``out``."""
    if find(out) is Kind.ENCODER_BUNDLE:  # built by an earlier test
        return out
    from edgeinfer.contract import registry as plugins
    from edgeinfer.testing import minilm

    be = plugins.get_backend(backend)
    out.mkdir(parents=True, exist_ok=True)
    artifact = be.quantize(onnx, "fp32", None, out / ("model" + be.tensors.native[0]))
    with be.load(artifact) as s:
        inputs, outputs, target = list(s.inputs), list(s.outputs), s.device
    if text:
        (out / "tokenizer").mkdir(exist_ok=True)
        shutil.copy(minilm.model_dir() / "tokenizer.json", out / "tokenizer" / "tokenizer.json")
    write(out, Manifest(
        backend=backend, board="host-cpu", scheme="fp32", artifacts=[artifact.name], inputs=inputs, outputs=outputs,
        source={"model": "sentence-transformers/all-MiniLM-L6-v2", "file": onnx.name}, versions=be.versions(),
        target=target or "", text=TextSpec(max_length=128, pooling="mean", normalize=True) if text else None,
    ))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProc:
    def __init__(self, bundles: list[Path], *args: str, log: Path, env: dict[str, str] | None = None,
                 wait_ready: bool = True):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # Ray Serve routes to the router's replica before serve.run returns and the CLI says "ready:"; a request
        # in between once got "Server disconnected without sending a response" (/v1/models, CI of 2026-12-05)
        self._ray = "--ray" in args
        self.log = log
        self._log_file = open(log, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "edgeinfer.cli", "serve", *map(str, bundles), "--port", str(self.port), *args],
            stdout=self._log_file, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
        )
        if wait_ready:
            self.wait_ready()

    def wait_ready(self, timeout: float = 120.0, headers: dict[str, str] | None = None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if (__import__("httpx").get(self.url + "/ready", headers=headers, timeout=2).status_code == 200
                        and (not self._ray or "\nready: " in "\n" + self.output())):
                    return
            except __import__("httpx").TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"server not ready within {timeout} s:\n{self.output()}")

    def output(self) -> str:
        if not self._log_file.closed:
            self._log_file.flush()
        return self.log.read_text()

    def terminate(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"server did not exit within {timeout} s of SIGTERM:\n{self.output()}") from None
        finally:
            self._log_file.close()

    def __enter__(self) -> ServerProc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate()


# Shared libraries of the model runtimes and vendor SDKs: only the worker processes that run a model load
# them; the HTTP process that answers every request stays small without them (issue 30, "Footprint").
RUNTIME_LIBRARIES = ("libtorch", "onnxruntime", "openvino", "librknn", "rkllm", "libascendcl", "libacl_")


def runtime_libraries(pid: int) -> list[str]:
    """The runtime / vendor-SDK shared libraries mapped into process ``pid`` (Linux /proc/PID/maps)."""
    paths = {line.split()[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if ".so" in line}
    return sorted(p for p in paths if any(w in Path(p).name.lower() or f"/{w}" in p.lower()
                                         for w in RUNTIME_LIBRARIES))


def rss_kib(pid: int) -> dict[str, int]:
    """VmRSS (now) and VmHWM (peak) of process ``pid`` in KiB, from /proc/PID/status."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {k: int(fields[k].split()[0]) for k in ("VmRSS", "VmHWM")}


def largest_embeddings_body(max_body_bytes: int = 8 * 1024 * 1024, max_inputs: int = 256) -> bytes:
    """The largest ``/v1/embeddings`` body the server accepts by default: ``max_inputs`` strings of ordinary
    words filling the body limit (each truncated to the model's ``max_length`` only after tokenizing)."""
    import json

    words = "the quick brown fox jumps over a lazy dog while edge devices embed every sentence ".split()
    each = (max_body_bytes - 1024) // max_inputs - 8  # JSON quotes, commas and the envelope fit in the rest
    text = " ".join(words[i % len(words)] for i in range(each // 4))[:each]
    body = json.dumps({"input": [text] * max_inputs}).encode()
    assert len(body) <= max_body_bytes, len(body)
    return body


def largest_generation_bodies(limit: int = 8 * 1024 * 1024,
                              model: str = "tiny-qwen3") -> dict[str, tuple[str, bytes]]:
    """The largest chat and completion bodies the default body limit allows: one long message / prompt
    filling it, and (chat) as many messages as a request may hold (MAX_MESSAGES), filling it together."""
    import json

    from edgeinfer.serve.decoder_schemas import MAX_MESSAGES

    text = "word " * ((limit - 1024) // 5)
    part = "word " * (((limit - 1024) // MAX_MESSAGES - len(json.dumps({"role": "user", "content": ""}) + ", ")) // 5)
    bodies = {"chat-one-message": ("/v1/chat/completions", {"messages": [{"role": "user", "content": text}]}),
              "chat-many-messages": ("/v1/chat/completions",
                                     {"messages": [{"role": "user", "content": part}] * MAX_MESSAGES}),
              "completion": ("/v1/completions", {"prompt": text})}
    out = {k: (path, json.dumps({"model": model, **b}).encode()) for k, (path, b) in bodies.items()}
    assert all(limit - 64 * 1024 < len(b) <= limit for _, b in out.values()), [len(b) for _, b in out.values()]
    return out


def log_bundle(out: Path) -> Path:
    """An onnxruntime bundle of ``y = log(x)`` (x float32 [batch, n]): negative inputs give NaN outputs, 0 gives
    -Inf — a real model producing non-numbers, for checking how the server answers them."""
    if find(out) is Kind.ENCODER_BUNDLE:  # built by an earlier test
        return out
    from onnx import TensorProto, helper


    graph = helper.make_graph(
        [helper.make_node("Log", ["x"], ["y"])], "log",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "n"])],
    )
    return _onnxruntime_bundle(out, graph, "log(x)")


class HealthProbe:
    """Polls ``GET /health`` on a fixed schedule (every ``interval`` s) in a thread. Each sample's latency
    counts from its *scheduled* time, so a server that stalls for 2 s yields 2 s / interval slow samples,
    not one (no coordinated omission)."""

    def __init__(self, url: str, interval: float = 0.01):
        self.url, self.interval = url + "/health", interval
        self.samples: list[tuple[float, float]] = []  # (scheduled time, latency) in perf_counter seconds
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import httpx

        with httpx.Client(timeout=60) as c:
            t0 = time.perf_counter()
            for k in itertools.count():
                due = t0 + k * self.interval
                now = time.perf_counter()
                if due > now:
                    time.sleep(due - now)
                if self._done.is_set():
                    return
                if c.get(self.url).status_code != 200:
                    raise AssertionError("/health did not answer 200")
                self.samples.append((due, time.perf_counter() - due))

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def between(self, start: float, end: float) -> list[float]:
        return [lat for due, lat in self.samples if start <= due <= end]


def slow_bundle(out: Path, layers: int = 64, width: int = 1024, batch: int | str = "batch") -> Path:
    """An onnxruntime bundle of ``layers`` dense layers (``x`` float32 [batch, 16] → ``y`` [batch, 16]) whose
    rows are cheap to send and slow to run (~``2 * layers * width**2`` FLOPs each): for timeouts. A fixed
    ``batch`` of thousands of rows makes it slow to load too (a worker runs it once before it is ready)."""
    if find(out) is Kind.ENCODER_BUNDLE:  # built by an earlier test
        return out
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper


    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((16, width)) / 4).astype(np.float32), "w_in"),
             numpy_helper.from_array((rng.standard_normal((width, width)) / width**0.5).astype(np.float32), "w"),
             numpy_helper.from_array((rng.standard_normal((width, 16)) / width**0.5).astype(np.float32), "w_out")]
    nodes, h = [helper.make_node("MatMul", ["x", "w_in"], ["h0"])], "h0"
    for i in range(layers):
        nodes += [helper.make_node("MatMul", [h, "w"], [f"m{i}"]), helper.make_node("Tanh", [f"m{i}"], [f"h{i + 1}"])]
        h = f"h{i + 1}"
    nodes.append(helper.make_node("MatMul", [h, "w_out"], ["y"]))
    graph = helper.make_graph(nodes, "slow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 16])], inits)
    return _onnxruntime_bundle(out, graph, f"{layers} dense layers of {width}")


def _onnxruntime_bundle(out: Path, graph: Any, what: str) -> Path:
    """Write ``graph`` as an fp32 onnxruntime bundle at ``out``."""
    import onnx
    from onnx import helper

    from edgeinfer.contract import registry as plugins

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(model, out / "model.onnx")
    be = plugins.get_backend("onnxruntime")
    with be.load(out / "model.onnx") as s:
        inputs, outputs = list(s.inputs), list(s.outputs)
    write(out, Manifest(backend="onnxruntime", board="host-cpu", scheme="fp32", artifacts=["model.onnx"],
                        inputs=inputs, outputs=outputs, source={"model": what}, versions=be.versions()))
    return out


def _serve_processes(name: str) -> dict:
    import json

    return json.loads((Path(__file__).resolve().parents[2] / "bench" / "results" /
                       f"serve_processes-{name}.json").read_text())


def _decoder_worker_peak(run: dict) -> int:
    return next(p["VmHWM_bytes"] for p in run["after"] if "edgeinfer.cli serve" not in p["cmdline"])


PEER_BUNDLES = ("llamacpp-q8_0", "host-w8a8")  # bench/serve_processes.py's two peer-bench bundles


def measured_in_process_saving() -> int:
    """The smaller of the two savings of ``serve --in-process`` that bench/serve_processes.py measured (bytes of the
    process tree's peak, with a worker process less; each the mean of two runs of each side), from the committed
    results: what plan and the start-up check may take off per decoder at most."""
    def tree(name: str) -> float:
        return sum(_serve_processes(f"{name}{i}")["tree_peak_bytes"] for i in ("", "2")) / 2

    return int(min(tree(f"{b}-s47-lean") - tree(f"{b}-s47-inproc") for b in PEER_BUNDLES))


def measured_served_worker_saving() -> int:
    """The smaller of the two savings bench/serve_processes.py measured in a served decoder worker's peak when it
    stopped reading the bundle's manifest itself (the mean of two runs before, baeb6bb, and after): what the plan
    may take off a served decoder's process at most."""
    def worker(name: str) -> float:
        return sum(_decoder_worker_peak(_serve_processes(f"{name}{i}")) for i in ("", "2")) / 2

    return int(min(worker(f"{b}-s47-base") - worker(f"{b}-s47-lean") for b in PEER_BUNDLES))


# bench/serve_footprint.py's runs of 2026-12-06 (tenth session) that measured a runtime's served decoder workers
SERVED_SAVING_RUNS = {"onnxruntime": ("s67-host-fill", "s67-tiny"), "llama.cpp": ("s67-llamacpp-host-fill",)}


def measured_runtime_served_worker_saving(runtime: str) -> int:
    """The smallest saving bench/serve_footprint.py measured in a served decoder worker of ``runtime`` against the
    bare decoder process of its host rows (their fitted overhead, the ``runtime`` of each run's plan, less the
    worker's peak less its planned weights, KV and activations): what the plan may take off such a served
    decoder's process at most."""
    import json

    results = Path(__file__).resolve().parents[2] / "bench" / "results"
    savings = []
    for name in SERVED_SAVING_RUNS[runtime]:
        for row in json.loads((results / f"serve_footprint-{name}.json").read_text())["rows"]:
            bd = row["plan_breakdown_bytes"]
            residual = row["worker_peak_bytes"] - bd["weights"] - bd["kv_cache"] - bd["activations"]
            savings.append(bd["runtime"] - residual)
    return int(min(savings))


def large_block_mapped() -> bool | None:
    """Whether a freshly allocated 4 MiB block gets a mapping of its own after an 8 MiB one was freed: not under
    glibc's default dynamic threshold (it rose to 8 MiB with that free), yes with serve's fixed one
    (``edgeinfer.serve.child.fixed_mmap_threshold``). None without glibc's ``mallinfo2`` (glibc < 2.33)."""
    import ctypes

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                    "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(None)
    if not hasattr(libc, "mallinfo2"):
        return None
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes, libc.mallinfo2.restype = [ctypes.c_void_p], Mallinfo2
    libc.free(libc.malloc(8 << 20))
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(4 << 20)
    mapped = libc.mallinfo2().hblkhd - before >= 4 << 20
    libc.free(block)
    return mapped


def send_large_block_mapped(conn: Any) -> None:
    """A worker entry point (``edgeinfer.serve.child.start``) that answers :func:`large_block_mapped`."""
    conn.send(large_block_mapped())
