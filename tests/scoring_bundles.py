"""Issue 31's scoring test models (edgeinfer.testing.scorers: MiniLM with a trained head) deployed to ``--board
host`` once per session for the run / bench / serve tests, and the logits they are checked against."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.testing import scorers

LABELS = list(scorers.LABELS)


def _deploy(model_dir: Path, out: Path) -> Path:
    from edgeinfer.deploy.encoder import deploy

    deploy(model_dir, "host", out, quant="fp32", force=True)  # writes the task section
    return out


@pytest.fixture(scope="session")
def reranker_host_bundle(tmp_path_factory, reranker_dir) -> Path:
    """The one-label cross-encoder's bundle for the host board, ``task: rerank, sigmoid``; serve names a model by
    its directory, hence ``reranker``."""
    return _deploy(reranker_dir, tmp_path_factory.mktemp("reranker-host") / "reranker")


@pytest.fixture(scope="session")
def classifier_host_bundle(tmp_path_factory, classifier_dir) -> Path:
    """The classifier's bundle for the host board, ``task: classify, softmax`` with :data:`LABELS`."""
    return _deploy(classifier_dir, tmp_path_factory.mktemp("classifier-host") / "classifier")


def direct_logits(bundle: Path, items: list) -> np.ndarray:
    """Logits from onnxruntime on the bundle's artifact, each text (or (query, document) pair) tokenized
    alone, unpadded, with the tokenizer file: no edgeinfer code in the way."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    manifest = json.loads((bundle / "manifest.json").read_text())
    tok = Tokenizer.from_file(str(bundle / manifest["text"]["tokenizer"] / "tokenizer.json"))
    tok.no_padding()
    sess = ort.InferenceSession(str(bundle / manifest["artifacts"][0]), providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    rows = []
    for item in items:
        enc = tok.encode(*item) if isinstance(item, tuple) else tok.encode(item)
        cols = {"input_ids": enc.ids, "attention_mask": enc.attention_mask, "token_type_ids": enc.type_ids}
        feeds = {k: np.array([v], dtype=np.int64) for k, v in cols.items() if k in names}
        rows.append(sess.run([manifest["text"]["output"]], feeds)[0][0])
    return np.array(rows, dtype=np.float64)
