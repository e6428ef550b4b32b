"""The runtime overhead of ``openvino-cpu`` (the OpenVINO plugin's CPU build, ``deploy --runtime openvino-cpu``):
a decoder process's peak RSS less what the plan puts in its weights, KV cache and activations.

For each model and scheme: ``deploy_decoder(model, "core-ultra-155h", runtime="openvino-cpu", ctx=CTX)`` (the
golden check runs; the conversion is cached), then in a fresh process ``edgeinfer.load(bundle)`` (one slot:
GenAI's LLMPipeline on the CPU) and one greedy request whose prompt and new tokens fill the context, so that
every KV position the plan counts is written. Peak = VmHWM of that process. The residual (peak − the plan's
weights + KV cache + activations) is what ``edgeinfer/data/runtimes.yaml`` ``openvino-cpu.overhead_mib`` takes:
the median over the rows. That is the fallback: bench/fit_speed.py's fit on the host's OpenVINO rows
(bench/planner_host_openvino.py) overrides it, and these rows, their context filled, check that fit.

    python bench/openvino_cpu_overhead.py [--no-big]

Models: the committed tiny test decoder and the peer bench's random Qwen3 (188 M parameters; ``--no-big``
leaves it out). Writes bench/results/openvino_cpu_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write  # noqa: E402

CTX = 256
NEW_TOKENS = 64
SCHEMES = ("fp32", "fp16", "w8a16")
MIB = 2**20

CHILD = r"""
import json, sys
import edgeinfer
from edgeinfer.contract.generation import GenerationOptions
from edgeinfer.contract.measure import peak_rss_bytes
path, ctx, new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with edgeinfer.load(path) as llm:
    prompt = [10 + i % 1000 for i in range(ctx - new - 1)]  # fills the context with the new tokens
    out = llm.generate_ids(prompt, GenerationOptions(max_new_tokens=new, ignore_eos=True))
    print(json.dumps({"peak_rss_bytes": peak_rss_bytes(), "prompt_tokens": len(prompt),
                      "new_tokens": len(out.token_ids), "device": llm.decoder.device,
                      "kv_dtype": llm.decoder.kv_dtype}))
"""


def measure(model: Path, scheme: str, work: Path) -> dict:
    from edgeinfer.deploy.decoder import deploy_decoder

    out = work / f"{model.name}-{scheme}"
    res = deploy_decoder(model, "core-ultra-155h", out, quant=scheme, ctx=CTX, runtime="openvino-cpu", force=True)
    parts = res.manifest.plan["memory"]["breakdown"]
    r = subprocess.run([sys.executable, "-c", CHILD, str(out), str(CTX), str(NEW_TOKENS)],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"child for {out} failed:\n{r.stderr[-3000:]}")
    child = json.loads(r.stdout.strip().splitlines()[-1])
    planned = parts["weights"] + parts["kv_cache"] + parts["activations"]
    row = {"model": model.name, "scheme": scheme, "ctx": CTX, **child,
           "plan_weights_bytes": parts["weights"], "plan_kv_bytes": parts["kv_cache"],
           "plan_activations_bytes": parts["activations"],
           "residual_mib": round((child["peak_rss_bytes"] - planned) / MIB, 1)}
    print(json.dumps(row), file=sys.stderr)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-big", action="store_true", help="the tiny test decoder only")
    args = ap.parse_args()
    from edgeinfer.testing.llm import model_dir, random_qwen3

    models = [model_dir()]
    if not args.no_big:  # the peer bench's model (bench/peer_llamacpp.py)
        models.append(random_qwen3(layers=16, hidden=1024, heads=16, kv_heads=8, intermediate=2816))
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(m, s, Path(tmp)) for m in models for s in SCHEMES]
    median = statistics.median(r["residual_mib"] for r in rows)
    write("openvino_cpu_overhead", {"ctx": CTX, "new_tokens": NEW_TOKENS, "rows": rows,
                                    "median_residual_mib": median})
    print(f"median residual {median} MiB over {len(rows)} rows")


if __name__ == "__main__":
    main()
