"""How many copies of a float decoder's weights OpenVINO's CPU plugin holds (issue 30 §2, "find and remove duplicate
weight copies in every backend's load path"): the fp16 or fp32 IR of a deployed OpenVINO decoder bundle compiled
alone (``core.compile_model``, no GenAI pipeline), per inference precision, in a fresh process each, stepped through
a 1 x 8 prefill, one 1-row decode step, a 16 x 32 prefill and one 16-row decode step; VmRSS / RssAnon / RssFile
(MiB) after each. A weights copy that a step packs shows as a jump in RssAnon the size of the weights it packs.

    python bench/openvino_weight_copies.py [BUNDLE] [--scheme fp16] [--precisions f32 bf16] [--out NAME]

BUNDLE: an OpenVINO decoder bundle (default: the peer bench's bundle of its random Qwen3 in ``--scheme``, fp16 or
fp32, built if missing).
Writes bench/results/openvino_weight_copies.json (or NAME.json).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

CHILD = r"""
import json, sys
import numpy as np
import openvino as ov

def mem():
    keys = ("VmRSS", "RssAnon", "RssFile")
    lines = [l for l in open("/proc/self/status") if l.startswith(keys)]
    return {l.split(":")[0]: round(int(l.split()[1]) / 1024, 1) for l in lines}

ir, precision = sys.argv[1], sys.argv[2]
core = ov.Core()
model = core.read_model(ir)
out = {"read": mem()}
compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": precision, "KV_CACHE_PRECISION": "f16"})
out["compiled"] = mem()
out["inference_precision"] = compiled.get_property("INFERENCE_PRECISION_HINT").to_string()
req = compiled.create_infer_request()
names = {i.get_any_name() for i in compiled.inputs}

def step(rows, new, past):
    feeds = {"input_ids": np.ones((rows, new), np.int64), "attention_mask": np.ones((rows, past + new), np.int64),
             "position_ids": np.arange(past, past + new, dtype=np.int64)[None].repeat(rows, 0),
             "beam_idx": np.arange(rows, dtype=np.int32)}
    req.infer({k: v for k, v in feeds.items() if k in names})

step(1, 8, 0); out["prefill 1x8"] = mem()
step(1, 1, 8); out["decode 1 row"] = mem()
req.reset_state()
step(16, 32, 0); out["prefill 16x32"] = mem()
step(16, 1, 32); out["decode 16 rows"] = mem()
print(json.dumps(out))
"""


def peer_bundle(scheme: str) -> Path:
    import fp16_planes
    import peer_llamacpp

    pair = dict(peer_llamacpp.PAIRS["ov-fp16"], quant=scheme)
    return peer_llamacpp.edgeinfer_target(pair, fp16_planes.peer_model())


def main() -> None:
    p = _common.arguments(__doc__)
    p.add_argument("bundle", nargs="?", type=Path)
    p.add_argument("--scheme", choices=["fp16", "fp32"], default="fp16", help="the default bundle's scheme")
    p.add_argument("--precisions", nargs="+", default=["f32", "bf16"])
    p.add_argument("--out", default="openvino_weight_copies")
    args = p.parse_args()
    bundle = args.bundle or peer_bundle(args.scheme)
    ir = next((bundle / "decoder").glob("openvino_model.xml"), None)
    if ir is None:
        p.error(f"{bundle} holds no decoder/openvino_model.xml: give an OpenVINO decoder bundle")
    weights_mib = ir.with_suffix(".bin").stat().st_size / 2**20
    rows = {}
    for precision in args.precisions:
        run = subprocess.run([sys.executable, "-c", CHILD, str(ir), precision], capture_output=True, text=True)
        if run.returncode:
            sys.exit(f"{precision}: {run.stderr.strip().splitlines()[-1]}")
        rows[precision] = json.loads(run.stdout.strip().splitlines()[-1])
        print(precision, json.dumps(rows[precision]))
    _common.write(args.out, {"bundle": str(bundle), "weights_file_mib": round(weights_mib, 1), "unit": "MiB",
                             "rows": rows})


if __name__ == "__main__":
    main()
