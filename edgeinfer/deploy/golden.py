"""Golden check: a converted model's outputs against the onnxruntime fp32 reference.

Per output: cosine similarity per sample (the verdict uses the worst one), max
absolute error, and top-1 agreement for classifier/logit outputs. For token
outputs ([batch, seq, ...]) with an ``attention_mask`` input, padded positions are
left out: no consumer reads them, and quantized models are free to differ there.
NaN or Inf in an output fails the check outright, naming the output (a NaN cosine would
compare as "not below the threshold" and pass).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.errors import InputError
from edgeinfer.run.once import non_finite

DEFAULT_THRESHOLD = 0.99
# Minimum cosine per scheme family when the user gives none. Activation quantization (a8) rounds every
# hidden state of every token: on all-MiniLM-L6-v2's last_hidden_state with 100 ordinary sentences the
# worst token-level cosine of a correct NNCF int8 model lands at 0.986-0.994 (the pooled sentence embeddings
# stay above 0.99), so 0.99 rejects a good first int8 try. Weight-only and float schemes keep 0.99.
DEFAULT_THRESHOLDS = {"w8a8": 0.98, "w4a8": 0.98}


def default_threshold(scheme: str) -> float:
    """The golden threshold for ``scheme`` (a canonical name such as ``w8a8`` or ``w8a8_g128``)."""
    return DEFAULT_THRESHOLDS.get(scheme.split("_g")[0], DEFAULT_THRESHOLD)
Feeds = dict[str, np.ndarray]


def _valid_rows(out: np.ndarray, feeds: Feeds) -> list[np.ndarray]:
    """One flattened vector per batch row, padded token positions removed where we can tell."""
    mask = feeds.get("attention_mask")
    rows = []
    for b in range(out.shape[0]):
        row = out[b]
        if mask is not None and out.ndim >= 3 and out.shape[:2] == mask.shape:
            row = row[mask[b].astype(bool)]
        rows.append(np.asarray(row, np.float64).ravel())
    return rows


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 1.0
    return float(a @ b / (na * nb + 1e-30))


def _non_finite_error(name: str, reference, candidate) -> str | None:
    bad_ref = sum(non_finite(r[name]) for r in reference)
    bad_cand = sum(non_finite(c[name]) for c in candidate)
    if bad_ref:
        return f"{bad_ref} NaN/Inf values in the reference output (the source model itself gives them)"
    if bad_cand:
        return f"{bad_cand} NaN/Inf values in the converted model's output"
    return None


def compare(
    reference: Sequence[dict[str, np.ndarray]],
    candidate: Sequence[dict[str, np.ndarray]],
    feeds: Sequence[Feeds],
    threshold: float = DEFAULT_THRESHOLD,
    worst: int = 3,
) -> dict[str, Any]:
    """Metrics per output over every sample; ``passed`` when every sample's cosine ≥ threshold."""
    report: dict[str, Any] = {"threshold": threshold, "samples": len(feeds), "outputs": {}, "passed": True}
    if not feeds:
        report.update(passed=False, reason="no golden samples")
        return report
    for name in reference[0]:
        bad = _non_finite_error(name, reference, candidate)
        if bad:
            report["outputs"][name] = {"error": bad, "non_finite": True}
            report["passed"] = False
            continue
        cosines, max_abs, top1 = [], 0.0, []
        for i, (ref, cand, f) in enumerate(zip(reference, candidate, feeds)):
            r, c = np.asarray(ref[name]), np.asarray(cand[name])
            if r.shape != c.shape:
                report["outputs"][name] = {"error": f"shape {list(c.shape)} != reference {list(r.shape)}"}
                report["passed"] = False
                break
            for rr, cc in zip(_valid_rows(r, f), _valid_rows(c, f)):
                cosines.append((_cos(rr, cc), i))
                max_abs = max(max_abs, float(np.max(np.abs(rr - cc))) if rr.size else 0.0)
            if _is_logits(name, r):
                top1.extend((np.argmax(r, -1) == np.argmax(c, -1)).ravel().tolist())
        else:
            vals = [c for c, _ in cosines]
            ranked = sorted(cosines)[:worst]
            entry = {
                "cosine_min": min(vals),
                "cosine_mean": float(np.mean(vals)),
                "max_abs_error": max_abs,
                "worst_samples": [{"sample": i, "cosine": c} for c, i in ranked],
            }
            if top1:
                entry["top1_agreement"] = float(np.mean(top1))
            report["outputs"][name] = entry
            if not entry["cosine_min"] >= threshold:
                report["passed"] = False
    return report


