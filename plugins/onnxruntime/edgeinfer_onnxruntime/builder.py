"""The onnxruntime-genai model builder (``python -m onnxruntime_genai.models.builder``,
https://github.com/microsoft/onnxruntime-genai, ``src/python/py/models/builder.py``) run on a Hugging Face decoder:
what it would export wrong refused first, the model directory's code run only where the user trusts it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path

from edgeinfer.contract import remote_code
from edgeinfer.contract.helpers import inside
from edgeinfer.errors import BackendUnavailableError, ModelError

from .last_logits import gather_last

GENAI_CONFIG = "genai_config.json"


def is_built(path: Path) -> bool:
    return (path / GENAI_CONFIG).is_file()


def builder_version() -> str:
    try:
        return version("onnxruntime-genai")
    except Exception:
        raise BackendUnavailableError(
            "onnxruntime-genai (its model builder) is not installed, so decoders cannot be exported to ONNX",
            "pip install onnxruntime-genai==0.14.1 onnx_ir (0.14.1 is the release that keeps protobuf 4.25)",
        ) from None


def check_exportable(hf_dir: Path) -> None:
    """Refuse what the builder exports wrong without a word. It takes every ``nn.Linear`` whose out_features equal
    the vocabulary size for the LM head (``has_lm_head`` in onnxruntime_genai/models/builders/base.py, 0.14.1), so a
    model whose MLP width equals its vocabulary gets an up/gate projection as its LM head: logits cosine 0.16
    against transformers on a random Qwen3 with intermediate_size = vocab_size = 3072 (the golden check caught it)."""
    try:
        cfg = json.loads((hf_dir / "config.json").read_text())
    except (OSError, ValueError):
        return  # the builder reports a missing or broken config itself
    cfg = cfg.get("text_config", cfg)
    vocab = cfg.get("vocab_size")
    widths = {k: cfg.get(k) for k in ("intermediate_size", "moe_intermediate_size", "ffn_hidden_size")}
    clash = [k for k, v in widths.items() if vocab and v == vocab]
    if clash:
        raise ModelError(f"{hf_dir.name}: {clash[0]} equals vocab_size ({vocab}); onnxruntime-genai's builder would "
                         "take an MLP projection for the LM head and export wrong logits",
                         "deploy it for another backend (e.g. --board core-ultra-155h), or pick another MLP width")


def builder_command(hf_dir: Path, out: Path, precision: str, extra: Sequence[str] = ()) -> list[str]:
    """The model builder's command line. Its ``hf_remote`` option (default true) is what it passes transformers
    as ``trust_remote_code`` (onnxruntime_genai/models/builder.py, 0.14.1): set to the user's choice, always;
    ``hf_token=false``: a local directory needs no Hugging Face login."""
    own = [f"hf_remote={'true' if remote_code.allowed(hf_dir) else 'false'}", "hf_token=false"]
    return [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_dir), "-o", str(out),
            "-p", precision, "-e", "cpu", "-c", str(out / "hf-cache"), "--extra_options", *extra, *own]


def export(hf_dir: Path, out: Path, precision: str, extra: Sequence[str] = ()) -> None:
    """Run the model builder on ``hf_dir`` into the (empty) directory ``out``; its LM head then runs at the
    positions a step reads only, where the graph lets :mod:`.last_logits` find it."""
    builder_version()
    check_exportable(hf_dir)
    proc = subprocess.run(builder_command(hf_dir, out, precision, extra), capture_output=True, text=True)
    shutil.rmtree(out / "hf-cache", ignore_errors=True)
    if proc.returncode != 0 or not is_built(out):
        lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        raise ModelError(f"onnxruntime-genai could not export {hf_dir.name}: {lines[-1] if lines else 'no output'}")
    dec = json.loads((out / GENAI_CONFIG).read_text())["model"]["decoder"]
    gather_last(inside(out, dec["filename"], f"{GENAI_CONFIG} model.decoder.filename"), dec["outputs"]["logits"])
