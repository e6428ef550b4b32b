"""``edgeinfer serve`` with bad input: one line on stderr, exit 2, no traceback, nothing written — never a
server that starts and then answers 500. Without its extras (FastAPI, uvicorn): the install line and exit 3."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from edgeinfer.contract.backend import TensorSpec
from edgeinfer.model.bundle import Manifest, TextSpec, write
from edgeinfer.testing.cli import run_cli

TOKENS = [TensorSpec(n, ("batch", "seq"), "int64") for n in ("input_ids", "attention_mask", "token_type_ids")]


def fake_bundle(root: Path, name: str = "model", backend: str = "onnxruntime", text: bool = False) -> Path:
    """A bundle whose manifest and files look right (its artifact is never loaded: every case fails before)."""
    d = root / name
    d.mkdir(parents=True)
    (d / "model.onnx").write_bytes(b"not loaded by these tests")
    if text:
        (d / "tokenizer").mkdir()
        (d / "tokenizer" / "tokenizer.json").write_text("{ this is not a tokenizer")
    write(d, Manifest(backend=backend, board="host-cpu", scheme="fp32", artifacts=["model.onnx"], inputs=TOKENS,
                      outputs=[TensorSpec("last_hidden_state", ("batch", "seq", 8), "float32")], source={},
                      text=TextSpec() if text else None))
    return d


def busy_port() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def case_files(tmp: Path) -> dict[str, Path]:
    ok = fake_bundle(tmp / "a")
    (tmp / "afile").write_text("x")
    broken_json = fake_bundle(tmp / "j", "broken-json")
    (broken_json / "manifest.json").write_text("{ not json")
    wrong_schema = fake_bundle(tmp / "s", "wrong-schema")
    (wrong_schema / "manifest.json").write_text(json.dumps({"schema": "something/9"}))
    no_artifact = fake_bundle(tmp / "n", "no-artifact")
    (no_artifact / "model.onnx").unlink()
    (tmp / "keys").mkdir()
    (tmp / "keys" / "empty").write_text("\n")
    (tmp / "keys" / "two-lines").write_text("key-one\nkey-two\n")
    (tmp / "keys" / "binary").write_bytes(b"\xff\xfe\x00key")
    (tmp / "keys" / "huge").write_text("k" * 10000)
    (tmp / "keys" / "good").write_text("a-good-key\n")
    os.mkfifo(tmp / "keys" / "fifo")
    return {
        "ok": ok, "afile": tmp / "afile", "broken_json": broken_json, "wrong_schema": wrong_schema,
        "no_artifact": no_artifact, "bad_tokenizer": fake_bundle(tmp / "t", "bad-tokenizer", text=True),
        "twin": fake_bundle(tmp / "b"), "rknn": fake_bundle(tmp / "r", "rknn-model", backend="rknn"),
        "ascend": fake_bundle(tmp / "c", "ascend-model", backend="ascend"),
    }


# (case id, arguments with {names} from case_files, extra env, words the line must hold)
CASES = [
    ("missing-dir", ["{tmp}/nope"], {}, "bundle not found"),
    ("not-a-bundle", ["{tmp}/keys"], {}, "not a bundle"),
    ("file-not-dir", ["{afile}"], {}, "not a bundle"),
    ("manifest-not-json", ["{broken_json}"], {}, "not valid JSON"),
    ("manifest-schema", ["{wrong_schema}"], {}, "schema"),
    ("artifact-missing", ["{no_artifact}"], {}, "model.onnx"),
    ("garbage-tokenizer", ["{bad_tokenizer}"], {}, "tokenizer"),
    ("same-name-twice", ["{ok}", "{twin}"], {}, "distinct names"),
    ("port-negative", ["{ok}", "--port", "-1"], {}, "--port"),
    ("port-too-big", ["{ok}", "--port", "70000"], {}, "--port"),
    ("port-busy", ["{ok}", "--port", "{busy}"], {}, "--port"),
    ("host-unknown", ["{ok}", "--host", "no such host!"], {}, "--host"),
    ("host-not-local", ["{ok}", "--host", "192.0.2.1"], {}, "cannot listen"),
    ("max-batch-0", ["{ok}", "--max-batch", "0"], {}, "--max-batch"),
    ("max-queue-0", ["{ok}", "--max-queue", "0"], {}, "--max-queue"),
    ("max-inputs-0", ["{ok}", "--max-inputs", "0"], {}, "--max-inputs"),
    ("timeout-0", ["{ok}", "--timeout-s", "0"], {}, "--timeout-s"),
    ("timeout-nan", ["{ok}", "--timeout-s", "nan"], {}, "--timeout-s"),
    ("window-negative", ["{ok}", "--batch-window-ms", "-1"], {}, "--batch-window-ms"),
    ("window-inf", ["{ok}", "--batch-window-ms", "inf"], {}, "--batch-window-ms"),
    ("body-0", ["{ok}", "--max-body-mb", "0"], {}, "--max-body-mb"),
    ("body-inf", ["{ok}", "--max-body-mb", "inf"], {}, "--max-body-mb"),
    ("devices-empty-entry", ["{ok}", "--devices", "0,,1"], {}, "--devices"),
    ("devices-junk", ["{ok}", "--devices", "CPU;rm -rf"], {}, "--devices"),
    ("devices-too-many", ["{ok}", "--devices", ",".join(["CPU"] * 65)], {}, "--devices"),
    ("devices-rknn-core", ["{rknn}", "--devices", "3"], {}, "core mask"),
    ("devices-ascend-name", ["{ascend}", "--devices", "GPU"], {}, "Ascend"),
    ("api-key-blank", ["{ok}", "--api-key", "  "], {}, "API key"),
    ("api-key-env-blank", ["{ok}"], {"EDGEINFER_API_KEY": "   "}, "API key"),
    ("api-key-not-utf8", ["{ok}", "--api-key", "k\udcff"], {}, "API key"),
    ("key-file-missing", ["{ok}", "--api-key-file", "{tmp}/keys/nope"], {}, "no such file"),
    ("key-file-dir", ["{ok}", "--api-key-file", "{tmp}/keys"], {}, "directory"),
    ("key-file-fifo", ["{ok}", "--api-key-file", "{tmp}/keys/fifo"], {}, "regular file"),
    ("key-file-empty", ["{ok}", "--api-key-file", "{tmp}/keys/empty"], {}, "empty"),
    ("key-file-two-lines", ["{ok}", "--api-key-file", "{tmp}/keys/two-lines"], {}, "several lines"),
    ("key-file-binary", ["{ok}", "--api-key-file", "{tmp}/keys/binary"], {}, "UTF-8"),
    ("key-file-huge", ["{ok}", "--api-key-file", "{tmp}/keys/huge"], {}, "larger than"),
    ("key-and-key-file", ["{ok}", "--api-key", "k", "--api-key-file", "{tmp}/keys/good"], {}, "not both"),
]


def snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("args, env, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_serve_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capfd, request, args, env, words):
    """In this process (edgeinfer.testing.cli: no interpreter start-up per case); the first case also as
    ``python -m edgeinfer.cli``, so what shows only in a fresh interpreter is still caught."""
    files = case_files(tmp_path)
    with busy_port() as taken:
        names = {**{k: str(v) for k, v in files.items()}, "tmp": str(tmp_path), "busy": str(taken.getsockname()[1])}
        before = snapshot(tmp_path)
        argv = ["serve", *(a.format(**names) for a in args)]
        if request.node.callspec.id == CASES[0][0]:
            proc = subprocess.run([sys.executable, "-m", "edgeinfer.cli", *argv], capture_output=True, text=True,
                                  timeout=120, cwd=tmp_path, env={**os.environ, **env, "EDGEINFER_DEBUG": ""})
        else:
            monkeypatch.chdir(tmp_path)
            proc = run_cli(capfd, *argv, env={**env, "EDGEINFER_DEBUG": ""})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    assert words in lines[0] and "Traceback" not in proc.stderr
    assert proc.stdout == ""
    assert snapshot(tmp_path) == before  # nothing written or left behind


@pytest.mark.parametrize("args, words", [(["--port", "abc"], "--port"), (["--log-level", "loud"], "--log-level"),
                                         (["--max-batch", "many"], "--max-batch"), ([], "BUNDLES")])
def test_serve_usage_errors_exit_2_without_traceback(tmp_path, args, words, capfd):
    """Click's own checks (types, choices, a missing argument), in this process. The line count is click's
    (edgeinfer.cli.invoke)."""
    proc = run_cli(capfd, "serve", *([str(tmp_path)] if args else []), *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert words in proc.stderr.strip().splitlines()[-1], proc.stderr


BLOCK_SERVE_EXTRA = textwrap.dedent("""
    import sys

    class BlockServeExtra:  # stands in for an install without the [serve] extra
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("starlette", "uvicorn"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, BlockServeExtra())
    sys.argv = ["edgeinfer", "serve", *sys.argv[1:]]
    from edgeinfer.cli import main
    main()
