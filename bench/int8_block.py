"""The onnxruntime int8 decoder's memory and speed per int8 block size (issue 30 §2, footprint): the fp32 graph
of a deployed fp32 bundle quantized as deploy's w8a8 does (``quantize_int8``: MatMulNBits bits=8, accuracy
level 4; ``--scheme w8a16``: accuracy level 1, fp32 activations) with each block size, then, per block and
round (interleaved: A B A B), one fresh process that loads the decoder at the peer bench's settings (16 slots,
ctx 256, 2 threads), prefills 16 prompts of 32 tokens in one batch and decodes 16 steps of 16 rows, then 16 of
one row (``--steps``; 0: load only): VmHWM / RssAnon / RssFile after load and after the run, tok/s, and the
greedy tokens of the last step (equal across blocks on the random model's flat logits says little; deploy's
golden check is the quality gate).

    python bench/int8_block.py ~/.cache/edgeinfer/bench/peer/<model>-host-fp32 [--blocks 32 128] [--rounds 2]
        [--scheme w8a8|w8a16] [--steps 16] [--out NAME]

Writes bench/results/int8_block.json (or NAME.json).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

CHILD = r"""
import json, sys, time
from pathlib import Path
import numpy as np
from edgeinfer_onnxruntime.decoder import OnnxRuntimeDecoder

def mem():
    keys = ("VmHWM", "RssAnon", "RssFile")
    return {l.split(":")[0]: int(l.split()[1]) / 1024 for l in open("/proc/self/status") if l.startswith(keys)}

d = OnnxRuntimeDecoder(Path(sys.argv[1]), 256, 16, threads=2)
steps = int(sys.argv[2])
loaded = mem()
if not steps:  # load only
    print(json.dumps({"after_load_mib": loaded}))
    sys.exit()
d.prefill_batch(list(range(16)), [np.arange(1, 33) + i for i in range(16)])
t = time.perf_counter()
for _ in range(steps):
    many = d.decode(list(range(16)), np.ones(16, dtype=np.int64))
rows16 = steps * 16 / (time.perf_counter() - t)
t = time.perf_counter()
for _ in range(steps):
    one = d.decode([0], np.ones(1, dtype=np.int64))
rows1 = steps / (time.perf_counter() - t)
print(json.dumps({"after_load_mib": loaded, "after_run_mib": mem(), "tok_s_16_rows": rows16, "tok_s_1_row": rows1,
                  "greedy_16": [int(x) for x in many.argmax(-1)], "greedy_1": int(one[0].argmax())}))
"""


def main() -> None:
    from edgeinfer_onnxruntime.weights import quantize_int8

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fp32_bundle", type=Path)
    ap.add_argument("--blocks", type=int, nargs="+", default=[32, 128])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--scheme", choices=["w8a8", "w8a16"], default="w8a8")
    ap.add_argument("--out", default="int8_block", help="results name: bench/results/OUT.json")
    ap.add_argument("--steps", type=int, default=16, help="decode steps of 16 rows, then of one row (0: load only)")
    args = ap.parse_args()
    runs: dict[int, list[dict]] = {b: [] for b in args.blocks}
    sizes = {}
    with tempfile.TemporaryDirectory() as tmp:
        for b in args.blocks:
            out = Path(tmp) / f"g{b}"
            shutil.copytree(args.fp32_bundle / "decoder", out)
            quantize_int8(out / "model.onnx", b, activations_int8=args.scheme == "w8a8")
            sizes[b] = (out / "model.onnx.data").stat().st_size / 2**20
        for _ in range(args.rounds):
            for b in args.blocks:
                proc = subprocess.run([sys.executable, "-c", CHILD, str(Path(tmp) / f"g{b}"), str(args.steps)],
                                      capture_output=True, text=True, check=True)
                runs[b].append(json.loads(proc.stdout.strip().splitlines()[-1]))
                r = runs[b][-1]
                ran = (f"peak {r['after_run_mib']['VmHWM']:6.1f} MiB, {r['tok_s_16_rows']:6.1f} tok/s x16, "
                       f"{r['tok_s_1_row']:6.1f} tok/s x1, " if args.steps else "")
                print(f"block {b:4d}: {ran}after load {r['after_load_mib']}", file=sys.stderr)
    _common.write(args.out, {"fp32_bundle": str(args.fp32_bundle), "scheme": args.scheme, "steps": args.steps,
                             "weights_file_mib": sizes, "runs": {str(b): v for b, v in runs.items()}})


if __name__ == "__main__":
    main()
