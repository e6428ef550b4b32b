"""Bad-input corpus: every case is one wrong file, argument or option given to the real CLI.

Each case asserts the exit code (2 for bad input), exactly one non-empty line on stderr with no
traceback and no "internal error", and that nothing new was written or left behind (the case's
directory, the shared fixtures and the conversion cache are snapshotted before and after).

Cases are data: ``Case(id, argv, files, code)``. ``argv`` may use ``{d}`` (the case's own empty
directory, also the working directory) and ``{fx}`` (fixtures built once per module: small ONNX
models, two bundles, a tiny Hugging Face directory). ``files`` maps a path under ``{d}`` to its
content: bytes, str, a JSON-able dict/list (written as JSON), or a function ``(fx, path) -> None``.
Most cases run in-process through ``edgeinfer.cli.invoke`` (the code path of ``main``); every
``SUBPROCESS_EVERY``-th case runs again as ``python -m edgeinfer.cli`` to show the two agree.
"""

from __future__ import annotations

import json
import math
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from helpers import edgeinfer, tiny_bert_dir

from edgeinfer.testing import llm, models

SUBPROCESS_EVERY = 10


@dataclass
class Case:
    id: str
    argv: list[str]
    files: dict[str, Any] = field(default_factory=dict)
    code: int = 2
    needle: str | None = None  # a word the error line must contain (what is wrong)


# --- file builders ----------------------------------------------------------------------------------


def npy(arr: Any) -> Callable[[Path, Path], None]:
    def build(fx: Path, path: Path) -> None:
        np.save(path, np.asarray(arr), allow_pickle=True)

    return build


def npz(**arrays: Any) -> Callable[[Path, Path], None]:
    def build(fx: Path, path: Path) -> None:
        np.savez(path, **{k: np.asarray(v) for k, v in arrays.items()})

    return build


def copy_of(name: str, then: Callable[[Path], None] | None = None) -> Callable[[Path, Path], None]:
    """A copy of fixture ``name`` (file or directory), then changed by ``then``."""

    def build(fx: Path, path: Path) -> None:
        src = fx / name
        if src.is_dir():
            shutil.copytree(src, path)
        else:
            shutil.copy(src, path)
        if then:
            then(path)

    return build


def put(rel: str, content: Any) -> Callable[[Path], None]:
    def change(root: Path) -> None:
        _write(root / rel, content, None)

    return change


def safetensors(header: Any, data: bytes = b"", raw_len: int | None = None) -> bytes:
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(body) if raw_len is None else raw_len) + body + data


def st_entry(**over: Any) -> dict:
    e = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
    e.update(over)
    return {"w": e}


LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 1000, "intermediate_size": 128, "max_position_embeddings": 4096}
BERT = {"model_type": "bert", "num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 2,
        "vocab_size": 1000, "intermediate_size": 64, "max_position_embeddings": 128}


def cfg(base: dict, **over: Any) -> str:
    d = dict(base)
    for k, v in over.items():
        if v is DROP:
            d.pop(k, None)
        else:
            d[k] = v
    return json.dumps(d)  # NaN / Infinity written as the bare tokens json.loads accepts


DROP = object()

BOARD = {"name": "myboard", "title": "my board", "family": "rk3588", "backend": "rknn", "memory_kind": "shared",
         "memory_total_gib": {"value": 8, "source": "https://example.com/datasheet"},
         "os_reserve_gib": {"value": 1, "source": "https://example.com/datasheet"},
         "runtimes": {"rknn": {"schemes": ["w8a8", "fp16"], "kinds": ["encoder", "decoder"],
                               "source": "https://example.com"}},
         "default_runtime": "rknn"}


def board(**over: Any) -> str:
    import yaml

    d = json.loads(json.dumps(BOARD))
    for k, v in over.items():
        if v is DROP:
            d.pop(k, None)
        else:
            d[k] = v
    return yaml.safe_dump(d)


