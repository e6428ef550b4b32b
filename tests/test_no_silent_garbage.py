"""No silent garbage from a decoder (issue 25, section 3).

A real NaN bundle (the session's tiny-qwen3 host bundle, every float weight set to NaN with the onnx API and
re-sealed with the project's own ``bundle.write``) fails its request: ``generate`` exits 1 in one line, a
served request is a 500 or an error event. A path the backend's own config names (genai_config.json's
``filename``) stays inside the artifact. Manifest facts that are not paths are checked against the model's
config and the loaded artifact. A stream that SIGTERM cuts off ends with an error event, never
``finish_reason: "stop"``.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

import edgeinfer
from edgeinfer.errors import CheckFailed, InputError, ModelError
from edgeinfer.testing.cli import run_cli
from edgeinfer.testing.llm import model_dir
from edgeinfer.testing.serve import ServerProc

NAN_NAME = "tiny-qwen3-nan"


def _reseal(bundle: Path) -> None:
    from edgeinfer.model.bundle import read_manifest, write

    write(bundle, read_manifest(bundle))


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.fixture
def cli(capfd):
    """``edgeinfer ARGS`` in this process (edgeinfer.testing.cli.run_cli): no interpreter start-up per call."""
    return functools.partial(run_cli, capfd)


def _one_error_line(proc, code: int) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout[-1000:], proc.stderr[-2000:])
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def nan_bundle(tiny_qwen3_host_bundle, tmp_path_factory) -> Path:
    import onnx
    from onnx import numpy_helper

    bundle = _copy(tiny_qwen3_host_bundle, tmp_path_factory.mktemp("nan") / NAN_NAME)
    graph = bundle / "decoder" / "model.onnx"
    model = onnx.load(str(graph))
    floats = [t for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
    for t in floats:
        t.CopyFrom(numpy_helper.from_array(np.full_like(numpy_helper.to_array(t), np.nan), t.name))
    (bundle / "decoder" / "model.onnx.data").unlink()
    onnx.save(model, str(graph), save_as_external_data=True, all_tensors_to_one_file=True,
              location="model.onnx.data")
    _reseal(bundle)
    assert len(floats) > 10
    return bundle


# --- NaN logits --------------------------------------------------------------------------------------------


def test_the_nan_bundle_is_sealed_and_really_gives_nan_logits(nan_bundle):
    """The corpus can fail: the bundle passes every seal check, and its decoder's logits are NaN."""
    from edgeinfer.model.bundle import verify

    assert verify(nan_bundle)["ok"] is True
    with edgeinfer.load(nan_bundle) as gen:
        assert np.isnan(gen.decoder.prefill(0, np.array([1, 2, 3]))).all()


@pytest.mark.parametrize("sampling", [["--temperature", "0"], ["--temperature", "0.8", "--seed", "3"]])
def test_generate_on_a_nan_bundle_exits_1_in_one_line_naming_the_model(nan_bundle, sampling, cli):
    proc = cli("generate", str(nan_bundle), "--prompt", "The licence grants", "--max-new-tokens", "8", *sampling)
    line = _one_error_line(proc, 1)
    assert f"model {NAN_NAME}" in line and "NaN/Inf logits" in line and "edgeinfer golden" in line
    assert proc.stdout.strip() == ""


def test_golden_on_a_nan_bundle_reports_non_finite_logits_per_prompt(nan_bundle, cli):
    """The decoder golden check records the NaN logits (it does not stop at the first) and judges them."""
    proc = cli("golden", str(nan_bundle), "--json")
    assert proc.returncode == 1, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["passed"] is False and report["rows"]
    assert all(r["finite"] is False and "non-finite logits" in r["problems"] for r in report["rows"])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_checked_logits_refuses_non_finite_values(bad):
    from edgeinfer.run.generation.sampling import checked_logits

    row = np.zeros(8, np.float32)
    np.testing.assert_array_equal(checked_logits(row, 8, "m", 0), row)
    row[5] = bad
    with pytest.raises(CheckFailed, match=r"model m produced NaN/Inf logits \(generated token 4\)"):
        checked_logits(row, 8, "m", 3)


