"""Deploying rerankers and classifiers (``*ForSequenceClassification``): the manifest's task section, the
held-out sets their golden check runs on, and the verdict (:mod:`edgeinfer.deploy.ranking`).

One label is a reranker (a cross-encoder scoring (query, document) pairs, sigmoid), several a classifier
(softmax over ``id2label`` in logit order), as Hugging Face text-embeddings-inference treats a
``*ForSequenceClassification`` model: one label → a re-ranker, several → a sequence classifier
(https://github.com/huggingface/text-embeddings-inference, README: "Sequence Classification and Re-Ranking").
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from edgeinfer.deploy import ranking
from edgeinfer.model.bundle import TaskSpec

Feeds = dict[str, np.ndarray]
QUERIES = "queries.json"


def task_spec(hf_dir: Path | None) -> TaskSpec | None:
    """The task of a Hugging Face sequence-classification directory, or None for any other model."""
    if hf_dir is None or not (hf_dir / "config.json").is_file():
        return None
    cfg = json.loads((hf_dir / "config.json").read_text())
    archs = cfg.get("architectures") or []
    if not any(isinstance(a, str) and a.endswith("ForSequenceClassification") for a in archs):
        return None
    id2label = cfg.get("id2label") or {}
    count = len(id2label) or int(cfg.get("num_labels", 2))
    if count == 1:
        return TaskSpec(kind="rerank", labels=[], activation="sigmoid")
    labels = [str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(count)]
    return TaskSpec(kind="classify", labels=labels, activation="softmax")


@dataclass
class ScoringCheck:
    """What decides a task bundle's golden check: the task, the reranker's queries (one held-out sample
    each: its candidates as a batch of pairs) and the thresholds."""

    task: TaskSpec
    limits: dict[str, float]
    queries: list[str] = field(default_factory=list)

    def judge(self, report: dict[str, Any], expected: list[Feeds], got: list[Feeds]) -> None:
        """Put the task metrics into ``report`` (the golden section) and let them give the verdict: a
        one-logit output's cosine is only its sign, so cosine does not decide here."""
        name = next(iter(expected[0]))
        ref, cand = [e[name] for e in expected], [g[name] for g in got]
        if self.task.kind == "rerank":
            task = ranking.check_rerank(self.queries, ref, cand, self.limits)
        else:
            task = ranking.check_classify(ref, cand, self.task.activation, self.limits)
        non_finite = any(o.get("non_finite") or "error" in o for o in report["outputs"].values())
        report["task"] = task
        report["passed"] = task["passed"] and not non_finite

    def save(self, golden_dir: Path) -> None:
        """The reranker's queries next to the golden samples, for ``edgeinfer golden`` to name them again."""
        if self.queries:
            (golden_dir / QUERIES).write_text(json.dumps(self.queries, ensure_ascii=False) + "\n")

    @classmethod
    def of_bundle(cls, bundle: Any, threshold: dict[str, float] | None = None) -> ScoringCheck | None:
        """The check a bundle was deployed with (its task, thresholds and queries); None for other bundles."""
        task = bundle.manifest.task
        if task is None:
            return None
        limits = {**((bundle.manifest.golden or {}).get("task") or {}).get("thresholds", {}), **(threshold or {})}
        check = cls(task, ranking.thresholds(task.kind, limits))
        if task.kind == "rerank":
            check.queries = json.loads(bundle.file(f"golden/{QUERIES}", "golden queries").read_text())
        return check

    def failure(self, report: dict[str, Any]) -> str | None:
        task = report.get("task")
        if task is None or task["passed"]:
            return None
        return f"{ranking.summary_line(task)}: {'; '.join(task['failures'][:3])}"


def takes_pairs(check: ScoringCheck | None) -> bool:
    """Whether the model reads (query, document) pairs: a reranker."""
    return check is not None and check.task.kind == "rerank"


def prepare(hf_dir: Path | None, golden_inputs: Path | None, tokenize: Callable | None,
            given: dict[str, float] | None) -> tuple[ScoringCheck | None, list[Feeds]]:
    """(the check, the reranker's held-out samples: one per query) for a task model; (None, []) otherwise.
    A classifier's held-out samples are texts, as an embedding model's."""
    task = task_spec(hf_dir)
    if task is None or tokenize is None:
        if given:
            from edgeinfer.errors import InputError

            raise InputError("--task-threshold is for rerankers and classifiers (*ForSequenceClassification)")
        return None, []
    check = ScoringCheck(task, ranking.thresholds(task.kind, given))
    if task.kind != "rerank":
        return check, []
    sets = ranking.load_queries(golden_inputs or ranking.DEFAULT_QUERIES)
    check.queries = [q for q, _ in sets]
    return check, [tokenize([(q, d) for d in docs]) for q, docs in sets]
