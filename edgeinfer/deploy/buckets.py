"""Static-shape buckets at deploy: which (batch × sequence) shapes a static-shape target gets, and their
artifacts, each converted from the dynamic model and golden-checked against the fp32 reference.

An NPU compiles one shape; a bundle with one [1, 128] artifact pads every text to 128 tokens and runs
every request alone. Buckets let a run pick the smallest shape that holds a batch (:mod:`edgeinfer.run.buckets`).

How they are chosen (:func:`choose`): the batch ladder ``BATCHES`` times a sequence ladder of the deployed
length and its halves (``SEQ_LEVELS`` rungs, none below ``MIN_SEQ``; only for models with an
``attention_mask``, which padding positions need), smallest first. The deployed shape (1, max) always stays.
Each further bucket is a separately compiled model, so it costs the plan's weights plus activations at its
shape; buckets are kept while that fits in the plan's headroom and while there are at most ``MAX_BUCKETS``
(each one is a conversion: build time).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.contract.backend import CalibrationSet, TensorSpec
from edgeinfer.deploy import golden
from edgeinfer.errors import CheckFailed, InputError
from edgeinfer.model.buckets import MASK
from edgeinfer.run.buckets import BucketedSession, Shape
from edgeinfer.run.padding import run_padded

BATCHES = (1, 4, 8)
SEQ_LEVELS = 3
MIN_SEQ = 16
MAX_BUCKETS = 9
Feeds = dict[str, np.ndarray]


def parse(value: str | None) -> str | list[Shape]:
    """``auto`` (default), ``none``, or an explicit list ``1x32,4x64,8x128``."""
    text = (value or "auto").strip().lower()
    if text in ("auto", "none"):
        return text
    shapes = []
    for item in text.split(","):
        b, sep, s = item.strip().partition("x")
        if not sep or not b.isdigit() or not s.isdigit() or int(b) < 1 or int(s) < 1:
            raise InputError(f"--buckets {value!r}: give auto, none, or BATCHxSEQ,... e.g. 1x32,4x64,8x128")
        shapes.append((int(b), int(s)))
    if len(set(shapes)) != len(shapes):
        raise InputError(f"--buckets {value!r} names a shape twice")
    return sorted(shapes)


def seq_ladder(max_seq: int, masked: bool) -> list[int]:
    """The deployed length and its halves, down to MIN_SEQ; only the deployed length without a mask."""
    if not masked:
        return [max_seq]
    return sorted({max(min(MIN_SEQ, max_seq), max_seq >> k) for k in range(SEQ_LEVELS)})


def choose(primary: Shape, candidates: Sequence[Shape], cost: Callable[[int, int], int], budget: int,
           max_count: int = MAX_BUCKETS) -> tuple[list[Shape], dict[str, str]]:
    """Keep ``primary`` and then the candidates smallest first (batch × seq, then seq) while the running
    ``cost`` stays within ``budget`` and there are at most ``max_count``; returns (kept, dropped → why)."""
    kept, dropped, spent = [primary], {}, 0
    for shape in sorted(set(candidates) - {primary}, key=lambda x: (x[0] * x[1], x[1], x[0])):
        c = cost(*shape)
        if len(kept) >= max_count:
            dropped[f"{shape[0]}x{shape[1]}"] = f"more than {max_count} buckets"
        elif spent + c > budget:
            dropped[f"{shape[0]}x{shape[1]}"] = f"memory: {c / 2**20:.0f} MiB more would exceed the plan's headroom"
        else:
            kept.append(shape)
            spent += c
    return sorted(kept), dropped


def auto(model: Path, board: Any, scheme: str, max_seq: int, masked: bool) -> tuple[list[Shape], str]:
    """The buckets for ``model`` on ``board`` from the planner's own memory arithmetic, and how they were chosen."""
    from edgeinfer.planning.planner import plan

    def at(b: int, s: int) -> dict[str, Any]:
        p = plan(str(model), board, quant=scheme, ctx=s, batch=b, runtime=board.backend_runtime)
        return p.to_dict()["memory"]

    def cost(b: int, s: int) -> int:
        parts = at(b, s)["breakdown"]
        return int(parts["weights"] + parts["activations"])

    budget = int(at(1, max_seq)["headroom_bytes"])
    seqs = seq_ladder(max_seq, masked)
    kept, dropped = choose((1, max_seq), [(b, s) for b in BATCHES for s in seqs], cost, budget)
    why = (f"batch {list(BATCHES)} × seq {seqs} (the deployed length and its halves"
           f"{'' if masked else '; no attention_mask, so the length stays'}); each bucket beyond 1x{max_seq} is "
           f"its own compiled model costing the plan's weights + activations at its shape, kept smallest first "
           f"within the plan's headroom ({budget / 2**30:.1f} GiB) and at most {MAX_BUCKETS} buckets")
    if dropped:
        why += "; left out: " + ", ".join(f"{k} ({v})" for k, v in dropped.items())
    return kept, why


def decode_batches(model: Path, board: Any, scheme: str, context: int, runtime: str) -> tuple[list[int], str]:
    """The batch sizes of a static-shape decoder's decode graphs (each one a graph per segment, so that
    ``serve --slots N`` decodes N sequences in one call): ``BATCHES``, smallest first, each kept while the plan
    with that many sequences of ``context`` positions (their KV cache and activations) fits the board."""
    from edgeinfer.planning.planner import plan

    kept = [1]
    for b in BATCHES[1:]:
        if not plan(str(model), board, quant=scheme, ctx=context, batch=b, runtime=runtime).fits:
            break
        kept.append(b)
    why = (f"decode graphs for batches of {', '.join(map(str, kept))} sequences: {list(BATCHES)} kept while the "
           f"plan of that many sequences × {context} positions fits {board.name}")
    return kept, why