def test_checked_logits_refuses_a_row_wider_or_narrower_than_the_vocabulary():
    from edgeinfer.run.generation.sampling import checked_logits

    for width in (7, 9):
        with pytest.raises(ModelError, match=f"gave {width} logits per token, but its vocabulary has 8"):
            checked_logits(np.zeros(width, np.float32), 8, "m", 0)


def test_the_serve_scheduler_ends_a_nan_sequence_with_an_error_and_frees_its_slot(nan_bundle):
    from edgeinfer.contract.generation import GenerationOptions
    from edgeinfer.serve.decoder_scheduler import Scheduler

    with edgeinfer.load(nan_bundle, slots=2) as gen:
        sched = Scheduler(gen)
        sched.add("a", [1, 2, 3], GenerationOptions(max_new_tokens=4))
        events = []
        for _ in range(5):
            events += sched.step()
        assert [(e.rid, e.finish) for e in events] == [("a", "error")]
        assert f"model {NAN_NAME} produced NaN/Inf logits" in events[0].error
        assert sched.free == [0, 1] and not sched.busy


@pytest.fixture(scope="module")
def server(nan_bundle, tmp_path_factory):
    """The NaN bundle and the healthy tiny-qwen3 (transformers, 1024 positions) on one server; the SIGTERM
    test, last in this module, ends it."""
    with ServerProc([nan_bundle, model_dir()], "--slots", "2", "--threads", "1", "--timeout-s", "0.5",
                    log=tmp_path_factory.mktemp("serve") / "log") as s:
        yield s


def _sse(server: ServerProc, path: str, body: dict[str, Any]) -> list[str]:
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        return [ln.removeprefix("data: ") for ln in r.iter_lines() if ln.startswith("data: ")]


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"model": NAN_NAME, "prompt": "The licence grants", "max_tokens": 8}),
    ("/v1/chat/completions", {"model": NAN_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                              "temperature": 0.7}),
])
def test_serve_answers_nan_logits_with_500_or_an_error_event_naming_the_model(server, path, body):
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code == 500, r.text
    err = r.json()["error"]
    assert err["type"] == "server_error" and f"model {NAN_NAME} produced NaN/Inf logits" in err["message"]

    events = _sse(server, path, body)
    assert events[-1] == "[DONE]"
    assert f"model {NAN_NAME} produced NaN/Inf logits" in json.loads(events[-2])["error"]["message"]
    chunks = [json.loads(e) for e in events[:-2]]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)  # never "length" or "stop"


def test_the_openai_client_raises_on_a_nan_stream(server):
    openai = pytest.importorskip("openai")
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.APIError, match="NaN/Inf logits"):
        for _ in c.completions.create(model=NAN_NAME, prompt="The licence", max_tokens=8, stream=True):
            pass


# --- paths inside the backend's own config -------------------------------------------------------------------


@pytest.mark.parametrize("where", ["relative", "absolute"])
def test_genai_config_filename_outside_the_artifact_is_refused(tiny_qwen3_host_bundle, tmp_path, where, cli):
    """A working graph (with its weights) lies outside the bundle; genai_config.json names it, and the bundle
    is re-sealed: without the check, onnxruntime would load and run it."""
    bundle = _copy(tiny_qwen3_host_bundle, tmp_path / "b")
    for f in ("model.onnx", "model.onnx.data"):
        shutil.copy(bundle / "decoder" / f, tmp_path / ("outside.onnx" if f == "model.onnx" else f))
    name = "../../outside.onnx" if where == "relative" else str(tmp_path / "outside.onnx")
    cfg_path = bundle / "decoder" / "genai_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["model"]["decoder"]["filename"] = name
    cfg_path.write_text(json.dumps(cfg))
    _reseal(bundle)
    line = _one_error_line(cli("generate", str(bundle), "--prompt", "hi", "--max-new-tokens", "2"), 2)
    assert "genai_config.json model.decoder.filename" in line and repr(name) in line
    assert ("('..')" if where == "relative" else "absolute path") in line


