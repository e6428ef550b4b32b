"""``edgeinfer serve`` pieces that need no model: CLI errors, options, placement, tensor parsing."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from helpers import HEAVY, edgeinfer, imported_modules

from edgeinfer.contract.backend import TensorSpec
from edgeinfer.contract.records import Placement
from edgeinfer.errors import InputError
from edgeinfer.serve.config import ServeConfig, api_key_from_env, parse_devices
from edgeinfer.serve.placement import placement
from edgeinfer.testing.cli import run_cli


@pytest.fixture
def cli(capfd):
    """``edgeinfer ARGS`` in this process (edgeinfer.testing.cli.run_cli): what the command answers."""
    return functools.partial(run_cli, capfd)


def test_serve_help_lists_the_options_and_stays_light():
    r = edgeinfer("serve", "--help")
    assert r.returncode == 0
    for opt in ("--host", "--port", "--max-batch", "--batch-window-ms", "--devices", "--api-key", "--api-key-file",
                "--max-queue", "--timeout-s", "--max-body-mb", "--max-inputs"):
        assert opt in r.stdout
    code = ("import sys; sys.argv=['edgeinfer','serve','--help']\nfrom edgeinfer.cli import main\n"
            "try:\n main()\nexcept SystemExit:\n pass")
    heavy = imported_modules(code) & (set(HEAVY) | {"fastapi", "starlette", "uvicorn", "prometheus_client"})
    assert not heavy, heavy


def test_the_http_process_runs_on_starlette_without_fastapi():
    """FastAPI would add ~12 MiB to serve's HTTP process (edgeinfer/serve/api.py): the app and both route
    modules are Starlette's alone."""
    code = "import edgeinfer.serve.app, edgeinfer.serve.decoder_routes, edgeinfer.serve.encoder_routes"
    mods = imported_modules(code)
    assert "starlette" in mods and "fastapi" not in mods


