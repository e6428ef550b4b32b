"""Install sizes and times of the README's lines: the light core and each line of a board's install table, each
into a fresh ``python3 -m venv`` (with pip, as a user makes it) from a clean copy of the committed tree; the
venv's size is ``du -sb``. Needs the package index (or pip's cache) and a few minutes.

    python bench/install_lines.py [--board "Intel Core Ultra"] [--python python3] [--out install_lines]

Writes bench/results/OUT.json (install_lines.json: the Intel row; install_lines-host.json: the host onnxruntime
row); the README's install tables quote them.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def board_lines(board: str) -> dict[str, str]:
    """The README's install lines of ``board`` (its row of the board install table): encoder, decoder, serve."""
    row = next(ln for ln in (ROOT / "README.md").read_text().splitlines() if ln.startswith(f"| {board} |"))
    lines = re.findall(r"`(pip install [^`]+)`", row)
    return dict(zip(("encoder", "decoder", "serve"), lines))


def du_bytes(path: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def measure(python: str, src: Path, line: str, where: Path) -> dict:
    venv = where / "venv"
    start = time.perf_counter()
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    args = shlex.split(line)[2:]  # after "pip install"
    proc = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *args], cwd=src, capture_output=True,
                          text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{line} failed:\n{proc.stderr[-3000:]}")
    out = {"line": line, "seconds": round(seconds, 1), "bytes": du_bytes(venv),
           "load_average_1min": round(os.getloadavg()[0], 1)}  # a shared machine's pip times vary with its load
    print(f"{line}: {out['bytes'] / 2**20:.0f} MiB, {seconds:.0f} s", file=sys.stderr)
    shutil.rmtree(venv)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--board", default="Intel Core Ultra", help="the README board install row to measure")
    ap.add_argument("--python", default=os.environ.get("PYTHON", "python3"))
    ap.add_argument("--out", default="install_lines", help="the result's name under bench/results/")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgeinfer-install-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
        rows = {"core": measure(a.python, src, "pip install .", Path(tmp))}
        for what, line in board_lines(a.board).items():
            rows[what] = measure(a.python, src, line, Path(tmp))
    write(a.out, {"board": a.board, "source": "git archive HEAD", "lines": rows})


if __name__ == "__main__":
    main()
