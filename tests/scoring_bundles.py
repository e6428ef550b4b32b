"""TEMPORARY stand-ins for issue 31's scoring test models, until engineer C's fixtures land: a MiniLM
``BertForSequenceClassification`` (the packaged all-MiniLM-L6-v2 weights, a seeded random head) deployed to
``--board host`` once per session, with the manifest's ``task`` section added here (C's deploy writes it).
At integration the lead swaps ``reranker_host_bundle`` / ``classifier_host_bundle`` for C's fixtures; the
random head makes scores arbitrary but deterministic, which is all run / bench / serve tests need."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

LABELS = ["negative", "neutral", "positive"]


def _classification_dir(root: Path, labels: list[str]) -> Path:
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from edgeinfer.testing import minilm

    src = minilm.model_dir()
    cfg = BertConfig.from_pretrained(src, num_labels=len(labels),
                                     id2label=dict(enumerate(labels)), label2id={x: i for i, x in enumerate(labels)},
                                     architectures=["BertForSequenceClassification"])
    torch.manual_seed(31)
    model = BertForSequenceClassification.from_pretrained(src, config=cfg)
    with torch.no_grad():  # a head big enough that scores spread over (0, 1)
        model.classifier.weight.normal_(0.0, 0.5)
    out = root / "hf"
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (src / name).is_file():
            shutil.copy(src / name, out / name)
    return out


def _deploy_scoring(root: Path, name: str, labels: list[str], task: dict) -> Path:
    from edgeinfer.deploy.encoder import deploy
    from edgeinfer.model.bundle import DISK, MANIFEST, Manifest, write
    from edgeinfer.model.kind import Kind, find

    out = root / name  # serve names a model by its directory
    if find(out) is Kind.ENCODER_BUNDLE:
        return out
    deploy(_classification_dir(root, labels), "host", out, quant="fp32", force=True)
    data = json.loads((out / MANIFEST).read_text())
    write(out, Manifest.model_validate({**data, "task": task}, context=DISK))
    return out


@pytest.fixture(scope="session")
def reranker_host_bundle(tmp_path_factory) -> Path:
    """A one-label cross-encoder bundle for the host board, ``task: rerank, sigmoid``."""
    root = tmp_path_factory.mktemp("reranker-host")
    return _deploy_scoring(root, "reranker", ["LABEL_0"], {"kind": "rerank", "activation": "sigmoid"})


@pytest.fixture(scope="session")
def classifier_host_bundle(tmp_path_factory) -> Path:
    """A three-label classifier bundle for the host board, ``task: classify, softmax`` with its labels."""
    root = tmp_path_factory.mktemp("classifier-host")
    task = {"kind": "classify", "activation": "softmax", "labels": LABELS}
    return _deploy_scoring(root, "classifier", LABELS, task)


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
