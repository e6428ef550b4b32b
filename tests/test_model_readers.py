"""Model readers. Expected values are hand arithmetic or published facts (docs/board-facts.md#model-configs)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from helpers import tiny_gguf

from edgeinfer.errors import EdgeInferError, ModelError
from edgeinfer.planning.models import resolve

KIB = 1024


# --------------------------------------------------------------- catalog (facts from each model's HF config.json)
@pytest.mark.parametrize("ref, kv_kib", [
    ("Qwen/Qwen3-8B", 144), ("qwen3-8b", 144), ("Qwen/Qwen3-0.6B", 112), ("Qwen/Qwen3-14B", 160),
    ("Qwen/Qwen3-32B", 256), ("Qwen/Qwen3-30B-A3B", 96), ("Qwen/Qwen2.5-0.5B-Instruct", 12),
    ("qwen2.5-7b", 56), ("meta-llama/Llama-3.1-8B", 128), ("llama-2-7b", 512), ("llama-2-13b", 800),
    ("TinyLlama/TinyLlama-1.1B-Chat-v1.0", 22), ("microsoft/Phi-3-mini-4k-instruct", 384),
])
def test_catalog_kv_per_token_matches_published_table(ref, kv_kib):
    assert resolve(ref).kv_bytes_per_token(2.0) == kv_kib * KIB


@pytest.mark.parametrize("ref, total_b, active_b", [
    ("Qwen/Qwen3-0.6B", 0.596, 0.596), ("Qwen/Qwen3-4B", 4.022, 4.022), ("Qwen/Qwen3-8B", 8.191, 7.568),
    ("Qwen/Qwen3-14B", 14.768, 13.990), ("Qwen/Qwen3-32B", 32.762, 31.984), ("Qwen/Qwen3-30B-A3B", 30.53, 3.04),
    ("qwen2.5-0.5b", 0.494, 0.494), ("qwen2.5-1.5b", 1.544, 1.544), ("deepseek-r1-distill-qwen-1.5b", 1.777, 1.544),
    ("llama-2-7b", 6.738, 6.607), ("llama-3.1-8b", 8.030, 7.505), ("tinyllama-1.1b", 1.100, 1.035),
    ("phi-3-mini-4k-instruct", 3.821, 3.723),
])
def test_catalog_param_counts_match_published_table(ref, total_b, active_b):
    s = resolve(ref)
    assert s.params_total / 1e9 == pytest.approx(total_b, abs=0.006)
    assert s.params_active / 1e9 == pytest.approx(active_b, abs=0.006)


@pytest.mark.parametrize("ref, total_m", [("all-minilm-l6-v2", 22.7), ("bert-base-uncased", 109.5),
                                          ("BAAI/bge-m3", 567.8), ("BAAI/bge-reranker-base", 278.0)])
def test_encoders_have_no_kv_and_published_sizes(ref, total_m):
    s = resolve(ref)
    assert s.encoder and s.kv_bytes_per_token() == 0
    assert s.params_total / 1e6 == pytest.approx(total_m, abs=0.06)


def test_every_catalog_entry_has_a_source():
    from edgeinfer.planning.models import catalog

    for entry in catalog().values():
        assert entry["source"].startswith("https://")


def test_moe_facts():
    s = resolve("Qwen/Qwen3-30B-A3B")
    assert (s.n_experts, s.experts_per_token, s.moe_intermediate) == (128, 8, 768)


# --------------------------------------------------------------- HF directory + safetensors
LLAMA_CFG = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 2,
             "num_key_value_heads": 1, "intermediate_size": 16, "vocab_size": 32, "tie_word_embeddings": False,
             "torch_dtype": "float16"}


def _write_tiny(dirpath, shards=1):
    from safetensors.numpy import save_file

    tensors = {"model.embed_tokens.weight": np.zeros((32, 8), np.float16),   # 256 el, 512 B
               "lm_head.weight": np.zeros((32, 8), np.float16),              # 256 el, 512 B
               "model.layers.0.mlp.up_proj.weight": np.zeros((16, 8), np.float32)}  # 128 el, 512 B
    (dirpath / "config.json").write_text(json.dumps(LLAMA_CFG))
    if shards == 1:
        save_file(tensors, str(dirpath / "model.safetensors"))
    else:
        names = list(tensors)
        save_file({k: tensors[k] for k in names[:2]}, str(dirpath / "model-00001-of-00002.safetensors"))
        save_file({k: tensors[k] for k in names[2:]}, str(dirpath / "model-00002-of-00002.safetensors"))
        wm = {k: ("model-00001-of-00002.safetensors" if i < 2 else "model-00002-of-00002.safetensors")
              for i, k in enumerate(names)}
        (dirpath / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))


@pytest.mark.parametrize("shards", [1, 2])
def test_hf_dir_exact_counts_from_safetensors_headers(tmp_path, shards):
    _write_tiny(tmp_path, shards)
    s = resolve(str(tmp_path))
    assert s.params_total == 256 + 256 + 128
    assert s.file_weight_bytes == 512 + 512 + 512
    assert s.embedding_params == 256 and s.lm_head_params == 256
    assert s.kv_bytes_per_token(2.0) == 2 * 2 * 1 * 4 * 2  # 2 × layers × kv_heads × head_dim(8/2) × 2 B


def test_config_json_path(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_CFG))
    s = resolve(str(tmp_path / "config.json"))
    assert s.layers == 2 and s.head_dim == 4


def test_hf_cache_lookup(tmp_path, monkeypatch):
    snap = tmp_path / "models--acme--tiny-llama" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(LLAMA_CFG))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    s = resolve("acme/tiny-llama")
    assert s.layers == 2 and s.name == "acme/tiny-llama"


def test_unknown_model_says_how_to_provide_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelError) as e:
        resolve("acme/not-there")
    assert e.value.exit_code == 2 and "huggingface-cli download" in e.value.one_line()


# --------------------------------------------------------------- GGUF
def _write_gguf(path):
    import gguf

    q = gguf.quants.quantize(np.zeros((64, 64), np.float32), gguf.GGMLQuantizationType.Q8_0)
    tiny_gguf(path, [("token_embd.weight", np.zeros((10, 64), np.float32)),   # 640 el × 4 B = 2560 B
                     ("blk.0.attn_q.weight", np.zeros((64, 64), np.float16)),  # 4096 el × 2 B = 8192 B
                     ("blk.0.ffn_up.weight", q, gguf.GGMLQuantizationType.Q8_0)])  # 4096/32 × 34 = 4352 B


def test_gguf_exact_per_tensor_bytes(tmp_path):
    p = tmp_path / "tiny.gguf"
    _write_gguf(p)
    s = resolve(str(p))
    assert s.architecture == "llama" and s.layers == 2 and s.kv_heads == 2 and s.head_dim == 16
    assert s.tensor_bytes["token_embd.weight"] == 2560
    assert s.tensor_bytes["blk.0.attn_q.weight"] == 8192
    assert s.tensor_bytes["blk.0.ffn_up.weight"] == 4352
    assert s.file_weight_bytes == 2560 + 8192 + 4352
    assert s.params_total == 640 + 4096 + 4096


def test_ggml_type_table_agrees_with_the_gguf_package():
    """The reader's block sizes are its own table (no gguf package at plan time); gguf's are the reference."""
    import gguf

    from edgeinfer.planning.models.gguf import GGML_TYPES

    assert len(GGML_TYPES) >= 30
    for kind, (name, block_n, block_bytes) in GGML_TYPES.items():
        t = gguf.GGMLQuantizationType(kind)
        if t in gguf.GGML_QUANT_SIZES:
            assert (t.name, *gguf.GGML_QUANT_SIZES[t]) == (name, block_n, block_bytes), kind


@pytest.mark.parametrize("endian", ["LITTLE", "BIG"])
def test_gguf_header_with_a_tokenizer_and_per_layer_arrays(tmp_path, endian):
    """What llama.cpp's converter writes around the shapes: a vocabulary of 70,000 tokens with scores (counted,
    not decoded), per-layer KV head counts (the largest is planned), K-quant tensors; both byte orders."""
    import gguf

    p = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(p), "qwen3", endianess=getattr(gguf.GGUFEndian, endian))
    w.add_block_count(3)
    w.add_embedding_length(256)
    w.add_head_count(8)
    w.add_head_count_kv([2, 4, 1])
    w.add_feed_forward_length(512)
    w.add_context_length(40960)
    w.add_name("tiny test")
    w.add_token_list([f"t{i}" for i in range(70_000)])
    w.add_token_scores([0.5] * 70_000)
    q4k = np.zeros((256, 256 // 256 * 144), np.uint8)  # 256 rows of one Q4_K block: 144 bytes each
    w.add_tensor("blk.0.ffn_up.weight", q4k, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    w.add_tensor("output_norm.weight", np.ones(256, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    s = resolve(str(p))
    assert (s.architecture, s.name, s.layers, s.hidden, s.heads, s.kv_heads) == ("qwen3", "tiny test", 3, 256, 8, 4)
    assert s.vocab == 70_000 and s.max_position == 40960 and s.intermediate == 512
    assert s.tensor_bytes == {"blk.0.ffn_up.weight": 256 * 144, "output_norm.weight": 1024}
    assert s.tensor_types == {"Q4_K": 256 * 144, "F32": 1024} and s.params_total == 256 * 256 + 256


def test_gguf_header_faults_are_one_line(tmp_path):
    good = tmp_path / "t.gguf"
    _write_gguf(good)
    data = bytearray(good.read_bytes())
    (tmp_path / "v1.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 1, 0, 0))
    _check_bad(str(tmp_path / "v1.gguf"), "not a valid GGUF file", "version 1", "versions 2 and 3")
    (tmp_path / "long-key.gguf").write_bytes(b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 2**40) + b"k" * 20)
    _check_bad(str(tmp_path / "long-key.gguf"), "not a valid GGUF file", "past the end")
    (tmp_path / "kind.gguf").write_bytes(b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 1) + b"k" + struct.pack("<I", 77))
    _check_bad(str(tmp_path / "kind.gguf"), "not a valid GGUF file", "value type 77")
    at = data.index(b"blk.0.ffn_up.weight") + len("blk.0.ffn_up.weight")  # name, n_dims, 2 dims, then the type
    data[at + 4 + 16:at + 4 + 16 + 4] = struct.pack("<I", 250)
    (tmp_path / "type.gguf").write_bytes(bytes(data))
    _check_bad(str(tmp_path / "type.gguf"), "ggml type 250", "does not know")


# --------------------------------------------------------------- ONNX
def _write_onnx(path, external=False):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((8, 4), np.float32), "W")  # 32 el × 4 B = 128 B
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], [w])
    m = helper.make_model(g)
    if external:
        onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location="weights.bin", size_threshold=0)
    else:
        onnx.save_model(m, str(path))


@pytest.mark.parametrize("external", [False, True])
def test_onnx_initializer_bytes(tmp_path, external):
    p = tmp_path / "m.onnx"
    _write_onnx(p, external)
    s = resolve(str(p))
    assert s.file_weight_bytes == 128 and s.params_total == 32
    assert [i["name"] for i in s.inputs] == ["x"] and s.outputs[0]["shape"] == ["n", 4]


# --------------------------------------------------------------- bad input: one line, exit 2
def _check_bad(ref, *words):
    """The one-line message of a bad model reference, checked to name the file and say each of ``words``."""
    with pytest.raises(EdgeInferError) as e:
        resolve(ref)
    msg = e.value.one_line()
    assert e.value.exit_code == 2 and "\n" not in msg
    assert Path(ref).name in msg and all(w in msg for w in words), msg
    return msg


def test_garbage_and_truncated_files(tmp_path):
    (tmp_path / "g.gguf").write_bytes(b"GGUF" + b"\xff" * 40)
    _check_bad(str(tmp_path / "g.gguf"), "not a valid GGUF file", "re-download")
    (tmp_path / "n.gguf").write_bytes(b"not a gguf at all")
    assert "not a GGUF" in _check_bad(str(tmp_path / "n.gguf"))
    good = tmp_path / "t.gguf"
    _write_gguf(good)
    data = good.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) - 3000])  # into the tensor data
    _check_bad(str(tmp_path / "cut.gguf"), "GGUF file is truncated", "tensors end at", "re-download")
    (tmp_path / "cut-header.gguf").write_bytes(data[:60])  # inside the metadata
    _check_bad(str(tmp_path / "cut-header.gguf"), "not a valid GGUF file", "re-download")
    (tmp_path / "g.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    _check_bad(str(tmp_path / "g.safetensors"), "not a valid safetensors file", "re-download")
    (tmp_path / "huge.safetensors").write_bytes(b"\xff" * 8 + b"{}")
    _check_bad(str(tmp_path / "huge.safetensors"), "header length", "does not fit a 10-byte file")
    d = tmp_path / "st"
    d.mkdir()
    _write_tiny(d)
    raw = (d / "model.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(raw[:-100])
    assert "truncated" in _check_bad(str(tmp_path / "cut.safetensors"))
    (tmp_path / "g.onnx").write_bytes(b"\x00garbage\xff" * 10)
    _check_bad(str(tmp_path / "g.onnx"), "not a valid ONNX model", "re-export")
    _write_onnx(tmp_path / "ok.onnx")
    raw = (tmp_path / "ok.onnx").read_bytes()
    (tmp_path / "cut.onnx").write_bytes(raw[: len(raw) // 2])
    _check_bad(str(tmp_path / "cut.onnx"), "not a valid ONNX model", "re-export")


def test_config_missing_keys_and_unsupported_type(tmp_path):
    cfg = dict(LLAMA_CFG)
    del cfg["hidden_size"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert "hidden_size" in _check_bad(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA_CFG, "model_type": "mamba"}))
    msg = _check_bad(str(tmp_path))
    assert "unsupported model_type 'mamba'" in msg and "qwen3" in msg
    (tmp_path / "config.json").write_text("{broken")
    _check_bad(str(tmp_path), "config.json")