def _is_logits(name: str, arr: np.ndarray) -> bool:
    """Classifier outputs: named logits/scores, or a 2-D [batch, classes] float array."""
    named = "logit" in name.lower() or "score" in name.lower()
    return arr.ndim >= 2 and arr.shape[-1] > 1 and (named or arr.ndim == 2)


def summary_line(report: dict[str, Any]) -> str:
    parts = []
    for name, m in report["outputs"].items():
        if "error" in m:
            parts.append(f"output {name}: {m['error']}")
            continue
        s = (f"{name}: cosine min {m['cosine_min']:.5f} mean {m['cosine_mean']:.5f}, "
             f"max |err| {m['max_abs_error']:.3g}")
        if "top1_agreement" in m:
            s += f", top-1 {m['top1_agreement']:.1%}"
        parts.append(s)
    verdict = "passed" if report["passed"] else f"FAILED (threshold {report['threshold']})"
    return f"golden check {verdict} on {report['samples']} samples — " + "; ".join(parts)


def worst_samples_line(report: dict[str, Any]) -> str:
    items = []
    for name, m in report["outputs"].items():
        for w in m.get("worst_samples", []):
            if w["cosine"] < report["threshold"]:
                items.append(f"{name} sample {w['sample']} (cosine {w['cosine']:.4f})")
    items += [f"output {name}: {m['error']}" for name, m in report["outputs"].items() if "error" in m]
    return ", ".join(items)


def check_bundle(bundle_dir: Path, inputs: Path | None = None, reference: Path | None = None,
                 threshold: float | None = None, device: str | None = None) -> dict[str, Any]:
    """Re-run an encoder bundle's golden check here: on its held-out samples against the outputs recorded
    at deploy, or on new ``inputs`` against the fp32 ``reference`` ONNX (what ``edgeinfer golden`` prints)."""
    from edgeinfer.contract.names import ENCODER_REFERENCE
    from edgeinfer.deploy.calibration import load_samples
    from edgeinfer.deploy.scoring import ScoringCheck
    from edgeinfer.model.bundle import Bundle
    from edgeinfer.model.samples import load_saved_samples
    from edgeinfer.run import bundle as run_bundle
    from edgeinfer.run.loading import load
    from edgeinfer.run.padding import run_padded

    b = Bundle.open(bundle_dir, verify="full")
    limit = threshold if threshold is not None else (b.manifest.golden or {}).get("threshold", 0.99)
    if inputs:
        if reference is None:
            raise InputError("--inputs needs --reference MODEL.onnx (the fp32 model to compare against)")
        tok = (lambda texts: run_bundle.tokenize_texts(b, texts)) if b.manifest.text else None
        samples = load_samples(inputs, b.manifest.inputs, tok, pairs=b.manifest.task is not None
                               and b.manifest.task.kind == "rerank")
        if not samples:
            raise InputError(f"--inputs {inputs} holds no samples; pass a .txt with lines, or a non-empty .npz")
        with load(reference, backend=ENCODER_REFERENCE) as ref:
            expected = [run_padded(ref, s) for s in samples]
    else:
        samples = load_saved_samples(b.file("golden/inputs.npz", "golden inputs"))
        expected = load_saved_samples(b.file("golden/expected.npz", "golden reference outputs"))
    scorer = None if inputs else ScoringCheck.of_bundle(b)  # new inputs have no queries: cosine only
    with run_bundle.open_session(b, device=device) as session:
        got = [run_padded(session, s) for s in samples]
        report = compare(expected, got, samples, limit)
        report["device"] = session.device
    if scorer:
        scorer.judge(report, expected, got)
    report["bundle"] = str(b.path)
    return report
