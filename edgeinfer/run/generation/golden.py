"""The golden check for decoders: a backend's greedy tokens and per-step logits against the
fp32 transformers reference, on the same prompts.

Per prompt it reports token agreement, the first divergence and the reference's top-1/top-2
logit margin there (a divergence where the reference itself was nearly tied is a *near-tie*,
reported and not counted as a failure), and, over the steps both runs share, the logits'
cosine (min, mean) and top-5 overlap. Thresholds depend on the scheme (``THRESHOLDS``).
:func:`check_batched` judges the same way the prompts decoded together, several sequences per decode call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeinfer.contract.boundary import plugin_call
from edgeinfer.contract.generation import GenerationOptions
from edgeinfer.model.decoder_bundle import Recorded
from edgeinfer.run.generation.generator import Generator
from edgeinfer.run.generation.sampling import checked_logits, top2_margin
from edgeinfer.run.generation.stopping import Answer


@dataclass(frozen=True)
class Thresholds:
    min_cosine: float  # per-step logits cosine over the shared steps
    min_top5: float  # mean top-5 overlap over the shared steps
    near_tie: float  # a divergence where the reference's top-1/top-2 margin is below this is a near-tie


# Lossless paths must agree token for token (up to near-ties) with logits that are the same up to
# float rounding; weight-quantized paths move logits, so they get looser logit bounds and a wider
# near-tie band. The figures for the quantized schemes are starting points to re-check per model.
THRESHOLDS = {
    "fp32": Thresholds(0.9999, 0.99, 0.05),
    "fp16": Thresholds(0.999, 0.95, 0.1),
    "bf16": Thresholds(0.995, 0.9, 0.25),
    "w8a16": Thresholds(0.99, 0.8, 0.5),
    "w8a8": Thresholds(0.98, 0.7, 1.0),
    "w4a16": Thresholds(0.95, 0.6, 1.5),
}


def thresholds_for(scheme: str) -> Thresholds:
    family = scheme.split("_g")[0]
    return THRESHOLDS.get(family, THRESHOLDS["w4a16"])


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    denom = np.linalg.norm(a64) * np.linalg.norm(b64)
    return float(a64 @ b64 / denom) if denom > 0 else (1.0 if not a64.any() and not b64.any() else 0.0)


def _top5(a: np.ndarray, b: np.ndarray) -> float:
    return len(set(np.argsort(a)[-5:]) & set(np.argsort(b)[-5:])) / 5


def compare_prompt(prompt: str, ref_ids: list[int], ref_logits: list[np.ndarray], got_ids: list[int],
                   got_logits: list[np.ndarray], t: Thresholds) -> dict[str, Any]:
    n = min(len(ref_ids), len(got_ids))
    diverge = next((i for i in range(n) if ref_ids[i] != got_ids[i]), None)
    if diverge is None and len(ref_ids) != len(got_ids):
        diverge = n  # one stopped (EOS) where the other went on
    shared = diverge + 1 if diverge is not None else n  # the divergent step still saw the same context
    shared = min(shared, len(ref_logits), len(got_logits))
    cos = [_cos(ref_logits[i], got_logits[i]) for i in range(shared)]
    top5 = [_top5(ref_logits[i], got_logits[i]) for i in range(shared)]
    finite = all(np.isfinite(x).all() for x in got_logits)
    margin = top2_margin(ref_logits[diverge]) if diverge is not None and diverge < len(ref_logits) else None
    near_tie = margin is not None and margin < t.near_tie
    row: dict[str, Any] = {
        "prompt": prompt,
        "tokens": len(ref_ids),
        "agreement": (diverge if diverge is not None else len(ref_ids)) / max(len(ref_ids), 1),
        "first_divergence": diverge,
        "reference_margin_at_divergence": margin,
        "near_tie": near_tie,
        "cosine_min": min(cos) if cos else None,
        "cosine_mean": float(np.mean(cos)) if cos else None,
        "top5_overlap": float(np.mean(top5)) if top5 else None,
        "finite": finite,
    }
    problems = []
    if not finite:
        problems.append("non-finite logits")
    if diverge is not None and not near_tie:
        problems.append(f"diverges at token {diverge} (reference margin {margin:.3f} ≥ {t.near_tie})"
                        if margin is not None else f"stops differently at token {diverge}")
    if cos and not min(cos) >= t.min_cosine:  # `not >=` also catches NaN
        problems.append(f"logits cosine min {fmt_cosine(min(cos))} < {t.min_cosine}")
    if top5 and not float(np.mean(top5)) >= t.min_top5:
        problems.append(f"top-5 overlap {np.mean(top5):.2f} < {t.min_top5}")
    row["problems"] = problems
    return row


def record(generator: Generator, prompts: Sequence[str], new_tokens: int, chat: bool = False,
           metrics: list[Any] | None = None) -> list[Recorded]:
    """Greedy ``new_tokens`` per prompt with their logits: the reference side of a check; each generation's
    GenerationMetrics appended to ``metrics`` when given."""
    opts = GenerationOptions(max_new_tokens=new_tokens)
    out = []
    for p in prompts:
        r = generator.generate(p, opts, chat=chat, record_logits=True)
        out.append(Recorded(p, list(r.token_ids), list(r.logits or [])))
        if metrics is not None:
            metrics.append(r.metrics)
    return out


def check_recorded(candidate: Generator, reference: Sequence[Recorded], new_tokens: int, scheme: str,
                   chat: bool = False, thresholds: Thresholds | None = None,
                   metrics: list[Any] | None = None) -> dict[str, Any]:
    """Run ``candidate`` on the recorded prompts and judge it against the recorded reference (what
    ``edgeinfer deploy`` and ``edgeinfer golden`` both call); ``metrics``: as :func:`record`'s."""
    t = thresholds or thresholds_for(scheme)
    got = record(candidate, [r.prompt for r in reference], new_tokens, chat, metrics)
    rows = [compare_prompt(r.prompt, r.token_ids, r.logits, g.token_ids, g.logits, t) for r, g in zip(reference, got)]
    agreement = float(np.mean([r["agreement"] for r in rows])) if rows else 0.0
    cos = [r["cosine_min"] for r in rows if r["cosine_min"] is not None]
    means = [r["cosine_mean"] for r in rows if r["cosine_mean"] is not None]
    top5 = [r["top5_overlap"] for r in rows if r["top5_overlap"] is not None]
    return {
        "kind": "decoder",
        "scheme": scheme,
        "thresholds": t.__dict__,
        "prompts": len(rows),
        "new_tokens": new_tokens,
        "token_agreement": agreement,
        "near_ties": sum(r["near_tie"] for r in rows),
        "cosine_min": min(cos) if cos else None,
        "cosine_mean": float(np.mean(means)) if means else None,
        "top5_overlap": float(np.mean(top5)) if top5 else None,
        "passed": all(not r["problems"] for r in rows),
        "rows": rows,
    }


