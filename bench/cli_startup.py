"""CLI start-up: wall time of `edgeinfer --help` (target < 0.5 s), CPU and wall time of
`edgeinfer plan MODEL --board BOARD --json` (target < 0.3 s CPU: a firmware script calls it per model and
board), and what `import edgeinfer` imports.

    python bench/cli_startup.py [--runs 10] [--model qwen3-8b] [--board rk3588-16g] [--pycache DIR]

CPU is the child's user + system time (``resource.getrusage(RUSAGE_CHILDREN)`` before and after each run);
figures are the median (and min, max) of ``--runs`` runs after one warm-up, with the 1-minute load average
before and after: on a busy machine CPU time grows too. ``--pycache DIR`` lets Python cache bytecode under
DIR (``PYTHONPYCACHEPREFIX``, as an installed package has its ``.pyc``); without it the environment decides,
and the JSON records it (``PYTHONDONTWRITEBYTECODE`` set and no ``__pycache__``: every module is compiled on
every call).
"""

from __future__ import annotations

import argparse
import os
import resource
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


def timed(cmd: list[str], runs: int, env: dict[str, str], ok: tuple[int, ...] = (0,)) -> dict:
    """Median / min / max wall and CPU (user + system) seconds of ``cmd`` over ``runs`` runs, after one warm-up."""
    subprocess.run(cmd, capture_output=True, env=env)  # page cache (and bytecode, where it may be written)
    wall, cpu = [], []
    for _ in range(runs):
        c0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        t1, c1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        if r.returncode not in ok:
            raise SystemExit(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()[-500:]}")
        wall.append(t1 - t0)
        cpu.append((c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime))

    def stats(xs: list[float]) -> dict:
        return {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4), "max": round(max(xs), 4)}

    return {"wall_s": stats(wall), "cpu_s": stats(cpu), "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--model", default="qwen3-8b", help="catalog name, HF directory or file (default qwen3-8b)")
    ap.add_argument("--board", default="rk3588-16g")
    ap.add_argument("--pycache", type=Path, help="cache bytecode under this folder (PYTHONPYCACHEPREFIX)")
    args = ap.parse_args()
    exe = shutil.which("edgeinfer") or str(Path(sys.executable).with_name("edgeinfer"))
    env = dict(os.environ)
    if args.pycache:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(args.pycache.resolve())
    load_before = os.getloadavg()[0]
    help_run = timed([exe, "--help"], args.runs, env)
    plan_cmd = [exe, "plan", args.model, "--board", args.board, "--json"]
    plan_run = timed(plan_cmd, args.runs, env, ok=(0, 1))  # 1: does not fit, a full answer all the same
    load_after = os.getloadavg()[0]
    mods = imported("import edgeinfer")
    heavy = sorted({m.split(".")[0] for m in mods} & set(HEAVY))
    result = {
        "help_wall_s": {**help_run["wall_s"], "runs": args.runs},
        "target_s": 0.5,
        "plan": {"command": " ".join(["edgeinfer", *plan_cmd[1:]]), **plan_run, "target_cpu_s": 0.3},
        "PYTHONDONTWRITEBYTECODE": env.get("PYTHONDONTWRITEBYTECODE"),  # set: no .pyc written, each call compiles
        "pycache_prefix": env.get("PYTHONPYCACHEPREFIX"),
        "load_average_1min": {"before": round(load_before, 2), "after": round(load_after, 2)},
        "import_edgeinfer_s": mods.get("edgeinfer"),
        "heavy_modules_imported_by_import_edgeinfer": heavy,
    }
    write("cli_startup", result)
    p = result["plan"]
    print(f"edgeinfer --help: median {result['help_wall_s']['median']:.3f} s wall over {args.runs} runs "
          f"(target < 0.5 s); {p['command']}: median {p['cpu_s']['median']:.3f} s CPU (target < 0.3 s), "
          f"{p['wall_s']['median']:.3f} s wall; load average {load_before:.2f} → {load_after:.2f}; "
          f"PYTHONDONTWRITEBYTECODE={result['PYTHONDONTWRITEBYTECODE']}; "
          f"import edgeinfer {result['import_edgeinfer_s']:.3f} s; heavy imports: {heavy or 'none'}")


if __name__ == "__main__":
    main()
