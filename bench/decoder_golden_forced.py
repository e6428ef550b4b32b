"""What the teacher-forced decoder golden check sees per scheme on the tiny test Qwen3: the figures its
thresholds (edgeinfer/run/generation/golden.py ``THRESHOLDS``) are set from.

For each converted decoder of ``edgeinfer.testing.llm.model_dir()`` (the conversions already in the cache under
``artifacts/<backend>/decoder-*`` for the backends and schemes the suite deploys, and llamacpp's Q4_0 / Q4_K_M
converted here): the fp32 transformers reference's greedy tokens on deploy's golden prompts (4 × 32 tokens),
then the candidate teacher-forced on them (:func:`golden.record` with ``forced``). Per decoder: the teacher-forced
agreement (min and mean over prompts), every step whose choice differs with the reference's top-1/top-2 margin
there, the leading agreement (what the free-running check measured) and the logits cosine min.

    python bench/decoder_golden_forced.py [--only llamacpp]

Writes bench/results/decoder_golden_forced.json. The rknn w8a8 figure (simulator, converted per run) comes from
plugins/rknn/tests/test_decoder.py::test_w8a8_passes_the_decoder_golden_check (pytest -s prints its rows).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

WANT = {"onnxruntime": ["fp32", "fp16", "w8a16", "w8a8", "w4a16"], "openvino": ["fp16", "w8a16"],
        "llamacpp": ["fp16", "gguf:Q8_0"]}
#: converted here: backend -> (label, scheme, convert options); OpenVINO's as plugins/openvino/tests converts them
CONVERT_HERE = {"llamacpp": [("gguf:Q4_0", "gguf:Q4_0", {}), ("gguf:Q4_K_M", "gguf:Q4_K_M", {})],
                "openvino": [("w4a16 (cpu)", "w4a16", {"target": "cpu"}),
                             ("w4a16 awq (cpu)", "w4a16", {"target": "cpu", "calibration": [
                                 "The licence grants permission to use, copy and modify the software.",
                                 "Permission is hereby granted, free of charge, to any person obtaining a copy.",
                                 "def main():\n    return 0\n"]})]}


def cached_artifacts(model_sha: str) -> dict[tuple[str, str], tuple[Path, int]]:
    from edgeinfer.contract import cache

    out = {}
    for stamp in sorted((cache.area("artifacts")).glob("*/decoder-*/decoder.stamp.json")):
        s = json.loads(stamp.read_text())
        key = (s["backend"], s["scheme"])
        if s["source"]["sha256"] != model_sha or s["scheme"] not in WANT.get(s["backend"], []):
            continue
        if key not in out or s.get("context", 0) > out[key][1]:  # the largest context of each
            out[key] = (stamp.parent / "decoder", int(s.get("context", 0)))
    return out


def measure(backend, artifact: Path, context: int, reference: list, scheme: str, label: str) -> dict:
    import numpy as np

    from edgeinfer.run.generation import golden
    from edgeinfer.run.generation.generator import Generator
    from edgeinfer.run.generation.sampling import top2_margin
    from edgeinfer.run.generation.text import TextCodec
    from edgeinfer.testing.llm import model_dir

    d = backend.load_decoder(artifact, context=context, **backend.decoders.logits_options)
    with Generator(d, TextCodec(model_dir())) as gen:
        n = min(32, context - max(len(gen.prompt_ids(r.prompt)) for r in reference))
        refs = [golden.Recorded(r.prompt, r.token_ids[:n], r.logits[:n]) for r in reference]
        report = golden.check_recorded(gen, refs, n, scheme)
        got = golden.record(gen, [r.prompt for r in refs], n, forced=[r.token_ids for r in refs])
    misses = [{"prompt": r.prompt, "step": i, "reference_margin": round(top2_margin(r.logits[i]), 4)}
              for r, g in zip(refs, got) for i in range(len(r.token_ids)) if g.token_ids[i] != r.token_ids[i]]
    forced = [row["forced_agreement"] for row in report["rows"]]
    return {"backend": backend.name, "scheme": scheme, "label": label, "context": context, "new_tokens": n,
            "forced_agreement_min": min(forced), "forced_agreement_mean": float(np.mean(forced)),
            "leading_agreement_mean": report["token_agreement"], "cosine_min": report["cosine_min"],
            "top5_overlap": report["top5_overlap"], "misses": misses,
            "largest_miss_margin": max((m["reference_margin"] for m in misses), default=None),
            "passes_now": report["passed"], "summary": golden.summary_line(report)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="one backend")
    args = ap.parse_args()
    import edgeinfer
    from edgeinfer.contract.stamp import sha256_file
    from edgeinfer.deploy.decoder import golden_prompts
    from edgeinfer.run.generation import golden
    from edgeinfer.run.loading import load_generator
    from edgeinfer.testing.decoder_conformance import PROMPTS
    from edgeinfer.testing.llm import model_dir

    found = cached_artifacts(sha256_file(model_dir()))
    prompts = list(dict.fromkeys([*golden_prompts(None), *PROMPTS]))  # deploy's and the plugin tests' prompts
    with load_generator(model_dir(), ctx=256, threads=1) as ref:
        reference = golden.record(ref, prompts, 32)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        todo = [(n, (s, s, None)) for n, ss in WANT.items() for s in ss]
        todo += [(n, c) for n, cs in CONVERT_HERE.items() for c in cs]
        for name, (label, scheme, options) in todo:
            if args.only and name != args.only:
                continue
            backend = edgeinfer.backend(name)
            if (name, label) in found:
                artifact, context = found[(name, label)]
            elif options is None:
                rows.append({"backend": name, "scheme": scheme, "skipped": "no cached conversion"})
                continue
            else:
                artifact, context = Path(tmp) / f"{name}-{len(rows)}", 256
                opts = dict(options)
                calib = opts.pop("calibration", None)
                backend.quantize_decoder(model_dir(), scheme, context, artifact, calib, **opts)
            rows.append(measure(backend, artifact, context, reference, scheme, label))
            r = rows[-1]
            print(f"{name} {label}: forced {r['forced_agreement_min']:.2f}/{r['forced_agreement_mean']:.2f} "
                  f"leading {r['leading_agreement_mean']:.2f} cos {r['cosine_min']:.5f} misses "
                  f"{[m['reference_margin'] for m in r['misses']]} passes {r['passes_now']}", file=sys.stderr)
    _common.write("decoder_golden_forced" + (f"-{args.only}" if args.only else ""),
                  {"model": "tiny-qwen3 (edgeinfer/testing/data)", "prompts": prompts, "rows": rows})


if __name__ == "__main__":
    main()