def test_the_openapi_document_resolves_every_reference_and_docs_points_at_it():
    """The document edgeinfer/serve/api.py builds: each POST body and answer a $ref into components.schemas
    (names as OpenAPI 3.1 allows them), every $ref there resolved, and /docs a page that loads it."""
    import json
    import re

    from starlette.testclient import TestClient

    from edgeinfer.serve.app import create_app

    client = TestClient(create_app(ServeConfig(bundles=[]), {}, {}))
    doc = client.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    assert doc["openapi"].startswith("3.1.") and all(re.fullmatch(r"[a-zA-Z0-9._-]+", k) for k in schemas)
    embed = doc["paths"]["/v1/embeddings"]["post"]
    assert embed["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/EmbeddingRequest"}
    assert embed["responses"]["429"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    refs = set(re.findall(r'"\$ref": "([^"]+)"', json.dumps(doc)))
    assert refs and all(r.startswith("#/components/schemas/") and r.rsplit("/", 1)[1] in schemas for r in refs)
    assert {"/v1/rerank", "/v2/rerank", "/health", "/ready", "/metrics"} <= set(doc["paths"])
    assert "/openapi.json" not in doc["paths"] and "/docs" not in doc["paths"]
    page = client.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'url: "/openapi.json"' in page.text


def test_missing_or_non_bundle_paths_exit_2_with_one_line(tmp_path, cli):
    r = cli("serve", str(tmp_path / "nope"))
    assert r.returncode == 2 and "bundle not found" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = cli("serve", str(tmp_path))
    assert r.returncode == 2 and "not a bundle" in r.stderr and "edgeinfer deploy" in r.stderr


def test_two_bundles_with_the_same_name_are_refused(tmp_path):
    from edgeinfer.model.bundle import Manifest, write
    from edgeinfer.serve.app import open_models

    paths = []
    for parent in ("a", "b"):
        d = tmp_path / parent / "model"
        (d / "m.onnx").parent.mkdir(parents=True)
        (d / "m.onnx").write_bytes(b"x")
        write(d, Manifest(backend="onnxruntime", board="b", scheme="fp32", artifacts=["m.onnx"],
                          inputs=[TensorSpec("x", ("batch", 3), "float32")],
                          outputs=[TensorSpec("y", ("batch", 3), "float32")], source={}))
        paths.append(d)
    with pytest.raises(InputError, match="distinct names"):
        open_models(paths)


@pytest.mark.parametrize("bad, words", [(dict(max_batch=0), "--max-batch"), (dict(max_queue=0), "--max-queue"),
                                        (dict(timeout_s=0), "--timeout-s"), (dict(api_key=" "), "API key"),
                                        (dict(bundles=[]), "BUNDLE"),
                                        (dict(request_helpers=-1), "--request-helpers")])
def test_bad_options_are_input_errors(tmp_path, bad, words):
    with pytest.raises(InputError, match=words):
        ServeConfig(**{"bundles": [tmp_path], **bad}).check()


def test_request_reading_is_strict_json():
    from edgeinfer.serve.prep import ApiError, read_json

    assert read_json(b'{"a": [1, 2.5]}', "application/json") == {"a": [1, 2.5]}
    for body, ctype in [(b'{"a": NaN}', ""), (b'{"a": Infinity}', ""), (b'{"a": -Infinity}', "application/json"),
                        (b"[" * 50000, ""), (b"\xff", ""), (b"1" * 5000, ""), (b"{}", "text/plain"), (b"  ", "")]:
        with pytest.raises(ApiError) as e:
            read_json(body, ctype)
        assert e.value.status == 400 and e.value.message.startswith("body:"), (body[:20], e.value.message)


def test_api_errors_survive_the_trip_back_from_a_helper_process():
    import pickle

    from edgeinfer.serve.prep import ApiError

    e = pickle.loads(pickle.dumps(ApiError(429, "full", {"Retry-After": "1"})))
    assert (e.status, e.message, e.headers) == (429, "full", {"Retry-After": "1"})


def _spawned_children() -> list[int]:
    """Our spawned child processes; a thread or child that ends while we read /proc is skipped."""
    import os

    def read(path: str) -> bytes:
        try:
            with open(path, "rb") as f:
                return f.read()
        except (FileNotFoundError, ProcessLookupError):
            return b""

    tasks = "/proc/self/task"
    kids = [int(p) for t in os.listdir(tasks) for p in read(f"{tasks}/{t}/children").split()]
    return [p for p in kids if b"spawn_main" in read(f"/proc/{p}/cmdline")]


def test_request_helpers_start_on_the_first_large_request_and_zero_means_inline():
    """No helper process while requests are small (each costs ~70 MiB of RSS); the first large one starts
    one, which does the work (its pid, not ours); when it dies, a request fails with 500 and the next large
    one gets a new helper; ``processes=0`` does large work inline."""
    import asyncio
    import os
    import signal
    import time

    from edgeinfer.serve.prep import ApiError, Offload

    before = set(_spawned_children())

    async def run(offload: Offload) -> tuple[int, int, list[int]]:
        ours = set(_spawned_children())
        small = await offload.encode(False, os.getpid)
        started = set(_spawned_children()) - ours
        large = await offload.encode(True, os.getpid)
        return small, large, sorted(started)

    lazy, inline = Offload({}, processes=2), Offload({}, processes=0)
    lazy.start(), inline.start()
    try:
        small, large, started = asyncio.run(run(lazy))
        assert small == os.getpid() and not started
        assert large != os.getpid() and large in set(_spawned_children()) - before
        assert len(set(_spawned_children()) - before) == 1  # one large request at a time: one helper
        os.kill(large, signal.SIGKILL)  # as an out-of-memory kill would: that request fails, the next works
        with pytest.raises(ApiError, match="helper process") as died:
            for _ in range(50):  # until the pool has seen the helper die
                asyncio.run(lazy.encode(True, os.getpid))
                time.sleep(0.1)
        assert died.value.status == 500
        assert asyncio.run(lazy.encode(True, os.getpid)) not in (os.getpid(), large)
        helpers = set(_spawned_children())
        assert asyncio.run(run(inline)) == (os.getpid(), os.getpid(), [])
        assert set(_spawned_children()) == helpers
    finally:
        lazy.stop(), inline.stop()
    assert not set(_spawned_children()) - before


def _where(_table: dict) -> tuple[int, str]:
    import os
    import threading

    return os.getpid(), threading.current_thread().name


def test_a_chat_template_runs_on_the_preparing_thread_not_in_a_helper():
    """Small threaded work (a chat request's template) runs on one thread of this process, off the event loop,
    and starts no helper process (each costs ~48 MiB plus the tokenizers, and the first the resource
    tracker); large work still goes to a helper, and with ``processes=0`` threaded work stays on the thread."""
    import asyncio
    import os
    import threading

    from edgeinfer.serve.prep import Offload

    before = set(_spawned_children())

    async def run(offload: Offload) -> tuple:
        loop_thread = threading.current_thread().name
        small = await offload.prepare(False, _where, threaded=True)
        started = set(_spawned_children()) - before
        return loop_thread, small, started

    for processes in (2, 0):
        offload = Offload({}, processes=processes)
        offload.start()
        try:
            loop_thread, (pid, thread), started = asyncio.run(run(offload))
            assert pid == os.getpid() and thread.startswith("edgeinfer-prepare") and thread != loop_thread
            assert not started
            if processes:
                assert asyncio.run(offload.prepare(True, _where, threaded=True))[0] != os.getpid()
        finally:
            offload.stop()
    assert not set(_spawned_children()) - before


def _switch_interval(_models, fail: bool = False) -> float:
    import sys

    if fail:
        raise ValueError("a template error")
    return sys.getswitchinterval()


def test_a_chat_template_renders_with_a_1_ms_switch_interval_and_the_process_keeps_its_own():
    """The preparing thread hands the event loop the GIL every 1 ms while a template renders (docs/serve.md), and
    puts the process's interval back afterwards, an error included."""
    import asyncio
    import sys

    from edgeinfer.serve.prep import Offload

    own = sys.getswitchinterval()
    assert own != 0.001
    offload = Offload({}, processes=0)
    offload.start()
    try:
        assert asyncio.run(offload.prepare(False, _switch_interval, threaded=True)) == pytest.approx(0.001)
        assert sys.getswitchinterval() == own
        with pytest.raises(ValueError, match="a template error"):
            asyncio.run(offload.prepare(False, _switch_interval, True, threaded=True))
        assert sys.getswitchinterval() == own
        assert asyncio.run(offload.prepare(False, _switch_interval)) == own  # not threaded: unchanged
    finally:
        offload.stop()


def test_a_helper_started_while_the_broken_pool_was_torn_down_is_killed():
    """CPython's pool can start a helper after its manager thread terminated the helpers of a broken pool
    (a request submitted just as one died); renewing the pool kills it instead of leaving it waiting for
    ever (this once left a helper behind in CI). The late helper is started the way ``submit`` starts one
    and kept out of the pool's table until the teardown has listed the helpers, as in the race."""
    import asyncio
    import os
    import signal

    from edgeinfer.serve.prep import ApiError, Offload

    before = set(_spawned_children())
    offload = Offload({}, processes=2)
    offload.start()
    try:
        first = asyncio.run(offload.encode(True, os.getpid))
        broken = offload._pool
        broken._spawn_process()  # what the racing submit does
        (late_pid,) = set(broken._processes) - {first}
        late_helper = broken._processes.pop(late_pid)
        os.kill(first, signal.SIGKILL)
        broken._executor_manager_thread.join(30)  # it has torn the pool down without seeing the late helper
        broken._processes[late_pid] = late_helper
        assert late_helper.is_alive()
        with pytest.raises(ApiError, match="helper process"):
            asyncio.run(offload.encode(True, os.getpid))
        assert not late_helper.is_alive() and late_pid not in _spawned_children()
    finally:
        offload.stop()
    assert not set(_spawned_children()) - before


def test_freed_heap_pages_are_returned_where_glibc_kept_them():
    """Many small blocks freed below one still in use stay resident in glibc's heap (parsing a Qwen
    tokenizer.json leaves ~80 MiB so); serve's HTTP process returns them once its models are open."""
    import subprocess
    import sys

    code = """
import ctypes
from edgeinfer.serve.child import return_freed_heap
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
def rss():
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) // 1024
blocks = [libc.malloc(64 << 10) for _ in range(1600)]  # 100 MiB of heap blocks under the mmap threshold
for b in blocks:
    ctypes.memset(b, 1, 64 << 10)
for b in blocks[:-1]:
    libc.free(b)  # the last one in use: the heap's top cannot shrink on its own
kept = rss()
print(return_freed_heap(), kept - rss())
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    returned, freed_mib = r.stdout.split()
    if returned == "False" and int(freed_mib) == 0:
        pytest.skip("not glibc (no malloc_trim)")
    assert int(freed_mib) > 50, r.stdout


def test_a_decoder_worker_gives_large_blocks_their_own_mapping_and_a_bare_interpreter_does_not():
    """Decoder workers (a process, or a thread with --in-process) fix glibc's mmap threshold, so a block freed by
    one step is returned to the system instead of kept in the heap (a served w8a8 decoder peaked 35 MiB lower);
    a bare interpreter, glibc's default, keeps the 4 MiB block in the heap after an 8 MiB one was freed."""
    import subprocess
    import sys

    from edgeinfer.serve.child import start
    from edgeinfer.testing.serve import send_large_block_mapped

    bare = subprocess.run([sys.executable, "-c", "from edgeinfer.testing.serve import large_block_mapped as f; "
                                                 "print(f())"], capture_output=True, text=True, check=True)
    if bare.stdout.strip() == "None":
        pytest.skip("not glibc >= 2.33 (no mallinfo2)")
    assert bare.stdout.strip() == "False"
    proc, conn = start(send_large_block_mapped, (), "mmap-probe")
    try:
        assert conn.recv() is True
    finally:
        proc.join(30)
    assert proc.exitcode == 0


def test_non_finite_outputs_are_refused_by_name():
    from edgeinfer.serve.prep import ApiError, check_finite

    check_finite("m", {"y": np.ones(3, np.float32), "ids": np.array([1, 2])})
    for bad in (np.nan, np.inf, -np.inf):
        with pytest.raises(ApiError) as e:
            check_finite("m", {"ok": np.ones(2), "y": np.array([1.0, bad], np.float32)})
        assert e.value.status == 500 and "'y'" in e.value.message


def test_cli_bad_option_exits_2(tmp_path, cli):
    r = cli("serve", str(tmp_path), "--max-batch", "0")
    assert r.returncode == 2 and "--max-batch" in r.stderr


def test_defaults_bind_loopback_and_key_comes_from_env(monkeypatch, tmp_path):
    assert ServeConfig(bundles=[tmp_path]).host == "127.0.0.1"
    monkeypatch.setenv("EDGEINFER_API_KEY", "k1")
    assert api_key_from_env(None) == "k1" and api_key_from_env("k2") == "k2"
    monkeypatch.delenv("EDGEINFER_API_KEY")
    assert api_key_from_env(None) is None
    assert parse_devices("0, 1") == ["0", "1"] and parse_devices(None) == []
    with pytest.raises(InputError):
        parse_devices("0,,1")


def test_placement_core_rules():
    """No --devices entry: no placement, whatever the backend (never looked up). An entry: what the backend's
    placement says, by default a name is the device and a bare index the default device. Each plugin's own
    rule is tested in that plugin (plugins/*/tests/test_placement.py)."""
    from edgeinfer.contract import Backend

    assert placement("no-such-backend", None) == Placement()

    class Plain(Backend):
        name = "plain"

    assert Plain().placement("NPU") == Placement(device="NPU")
    assert Plain().placement("GPU.1") == Placement(device="GPU.1")
    assert Plain().placement("0") == Placement()


def test_tensor_parsing_checks_dtype_range_and_shape():
    from edgeinfer.serve.prep import ApiError, ServedModel, parse_tensors

    class FakeManifest:  # only the specs and buckets are read
        inputs = [TensorSpec("ids", ("batch", 4), "int64"), TensorSpec("mask", ("batch", 4), "int64")]
        buckets = None  # not a bucketed static bundle

    class FakeBundle:
        manifest = FakeManifest()

    m = ServedModel("m", FakeBundle())  # type: ignore[arg-type]
    feeds = parse_tensors(m, {"ids": [[1, 2, 3, 4]] * 2, "mask": [[1.0, 1, 1, 0]] * 2}, 8)
    assert feeds["ids"].dtype == np.int64 and feeds["mask"].dtype == np.int64 and feeds["mask"].shape == (2, 4)
    for inputs, words in [
        ({"ids": [[1, 2, 3]], "mask": [[1, 1, 1]]}, "expected shape"),
        ({"ids": [[1, 2, 3, 4]], "mask": [[1, 1, 1, 1]] * 2}, "batch"),
        ({"ids": [[2**63, 0, 0, 0]], "mask": [[1, 1, 1, 1]]}, "range"),
        ({"ids": [[1, 2, 3, 4]] * 9, "mask": [[1, 1, 1, 1]] * 9}, "at most 8 rows"),
        ({"ids": [], "mask": []}, "expected shape"),  # no rows: refused, not run on an empty batch
        ({}, "give the model's inputs"),
    ]:
        with pytest.raises(ApiError) as err:
            parse_tensors(m, inputs, 8)
        assert err.value.status == 400 and words in err.value.message, (inputs, err.value.message)
    # bools are valid integers 0/1
    feeds = parse_tensors(m, {"ids": [[True, 0, 0, 0]], "mask": [[1, 1, 1, 1]]}, 8)
    assert feeds["ids"].dtype == np.int64 and feeds["ids"].tolist() == [[1, 0, 0, 0]]


def test_a_busy_port_is_refused_in_one_line_before_any_bundle_is_read(tmp_path):
    """The port is bound first: with a busy port, a path that is not even a bundle is never looked at (the
    bundles of a real server are hashed for minutes)."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = edgeinfer("serve", str(tmp_path / "not-a-bundle"), "--port", str(port))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in lines[0] and "not found" not in lines[0]


def test_only_workers_that_exist_are_reported():
    """A server of decoders only has no embedding worker: no edgeinfer_worker_up{worker="0"} 0 for its life."""
    from prometheus_client import generate_latest

    from edgeinfer.serve.metrics import Metrics
    from edgeinfer.serve.workers import WorkerPool

    assert "edgeinfer_worker_up{" not in generate_latest(Metrics(WorkerPool([], [], 4)).registry).decode()
    text = generate_latest(Metrics(WorkerPool([("m", "/x")], ["0", "1"], 4)).registry).decode()
    assert text.count("edgeinfer_worker_up{") == 2


@pytest.fixture(scope="module")
def tiny_decoders(tmp_path_factory):
    """The committed tiny decoder, and a copy whose chat template is a bomb (10**10 loop steps)."""
    from edgeinfer.serve.decoder_engine import open_served_decoder
    from edgeinfer.testing.llm import model_dir, with_template_bomb

    bomb = with_template_bomb(tmp_path_factory.mktemp("bomb") / "tiny-bomb")
    decoders = [open_served_decoder(model_dir(), ctx=256), open_served_decoder(bomb, ctx=256)]
    return {m.name: m for m in decoders}


def _gen(decoders, body: dict, chat: bool = True, elsewhere=None):
    import json

    from edgeinfer.serve.generation_prep import prepare_generation

    return prepare_generation(decoders, json.dumps(body).encode(), "application/json", chat, elsewhere)


def test_a_request_to_a_model_of_another_endpoint_says_where_it_is_served(tiny_decoders):
    import json

    from edgeinfer.serve.prep import ApiError, prepare_embeddings

    elsewhere = {"minilm": "/v1/embeddings and /v1/infer", "tiny-qwen3": "/v1/chat/completions and /v1/completions"}
    with pytest.raises(ApiError) as e:
        _gen(tiny_decoders, {"model": "minilm", "messages": [{"role": "user", "content": "hi"}]}, elsewhere=elsewhere)
    assert e.value.status == 400 and "served on /v1/embeddings and /v1/infer" in e.value.message
    assert "not on /v1/chat/completions" in e.value.message
    with pytest.raises(ApiError) as e:
        prepare_embeddings({}, json.dumps({"model": "tiny-qwen3", "input": "x"}).encode(), "application/json", 8,
                           elsewhere)
    assert e.value.status == 400 and "/v1/chat/completions and /v1/completions, not on /v1/embeddings" in \
        e.value.message
    with pytest.raises(ApiError) as e:  # a model served nowhere is still a 404
        _gen(tiny_decoders, {"model": "nope", "prompt": "hi"}, chat=False, elsewhere=elsewhere)
    assert e.value.status == 404 and "does not exist" in e.value.message


def test_a_prompt_longer_than_the_context_can_hold_is_refused_before_tokenizing(tiny_decoders):
    """context × the longest vocabulary entry (60 bytes in tiny-qwen3) × 2 characters at most (of the
    messages, then of the rendered prompt); a prompt just under the bound is tokenized and then refused
    for its token count."""
    from edgeinfer.serve.prep import ApiError

    llm = tiny_decoders["tiny-qwen3"]
    limit = 256 * llm.codec.longest_token * 2
    assert llm.codec.longest_token == 60  # tiny-qwen3's longest token, counted by hand from its vocab
    for chat in (True, False):
        for n, tokenized in ((limit + 1, False), (limit - 100 if chat else limit, True)):  # the template adds ~30
            text = "x" * n
            body = {"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text}
            with pytest.raises(ApiError) as e:
                _gen(tiny_decoders, {"model": "tiny-qwen3", **body}, chat)
            assert e.value.status == 400 and "maximum context length is 256" in e.value.message
            said_chars = f"the prompt has {n} characters" in e.value.message
            assert said_chars != tokenized and ("max_tokens is" in e.value.message) == tokenized, e.value.message


def test_a_template_bomb_is_a_400_naming_the_template(tiny_decoders):
    import time

    from edgeinfer.serve.prep import ApiError

    start = time.monotonic()
    with pytest.raises(ApiError) as e:
        _gen(tiny_decoders, {"model": "tiny-bomb", "messages": [{"role": "user", "content": "hi"}]})
    assert e.value.status == 400 and "chat template of" in e.value.message and "tiny-bomb" in e.value.message
    assert time.monotonic() - start < 30
    ok = _gen(tiny_decoders, {"model": "tiny-bomb", "prompt": "hi", "max_tokens": 2}, chat=False)  # no template
    assert ok.ids and ok.options.max_new_tokens == 2


def test_a_template_that_adds_text_beyond_the_context_is_refused_before_tokenizing(tiny_decoders, tmp_path):
    """The characters bound applies to the rendered prompt too: a template may add text of its own."""
    import shutil

    from edgeinfer.serve.decoder_engine import open_served_decoder
    from edgeinfer.serve.prep import ApiError

    padded = tmp_path / "tiny-padded"
    shutil.copytree(tiny_decoders["tiny-qwen3"].path, padded)
    (padded / "chat_template.jinja").write_text("{{ 'x' * 40000000 }}{% for m in messages %}{{ m.content }}"
                                                "{% endfor %}")
    decoders = {"tiny-padded": open_served_decoder(padded, ctx=256)}
    with pytest.raises(ApiError) as e:
        _gen(decoders, {"messages": [{"role": "user", "content": "hi"}]})
    assert e.value.status == 400 and "renders these messages as 40000002 characters" in e.value.message


def test_the_supervisor_restarts_a_crashed_worker_until_the_crash_window_is_full():
    """The restart rule both kinds of worker share, without processes: a worker that never became ready fails
    start-up; a crash after it was ready restarts it, more than max_restarts in the window give it up; a kill
    by the main process is not a crash; a stopped one stays stopped. (Real processes: test_serve_lifecycle.)"""
    from types import SimpleNamespace

    from edgeinfer.serve.supervisor import Supervisor

    class Watched(Supervisor):
        def __init__(self):
            super().__init__("watched", max_restarts=2, restart_window_s=60.0)
            self.outcomes: list[tuple[int | None, str]] = []
            self.messages: list[tuple] = []
            self.spawned = 0

        def spawn(self):  # stands in for a real process start
            self.spawned += 1
            self.generation += 1
            self.process = SimpleNamespace(exitcode=-9, kill=lambda: None)

        def on_message(self, msg):
            self.messages.append(msg)

        def on_exit(self, code, outcome):
            self.outcomes.append((code, outcome))

    def exit_now(w: Watched) -> str:
        w._exited(w.generation)
        return w.outcomes[-1][1]

    w = Watched()
    w.spawn()
    assert exit_now(w) == "failed" and w.spawned == 1 and w.restarts == 0  # never ready: no restart
    w = Watched()
    w.spawn()
    w._message(w.generation, ("ready", {"pid": 42}))
    assert w.pid == 42 and not w.loading
    assert [exit_now(w) for _ in range(3)] == ["restarting", "restarting", "gave up"]
    assert w.spawned == 3 and w.restarts == 2 and w.outcomes[0] == (-9, "restarting")
    w = Watched()
    w.spawn()
    w._message(w.generation, ("ready", {"pid": 7}))
    for _ in range(4):
        w.kill()
        assert exit_now(w) == "restarting"  # the main process's own kills never give a worker up
    w._message(w.generation - 1, ("fatal", "from a process it replaced"))  # dropped
    w._exited(w.generation - 1)  # dropped too
    assert w.messages == [("ready", {"pid": 7})] and len(w.outcomes) == 4 and w.spawned == 5
    w.stopping = True
    assert exit_now(w) == "stopped" and w.spawned == 5


def test_streamed_text_chunks_are_the_openai_chunk_json_whatever_the_text():
    """A streamed text piece is framed from bytes made once per stream (decoder_routes._sse): each chunk is the
    JSON of OpenAI's chunk object, byte for byte, for pieces with quotes, escapes, non-ASCII and NUL."""
    import asyncio
    import json

    from edgeinfer.serve.decoder_routes import _sse

    pieces = ['say "hi"', "\\n", "é ✓ \u2028", "\0", "\0\0 end"]

    async def events():
        for p in pieces:
            yield p, 1, None, None, []
        yield "", 0, "length", None, []

    async def collect(chat: bool) -> list[bytes]:
        meta = {"id": "cmpl-1", "created": 7, "model": "m"}
        return [c async for c in _sse(events(), meta, chat, False, 3)]

    def frame(obj: dict) -> bytes:
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    head = {"id": "cmpl-1", "created": 7, "model": "m"}
    for chat in (False, True):
        out = asyncio.run(collect(chat))
        if chat:
            out = out[1:]  # the role chunk
            texts = [{"index": 0, "delta": {"content": p}, "logprobs": None, "finish_reason": None} for p in pieces]
            obj = "chat.completion.chunk"
        else:
            texts = [{"index": 0, "text": p, "logprobs": None, "finish_reason": None} for p in pieces]
            obj = "text_completion"
        assert out[: len(pieces)] == [frame({**head, "object": obj, "choices": [c]}) for c in texts]
        assert out[-1] == b"data: [DONE]\n\n"


def test_a_decoder_worker_is_started_without_multiprocessing_spawn(tmp_path):
    """Issue 30 (footprint): serve.child starts a decoder worker as ``python -c`` over a socket pair, so
    multiprocessing's resource tracker (a third process, ~12 MiB) is not started; the child gets our
    sys.path, runs the pickled entry point with its arguments, and reports exit codes as multiprocessing does."""
    from multiprocessing.connection import Connection

    from edgeinfer.serve import child
    from edgeinfer.serve.decoder_worker import decoder_worker_main

    missing = tmp_path / "no-such-bundle"
    proc, conn = child.start(decoder_worker_main, (str(missing), "onnxruntime", None, 64, 1, None), "t")
    msg = conn.recv()
    assert msg[0] == "fatal" and "no-such-bundle" in msg[1], msg
    proc.join(60)
    assert proc.exitcode == 0 and not proc.is_alive()
    blocked, conn = child.start(Connection.recv, (), "t")  # waits on its pipe until killed
    assert blocked.is_alive()
    blocked.kill()
    blocked.join(60)
    assert blocked.exitcode == -9


def test_several_decoders_on_one_cpu_stop_busy_waiting_unless_threads_split_the_cores(tmp_path):
    """ServeConfig.spin_wait: two or more decoder workers that together would run more threads than the CPU has
    (the backends' default threads, or --threads N with N x decoders > CPUs) get spin_wait False; one decoder, or
    --threads that split the cores, keep the backend's default (None). create_app hands it to every Engine, and
    the option reaches only a backend whose decoders declare it (bench/serve_shared_cpu.py measures why)."""
    from types import SimpleNamespace

    from edgeinfer.run.loading import spin_wait_option
    from edgeinfer.serve.app import create_app

    config = ServeConfig(bundles=[tmp_path])
    assert config.spin_wait(1, cpus=2) is None
    assert config.spin_wait(2, cpus=2) is False and config.spin_wait(2, cpus=64) is False
    assert ServeConfig(bundles=[tmp_path], threads=1).spin_wait(2, cpus=2) is None
    assert ServeConfig(bundles=[tmp_path], threads=1).spin_wait(3, cpus=2) is False
    assert ServeConfig(bundles=[tmp_path], threads=2).spin_wait(2, cpus=2) is False
    assert ServeConfig(bundles=[tmp_path], threads=2).spin_wait(2, cpus=4) is None

    assert spin_wait_option("onnxruntime", False) == {"spin_wait": False}
    assert spin_wait_option("onnxruntime", None) == {}
    assert spin_wait_option("rknn", False) == {}  # an NPU decoder: no CPU threads that wait

    two = {n: SimpleNamespace(name=n) for n in ("a", "b")}
    engines = create_app(config, {}, two).state.serve.engines
    assert {e.spin_wait for e in engines.values()} == {config.spin_wait(2)}
    one = create_app(config, {}, {"a": SimpleNamespace(name="a")}).state.serve.engines
    assert one["a"].spin_wait is None
