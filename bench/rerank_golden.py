"""Ranking and label agreement of the test reranker and classifier (edgeinfer.testing.scorers) with their fp32
reference, per board and scheme: fp32, fp16 and int8 (w8a8, calibrated on the models' own training pairs /
texts; w8a16 where the board's backend has no w8a8).

Each deploy runs with thresholds that never fail (so a conversion that reorders is measured, not refused); the
row's ``passes_defaults`` says whether the default thresholds (edgeinfer.deploy.ranking) would have shipped
it. Writes bench/results/rerank_golden.json.

    .venv/bin/python bench/rerank_golden.py [--boards host,rk3588-8g] [--queries 6]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write  # noqa: E402

from edgeinfer.deploy import ranking  # noqa: E402
from edgeinfer.errors import EdgeInferError  # noqa: E402
from edgeinfer.testing import scorers  # noqa: E402
from edgeinfer.testing.fixtures import scorer_dir  # noqa: E402

BOARDS = ("host", "core-ultra-155h", "rk3588-8g", "atlas-300i-pro")
SCHEMES = ("fp32", "fp16", "w8a8", "w8a16")
NEVER_FAIL = {"rerank": {"kendall_tau": -1.0, "topk_overlap": 0.0, "ndcg": 0.0},
              "classify": {"label_agreement": 0.0, "max_prob_error": 1.0}}


def inputs(root: Path, queries: int) -> dict[str, dict[str, Path]]:
    pairs, _ = scorers.rerank_training_pairs()
    (root / "pairs.tsv").write_text("".join(f"{q}\t{d}\n" for q, d in pairs[:128]))
    texts, _ = scorers.labelled_sentences()
    (root / "texts.txt").write_text("\n".join(texts[::2][:128]) + "\n")
    lines = ranking.DEFAULT_QUERIES.read_text().splitlines()[:queries]
    (root / "queries.jsonl").write_text("\n".join(lines) + "\n")
    held, _ = scorers.labelled_sentences(heldout=True)
    (root / "held.txt").write_text("\n".join(held) + "\n")
    return {"reranker": {"calib": root / "pairs.tsv", "golden": root / "queries.jsonl"},
            "classifier": {"calib": root / "texts.txt", "golden": root / "held.txt"}}


def row(model: str, board: str, scheme: str, data: dict[str, Path], out: Path) -> dict:
    from edgeinfer.deploy.encoder import deploy

    kind = "rerank" if model == "reranker" else "classify"
    t0 = time.perf_counter()
    try:
        r = deploy(scorer_dir(model), board, out, quant=scheme, buckets="none", golden_inputs=data["golden"],
                   calib=data["calib"] if scheme.startswith("w8") else None, task_thresholds=NEVER_FAIL[kind])
    except EdgeInferError as e:
        return {"model": model, "board": board, "scheme": scheme, "error": e.message[:300]}
    task = r.golden["task"]
    limits = ranking.thresholds(kind, None)
    if kind == "rerank":
        metrics = {n: task[n] for n in ("kendall_tau", "topk_overlap", "ndcg")}
        ok = all(metrics[n]["min"] >= limits[n] for n in metrics)
    else:
        metrics = {n: task[n] for n in ("label_agreement", "max_prob_error")}
        ok = metrics["label_agreement"] >= limits["label_agreement"] and \
            metrics["max_prob_error"] <= limits["max_prob_error"]
    return {"model": model, "board": board, "scheme": r.manifest.scheme, "device": r.golden.get("device"),
            **metrics, "passes_defaults": ok, "deploy_s": round(time.perf_counter() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--boards", default=",".join(BOARDS))
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--queries", type=int, default=12, help="packaged reranker queries to use (of 12)")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = inputs(Path(tmp), args.queries)
        for board in args.boards.split(","):
            for scheme in args.schemes.split(","):
                for model in ("reranker", "classifier"):
                    rows.append(row(model, board, scheme, data[model], Path(tmp) / f"{model}-{board}-{scheme}"))
                    print(json.dumps(rows[-1]), flush=True)
                    write("rerank_golden", {"queries": args.queries, "k": ranking.TOP_K, "rows": rows})


if __name__ == "__main__":
    main()