def gguf_file(kv: dict[str, Any] | None = None, tensors: bool = True) -> Callable[[Path, Path], None]:
    """A small, well-formed GGUF file whose metadata we choose (llama architecture)."""

    def build(fx: Path, path: Path) -> None:
        import gguf

        w = gguf.GGUFWriter(str(path), "llama")
        base = {"block_count": 2, "embedding_length": 64, "attention.head_count": 4,
                "attention.head_count_kv": 2, "feed_forward_length": 128, "context_length": 4096}
        base.update(kv or {})
        for k, v in base.items():
            if v is DROP:
                continue
            key = f"llama.{k}"
            if isinstance(v, str):
                w.add_string(key, v)
            elif isinstance(v, float):
                w.add_float32(key, v)
            elif v < 0:
                w.add_int32(key, v)
            elif v >= 2**32:
                w.add_uint64(key, v)
            else:
                w.add_uint32(key, v)
        if tensors:
            w.add_tensor("token_embd.weight", np.zeros((100, 64), np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    return build


def _link(target: str) -> Callable[[Path, Path], None]:
    def build(fx: Path, path: Path) -> None:
        path.symlink_to(target)

    return build


def truncated(name: str, keep: int) -> Callable[[Path, Path], None]:
    def build(fx: Path, path: Path) -> None:
        path.write_bytes((fx / name).read_bytes()[:keep])

    return build


# --- the corpus -------------------------------------------------------------------------------------

P = ["plan"]
HOST = ["--board", "host"]
PLAN_CASES = [
    # click usage: one line, exit 2
    Case("usage-no-command", ["frobnicate"]),
    Case("usage-plan-no-such-option", P + ["qwen3-0.6b", "--board", "rk3588-8g", "--bogus"], needle="--bogus"),
    Case("usage-plan-missing-model", P + ["--board", "rk3588-8g"]),
    Case("usage-plan-missing-board", P + ["qwen3-0.6b"], needle="--board"),
    Case("usage-plan-board-without-value", P + ["qwen3-0.6b", "--board"]),
    Case("usage-plan-ctx-not-int", P + ["qwen3-0.6b", "--board", "rk3588-8g", "--ctx", "abc"], needle="--ctx"),
    Case("usage-plan-ctx-float", P + ["qwen3-0.6b", "--board", "rk3588-8g", "--ctx", "1.5"]),
    Case("usage-plan-batch-not-int", P + ["qwen3-0.6b", "--board", "rk3588-8g", "--batch", "x"]),
    Case("usage-plan-paging-not-int", P + ["qwen3-0.6b", "--board", "rk3588-8g", "--paging", "two"]),
    Case("usage-run-missing-model", ["run"]),
    Case("usage-run-no-such-option", ["run", "{fx}/mlp.onnx", "--frob"]),
    Case("usage-deploy-missing-board", ["deploy", "{fx}/mlp.onnx", "-o", "{d}/b"]),
    Case("usage-deploy-missing-out", ["deploy", "{fx}/mlp.onnx", "--board", "host"]),
    Case("usage-deploy-threshold-not-float", ["deploy", "{fx}/mlp.onnx", *HOST, "-o", "{d}/b", "--threshold", "x"]),
    Case("usage-deploy-max-samples-not-int", ["deploy", "{fx}/mlp.onnx", *HOST, "-o", "{d}/b", "--max-samples", "a"]),
    Case("usage-golden-missing-bundle", ["golden"]),
    Case("usage-golden-threshold-not-float", ["golden", "{fx}/bundle", "--threshold", "high"]),
    Case("usage-bench-repeat-not-int", ["bench", "{fx}/bundle", "--repeat", "many"]),
    Case("usage-bench-missing-bundle", ["bench"]),
    Case("usage-boards-show-missing-name", ["boards", "show"]),
    Case("usage-boards-no-such-option", ["boards", "--wide"]),
    Case("usage-backends-extra-argument", ["backends", "extra"]),
    Case("usage-doctor-no-such-option", ["doctor", "--fix"]),
    # plan options
    Case("plan-ctx-zero", P + ["qwen3-0.6b", "--board", "rk3588-8g", "--ctx", "0"], needle="--ctx"),
    Case("plan-ctx-negative", P + ["qwen3-0.6b", "--board", "rk3588-8g", "--ctx", "-5"], needle="--ctx"),
    Case("plan-ctx-huge", P + ["qwen3-0.6b", "--board", "rk3588-8g", "--ctx", str(10**30)], needle="--ctx"),
    Case("plan-batch-zero", P + ["qwen3-0.6b", "--board", "rk3588-8g", "--batch", "0"], needle="--batch"),
    Case("plan-batch-negative", P + ["qwen3-0.6b", "--board", "rk3588-8g", "--batch", "-1"], needle="--batch"),
    Case("plan-batch-huge", P + ["qwen3-0.6b", "--board", "rk3588-8g", "--batch", str(10**20)], needle="--batch"),
    Case("plan-unknown-quant", P + ["qwen3-0.6b", "--board", "rk3588-8g", "--quant", "w3a5"]),
    Case("plan-empty-quant", P + ["qwen3-0.6b", "--board", "rk3588-8g", "--quant", ""]),
    Case("plan-unknown-kv-dtype", P + ["qwen3-0.6b", "--board", "rk3588-8g", "--kv-dtype", "int3"]),
    Case("plan-unknown-runtime", P + ["qwen3-0.6b", "--board", "rk3588-8g", "--runtime", "tensorrt"]),
    Case("plan-paging-zero", P + ["qwen3-0.6b", "--board", "rk3588-8g", "--paging", "0"]),
    Case("plan-paging-negative", P + ["qwen3-0.6b", "--board", "rk3588-8g", "--paging", "-2"]),
    Case("plan-segments-zero", P + ["qwen3-0.6b", "--board", "rk3588-8g", "--paging", "1", "--segments", "0"]),
    Case("plan-segments-without-paging", P + ["qwen3-0.6b", "--board", "rk3588-8g", "--segments", "4"]),
    Case("plan-unknown-storage", P + ["qwen3-0.6b", "--board", "rk3588-8g", "--paging", "1", "--storage", "tape"]),
    Case("plan-unknown-board", P + ["qwen3-0.6b", "--board", "rk9999"], needle="rk9999"),
    Case("plan-unknown-model", P + ["no-such-model-xyz", "--board", "rk3588-8g"]),
    Case("plan-empty-model", P + ["", "--board", "rk3588-8g"]),
    Case("plan-model-unsupported-suffix", P + ["{d}/m.bin", "--board", "rk3588-8g"], {"m.bin": b"\0" * 64}),
    Case("plan-model-dir-without-config", P + ["{d}/m", "--board", "rk3588-8g"], {"m/readme.txt": "hi"}),
    Case("plan-board-file-missing", P + ["qwen3-0.6b", "--board", "{d}/nope.yaml"]),
    Case("plan-matrix-one-bad-model", P + ["qwen3-0.6b", "{d}/m", "--board", "rk3588-8g"],
         {"m/config.json": cfg(LLAMA, num_key_value_heads=-8)}),
    Case("plan-all-boards-bad-model", P + ["{d}/m", "--board", "all"], {"m/config.json": cfg(LLAMA,
                                                                                             head_dim=math.nan)}),
]

# board YAML given to plan --board
BOARD_CASES = [
    Case(f"board-yaml-{k}", P + ["qwen3-0.6b", "--board", "{d}/b.yaml"], {"b.yaml": v})
    for k, v in {
        "garbage": "{{{ not: yaml: [",
        "empty": "",
        "list": "- 1\n- 2\n",
        "scalar": "just a string\n",
        "binary": b"\x00\xff\xfe" * 50,
        "missing-memory": board(memory_total_gib=DROP),
        "missing-backend": board(backend=DROP),
        "memory-negative": board(memory_total_gib={"value": -8, "source": "x"}),
        "memory-zero": board(memory_total_gib={"value": 0, "source": "x"}),
        "memory-string": board(memory_total_gib={"value": "eight", "source": "x"}),
        "memory-nan": board(memory_total_gib={"value": float("nan"), "source": "x"}),
        "memory-inf": board(memory_total_gib={"value": float("inf"), "source": "x"}),
        "memory-huge": board(memory_total_gib={"value": 1e300, "source": "x"}),
        "memory-no-source": board(memory_total_gib={"value": 8}),
        "memory-bare-number": board(memory_total_gib=8),
        "reserve-negative": board(os_reserve_gib={"value": -1, "source": "x"}),
        "reserve-above-memory": board(os_reserve_gib={"value": 9, "source": "x"}),
        "bandwidth-negative": board(bandwidth_gbps={"value": -3, "source": "x"}),
        "bandwidth-string": board(bandwidth_gbps={"value": "fast", "source": "x"}),
        "runtimes-list": board(runtimes=["rknn"]),
        "runtimes-empty": board(runtimes={}),
        "schemes-not-list": board(runtimes={"rknn": {"schemes": "w8a8", "kinds": ["decoder"], "source": "x"}}),
        "default-runtime-unknown": board(default_runtime="nope"),
        "chips-zero": board(chips=0),
        "chips-string": board(chips="two"),
        "tops-negative": board(int8_tops={"value": -6, "source": "x"}),
    }.items()
]

# config.json read by plan (directory or config.json path)
CFG_BAD = {
    "not-json": "{ this is not json",
    "empty": "",
    "array": "[1, 2, 3]",
    "string": '"llama"',
    "binary": b"\xff\xfe\x00garbage",
    "no-model-type": cfg(LLAMA, model_type=DROP),
    "unknown-model-type": cfg(LLAMA, model_type="transformer-xl-9000"),
    "model-type-number": cfg(LLAMA, model_type=7),
    "model-type-list": cfg(LLAMA, model_type=["llama"]),
}
for key in ("num_key_value_heads", "head_dim", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "intermediate_size", "vocab_size"):
    for label, val in {"nan": math.nan, "string": "8", "negative": -2, "zero": 0, "float": 2.5, "bool": True,
                       "inf": math.inf}.items():
        if key in ("hidden_size", "num_hidden_layers", "vocab_size") and label in ("bool", "inf"):
            continue  # keep the corpus fast: these readers share one validator
        CFG_BAD[f"{key}-{label}"] = cfg(LLAMA, **{key: val})
CFG_BAD.update({
    "max-position-negative": cfg(LLAMA, max_position_embeddings=-1),
    "max-position-string": cfg(LLAMA, max_position_embeddings="4k"),
    "sliding-window-negative": cfg(LLAMA, model_type="mistral", sliding_window=-4096),
    "sliding-window-string": cfg(LLAMA, model_type="mistral", sliding_window="big"),
    "layer-types-wrong": cfg(LLAMA, model_type="qwen3", sliding_window=128, layer_types=5),
    "moe-experts-negative": cfg(LLAMA, model_type="qwen3_moe", num_experts=-8, num_experts_per_tok=2,
                                moe_intermediate_size=64),
    "moe-per-token-above-experts": cfg(LLAMA, model_type="qwen3_moe", num_experts=4, num_experts_per_tok=8,
                                       moe_intermediate_size=64),
    "moe-sparse-step-string": cfg(LLAMA, model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2,
                                  moe_intermediate_size=64, decoder_sparse_step="x"),
    "kv-heads-above-heads": cfg(LLAMA, num_key_value_heads=8),
    "hidden-not-divisible": cfg(LLAMA, hidden_size=66, head_dim=DROP),
    "bert-type-vocab-negative": cfg(BERT, type_vocab_size=-2),
    "bert-max-position-zero": cfg(BERT, max_position_embeddings=0),
    "layers-huge": cfg(LLAMA, num_hidden_layers=2**35),
    "bert-architectures-ints": cfg(BERT, architectures=[1, 2]),
    "bert-num-labels-string": cfg(BERT, architectures=["BertForSequenceClassification"], num_labels="two"),
})
CONFIG_CASES = [Case(f"config-{k}", P + ["{d}/m", "--board", "rk3588-8g"], {"m/config.json": v})
                for k, v in CFG_BAD.items()]
CONFIG_CASES += [
    Case("config-json-path-negative-kv", P + ["{d}/config.json", "--board", "rk3588-8g"],
         {"config.json": cfg(LLAMA, num_key_value_heads=-8)}),
    Case("config-index-garbage", P + ["{d}/m", "--board", "rk3588-8g"],
         {"m/config.json": cfg(LLAMA), "m/model.safetensors.index.json": "not json"}),
    Case("config-index-missing-shard", P + ["{d}/m", "--board", "rk3588-8g"],
         {"m/config.json": cfg(LLAMA), "m/model.safetensors.index.json": {"weight_map": {"a": "x.safetensors"}}}),
    Case("config-index-weight-map-list", P + ["{d}/m", "--board", "rk3588-8g"],
         {"m/config.json": cfg(LLAMA), "m/model.safetensors.index.json": {"weight_map": ["x"]}}),
    Case("config-index-shard-outside", P + ["{d}/m", "--board", "rk3588-8g"],
         {"m/config.json": cfg(LLAMA), "m/model.safetensors.index.json": {"weight_map": {"a": "../x.safetensors"}},
          "x.safetensors": safetensors(st_entry(), b"\0" * 16)}),
]

# safetensors headers
ST_BAD = {
    "offsets-strings": safetensors(st_entry(data_offsets=["0", "16"]), b"\0" * 16),
    "offsets-floats": safetensors(st_entry(data_offsets=[0.5, 16.5]), b"\0" * 17),
    "offsets-empty": safetensors(st_entry(data_offsets=[]), b"\0" * 16),
    "offsets-one": safetensors(st_entry(data_offsets=[16]), b"\0" * 16),
    "offsets-three": safetensors(st_entry(data_offsets=[0, 8, 16]), b"\0" * 16),
    "offsets-reversed": safetensors(st_entry(data_offsets=[16, 0]), b"\0" * 16),
    "offsets-negative": safetensors(st_entry(data_offsets=[-16, 0]), b"\0" * 16),
    "offsets-null": safetensors(st_entry(data_offsets=None), b"\0" * 16),
    "offsets-dict": safetensors(st_entry(data_offsets={"a": 1}), b"\0" * 16),
    "offsets-bool": safetensors(st_entry(data_offsets=[False, True]), b"\0" * 16),
    "offsets-beyond-file": safetensors(st_entry(data_offsets=[0, 10**12]), b"\0" * 16),
    "size-mismatch": safetensors(st_entry(shape=[100, 100]), b"\0" * 16),
    "dims-strings": safetensors(st_entry(shape=["2", "2"]), b"\0" * 16),
    "dims-negative": safetensors(st_entry(shape=[-2, -2]), b"\0" * 16),
    "dims-float": safetensors(st_entry(shape=[2.0, 2.0]), b"\0" * 16),
    "dims-nested": safetensors(st_entry(shape=[[2], [2]]), b"\0" * 16),
    "dims-huge": safetensors(st_entry(shape=[10**40, 10**40]), b"\0" * 16),
    "shape-string": safetensors(st_entry(shape="2x2"), b"\0" * 16),
    "dtype-unknown": safetensors(st_entry(dtype="F7"), b"\0" * 16),
    "dtype-number": safetensors(st_entry(dtype=4), b"\0" * 16),
    "entry-not-object": safetensors({"w": [1, 2, 3]}, b"\0" * 16),
    "entry-missing-dtype": safetensors({"w": {"shape": [2, 2], "data_offsets": [0, 16]}}, b"\0" * 16),
    "header-list": safetensors([1, 2], b""),
    "header-not-json": safetensors(b"{not json at all", b""),
    "header-not-utf8": safetensors(b"\xff\xfe\xfd\xfc", b""),
    "header-length-zero": safetensors(b"{}", b"", raw_len=0),
    "header-length-huge": safetensors(b"{}", b"", raw_len=2**63),
    "short-file": b"\x01\x02",
    "empty-file": b"",
    "metadata-not-object": safetensors({"__metadata__": [1], **st_entry()}, b"\0" * 16),
}
SAFETENSORS_CASES = [Case(f"safetensors-{k}", P + ["{d}/m.safetensors", "--board", "rk3588-8g"], {"m.safetensors": v})
                     for k, v in ST_BAD.items()]
SAFETENSORS_CASES += [
    Case("safetensors-in-hf-dir-negative-dims", P + ["{d}/m", "--board", "rk3588-8g"],
         {"m/config.json": cfg(LLAMA), "m/model.safetensors": safetensors(st_entry(shape=[-4, 4]), b"\0" * 16)}),
    Case("safetensors-next-to-bad-config", P + ["{d}/m/model.safetensors", "--board", "rk3588-8g"],
         {"m/config.json": cfg(LLAMA, head_dim="x"), "m/model.safetensors": safetensors(st_entry(), b"\0" * 16)}),
]

def _negative_dims_onnx(fx: Path, path: Path) -> None:
    import onnx

    model = onnx.load(str(fx / "mlp.onnx"))
    model.graph.initializer[0].dims[0] = -16
    onnx.save(model, str(path))


# GGUF and ONNX readers
GGUF_CASES = [
    Case("gguf-magic-only", P + ["{d}/m.gguf", "--board", "rk3588-8g"], {"m.gguf": b"GGUF"}),
    Case("gguf-bad-magic", P + ["{d}/m.gguf", "--board", "rk3588-8g"], {"m.gguf": b"GGML" + b"\0" * 100}),
    Case("gguf-garbage-after-magic", P + ["{d}/m.gguf", "--board", "rk3588-8g"],
         {"m.gguf": b"GGUF" + bytes(range(256)) * 4}),
    Case("gguf-huge-counts", P + ["{d}/m.gguf", "--board", "rk3588-8g"],
         {"m.gguf": b"GGUF" + struct.pack("<IQQ", 3, 2**62, 2**62)}),
    Case("gguf-version-99", P + ["{d}/m.gguf", "--board", "rk3588-8g"],
         {"m.gguf": b"GGUF" + struct.pack("<IQQ", 99, 0, 0)}),
    Case("gguf-empty", P + ["{d}/m.gguf", "--board", "rk3588-8g"], {"m.gguf": b""}),
    Case("gguf-truncated", P + ["{d}/m.gguf", "--board", "rk3588-8g"], {"m.gguf": truncated("good.gguf", 200)}),
    Case("gguf-negative-layers", P + ["{d}/m.gguf", "--board", "rk3588-8g"],
         {"m.gguf": gguf_file({"block_count": -2})}),
    Case("gguf-zero-heads", P + ["{d}/m.gguf", "--board", "rk3588-8g"],
         {"m.gguf": gguf_file({"attention.head_count": 0})}),
    Case("gguf-negative-kv-heads", P + ["{d}/m.gguf", "--board", "rk3588-8g"],
         {"m.gguf": gguf_file({"attention.head_count_kv": -2})}),
    Case("gguf-string-hidden", P + ["{d}/m.gguf", "--board", "rk3588-8g"],
         {"m.gguf": gguf_file({"embedding_length": "sixty-four"})}),
    Case("gguf-huge-layers", P + ["{d}/m.gguf", "--board", "rk3588-8g"],
         {"m.gguf": gguf_file({"block_count": 2**33})}),
    Case("gguf-nan-context", P + ["{d}/m.gguf", "--board", "rk3588-8g"],
         {"m.gguf": gguf_file({"context_length": math.nan})}),
]
ONNX_CASES = [
    Case("onnx-garbage", P + ["{d}/m.onnx", "--board", "rk3588-8g"], {"m.onnx": b"not a protobuf at all"}),
    Case("onnx-empty", P + ["{d}/m.onnx", "--board", "rk3588-8g"], {"m.onnx": b""}),
    Case("onnx-truncated", P + ["{d}/m.onnx", "--board", "rk3588-8g"], {"m.onnx": truncated("mlp.onnx", 100)}),
    Case("onnx-negative-initializer-dims", P + ["{d}/m.onnx", "--board", "rk3588-8g"],
         {"m.onnx": _negative_dims_onnx}),
    Case("onnx-missing-external-data", P + ["{d}/m.onnx", "--board", "rk3588-8g"],
         {"m.onnx": copy_of("external.onnx")}),
    Case("run-onnx-garbage", ["run", "{d}/m.onnx", "-i", "x={fx}/x.npy"], {"m.onnx": b"\x08\x07garbage"}),
    Case("run-onnx-truncated", ["run", "{d}/m.onnx", "-i", "x={fx}/x.npy"], {"m.onnx": truncated("mlp.onnx", 150)}),
    Case("run-onnx-missing-external-data", ["run", "{d}/m.onnx", "-i", "x={fx}/x.npy"],
         {"m.onnx": copy_of("external.onnx")}),
]

# run
R = ["run", "{fx}/mlp.onnx"]
E = ["run", "{fx}/embedding.onnx"]
RUN_CASES = [
    Case("run-model-missing", ["run", "{d}/nope.onnx", "-i", "x={fx}/x.npy"], needle="not found"),
    Case("run-model-unsupported-suffix", ["run", "{d}/m.txt", "-i", "x={fx}/x.npy"], {"m.txt": "hello"}),
    Case("run-model-dir-not-bundle", ["run", "{d}/m", "-i", "x={fx}/x.npy"], {"m/a.txt": "x"}),
    Case("run-no-inputs", R),
    Case("run-text-and-input", R + ["-t", "hi", "-i", "x={fx}/x.npy"]),
    Case("run-text-on-onnx", R + ["-t", "hello"], needle="--text"),
    Case("run-text-on-bundle-without-tokenizer", ["run", "{fx}/bundle", "-t", "hello"]),
    Case("run-input-no-equals", R + ["-i", "x"]),
    Case("run-input-empty-name", R + ["-i", "={fx}/x.npy"]),
    Case("run-input-empty-file", R + ["-i", "x="]),
    Case("run-input-file-missing", R + ["-i", "x={d}/nope.npy"]),
    Case("run-input-garbage-npy", R + ["-i", "x={d}/x.npy"], {"x.npy": b"garbage bytes"}),
    Case("run-input-npz-not-npy", R + ["-i", "x={d}/x.npz"], {"x.npz": npz(x=np.zeros((2, 16), np.float32))}),
    Case("run-input-object-array", R + ["-i", "x={d}/x.npy"], {"x.npy": npy(np.array([{"a": 1}, None],
                                                                                     dtype=object))}),
    Case("run-input-pickle", R + ["-i", "x={d}/x.npy"],
         {"x.npy": b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00K\x01."}),
    Case("run-input-directory", R + ["-i", "x={d}/sub"], {"sub/a.npy": npy(np.zeros(2))}),
    Case("run-input-unknown-name", R + ["-i", "z={fx}/x.npy"], needle="'z'"),
    Case("run-input-wrong-dtype", R + ["-i", "x={d}/x.npy"], {"x.npy": npy(np.zeros((2, 16), np.float64))}),
    Case("run-input-wrong-shape", R + ["-i", "x={d}/x.npy"], {"x.npy": npy(np.zeros((2, 3), np.float32))}),
    Case("run-input-wrong-rank", R + ["-i", "x={d}/x.npy"], {"x.npy": npy(np.zeros(16, np.float32))}),
    Case("run-input-scalar", R + ["-i", "x={d}/x.npy"], {"x.npy": npy(np.float32(1))}),
    Case("run-input-strings", R + ["-i", "x={d}/x.npy"], {"x.npy": npy(np.array(["a", "b"]))}),
    Case("run-input-twice", R + ["-i", "x={fx}/x.npy", "-i", "x={fx}/x.npy"]),
    Case("run-ids-above-vocab", E + ["-i", "ids={d}/i.npy"], {"i.npy": npy(np.array([[1, 2, 3, 4, 5, 32]]))},
         needle="vocabulary"),
    Case("run-ids-negative", E + ["-i", "ids={d}/i.npy"], {"i.npy": npy(np.array([[1, 2, -1, 4, 5, 6]]))},
         needle="vocabulary"),
    Case("run-ids-huge", E + ["-i", "ids={d}/i.npy"], {"i.npy": npy(np.array([[2**62] * 6]))}, needle="vocabulary"),
    Case("run-ids-int32-above", E + ["-i", "ids={d}/i.npy"], {"i.npy": npy(np.full((1, 6), 99, np.int32))}),
    Case("run-text-bundle-ids-above-vocab", ["run", "{fx}/text_bundle", "-i", "input_ids={d}/i.npy",
                                              "-i", "attention_mask={fx}/mask.npy",
                                              "-i", "token_type_ids={fx}/types.npy"],
         {"i.npy": npy(np.full((1, 128), 10**6, np.int64))}, needle="vocabulary"),
    Case("run-text-bundle-type-ids-above", ["run", "{fx}/text_bundle", "-i", "input_ids={fx}/ids.npy",
                                             "-i", "attention_mask={fx}/mask.npy",
                                             "-i", "token_type_ids={d}/t.npy"],
         {"t.npy": npy(np.full((1, 128), 7, np.int64))}, needle="vocabulary"),
    Case("run-out-is-file", R + ["-i", "x={fx}/x.npy", "--out", "{d}/o"], {"o": "a file"}, needle="--out"),
    Case("run-out-under-file", R + ["-i", "x={fx}/x.npy", "--out", "{d}/f/o"], {"f": "a file"}, needle="--out"),
    Case("run-out-proc", R + ["-i", "x={fx}/x.npy", "--out", "/proc/edgeinfer-out"], needle="/proc"),
    Case("run-out-sys", R + ["-i", "x={fx}/x.npy", "--out", "/sys/kernel/edgeinfer-out"], needle="/sys"),
    Case("run-out-dev", R + ["-i", "x={fx}/x.npy", "--out", "/dev/edgeinfer-out"], needle="/dev"),
    Case("run-out-symlink-to-proc", R + ["-i", "x={fx}/x.npy", "--out", "{d}/link/o"], {"link": _link("/proc/self")},
         needle="/proc"),
    Case("run-shape-malformed", R + ["-i", "x={fx}/x.npy", "--shape", "x"]),
    Case("run-shape-zero", R + ["-i", "x={fx}/x.npy", "--shape", "x=0x16"]),
    Case("run-shape-negative", R + ["-i", "x={fx}/x.npy", "--shape", "x=-1x16"]),
    Case("run-shape-letters", R + ["-i", "x={fx}/x.npy", "--shape", "x=axb"]),
    Case("run-shape-empty-name", R + ["-i", "x={fx}/x.npy", "--shape", "=2x16"]),
    Case("run-shape-huge", R + ["-i", "x={fx}/x.npy", "--shape", f"x={10**30}x16"]),
    Case("run-paging-zero", R + ["-i", "x={fx}/x.npy", "--paging", "0"]),
    Case("run-paging-negative", R + ["-i", "x={fx}/x.npy", "--paging", "-1"]),
    Case("run-segments-without-paging", R + ["-i", "x={fx}/x.npy", "--segments", "2"]),
    Case("run-segments-zero", R + ["-i", "x={fx}/x.npy", "--paging", "1", "--segments", "0"]),
    Case("run-cut-unknown-tensor", R + ["-i", "x={fx}/x.npy", "--paging", "1", "--cut", "nope"]),
    # text that is not UTF-8 (argv reaches Python surrogate-escaped, PEP 383) or holds a lone surrogate
    Case("run-text-not-utf8", ["run", "{fx}/text_bundle", "-t", "ok", "-t", "bad \udcff"], needle="--text"),
    Case("run-text-lone-surrogate", ["run", "{fx}/text_bundle", "-t", "\ud800"], needle="surrogate"),
    Case("generate-prompt-not-utf8", ["generate", "{fx}/tiny_llm", "--prompt", "\udcff"], needle="--prompt"),
    Case("generate-prompt-lone-surrogate", ["generate", "{fx}/tiny_llm", "--prompt", "a\udfff"], needle="--prompt"),
    Case("generate-chat-prompt-not-utf8", ["generate", "{fx}/tiny_llm", "--chat", "--prompt", "\udce9t\udce9"],
         needle="0xe9"),
    Case("generate-stop-not-utf8", ["generate", "{fx}/tiny_llm", "--prompt", "hi", "--stop", "\udcfe"],
         needle="stop"),
    Case("generate-prompt-twice", ["generate", "{fx}/tiny_llm", "hi", "--prompt", "hi"], needle="given twice"),
    Case("generate-no-prompt", ["generate", "{fx}/tiny_llm"], needle="no prompt"),
    Case("generate-seed-too-big", ["generate", "{fx}/tiny_llm", "--prompt", "hi", "--seed", str(2**64)],
         needle="seed"),
    Case("chat-system-not-utf8", ["chat", "{fx}/tiny_llm", "--system", "\udcc3"], needle="--system"),
    Case("run-bundle-garbage-manifest", ["run", "{d}/b", "-i", "x={fx}/x.npy"], {"b/manifest.json": "{{{"}),
    Case("run-bundle-garbage-tokenizer", ["run", "{d}/b", "-t", "hello"],
         {"b": copy_of("text_bundle", put("tokenizer/tokenizer.json", "not a tokenizer"))}),
    Case("run-bundle-tokenizer-wrong-json", ["run", "{d}/b", "-t", "hello"],
         {"b": copy_of("text_bundle", put("tokenizer/tokenizer.json", {"model": 5}))}),
]

# deploy: everything here must be refused before any export or conversion
D = ["deploy", "{fx}/mlp.onnx", *HOST]
DEPLOY_CASES = [
    Case("deploy-out-is-file", D + ["-o", "{d}/o"], {"o": "x"}, needle="-o"),
    Case("deploy-out-under-file", D + ["-o", "{d}/f/b"], {"f": "x"}, needle="-o"),
    Case("deploy-out-nonempty-dir", D + ["-o", "{d}/o"], {"o/keep.txt": "mine"}),
    Case("deploy-model-missing", ["deploy", "{d}/nope.onnx", *HOST, "-o", "{d}/b"]),
    Case("deploy-model-unsupported", ["deploy", "{d}/m.gguf", *HOST, "-o", "{d}/b"], {"m.gguf": b"GGUF"}),
    Case("deploy-dir-without-config", ["deploy", "{d}/m", *HOST, "-o", "{d}/b"], {"m/x.txt": "x"}),
    Case("deploy-unknown-board", ["deploy", "{fx}/mlp.onnx", "--board", "nope-board", "-o", "{d}/b"]),
    Case("deploy-board-file-garbage", ["deploy", "{fx}/mlp.onnx", "--board", "{d}/b.yaml", "-o", "{d}/b"],
         {"b.yaml": "[[["}),
    Case("deploy-unknown-quant", D + ["-o", "{d}/b", "--quant", "w2a2"]),
    Case("deploy-threshold-nan", D + ["-o", "{d}/b", "--threshold", "nan"], needle="--threshold"),
    Case("deploy-threshold-inf", D + ["-o", "{d}/b", "--threshold", "inf"], needle="--threshold"),
    Case("deploy-threshold-above-one", D + ["-o", "{d}/b", "--threshold", "2"], needle="--threshold"),
    Case("deploy-max-samples-zero", D + ["-o", "{d}/b", "--max-samples", "0"], needle="--max-samples"),
    Case("deploy-max-samples-negative", D + ["-o", "{d}/b", "--max-samples", "-3"], needle="--max-samples"),
    Case("deploy-shape-malformed", D + ["-o", "{d}/b", "--shape", "x=1by16"]),
    Case("deploy-shape-unknown-input", D + ["-o", "{d}/b", "--shape", "nope=2x16"]),
    Case("deploy-option-no-equals", D + ["-o", "{d}/b", "--option", "novalue"]),
    Case("deploy-option-empty-key", D + ["-o", "{d}/b", "--option", "=3"]),
    Case("deploy-paging-zero", D + ["-o", "{d}/b", "--paging", "0"]),
    Case("deploy-segments-without-paging", D + ["-o", "{d}/b", "--segments", "2"]),
    Case("deploy-segments-and-cut", D + ["-o", "{d}/b", "--paging", "1", "--segments", "2", "--cut", "xw"]),
    Case("deploy-calib-missing", D + ["-o", "{d}/b", "--calib", "{d}/nope.npz"]),
    Case("deploy-calib-garbage-npz", D + ["-o", "{d}/b", "--calib", "{d}/c.npz"], {"c.npz": b"PK\x03\x04junk"}),
    Case("deploy-calib-object-npz", D + ["-o", "{d}/b", "--calib", "{d}/c.npz"],
         {"c.npz": npz(x=np.array([None, {"a": 1}], dtype=object))}),
    Case("deploy-calib-wrong-name", D + ["-o", "{d}/b", "--calib", "{d}/c.npz"],
         {"c.npz": npz(nope=np.zeros((2, 16), np.float32))}),
    Case("deploy-calib-text-for-onnx", D + ["-o", "{d}/b", "--calib", "{d}/c.txt"], {"c.txt": "one\ntwo\n"}),
    Case("deploy-golden-inputs-garbage", D + ["-o", "{d}/b", "--golden-inputs", "{d}/g.npz"], {"g.npz": b"\0" * 64}),
    Case("deploy-golden-inputs-object-npz", D + ["-o", "{d}/b", "--golden-inputs", "{d}/g.npz"],
         {"g.npz": npz(x=np.array([object()], dtype=object))}),
    Case("deploy-int8-without-calib", D + ["-o", "{d}/b", "--quant", "int8"], needle="--calib"),
    Case("deploy-new-parent-bad-calib", D + ["-o", "{d}/new/sub/b", "--calib", "{d}/c.npz"], {"c.npz": b"junk"}),
    Case("deploy-new-parent-bad-golden", D + ["-o", "{d}/new/b", "--golden-inputs", "{d}/g.txt"], {"g.txt": "a\n"}),
    Case("deploy-pt2-garbage", ["deploy", "{d}/m.pt2", *HOST, "-o", "{d}/b"], {"m.pt2": b"not a zip"}),
    Case("deploy-hf-garbage-tokenizer", ["deploy", "{d}/m", *HOST, "-o", "{d}/b"],
         {"m": copy_of("tiny_hf", put("tokenizer.json", "garbage {"))}, needle="tokenizer"),
    Case("deploy-hf-tokenizer-binary", ["deploy", "{d}/m", *HOST, "-o", "{d}/b"],
         {"m": copy_of("tiny_hf", put("tokenizer.json", b"\xff\x00\xfe"))}, needle="tokenizer"),
    Case("deploy-hf-config-garbage", ["deploy", "{d}/m", *HOST, "-o", "{d}/b"],
         {"m": copy_of("tiny_hf", put("config.json", "{nope"))}),
    Case("deploy-hf-config-string-hidden", ["deploy", "{d}/m", *HOST, "-o", "{d}/b"],
         {"m": copy_of("tiny_hf", put("config.json", cfg(BERT, hidden_size="32")))}),
    Case("deploy-hf-config-negative-layers", ["deploy", "{d}/m", *HOST, "-o", "{d}/b"],
         {"m": copy_of("tiny_hf", put("config.json", cfg(BERT, num_hidden_layers=-1)))}),
    Case("deploy-hf-config-max-position-string", ["deploy", "{d}/m", *HOST, "-o", "{d}/b"],
         {"m": copy_of("tiny_hf", put("config.json", cfg(BERT, max_position_embeddings="x")))}),
]

# golden and bench
G = ["golden", "{d}/b"]
GOLDEN_CASES = [
    Case("golden-bundle-missing", ["golden", "{d}/nope"]),
    Case("golden-not-a-bundle", ["golden", "{d}/b"], {"b/x.txt": "x"}),
    Case("golden-inputs-without-reference", ["golden", "{fx}/bundle", "--inputs", "{fx}/x.npy"],
         needle="--reference"),
    Case("golden-threshold-nan", ["golden", "{fx}/bundle", "--threshold", "nan"], needle="--threshold"),
    Case("golden-threshold-large", ["golden", "{fx}/bundle", "--threshold", "1e9"], needle="--threshold"),
    Case("golden-saved-inputs-garbage", G, {"b": copy_of("bundle", put("golden/inputs.npz", b"garbage"))}),
    Case("golden-saved-inputs-object", G, {"b": copy_of("bundle", lambda p: np.savez(
        p / "golden" / "inputs.npz", **{"0/x": np.array([None], dtype=object)}))}),
    Case("golden-saved-inputs-bad-keys", G, {"b": copy_of("bundle", lambda p: np.savez(
        p / "golden" / "inputs.npz", x=np.zeros((2, 16), np.float32)))}),
    Case("golden-saved-inputs-missing", G, {"b": copy_of("bundle",
                                                         lambda p: (p / "golden" / "inputs.npz").unlink())}),
    Case("golden-saved-expected-npy", G, {"b": copy_of("bundle", lambda p: np.save(
        (p / "golden" / "expected.npz").open("wb"), np.zeros(3)))}),
    Case("golden-inputs-garbage-npz", ["golden", "{fx}/bundle", "--inputs", "{d}/g.npz", "--reference",
                                       "{fx}/mlp.onnx"], {"g.npz": b"PK\x05\x06" + b"\0" * 18}),
    Case("golden-inputs-object-npz", ["golden", "{fx}/bundle", "--inputs", "{d}/g.npz", "--reference",
                                      "{fx}/mlp.onnx"], {"g.npz": npz(x=np.array([None, 1], dtype=object))}),
    Case("golden-reference-garbage", ["golden", "{fx}/bundle", "--inputs", "{fx}/x.npz", "--reference", "{d}/r.onnx"],
         {"r.onnx": b"junk"}),
]
B = ["bench", "{fx}/bundle", "--repeat", "1", "--batch", "2"]
BENCH_CASES = [
    Case("bench-plot-is-dir", B + ["--plot", "{d}/p"], {"p/x": "x"}, needle="--plot"),
    Case("bench-plot-under-file", B + ["--plot", "{d}/f/p.png"], {"f": "x"}, needle="--plot"),
    Case("bench-plot-bad-suffix", B + ["--plot", "{d}/p.xyz"], needle="--plot"),
    Case("bench-plot-proc", B + ["--plot", "/proc/x.png"], needle="/proc"),
    Case("bench-plot-sys", B + ["--plot", "/sys/x.png"], needle="/sys"),
    Case("bench-output-dev-null", B + ["--output", "/dev/null"], needle="--output"),
    Case("bench-output-dev-stdout", B + ["--output", "/dev/stdout"], needle="--output"),
    Case("calibrate-output-proc", ["calibrate", "{d}/m.yaml", "--board", "rk3588-8g", "-o", "/proc/b.yaml"],
         {"m.yaml": "[]"}, needle="/proc"),
    Case("deploy-out-proc", D + ["-o", "/proc/edgeinfer-bundle"], needle="/proc"),
    Case("deploy-out-sys", D + ["-o", "/sys/edgeinfer-bundle"], needle="/sys"),
    Case("bench-batch-zero", ["bench", "{fx}/bundle", "--batch", "0"]),
    Case("bench-batch-negative", ["bench", "{fx}/bundle", "--batch", "-1"]),
    Case("bench-batch-letters", ["bench", "{fx}/bundle", "--batch", "a,b"]),
    Case("bench-batch-empty", ["bench", "{fx}/bundle", "--batch", ""]),
    Case("bench-batch-huge", ["bench", "{fx}/bundle", "--batch", str(10**12)], needle="--batch"),
    Case("bench-seq-zero", ["bench", "{fx}/bundle", "--seq", "0"]),
    Case("bench-repeat-zero", ["bench", "{fx}/bundle", "--repeat", "0"]),
    Case("bench-repeat-huge", ["bench", "{fx}/bundle", "--repeat", str(10**12)], needle="--repeat"),
    Case("bench-bundle-missing", ["bench", "{d}/nope"]),
    Case("boards-show-unknown", ["boards", "show", "no-such-board"]),
    Case("boards-show-garbage-file", ["boards", "show", "{d}/b.yaml"], {"b.yaml": ": : :"}),
]

CASES = (PLAN_CASES + BOARD_CASES + CONFIG_CASES + SAFETENSORS_CASES + GGUF_CASES + ONNX_CASES + RUN_CASES
         + DEPLOY_CASES + GOLDEN_CASES + BENCH_CASES)


# --- fixtures and the runner ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fx(tmp_path_factory) -> Path:
    """Small models and bundles every case may read (never write)."""
    root = tmp_path_factory.mktemp("fx")
    cache = tmp_path_factory.mktemp("fx-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("EDGEINFER_CACHE_DIR", str(cache))
    try:
        mlp = models.mlp(root, batch=2)
        models.embedding(root)
        np.save(root / "x.npy", mlp.feeds["x"])
        np.savez(root / "x.npz", x=mlp.feeds["x"])
        _external_onnx(root / "external.onnx")
        gguf_file()(root, root / "good.gguf")
        from edgeinfer.deploy.encoder import deploy

        deploy(mlp.path, "host", root / "bundle")
        tiny_bert_dir(root / "tiny_hf")
        deploy(root / "tiny_hf", "host", root / "text_bundle")
        np.save(root / "ids.npy", np.full((1, 128), 5, np.int64))
        np.save(root / "mask.npy", np.ones((1, 128), np.int64))
        np.save(root / "types.npy", np.zeros((1, 128), np.int64))
        (root / "tiny_llm").symlink_to(llm.model_dir(), target_is_directory=True)
    finally:
        mp.undo()
    return root


def _external_onnx(path: Path) -> None:
    """An ONNX model whose weights live in an external file that is not there."""
    import onnx

    tmp = path.with_name("ext_src")
    tmp.mkdir()
    m = models.mlp(tmp)
    model = onnx.load(str(m.path))
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    (path.parent / "weights.bin").unlink()
    shutil.rmtree(tmp)


def _write(path: Path, content: Any, fx: Path | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if callable(content):
        content(fx, path)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    else:
        path.write_text(json.dumps(content))


def _tree(*roots: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for root in roots:
        for p in sorted(root.rglob("*")):
            st = p.lstat()
            out[str(p)] = (st.st_size if p.is_file() else -1, st.st_mtime_ns if p.is_file() else 0)
    return out


def _expand(argv: list[str], d: Path, fx: Path) -> list[str]:
    return [a.replace("{d}", str(d)).replace("{fx}", str(fx)) for a in argv]


@pytest.fixture
def case_env(tmp_path, fx, monkeypatch, tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "corpus-cache"
    cache.mkdir(exist_ok=True)
    hub = tmp_path_factory.getbasetemp() / "corpus-hf-hub"
    hub.mkdir(exist_ok=True)
    monkeypatch.setenv("EDGEINFER_CACHE_DIR", str(cache))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.chdir(tmp_path)
    return tmp_path, fx, cache


def _prepare(case: Case, d: Path, fx: Path) -> list[str]:
    for rel, content in case.files.items():
        if callable(content) and not isinstance(content, (bytes, str)):
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            content(fx, d / rel)
        else:
            _write(d / rel, content, fx)
    return _expand(case.argv, d, fx)


def _check(case: Case, code: int, stderr: str, before: dict, after: dict) -> None:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert code == case.code, f"exit {code}, stderr:\n{stderr}"
    assert len(lines) == 1, f"{len(lines)} stderr lines:\n{stderr}"
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr
    assert lines[0].startswith("error: "), stderr
    if case.needle:
        assert case.needle in lines[0], lines[0]
    assert after == before, f"files changed: {sorted(set(after) ^ set(before))}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, case_env, capfd) -> None:
    from edgeinfer import cli

    d, fx, cache = case_env
    argv = _prepare(case, d, fx)
    before = _tree(d, fx, cache)
    cli._attach_optional_commands()
    capfd.readouterr()
    code = cli.invoke(argv)
    _, err = capfd.readouterr()
    _check(case, code, err, before, _tree(d, fx, cache))


SUB = CASES[::SUBPROCESS_EVERY]


@pytest.mark.parametrize("case", SUB, ids=[c.id for c in SUB])
def test_bad_input_subprocess(case: Case, case_env) -> None:
    d, fx, cache = case_env
    argv = _prepare(case, d, fx)
    before = _tree(d, fx, cache)
    proc = edgeinfer(*argv, cwd=d)
    _check(case, proc.returncode, proc.stderr, before, _tree(d, fx, cache))


def test_corpus_is_large_and_ids_unique() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
    assert len(CASES) >= 150
