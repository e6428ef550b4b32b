"""Wall time of `edgeinfer --help` (target < 0.5 s) and what `import edgeinfer` imports.

    python bench/cli_startup.py [--runs 10]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write  # noqa: E402

HEAVY = ("torch", "onnxruntime", "openvino", "rknn", "torch_npu", "onnx", "transformers")


def imported(code: str) -> dict[str, float]:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True)
    mods = {}
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            parts = [p.strip() for p in line[len("import time:"):].split("|")]
            if parts[0].isdigit():
                mods[parts[2]] = int(parts[1]) / 1e6  # cumulative seconds
    return mods


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    exe = shutil.which("edgeinfer") or str(Path(sys.executable).with_name("edgeinfer"))
    subprocess.run([exe, "--help"], capture_output=True, check=True)  # warm the page cache
    times = []
    for _ in range(args.runs):
        t = time.perf_counter()
        subprocess.run([exe, "--help"], capture_output=True, check=True)
        times.append(time.perf_counter() - t)
    mods = imported("import edgeinfer")
    heavy = sorted({m.split(".")[0] for m in mods} & set(HEAVY))
    result = {
        "help_wall_s": {"median": statistics.median(times), "min": min(times), "max": max(times), "runs": len(times)},
        "target_s": 0.5,
        "import_edgeinfer_s": mods.get("edgeinfer"),
        "heavy_modules_imported_by_import_edgeinfer": heavy,
    }
    write("cli_startup", result)
    print(
        f"edgeinfer --help: median {result['help_wall_s']['median']:.3f} s over {len(times)} runs "
        f"(target < 0.5 s); import edgeinfer {result['import_edgeinfer_s']:.3f} s; heavy imports: {heavy or 'none'}"
    )


if __name__ == "__main__":
    main()
