"""all-MiniLM-L6-v2 [1, 128] through the rknn backend on this PC: conversion time (fp16, int8),
rknn-toolkit2 *simulator* latency (not board speed), artifact sizes, embedding cosine vs
onnxruntime fp32 on held-out sentences. JSON to bench/results/rknn_minilm.json.

    .venv/bin/python bench/rknn_minilm.py [--repeat 20]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

import edgeinfer
from edgeinfer.contract import stamp
from edgeinfer.contract.backend import CalibrationSet
from edgeinfer.testing import minilm

OUT = Path(__file__).parent / "results" / "rknn_minilm.json"
HELD_OUT = 40


def embed(run, sentences):
    rows = []
    for s in sentences:
        f = minilm.tokenize([s])
        rows.append(minilm.mean_pool(run(f), f["attention_mask"])[0])
    return np.stack(rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    import onnxruntime as ort

    be = edgeinfer.backend("rknn")
    work = Path(tempfile.mkdtemp(prefix="bench-rknn-"))
    src = minilm.export_onnx(work / "minilm_1x128.onnx", batch=1, seq=minilm.SEQ)
    held = minilm.heldout_sentences(HELD_OUT)
    sess = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    ref = embed(lambda f: sess.run(["last_hidden_state"], f)[0], held)
    feeds = minilm.tokenize([held[0]])
    t = time.perf_counter()
    for _ in range(args.repeat):
        sess.run(["last_hidden_state"], feeds)
    ort_ms = (time.perf_counter() - t) / args.repeat * 1e3

    calib = CalibrationSet([minilm.tokenize([s]) for s in minilm.calibration_sentences(120)])
    variants = {
        "fp16": ("fp16", None, {}),
        "int8": ("w8a8", calib, {}),
        "int8_auto_hybrid": ("w8a8", calib, {"auto_hybrid": True, "auto_hybrid_cos_thresh": 0.995}),
    }
    results = {}
    for name, (scheme, cal, opts) in variants.items():
        out = work / f"minilm_{name}.rknn"
        t = time.perf_counter()
        art = be.quantize(src, scheme, cal, out, target="rk3588", **opts)
        convert_s = time.perf_counter() - t
        with be.load(art) as s:
            prof = s.profile(feeds, repeat=args.repeat, warmup=2)
            cos = minilm.cosine(embed(lambda f: s.run(f)["last_hidden_state"], held), ref)
        data = stamp.read(art)
        results[name] = {
            "scheme": scheme,
            "options": opts,
            "convert_s": round(convert_s, 2),
            "artifact_bytes": art.stat().st_size,
            "build_inputs_bytes": Path(str(art) + ".src.tar").stat().st_size,
            "simulator_latency_ms": {k: round(v, 2) for k, v in prof.latency_ms.items()},
            "latency_label": prof.notes.get("note"),
            "cosine_vs_onnxruntime_fp32": {"min": round(float(cos.min()), 5), "mean": round(float(cos.mean()), 5)},
            "disabled_rules": data.get("disabled_rules", []),
        }
        print(f"{name:18s} convert {convert_s:6.1f} s  size {art.stat().st_size / 2**20:6.1f} MiB  "
              f"simulator p50 {prof.latency_ms['p50']:7.1f} ms (simulator, not board)  "
              f"cos min {cos.min():.4f} mean {cos.mean():.4f}")
    report = {
        "model": "sentence-transformers/all-MiniLM-L6-v2, last_hidden_state, static [1,128]",
        "target": "rk3588",
        "toolkit": be.versions().get("rknn-toolkit2"),
        "mode": "simulator (rknn-toolkit2 on x86_64): latency is simulator time on this PC, not RK3588 NPU speed",
        "host": {"machine": platform.machine(), "python": platform.python_version()},
        "calibration_sentences": 120,
        "held_out_sentences": HELD_OUT,
        "repeat": args.repeat,
        "onnxruntime_fp32_cpu_ms": round(ort_ms, 2),
        "results": results,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