def check_batched(decoder: Any, codec: Any, reference: Sequence[Recorded], new_tokens: int,
                  t: Thresholds) -> dict[str, Any]:
    """The recorded prompts decoded together by the step decoder ``decoder``, ``decoder.slots`` at a time (one
    slot each): each prefilled in its slot, then one ``decode`` call per step for every sequence still going,
    greedy and stopping as :class:`Generator` does; each judged against its reference by :func:`compare_prompt`."""
    opts, rows, name = GenerationOptions(max_new_tokens=new_tokens), [], decoder.backend_name
    for first in range(0, len(reference), decoder.slots):
        group = reference[first:first + decoder.slots]
        answers, seen, last = [Answer(codec, opts) for _ in group], [[] for _ in group], []
        for slot, r in enumerate(group):
            ids = codec.encode(r.prompt)
            chunk = decoder.prefill_chunk or len(ids)
            plugin_call(name, "decoder reset", decoder.reset, slot)
            for i in range(0, len(ids), chunk):
                logits = plugin_call(name, "decoder prefill", decoder.prefill, slot,
                                     np.asarray(ids[i:i + chunk], dtype=np.int64))
            last.append(logits)
        live = list(range(len(group)))
        while live:
            for s in live:
                seen[s].append(checked_logits(last[s], decoder.vocab_size, codec.directory.name, len(seen[s]), False))
                answers[s].push(int(np.argmax(seen[s][-1])))
            live = [s for s in live if not answers[s].done]
            if live:
                out = plugin_call(name, "decoder decode", decoder.decode, live,
                                  np.asarray([answers[s].ids[-1] for s in live], dtype=np.int64))
                for s, row in zip(live, out):
                    last[s] = row
        rows += [compare_prompt(r.prompt, r.token_ids, r.logits, a.ids, x, t)
                 for r, a, x in zip(group, answers, seen)]
    return {"slots": decoder.slots, "prompts": len(rows), "passed": all(not r["problems"] for r in rows),
            "token_agreement": float(np.mean([r["agreement"] for r in rows])) if rows else 0.0, "rows": rows}


def check(candidate: Generator, reference: Generator, prompts: Sequence[str], new_tokens: int,
          scheme: str, chat: bool = False) -> dict[str, Any]:
    """Greedy ``new_tokens`` per prompt on both; the report and whether it passed."""
    return check_recorded(candidate, record(reference, prompts, new_tokens, chat), new_tokens, scheme, chat)


def fmt_cosine(c: float) -> str:
    """A cosine readable near 1, where 5 decimals would print 1.00000 for every lossless run."""
    return f"{c:.5f}" if not c > 0.99999 else f"1 - {1 - c:.1e}"


def not_run(reason: str, scheme: str) -> dict[str, Any]:
    """The report of a check that could not run here (``passed`` None, never True)."""
    return {"ran": False, "passed": None, "scheme": scheme, "reason": reason}


def summary_line(report: dict[str, Any]) -> str:
    if report.get("ran") is False:
        return f"decoder golden check NOT RUN: {report['reason']}"
    verdict = "passed" if report["passed"] else "FAILED"
    cos = "n/a" if report["cosine_min"] is None else fmt_cosine(report["cosine_min"])
    line = (f"decoder golden check {verdict}: {report['prompts']} prompts × {report['new_tokens']} tokens, "
            f"token agreement {report['token_agreement']:.1%}, logits cosine min {cos}")
    if report["near_ties"]:
        line += f", {report['near_ties']} divergence(s) at near-ties (not failures)"
    bad = [f"{r['prompt']!r}: {'; '.join(r['problems'])}" for r in report["rows"] if r["problems"]]
    batched = report.get("batched")
    if batched and batched.get("ran") is False:
        line += f"; batched decode not checked: {batched['reason']}"
    elif batched:
        verdict = "passed" if batched["passed"] else "FAILED"
        line += (f"; batched decode ({batched['slots']} sequences per call) {verdict}, token agreement "
                 f"{batched['token_agreement']:.1%}")
        bad += [f"{r['prompt']!r} decoded {batched['slots']} per call: {'; '.join(r['problems'])}"
                for r in batched["rows"] if r["problems"]]
    return line + (" — " + " | ".join(bad) if bad else "")
