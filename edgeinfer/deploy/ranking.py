"""The golden check of rerankers and classifiers: what the scores are used for, against the fp32 reference.

Rerankers: per held-out query (a candidate list), the converted model's ranking against the fp32 model's —
Kendall tau over the whole list, top-k overlap and NDCG@k. Every query must meet every threshold; a failure
names the query. A reranker whose scores stay close (high cosine) can still swap two documents of the top-k,
which is what retrieval quality depends on, so the cosine check alone does not decide for these bundles.
Classifiers: label agreement (argmax) over the samples and the largest probability error.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.errors import InputError

TOP_K = 3
# Per query. top-k overlap 1.0: the same k documents on top. NDCG@k (gains k, k-1, ... by the fp32 rank) is
# 0.9725 when the 2nd and 3rd of k=3 swap, so 0.98 fails any reordering inside the top 3. Kendall tau 0.8 over
# the whole list leaves room for swaps further down (2 of the 28 pairs of 8 candidates discordant: 0.857).
RERANK_THRESHOLDS = {"kendall_tau": 0.8, "topk_overlap": 1.0, "ndcg": 0.98}
# label_agreement: fraction of samples whose top label matches fp32; max_prob_error: the largest difference
# of a label's probability. A correct int8 model moves probabilities by a few hundredths.
CLASSIFY_THRESHOLDS = {"label_agreement": 1.0, "max_prob_error": 0.1}
_AT_MOST = ("max_prob_error",)  # the other metrics are minimums
DEFAULT_QUERIES = Path(__file__).parents[1] / "data" / "golden_rerank.jsonl"


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall's tau-b of two score lists over the same items (as scipy.stats.kendalltau computes it)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    i, j = np.triu_indices(len(a), k=1)
    da, db = np.sign(a[i] - a[j]), np.sign(b[i] - b[j])
    n0 = len(i)
    ties_a, ties_b = int((da == 0).sum()), int((db == 0).sum())
    denom = np.sqrt(float(n0 - ties_a) * float(n0 - ties_b))
    return float((da * db).sum() / denom) if denom else 1.0


def top_k_overlap(reference: Sequence[float], candidate: Sequence[float], k: int) -> float:
    """The fraction of the reference's k best items that are among the candidate's k best."""
    k = min(k, len(reference))
    ref = set(np.argsort(-np.asarray(reference), kind="stable")[:k].tolist())
    cand = set(np.argsort(-np.asarray(candidate), kind="stable")[:k].tolist())
    return len(ref & cand) / k


def ndcg_at_k(reference: Sequence[float], candidate: Sequence[float], k: int) -> float:
    """NDCG@k of the candidate's ranking, the reference's ranking being the ideal one: the reference's best
    item has gain k, the next k-1, ... and items below its top k gain nothing."""
    k = min(k, len(reference))
    ref_order = np.argsort(-np.asarray(reference), kind="stable")
    gain = np.zeros(len(reference))
    gain[ref_order[:k]] = np.arange(k, 0, -1)
    discount = 1.0 / np.log2(np.arange(2, k + 2))
    cand_order = np.argsort(-np.asarray(candidate), kind="stable")
    return float((gain[cand_order[:k]] * discount).sum() / (gain[ref_order[:k]] * discount).sum())


def activate(logits: np.ndarray, activation: str) -> np.ndarray:
    x = np.asarray(logits, np.float64)
    if activation == "sigmoid":
        return 1.0 / (1.0 + np.exp(-x))
    if activation == "softmax":
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    return x


def thresholds(kind: str, given: dict[str, float] | None) -> dict[str, float]:
    """The task's default thresholds with the user's overrides; a metric the task has not is refused."""
    base = dict(RERANK_THRESHOLDS if kind == "rerank" else CLASSIFY_THRESHOLDS)
    for name, value in (given or {}).items():
        if name not in base:
            raise InputError(f"--task-threshold {name}: a {kind} model has the metrics {', '.join(base)}")
        if not isinstance(value, (int, float)) or not np.isfinite(value):
            raise InputError(f"--task-threshold {name} must be a number, got {value!r}")
        base[name] = float(value)
    return base


def check_rerank(queries: Sequence[str], reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray],
                 limits: dict[str, float], k: int = TOP_K) -> dict[str, Any]:
    """Ranking agreement per query (``reference``/``candidate``: the logits of each query's candidates)."""
    per_query, failures = [], []
    for q, ref, cand in zip(queries, reference, candidate):
        r, c = np.asarray(ref, np.float64).ravel(), np.asarray(cand, np.float64).ravel()
        m = {"kendall_tau": kendall_tau(r, c), "topk_overlap": top_k_overlap(r, c, k), "ndcg": ndcg_at_k(r, c, k)}
        per_query.append({"query": q, **m})
        bad = [f"{n} {v:.3f} < {limits[n]}" for n, v in m.items() if not v >= limits[n]]
        if bad:
            failures.append(f"query {q!r}: {', '.join(bad)}")
    report: dict[str, Any] = {"kind": "rerank", "k": k, "thresholds": limits, "queries": len(per_query)}
    for n in ("kendall_tau", "topk_overlap", "ndcg"):
        vals = [p[n] for p in per_query]
        report[n] = {"min": min(vals), "mean": float(np.mean(vals))} if vals else None
    report.update(per_query=per_query, failures=failures, passed=bool(per_query) and not failures)
    return report


def check_classify(reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray], activation: str,
                   limits: dict[str, float]) -> dict[str, Any]:
    """Label agreement and the largest probability error over every sample (rows of [batch, labels] logits)."""
    ref = np.concatenate([np.asarray(r).reshape(-1, np.asarray(r).shape[-1]) for r in reference])
    cand = np.concatenate([np.asarray(c).reshape(-1, np.asarray(c).shape[-1]) for c in candidate])
    agree = float(np.mean(ref.argmax(-1) == cand.argmax(-1)))
    err = float(np.max(np.abs(activate(ref, activation) - activate(cand, activation))))
    m = {"label_agreement": agree, "max_prob_error": err}
    failures = [f"{n} {v:.4f} {'>' if n in _AT_MOST else '<'} {limits[n]}" for n, v in m.items()
                if not (v <= limits[n] if n in _AT_MOST else v >= limits[n])]
    rows = [int(i) for i in np.flatnonzero(ref.argmax(-1) != cand.argmax(-1))]
    return {"kind": "classify", "thresholds": limits, "samples": len(ref), **m, "disagreeing_rows": rows[:10],
            "failures": failures, "passed": not failures}


