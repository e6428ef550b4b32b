"""Bundles deployed here (x86-64, the own ops' AVX build) run on AArch64: scripts/test_aarch64.sh's second part.

For each host scheme the tiny test decoder is deployed with this machine's Python, generates greedily here, then
generates and re-runs its golden check under the emulated AArch64 Python (``ARM`` below: the command line the
shell script builds), where the own ops run their portable build. Exit 1 unless every bundle passes ``edgeinfer
verify`` there (nothing refused: the portable build and a compiler are there), gives the same tokens there and
passes its golden check there.

    python scripts/aarch64_bundles.py OUT_DIR ARM_PYTHON_COMMAND...
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from edgeinfer.testing.llm import model_dir

SCHEMES = [("fp16", []), ("w8a16", []), ("w4a16", []), ("w4a8", []), ("w8a8", ["--option", "kv_dtype=q8_0"])]
PROMPT = ["--prompt", "The quick brown fox", "--max-new-tokens", "24"]


def run(cmd: list[str]) -> dict:
    proc = subprocess.run([*cmd, "--json"], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def main() -> None:
    out, arm = Path(sys.argv[1]), sys.argv[2:]
    here = [sys.executable, "-m", "edgeinfer.cli"]
    failed = 0
    for scheme, options in SCHEMES:
        bundle = out / f"tiny-{scheme}"
        shutil.rmtree(bundle, ignore_errors=True)
        run([*here, "deploy", str(model_dir()), "--board", "host", "--quant", scheme, "--ctx", "256", *options,
             "-o", str(bundle)])
        x86 = run([*here, "generate", str(bundle), *PROMPT])["token_ids"]
        verify = run([*arm, "-m", "edgeinfer.cli", "verify", str(bundle)])
        gen = run([*arm, "-m", "edgeinfer.cli", "generate", str(bundle), *PROMPT])
        golden = run([*arm, "-m", "edgeinfer.cli", "golden", str(bundle)])
        ok = verify["installed"] and not verify["refused"] and gen["token_ids"] == x86 and golden["passed"]
        failed += not ok
        print(f"{scheme}{' ' + ' '.join(options[1:]) if options else ''}: verify on aarch64 "
              f"{'passed' if verify['installed'] and not verify['refused'] else 'REFUSED'}, {len(x86)} tokens "
              f"{'equal' if gen['token_ids'] == x86 else 'DIFFER'}, golden on aarch64 "
              f"{'passed' if golden['passed'] else 'FAILED'} (teacher-forced agreement "
              f"{golden['forced_agreement']:.3f}, cosine min {golden['cosine_min']:.6f}); "
              f"notes: {gen.get('notes') or 'none'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