def shapes_for(specs: Sequence[TensorSpec], batch: int, seq: int) -> dict[str, list[int]]:
    """Static shapes of the dynamic model's inputs at one bucket: axis 0 the batch, other free axes ``seq``."""
    return {s.name: [batch if i == 0 else (d if isinstance(d, int) else seq) for i, d in enumerate(s.shape)]
            for s in specs}


def usable(specs: Sequence[TensorSpec]) -> bool:
    """Buckets need a free batch axis on every input of the model they are converted from."""
    return bool(specs) and all(s.shape and not isinstance(s.shape[0], int) for s in specs)


def masked(specs: Sequence[TensorSpec]) -> bool:
    return any(s.name == MASK for s in specs)


def _rows(samples: Sequence[Feeds]) -> Feeds:
    return {k: np.concatenate([s[k] for s in samples]) for k in samples[0]}


def _fit_seq(feeds: Feeds, seq: int) -> Feeds:
    """Token feeds cut (or padded with masked zeros) to ``seq`` positions; other feeds as they are."""
    if MASK not in feeds:
        return feeds
    out = {}
    for k, v in feeds.items():
        if v.ndim >= 2 and v.shape[1] > seq:
            v = v[:, :seq]
        elif v.ndim >= 2 and v.shape[1] < seq:
            v = np.concatenate([v, np.zeros((len(v), seq - v.shape[1], *v.shape[2:]), v.dtype)], axis=1)
        out[k] = np.ascontiguousarray(v)
    return out


def regroup(samples: Sequence[Feeds], batch: int, seq: int) -> list[Feeds]:
    """Samples as feeds of exactly ``batch`` rows of ``seq`` positions (calibration for one bucket)."""
    rows = _fit_seq(_rows(samples), seq)
    n = len(next(iter(rows.values())))
    if n < batch:
        rows = {k: np.concatenate([v] * -(-batch // n))[:batch] for k, v in rows.items()}
        n = batch
    return [{k: v[i : i + batch] for k, v in rows.items()} for i in range(0, n - n % batch, batch)]


def check_bucket(session: Any, reference: Any, held: Sequence[Feeds], bucket: Shape, ref_seq: int,
           threshold: float, scorer: Any = None) -> dict[str, Any]:
    """The bucket's outputs on the held-out rows (cut to its length) against the reference on the same rows; a
    reranker's or classifier's verdict is its task check (``scorer``, edgeinfer.deploy.scoring) per sample."""
    b, s = bucket
    x = _fit_seq(_rows(held), s)
    expected = run_padded(reference, _fit_seq(x, ref_seq))
    expected = {k: (v[:, :s] if v.ndim >= 2 and v.shape[1] == ref_seq and MASK in x else v)
                for k, v in expected.items()}
    got = BucketedSession({bucket: session}).run(x)
    report = golden.compare([expected], [got], [x], threshold)
    if scorer:
        cuts = np.cumsum([len(next(iter(h.values()))) for h in held])[:-1]
        scorer.judge(report, *([dict(zip(o, parts)) for parts in zip(*(np.split(o[k], cuts) for k in o))]
                               for o in (expected, got)))
    if not report["passed"]:
        why = (scorer and scorer.failure(report)) or golden.summary_line(report)
        raise CheckFailed(f"bucket {b}x{s}: {why} — the bundle was not written "
                          "(deploy with --buckets none, or fewer/longer buckets)", kind="golden_failed")
    return {name: {"cosine_min": m["cosine_min"], "max_abs_error": m["max_abs_error"]}
            for name, m in report["outputs"].items()}


def build(backend: Any, dynamic_model: Path, work: Path, scheme: str, shapes: list[Shape], primary: Shape,
          primary_artifact: str, dynamic_specs: Sequence[TensorSpec], calib: Sequence[Feeds], held: Sequence[Feeds],
          reference: Any, threshold: float, convert_opts: dict[str, Any], primary_golden: dict[str, Any],
          progress: Any, scorer: Any = None) -> list[dict[str, Any]]:
    """Convert and check every bucket but ``primary`` (already built) into ``work/buckets/BxS/``; the items."""
    ref_seq = primary[1]
    items = [{"batch": primary[0], "seq": primary[1], "artifact": primary_artifact,
              "golden": {k: {"cosine_min": v["cosine_min"], "max_abs_error": v["max_abs_error"]}
                         for k, v in primary_golden.get("outputs", {}).items() if "cosine_min" in v}}]
    for b, s in progress.track([x for x in shapes if x != primary], "converting buckets"):
        rel = f"buckets/{b}x{s}/model{backend.tensors.native[0]}"
        cal = CalibrationSet(regroup(calib, b, s)) if calib else None
        opts = {**convert_opts, "shapes": shapes_for(dynamic_specs, b, s)}
        backend.quantize(dynamic_model, scheme, cal, work / rel, **opts)
        with backend.load(work / rel) as session:
            report = check_bucket(session, reference, held, (b, s), ref_seq, threshold, scorer)
        items.append({"batch": b, "seq": s, "artifact": rel, "golden": report})
    return sorted(items, key=lambda i: (i["batch"], i["seq"]))