def test_inside_refuses_every_way_out(tmp_path):
    from edgeinfer.contract.helpers import inside

    root = tmp_path / "art"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "f").write_text("x")
    (root / "link").symlink_to(tmp_path)
    assert inside(root, "sub/./f", "cfg file") == root / "sub" / "f"
    for rel, needle in [("../x", "leads out of"), ("sub/../../x", "leads out of"), ("/etc/passwd", "absolute"),
                        ("link/x", "points outside"), (".", "itself"), ("", "not a relative path"),
                        (3, "not a relative path"), ("a\\..\\b", "not a relative path")]:
        with pytest.raises(InputError, match=needle):
            inside(root, rel, "cfg file")


# --- manifest facts against the artifact ---------------------------------------------------------------------


def _edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _set_decoder(key: str, value: Any):
    return lambda m: m["decoder"].__setitem__(key, value)


TAMPERED = [
    ("vocab-10", "manifest.json", _set_decoder("vocab_size", 10), "logits width is 3072, but its decoder.vocab_size "
                                                                 "is 10"),
    ("vocab-and-width-10", "manifest.json",
     lambda m: (m["decoder"].__setitem__("vocab_size", 10), m["outputs"][0]["shape"].__setitem__(2, 10)),
     "decoder.vocab_size is 10, but the model's config.json vocab_size is 3072"),
    ("context-past-the-model", "manifest.json", _set_decoder("context", 100_000), "max_position_embeddings is 1024"),
    ("context-past-the-artifact", "manifest.json", _set_decoder("context", 512),
     "converted for a context of 256 tokens, not 512"),
    ("ids-int32", "manifest.json", lambda m: m["inputs"][0].__setitem__("dtype", "int32"),
     "input_ids dtype is int32"),
    ("kv-dtype", "manifest.json", _set_decoder("kv_dtype", "fp32"),
     "decoder.kv_dtype is fp32, but the KV cache the artifact allocates is fp16"),
    ("genai-kv-heads", "decoder/genai_config.json",
     lambda c: c["model"]["decoder"].__setitem__("num_key_value_heads", 4), "num_key_value_heads 4"),
    ("genai-layers", "decoder/genai_config.json",
     lambda c: c["model"]["decoder"].__setitem__("num_hidden_layers", 2), "num_hidden_layers is 2"),
    ("genai-vocab", "decoder/genai_config.json", lambda c: c["model"].__setitem__("vocab_size", 3000),
     "vocab_size is 3000, but the graph gives 3072 logits"),
]


@pytest.mark.parametrize("case, rel, change, needle", TAMPERED, ids=[t[0] for t in TAMPERED])
def test_a_manifest_or_artifact_config_that_disagrees_with_the_model_fails_at_load(tiny_qwen3_host_bundle, tmp_path,
                                                                                  case, rel, change, needle):
    bundle = _copy(tiny_qwen3_host_bundle, tmp_path / "b")
    _edit_json(bundle / rel, change)
    _reseal(bundle)
    with pytest.raises(InputError, match=re.escape(needle)):
        edgeinfer.load(bundle)


