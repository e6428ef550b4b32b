"""Wall time of `edgeinfer plan Qwen/Qwen3-8B --board rk3588-16g --quant w8a8 --ctx 4096 --json`
and a `python -X importtime` check that no torch / onnxruntime / openvino / onnx / transformers is imported.

Runs the installed `edgeinfer` console script when present (else `python -m edgeinfer.cli`), 15 times;
reports min / median / max. Writes bench/results/plan_speed.json.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["plan", "Qwen/Qwen3-8B", "--board", "rk3588-16g", "--quant", "w8a8", "--ctx", "4096", "--json"]
HEAVY = ("torch", "onnxruntime", "openvino", "onnx", "transformers", "rknn", "torch_npu")


def main(n: int = 15) -> dict:
    exe = shutil.which("edgeinfer", path=str(Path(sys.executable).parent))
    cmd = [exe, *ARGS] if exe else [sys.executable, "-m", "edgeinfer.cli", *ARGS]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    import resource

    times, cpu = [], []
    load_before = os.getloadavg()[0]
    for _ in range(n):
        t = time.perf_counter()
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        times.append(time.perf_counter() - t)
        cpu.append((c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime))
        assert r.returncode == 0, r.stderr
        json.loads(r.stdout)
    imp = subprocess.run([sys.executable, "-X", "importtime", "-m", "edgeinfer.cli", *ARGS], capture_output=True,
                         text=True, env=env)
    mods = {line.split("|")[-1].strip() for line in imp.stderr.splitlines() if line.startswith("import time:")}
    heavy = sorted(m for m in mods if m.split(".")[0] in HEAVY)
    res = {"command": " ".join(["edgeinfer", *ARGS]), "runs": n, "wall_s_min": round(min(times), 3),
           "wall_s_median": round(statistics.median(times), 3), "wall_s_max": round(max(times), 3),
           "cpu_s_median": round(statistics.median(cpu), 3), "load_average_1min": round(load_before, 2),
           "target_s": 0.3, "heavy_modules_imported": heavy, "modules_imported": len(mods),
           "via": "console script" if exe else "python -m edgeinfer.cli"}
    (ROOT / "bench" / "results").mkdir(parents=True, exist_ok=True)
    (ROOT / "bench" / "results" / "plan_speed.json").write_text(json.dumps(res, indent=1) + "\n")
    return res


if __name__ == "__main__":
    from _common import arguments

    arguments(__doc__).parse_args()
    r = main()
    print(json.dumps(r, indent=1))
    sys.exit(0 if not r["heavy_modules_imported"] else 1)
