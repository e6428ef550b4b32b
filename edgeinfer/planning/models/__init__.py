"""Model references -> ModelSpec.

``resolve(ref)`` tries, in order: the built-in catalog (HF id or short name), a Hugging
Face directory or a config.json path, a .gguf, .onnx or .safetensors file, a decoder file an
installed backend runs as it is (.rkllm), an HF id in the local Hugging Face cache. Nothing heavy is
imported for catalog or config inputs.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path

from edgeinfer.contract import registry
from edgeinfer.errors import ModelError
from edgeinfer.planning.models.spec import ModelSpec

CATALOG_DIR = Path(__file__).parent / "catalog"

__all__ = ["ModelSpec", "resolve", "catalog", "catalog_names", "hf_cache_dirs"]


@lru_cache(maxsize=1)
def catalog() -> dict[str, dict]:
    """lower-cased HF id and short names -> catalog entry."""
    out: dict[str, dict] = {}
    for p in sorted(CATALOG_DIR.glob("*.json")):
        entry = json.loads(p.read_text(encoding="utf-8"))
        for key in [entry["hf_id"], *entry.get("short_names", [])]:
            out[key.lower()] = entry
    return out


def catalog_names() -> list[str]:
    return sorted({e["hf_id"] for e in catalog().values()})


def from_catalog(ref: str) -> ModelSpec | None:
    entry = catalog().get(ref.strip().lower())
    if entry is None:
        return None
    from edgeinfer.planning.models.hf import spec_from_config

    spec = spec_from_config(entry["config"], entry["hf_id"], entry["source"])
    spec.notes.extend(entry.get("notes", []))
    return spec


def hf_cache_dirs() -> list[Path]:
    if os.environ.get("HF_HUB_CACHE"):
        return [Path(os.environ["HF_HUB_CACHE"])]
    if os.environ.get("HF_HOME"):
        return [Path(os.environ["HF_HOME"]) / "hub"]
    return [Path.home() / ".cache" / "huggingface" / "hub"]


def find_in_hf_cache(ref: str) -> Path | None:
    if "/" not in ref or ref.count("/") != 1:
        return None
    org, name = ref.split("/")
    for root in hf_cache_dirs():
        repo = root / f"models--{org}--{name}"
        if not repo.is_dir():
            continue
        snaps = repo / "snapshots"
        ref_main = repo / "refs" / "main"
        if ref_main.is_file():
            cand = snaps / ref_main.read_text().strip()
            if (cand / "config.json").is_file():
                return cand
        found = sorted(snaps.glob("*/config.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        if found:
            return found[0].parent
    return None


def resolve(ref: str | os.PathLike) -> ModelSpec:
    """Turn a model reference into a ModelSpec (see the module docstring for the order)."""
    if isinstance(ref, ModelSpec):
        return ref
    text = str(ref).strip()
    if not text:
        raise ModelError("empty model reference", "pass a catalog name, an HF id or a model path")
    spec = from_catalog(text)
    if spec is not None:
        return spec
    path = Path(text).expanduser()
    if path.is_dir():
        from edgeinfer.planning.models.hf import read_hf_dir

        return read_hf_dir(path)
    if path.is_file():
        suffix = path.suffix.lower()
        if path.name == "config.json" or suffix == ".json":
            from edgeinfer.planning.models.hf import read_config, spec_from_config

            return spec_from_config(read_config(path), path.parent.name, str(path))
        if suffix == ".gguf":
            from edgeinfer.planning.models.gguf import read_gguf

            return read_gguf(path)
        if suffix == ".onnx":
            from edgeinfer.planning.models.onnx import read_onnx

            return read_onnx(path)
        if suffix == ".safetensors":
            from edgeinfer.planning.models.hf import read_safetensors_file

            return read_safetensors_file(path)
        owner = registry.decoder_file(path)
        if owner is not None:
            from edgeinfer.planning.models.decoder_file import read_decoder_file

            return read_decoder_file(path, owner[1])
        raise ModelError(f"{path}: unsupported model file type '{suffix}'",
                         "pass a .gguf, .onnx, .safetensors, config.json, a decoder file an installed backend "
                         "runs (.rkllm) or an HF model directory")
    cached = find_in_hf_cache(text)
    if cached is not None:
        from edgeinfer.planning.models.hf import read_hf_dir

        spec = read_hf_dir(cached, name=text)
        return spec
    import difflib

    close = difflib.get_close_matches(text.lower(), list(catalog()), n=3, cutoff=0.6)
    names = catalog_names()
    hint = f"pass one of the catalog's {len(names)} models (such as Qwen/Qwen3-8B), " \
           "a local HF directory, a .gguf/.onnx/.safetensors file, or download it into the HF cache " \
           "with `huggingface-cli download " + text + " config.json`"
    if close:
        hint = "did you mean " + ", ".join(close) + "? Otherwise " + hint
    raise ModelError(f"model '{text}' not found in the catalog, on disk or in the Hugging Face cache", hint,
                     kind="model_not_found")