def load_queries(path: Path) -> list[tuple[str, list[str]]]:
    """Held-out reranking sets: a JSONL file, one ``{"query": ..., "documents": [...]}`` per line."""
    if not path.is_file():
        raise InputError(f"golden queries not found: {path}")
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            q, docs = item["query"], item["documents"]
        except (ValueError, KeyError, TypeError):
            raise InputError(f"{path} line {n}: a reranker's golden inputs are JSONL lines "
                             '{"query": "...", "documents": ["...", "..."]}') from None
        if not (isinstance(q, str) and isinstance(docs, list) and len(docs) >= 2
                and all(isinstance(d, str) for d in docs)):
            raise InputError(f"{path} line {n}: needs a query string and at least 2 document strings")
        out.append((q, docs))
    if not out:
        raise InputError(f"{path} holds no queries")
    return out


def summary_line(task: dict[str, Any]) -> str:
    verdict = "passed" if task["passed"] else "FAILED"
    if task["kind"] == "rerank":
        return (f"ranking check {verdict} on {task['queries']} queries — Kendall tau min "
                f"{task['kendall_tau']['min']:.3f}, top-{task['k']} overlap min {task['topk_overlap']['min']:.2f}, "
                f"NDCG@{task['k']} min {task['ndcg']['min']:.4f}")
    return (f"label check {verdict} on {task['samples']} samples — agreement {task['label_agreement']:.1%}, "
            f"max probability error {task['max_prob_error']:.4f}")
