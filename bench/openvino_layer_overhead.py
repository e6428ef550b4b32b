"""What each layer of a decoder costs OpenVINO's CPU plugin beyond its weights: random Qwen3s of several depths at
a few widths, built as ``deploy --runtime openvino-cpu -q w8a16`` builds them, each loaded in a fresh process as
serve's worker loads it (4 slots, ctx 256 or ``--ctx``, the ContinuousBatchingPipeline) and given 4 prompts of
25/32 of the context (200 tokens at 256).

Per model: the IR's weight bytes, the KV cache its prompts and tokens wrote (f16), RssAnon after the load and after
the prompts, and the peak (VmHWM). Per width: the least-squares slope over depth of (peak − weights − KV written),
the memory one more layer adds besides what the plan counts for it already (the compiled graph's nodes, their
kernels and buffers). The planner's ``openvino-cpu`` overhead had only a
constant and a share of the weights, fitted on Qwen3s of 4 to 16 layers, and planned SmolLM2-135M (30 narrow
layers) 15 % under (docs/planner.md, "A trained model"); runtimes.yaml's ``layer_overhead_mib`` comes from here.

    python bench/openvino_layer_overhead.py [--widths 256,576,1024] [--ctx 512 --out NAME]

Writes bench/results/openvino_layer_overhead.json (or NAME.json).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

MIB = 2**20
DEPTHS = {256: (4, 16, 32), 576: (4, 16, 32), 1024: (4, 8, 16)}
CHILD = r"""
import json, sys
from edgeinfer.serve.child import fixed_mmap_threshold
fixed_mmap_threshold()  # as serve's decoder worker does before it loads anything
import edgeinfer
from edgeinfer.contract.generation import GenerationOptions

def status():
    out = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("RssAnon", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out

ctx = int(sys.argv[2])
d = edgeinfer.backend("openvino").load_decoder(sys.argv[1], context=ctx, slots=4, threads=1)
loaded = status()
opts = GenerationOptions(max_new_tokens=4, ignore_eos=True)
d.generate_native_batch([([5 + i] * (ctx * 25 // 32), opts) for i in range(4)], lambda i, t: True)
after = status()
print(json.dumps({"anon_loaded": loaded["RssAnon"], "anon_after": after["RssAnon"], "peak": after["VmHWM"]}))
"""


def model(layers: int, hidden: int, ctx: int) -> Path:
    import edgeinfer
    from edgeinfer.contract import cache
    from edgeinfer.testing.llm import random_qwen3

    heads = hidden // 64
    kv_heads = heads // 3 if heads % 3 == 0 else heads // 2
    src = random_qwen3(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                       intermediate=hidden * 8 // 3 // 64 * 64)
    backend = edgeinfer.backend("openvino")
    out = cache.area("bench") / "openvino_layer_overhead" / f"{src.name}-w8a16-{ctx}-{cache.code(backend)}"
    if not (out / "openvino_model.xml").is_file():
        out.mkdir(parents=True, exist_ok=True)
        backend.convert_decoder(src, "w8a16", ctx, out, None, runtime="openvino-cpu")
    return out


def main() -> None:
    ap = _common.arguments(__doc__)
    ap.add_argument("--widths", default=",".join(map(str, DEPTHS)), help="hidden sizes, comma-separated")
    ap.add_argument("--ctx", type=int, default=256, help="context (GenAI's prefill steps take max(ctx, 256) tokens)")
    ap.add_argument("--out", default="openvino_layer_overhead")
    args = ap.parse_args()
    rows, per_layer = [], {}
    for hidden in (int(w) for w in args.widths.split(",")):
        for layers in DEPTHS.get(hidden, (4, 16, 32)):
            ir = model(layers, hidden, args.ctx)
            run = subprocess.run([sys.executable, "-c", CHILD, str(ir), str(args.ctx)], capture_output=True,
                                 text=True, check=True)
            cfg = json.loads((ir / "config.json").read_text())
            positions = 4 * (args.ctx * 25 // 32 + 4)  # every sequence's prompt and new tokens, in f16
            kv = layers * positions * cfg["num_key_value_heads"] * cfg["head_dim"] * 2 * 2
            row = {"hidden": hidden, "layers": layers, "weights": (ir / "openvino_model.bin").stat().st_size,
                   "kv_written": kv, **json.loads(run.stdout.strip().splitlines()[-1])}
            print(f"hidden {hidden}, {layers} layers: weights {row['weights'] / MIB:.1f} MiB, peak "
                  f"{row['peak'] / MIB:.1f}, anon after load {row['anon_loaded'] / MIB:.1f}", flush=True)
            rows.append(row)
        mine = [r for r in rows if r["hidden"] == hidden]
        fit = statistics.linear_regression([r["layers"] for r in mine],
                                           [(r["peak"] - r["weights"] - r["kv_written"]) / MIB for r in mine])
        per_layer[str(hidden)] = round(fit.slope, 2)
        print(f"hidden {hidden}: {per_layer[str(hidden)]} MiB a layer beyond its weights and KV", flush=True)
    _common.write(args.out, {
        "setting": f"w8a16 CPU build, load_decoder(context={args.ctx}, slots=4, threads=1), 4 prompts of "
                   f"{args.ctx * 25 // 32} tokens, 4 new tokens; a fresh process per model", "ctx": args.ctx,
        "per_layer_mib_beyond_weights_and_kv": per_layer, "unit": "bytes", "rows": rows})


if __name__ == "__main__":
    main()