def test_a_decoder_load_read_earlier_refuses_a_bundle_damaged_since(tiny_qwen3_host_bundle, tmp_path):
    """What serve's HTTP process read of the manifest at start-up (a DecoderLoad) loads the bundle in its decoder
    worker, without the manifest's schema; a worker (re)started after a file of the bundle changed size is
    refused, in one line, as Bundle.open refuses it."""
    import pickle

    from edgeinfer.model.bundle import Bundle
    from edgeinfer.run.bundle import decoder_load
    from edgeinfer.run.decoder_load import open_load

    bundle = _copy(tiny_qwen3_host_bundle, tmp_path / "b")
    load = pickle.loads(pickle.dumps(decoder_load(Bundle.open(bundle), 64)))  # as it reaches a worker process
    with open_load(load, threads=1) as gen:
        assert gen.decoder.context == 64 and gen.decoder.vocab_size == load.vocab_size == 3072
    weights = max((p for p in (bundle / "decoder").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    with weights.open("ab") as f:
        f.write(b"\0")
    with pytest.raises(InputError, match=re.escape(f"bundle {bundle} is damaged: ")):
        open_load(load, threads=1)


def test_a_manifest_agreeing_with_its_config_but_not_with_the_artifact_is_refused(tiny_qwen3_host_bundle,
                                                                                   tmp_path, cli):
    """vocab_size 10 in the manifest, its logits width and the bundled config.json: only the loaded artifact
    (3072) still tells; in one line, exit 2."""
    bundle = _copy(tiny_qwen3_host_bundle, tmp_path / "b")
    _edit_json(bundle / "manifest.json", lambda m: (m["decoder"].__setitem__("vocab_size", 10),
                                                    m["outputs"][0]["shape"].__setitem__(2, 10)))
    _edit_json(bundle / "tokenizer" / "config.json", lambda c: c.__setitem__("vocab_size", 10))
    _reseal(bundle)
    line = _one_error_line(cli("generate", str(bundle), "--prompt", "hi", "--max-new-tokens", "2"), 2)
    assert "decoder.vocab_size is 10, but the artifact's vocabulary is 3072" in line


# --- a stream cut off by the shutdown --------------------------------------------------------------------------


def test_sigterm_cuts_a_long_stream_with_an_error_event_not_finish_reason_stop(server):
    """Last in this module: it ends the server. A stream and a whole answer of ~1000 tokens are running, and a
    third request waits for a slot, when SIGTERM arrives; after the drain period (--timeout-s 0.5) all are cut
    off: the stream ends with an error event then [DONE], the whole answers are 503s, and no chunk carries a
    finish_reason a client would take for a complete answer."""
    body = {"model": "tiny-qwen3", "prompt": "The city", "max_tokens": 1000, "ignore_eos": True, "temperature": 0}
    events: list[str] = []
    whole: list[httpx.Response] = []
    first = threading.Event()

    def stream() -> None:
        with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=120) as r:
            for ln in r.iter_lines():
                if ln.startswith("data: "):
                    events.append(ln.removeprefix("data: "))
                    first.set()

    def state() -> tuple[int, int]:
        decoders = httpx.get(server.url + "/ready").json()["decoders"]
        d = next(d for d in decoders if d["model"] == "tiny-qwen3")
        return d["running"], d["waiting"]

    def post() -> None:
        whole.append(httpx.post(server.url + "/v1/completions", json=body, timeout=120))

    threads = [threading.Thread(target=stream), threading.Thread(target=post), threading.Thread(target=post)]
    threads[0].start()
    assert first.wait(60), server.output()[-2000:]
    for t in threads[1:]:
        t.start()
    deadline = time.monotonic() + 30
    while state() != (2, 1):  # both slots busy (--slots 2), one request queued
        assert time.monotonic() < deadline, f"requests never reached 2 running + 1 waiting: {state()}"
        time.sleep(0.02)
    server.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(60)
    assert server.terminate() == 0, server.output()[-2000:]
    assert events[-1] == "[DONE]", events[-3:]
    err = json.loads(events[-2])["error"]
    assert err["code"] == 503 and err["type"] == "service_unavailable" and "cut this answer off" in err["message"]
    chunks = [json.loads(e) for e in events[:-2]]
    assert len(chunks) > 1 and all(c["choices"][0]["finish_reason"] is None for c in chunks)
    tokens = int(err["message"].split(" after ")[1].split()[0])
    assert 0 < tokens < 1000
    assert len(whole) == 2
    for r in whole:
        assert r.status_code == 503 and "cut this answer off" in r.json()["error"]["message"], r.text
