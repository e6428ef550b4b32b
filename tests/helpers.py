"""Helpers for the core tests: run the real CLI in a subprocess, make throwaway plugin distributions."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

HEAVY = ("torch", "onnxruntime", "openvino", "rknn", "torch_npu", "tensorflow", "onnx", "transformers")


def edgeinfer(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "edgeinfer.cli", *args], capture_output=True, text=True, env=full_env, cwd=cwd
    )


def make_plugin_dist(root: Path, dist: str, ep_name: str, module_src: str) -> dict[str, str]:
    """Write a real installed-distribution layout (dist-info with an entry point) under ``root``;
    return the env that puts it on the path."""
    module = f"{ep_name}_plugin_mod"
    (root / f"{module}.py").write_text(textwrap.dedent(module_src))
    info = root / f"{dist.replace('-', '_')}-0.0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text(f"[edgeinfer]\n{ep_name} = {module}\n")
    path = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": path}


def imported_modules(code: str) -> set[str]:
    """Top-level names of every module ``code`` imports, from ``python -X importtime``."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True)
    names = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


def tiny_bert_dir(out: Path) -> Path:
    """A real Hugging Face directory: a two-layer BERT with random weights (hidden 32) and the
    all-MiniLM-L6-v2 tokenizer and pooling files. Exports and converts in seconds."""
    import shutil

    import transformers

    from edgeinfer.testing import minilm

    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=128)
    transformers.BertModel(cfg).save_pretrained(out)
    src = minilm.model_dir()
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "modules.json"):
        if (src / f).is_file():
            shutil.copy(src / f, out / f)
    shutil.copytree(src / "1_Pooling", out / "1_Pooling")
    return out


def tiny_gguf(path: Path, tensors: list[tuple], file_type=None) -> Path:
    """A 2-block llama GGUF (hidden 64, 4 heads, 2 KV heads) with ``tensors``: (name, array[, raw_dtype])."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_feed_forward_length(128)
    w.add_context_length(2048)
    if file_type is not None:
        w.add_file_type(file_type)
    for name, data, *raw in tensors:
        w.add_tensor(name, data, raw_dtype=raw[0] if raw else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def labelled_bundle(src: Path, dst: Path, board: str) -> Path:
    """A copy of the bundle at ``src`` whose manifest names ``board`` (its seals dropped: a relabelled copy)."""
    import shutil

    from edgeinfer.model.bundle import read_manifest, write

    shutil.copytree(src, dst)
    write(dst, read_manifest(dst).model_copy(update={"board": board, "files": {}}))
    return dst


def npu_test_board(path: Path, **memory_gib: float) -> str:
    """A board profile for fleet tests: Core Ultra 155H's facts (openvino NPU → the `intel_npu` Ray resource), its
    runtime also taking fp32 (the committed tiny model's bundle), memory as given; named after the file."""
    import yaml

    from edgeinfer.planning.boards import boards_dirs

    board = yaml.safe_load((boards_dirs()[0] / "core-ultra-155h.yaml").read_text())
    board["name"] = path.stem
    board["runtimes"]["openvino-npu"]["schemes"].append("fp32")
    for key, value in memory_gib.items():
        board[key]["value"] = value
    path.write_text(yaml.safe_dump(board, sort_keys=False))
    return str(path)
