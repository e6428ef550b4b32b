"""Hostile model directories for tests: a copy of a real one whose ``auto_map`` names a module of its own.

The module writes a marker file the moment it is imported, so a test proves that no loader imported it
(the marker is absent) or that a trusted one did (it is there). Weights are linked, not copied.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

MODULE = "modeling_evil"
_LINKED = (".safetensors", ".bin")


@dataclass
class EvilDir:
    path: Path
    marker: Path
    entry: str  # what the refusal names, e.g. "config.json auto_map names AutoModelForCausalLM -> modeling_evil.X"

    @property
    def imported(self) -> bool:
        return self.marker.exists()


def evil_copy(src: Path, dst: Path, naming_file: str = "config.json", auto_class: str = "AutoModelForCausalLM",
              base: str = "Qwen3ForCausalLM") -> EvilDir:
    """``src`` copied to ``dst`` with ``naming_file``'s auto_map naming ``modeling_evil.EvilModel`` (for a
    tokenizer_config.json: ``EvilTokenizer``), a subclass of transformers' ``base`` so that a trusted load
    still works."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix in _LINKED:
            (dst / f.name).symlink_to(f)
        elif f.is_file():
            shutil.copy2(f, dst / f.name)
        else:
            shutil.copytree(f, dst / f.name)
    marker = dst.parent / f"{dst.name}.imported"
    cls = "EvilTokenizer" if naming_file == "tokenizer_config.json" else "EvilModel"
    (dst / f"{MODULE}.py").write_text(
        "import pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text('imported')\n"
        f"from transformers import {base}\n\n\n"
        f"class {cls}({base}):\n    pass\n")
    cfg_path = dst / naming_file
    cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    target = f"{MODULE}.{cls}"
    cfg["auto_map"] = {auto_class: [target, None] if naming_file == "tokenizer_config.json" else target}
    cfg_path.write_text(json.dumps(cfg, indent=1))
    return EvilDir(dst, marker, f"{naming_file} auto_map names {auto_class} -> {target}")


def evil_decoder(dst: Path, naming_file: str = "config.json") -> EvilDir:
    """The committed tiny decoder (``edgeinfer.testing.llm.model_dir()``) with code named in ``naming_file``."""
    from edgeinfer.testing.llm import model_dir

    if naming_file == "tokenizer_config.json":
        return evil_copy(model_dir(), dst, naming_file, "AutoTokenizer", "PreTrainedTokenizerFast")
    return evil_copy(model_dir(), dst, naming_file)


def evil_encoder(dst: Path) -> EvilDir:
    """all-MiniLM-L6-v2 (``edgeinfer.testing.minilm.model_dir()``) whose config names an AutoModel of its own."""
    from edgeinfer.testing.minilm import model_dir

    return evil_copy(model_dir(), dst, "config.json", "AutoModel", "BertModel")
