"""A small reranker and a small text classifier the test suites share, derived from all-MiniLM-L6-v2.

Both are ``BertForSequenceClassification`` directories: MiniLM's encoder, frozen, plus a pooler and head
trained for a few seconds on a synthetic task, so that their scores mean something:

* reranker (one label, a cross-encoder): the query is a few consecutive words of a sentence of
  :func:`edgeinfer.testing.minilm.sentences`; the relevant document is that sentence, the others are other
  sentences. Tokenized as a text pair, as cross-encoders are.
* classifier (:data:`LABELS`): which standard-library module's docstrings a sentence comes from.

The encoder's [CLS] states are computed once; only the pooler (dense + tanh) and the classifier layer train.
With the encoder frozen the reranker is a weak one (it puts the relevant document first for about 70% of
held-out queries among four candidates, against 25% by chance): enough for rankings that mean something.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from edgeinfer.testing import minilm

VERSION = "1"  # bump when the data or training changes: the cached directories are keyed by it
LABELS = ("logging", "statistics", "shutil", "threading")
TRAIN_SEQ = 64
HELDOUT_PER_LABEL = 5
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def query_of(sentence: str, words: int = 8) -> str:
    """A query a user might type for ``sentence``: a few of its words from the middle, lowercased."""
    ws = sentence.rstrip(".").split()
    start = max(0, (len(ws) - words) // 2)
    return " ".join(ws[start : start + words]).lower()


def rerank_training_pairs(n: int = 520, negatives: int = 3, seed: int = 0) -> tuple[list[tuple[str, str]], list[int]]:
    """(pairs, labels): each of the first ``n`` sentences with its query (1) and ``negatives`` others (0). The
    corpus tail is left for held-out checks (edgeinfer/data/golden_rerank.jsonl is made from it)."""
    sents = minilm.sentences()
    rng = np.random.default_rng(seed)
    pairs, labels = [], []
    for i in range(n):
        q = query_of(sents[i])
        pairs.append((q, sents[i]))
        labels.append(1)
        for j in rng.choice([k for k in range(n) if k != i], size=negatives, replace=False):
            pairs.append((q, sents[int(j)]))
            labels.append(0)
    return pairs, labels


def labelled_sentences(heldout: bool = False) -> tuple[list[str], list[int]]:
    """(sentences, label index) for the classifier: the last :data:`HELDOUT_PER_LABEL` of each module are held
    out (``heldout=True`` returns just those)."""
    texts, ids = [], []
    for i, name in enumerate(LABELS):
        sents = list(dict.fromkeys(minilm.module_sentences(name)))
        part = sents[-HELDOUT_PER_LABEL:] if heldout else sents[:-HELDOUT_PER_LABEL]
        texts += part
        ids += [i] * len(part)
    return texts, ids


def _cls_states(texts: list, seq: int = TRAIN_SEQ) -> np.ndarray:
    """The frozen encoder's last-layer [CLS] state of each text or (query, document) pair."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModel

    tok = Tokenizer.from_file(str(minilm.model_dir() / "tokenizer.json"))
    tok.enable_truncation(max_length=seq)
    tok.enable_padding(length=seq, pad_id=0, pad_token="[PAD]")
    bert = AutoModel.from_pretrained(str(minilm.model_dir()), attn_implementation="eager").eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), 64):
            enc = tok.encode_batch(texts[i : i + 64])
            feeds = {k: torch.tensor([getattr(e, a) for e in enc]) for k, a in
                     (("input_ids", "ids"), ("attention_mask", "attention_mask"), ("token_type_ids", "type_ids"))}
            out.append(bert(**feeds).last_hidden_state[:, 0].numpy())
    return np.concatenate(out)


def _train_head(feats: np.ndarray, labels: list[int], num_labels: int, steps: int = 150, seed: int = 0):
    """Pooler (initialised from MiniLM's) and classifier weights trained on fixed [CLS] states."""
    import torch
    from safetensors.numpy import load_file

    torch.manual_seed(seed)
    base = load_file(str(minilm.model_dir() / "model.safetensors"))
    pooler = torch.nn.Linear(feats.shape[1], feats.shape[1])
    with torch.no_grad():
        pooler.weight.copy_(torch.from_numpy(base["pooler.dense.weight"]))
        pooler.bias.copy_(torch.from_numpy(base["pooler.dense.bias"]))
    head = torch.nn.Linear(feats.shape[1], num_labels)
    x = torch.from_numpy(feats)
    y = torch.tensor(labels)
    opt = torch.optim.Adam([*pooler.parameters(), *head.parameters()], lr=3e-3, weight_decay=1e-3)
    for _ in range(steps):
        logits = head(torch.tanh(pooler(x)))
        if num_labels == 1:
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits[:, 0], y.float())
        else:
            loss = torch.nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return pooler, head


def build(out: Path, kind: str) -> Path:
    """Write the ``kind`` ("reranker" | "classifier") directory to ``out``."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    if kind == "reranker":
        pairs, labels = rerank_training_pairs()
        feats, names = _cls_states(pairs), ["relevance"]
    else:
        texts, labels = labelled_sentences()
        feats, names = _cls_states(texts), list(LABELS)
    pooler, head = _train_head(feats, labels, len(names))
    cfg = BertConfig.from_pretrained(str(minilm.model_dir()))
    cfg.architectures = ["BertForSequenceClassification"]
    cfg.num_labels = len(names)
    cfg.id2label = dict(enumerate(names))
    cfg.label2id = {n: i for i, n in enumerate(names)}
    model = BertForSequenceClassification(cfg).eval()
    model.bert.load_state_dict(_encoder_weights(), strict=False)
    with torch.no_grad():
        model.bert.pooler.dense.load_state_dict(pooler.state_dict())
        model.classifier.load_state_dict(head.state_dict())
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copy2(minilm.model_dir() / name, out / name)
    (out / "edgeinfer-test-model.json").write_text(json.dumps({"kind": kind, "version": VERSION}) + "\n")
    return out


def _encoder_weights() -> dict:
    import torch
    from safetensors.numpy import load_file

    return {k: torch.from_numpy(v) for k, v in load_file(str(minilm.model_dir() / "model.safetensors")).items()
            if not k.startswith("pooler.")}