""")


def test_serve_without_its_extras_says_how_to_install_them_and_exits_3(tmp_path):
    bundle = fake_bundle(tmp_path)
    proc = subprocess.run([sys.executable, "-c", BLOCK_SERVE_EXTRA, str(bundle)], capture_output=True, text=True,
                          timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 3, proc.stderr
    assert len(lines) == 1 and "pip install '.[serve]' (in a clone of edgeinfer)" in lines[0], proc.stderr
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr


# --- OpenAI request bodies: strict types, bounds, fields that are not implemented ----------------------

MSG = [{"role": "user", "content": "hi"}]
# (case id, chat?, body, the field the 400 must name)
BAD_BODIES = [
    ("max-tokens-string", True, {"messages": MSG, "max_tokens": "4"}, "max_tokens"),
    ("max-tokens-bool", True, {"messages": MSG, "max_tokens": True}, "max_tokens"),
    ("max-tokens-float", False, {"prompt": "hi", "max_tokens": 4.0}, "max_tokens"),
    ("n-string", True, {"messages": MSG, "n": "1"}, "n"),
    ("stream-string", True, {"messages": MSG, "stream": "yes"}, "stream"),
    ("stream-int", False, {"prompt": "hi", "stream": 1}, "stream"),
    ("ignore-eos-string", True, {"messages": MSG, "ignore_eos": "y"}, "ignore_eos"),
    ("temperature-string", True, {"messages": MSG, "temperature": "0.5"}, "temperature"),
    ("temperature-bool", False, {"prompt": "hi", "temperature": False}, "temperature"),
    ("seed-string", True, {"messages": MSG, "seed": "1"}, "seed"),
    ("seed-too-big", True, {"messages": MSG, "seed": 10**30}, "seed"),
    ("seed-2-64", False, {"prompt": "hi", "seed": 2**64}, "seed"),
    ("seed-negative", False, {"prompt": "hi", "seed": -1}, "seed"),
    ("include-usage-string", True, {"messages": MSG, "stream_options": {"include_usage": "true"}},
     "stream_options.include_usage"),
    ("stream-options-unknown", True, {"messages": MSG, "stream_options": {"x": 1}}, "stream_options.x"),
    ("stop-five", True, {"messages": MSG, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ("stop-600k", False, {"prompt": "hi", "stop": ["x"] * 600_000}, "stop"),
    ("stop-long", True, {"messages": MSG, "stop": "x" * 257}, "stop"),
    ("stop-empty-string", True, {"messages": MSG, "stop": [""]}, "stop"),
    ("stop-number", True, {"messages": MSG, "stop": [1]}, "stop"),
    ("messages-too-many", True, {"messages": MSG * 2049}, "messages"),
    ("messages-empty", True, {"messages": []}, "messages"),
    ("content-int", True, {"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ("content-image-part", True, {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
     "messages.0.content"),
    ("content-part-extra-key", True, {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "a", "cache_control": {}}]}]}, "messages.0.content"),
    ("content-too-many-parts", True, {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}] * 257}]}, "messages.0.content"),
    ("role-tool", True, {"messages": [{"role": "tool", "content": "x", "tool_call_id": "1"}]}, "messages.0"),
    ("tool-calls", True, {"messages": [{"role": "assistant", "content": "x", "tool_calls": []}]},
     "messages.0.tool_calls"),
    ("name-too-long", True, {"messages": [{"role": "user", "content": "x", "name": "n" * 65}]}, "messages.0.name"),
    ("model-too-long", True, {"messages": MSG, "model": "m" * 257}, "model"),
    ("user-too-long", False, {"prompt": "hi", "user": "u" * 257}, "user"),
    ("user-number", False, {"prompt": "hi", "user": 7}, "user"),
    ("metadata-too-many", True, {"messages": MSG, "metadata": {str(i): "v" for i in range(17)}}, "metadata"),
    ("unknown-field", True, {"messages": MSG, "frobnicate": 1}, "frobnicate"),
    ("tools", True, {"messages": MSG, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ("tool-choice", True, {"messages": MSG, "tool_choice": "required"}, "tool_choice"),
    ("functions", True, {"messages": MSG, "functions": [{"name": "f"}]}, "functions"),
    ("response-format", True, {"messages": MSG, "response_format": {"type": "json_object"}}, "response_format"),
    ("logit-bias", False, {"prompt": "hi", "logit_bias": {"50256": -100}}, "logit_bias"),
    ("frequency-penalty", True, {"messages": MSG, "frequency_penalty": 0.5}, "frequency_penalty"),
    ("presence-penalty", False, {"prompt": "hi", "presence_penalty": 1}, "presence_penalty"),
    ("audio", True, {"messages": MSG, "audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ("modalities", True, {"messages": MSG, "modalities": ["text", "audio"]}, "modalities"),
    ("prediction", True, {"messages": MSG, "prediction": {"type": "content", "content": "x"}}, "prediction"),
    ("echo", False, {"prompt": "hi", "echo": True}, "echo"),
    ("best-of", False, {"prompt": "hi", "best_of": 3}, "best_of"),
    ("suffix", False, {"prompt": "hi", "suffix": "end"}, "suffix"),
    ("top-logprobs-without-logprobs", True, {"messages": MSG, "top_logprobs": 2}, "top_logprobs"),
    ("top-logprobs-21", True, {"messages": MSG, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("chat-logprobs-int", True, {"messages": MSG, "logprobs": 1}, "logprobs"),
    ("completion-logprobs-6", False, {"prompt": "hi", "logprobs": 6}, "logprobs"),
    ("completion-logprobs-bool", False, {"prompt": "hi", "logprobs": True}, "logprobs"),
    ("prompt-two", False, {"prompt": ["a", "b"]}, "prompt"),
    ("prompt-token-ids", False, {"prompt": [1, 2, 3]}, "prompt"),
]


def _validate(chat: bool, body: dict):
    from edgeinfer.serve.decoder_routes import ChatRequest, CompletionRequest
    from edgeinfer.serve.prep import validated

    return validated(ChatRequest if chat else CompletionRequest, body)


@pytest.mark.parametrize("chat, body, field", [c[1:] for c in BAD_BODIES], ids=[c[0] for c in BAD_BODIES])
def test_bad_openai_bodies_are_400_naming_the_field(chat, body, field):
    from edgeinfer.serve.prep import ApiError

    with pytest.raises(ApiError) as e:
        _validate(chat, body)
    assert e.value.status == 400
    assert e.value.message.startswith(field), e.value.message


def test_seed_error_says_the_range_and_the_openapi_document_too():
    from edgeinfer.serve.api import Endpoint, document
    from edgeinfer.serve.decoder_schemas import ChatRequest
    from edgeinfer.serve.prep import ApiError

    with pytest.raises(ApiError, match="from 0 to 18446744073709551615"):
        _validate(True, {"messages": MSG, "seed": 10**30})
    doc = document({}, [Endpoint("/v1/chat/completions", "POST", "chat", "", "generation", body=ChatRequest)])
    ref = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    seed = doc["components"]["schemas"][ref["$ref"].rsplit("/", 1)[1]]["properties"]["seed"]
    assert "18446744073709551615" in seed["description"] and seed["maximum"] == 2**64 - 1


@pytest.mark.parametrize("body", [
    {"temperature": 1, "top_p": 1, "max_tokens": 4, "seed": 2**64 - 1, "stop": "x"},  # an int where a float goes
    {"tools": [], "tool_choice": "none", "logit_bias": {}, "frequency_penalty": 0, "presence_penalty": 0.0,
     "response_format": {"type": "text"}, "modalities": ["text"], "parallel_tool_calls": False, "audio": None},
    {"user": "u-1", "metadata": {"k": "v"}, "store": False, "stop": ["a", "b", "c", "d"]},
    {"logprobs": True, "top_logprobs": 20},
    {"n": None, "stream": None, "logprobs": None, "top_logprobs": None, "stop": None, "seed": None, "user": None,
     "max_tokens": None, "temperature": None, "stream_options": {"include_usage": None}},  # OpenAI's nullables
])
def test_neutral_and_metadata_fields_are_accepted(body):
    req = _validate(True, {"messages": MSG, **body})
    assert not {"tools", "logit_bias", "response_format"} & set(req.model_dump())


def test_text_parts_are_joined_and_a_completion_list_of_one_is_the_prompt():
    req = _validate(True, {"messages": [{"role": "user", "content": [{"type": "text", "text": "one"},
                                                                     {"type": "text", "text": "two"}]}]})
    assert req.messages[0].content == "one\ntwo"
    assert _validate(False, {"prompt": ["once"]}).prompt == ["once"]


@pytest.mark.parametrize("body", [
    b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}',
    b'{"prompt": "\\udfff"}',
    b'{"input": ["ok", "\\uDBFF"]}',
    b'{"model": "x", "inputs": {"input_ids": [[1]]}, "id": "\\ud800"}',
    b'{"messages": [{"role": "user", "content": "x"}], "stop": ["\\udc00"]}',
    b'{"\\ud800": 1}',
])
def test_lone_surrogates_anywhere_in_a_body_are_400(body):
    from edgeinfer.serve.prep import ApiError, read_json

    with pytest.raises(ApiError, match="surrogate") as e:
        read_json(body, "application/json")
    assert e.value.status == 400
    assert read_json(b'{"x": "\\ud83d\\ude00"}', "application/json") == {"x": "\U0001f600"}  # a pair is fine


@pytest.mark.parametrize("body, field", [
    ({"input": "x", "dimensions": "8"}, "dimensions"),
    ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
    ({"input": ["x"] * 2049}, "input"),
    ({"input": [1, 2]}, "input.0"),
    ({"input": "x", "user": 1}, "user"),
    ({"input": "x", "extra": True}, "extra"),
])
def test_bad_embedding_bodies_are_400_naming_the_field(body, field):
    from edgeinfer.serve.prep import ApiError, validated
    from edgeinfer.serve.schemas import EmbeddingRequest

    with pytest.raises(ApiError) as e:
        validated(EmbeddingRequest, body)
    assert e.value.message.startswith(field), e.value.message
