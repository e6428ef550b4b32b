"""The llama.cpp runtime's memory overhead on this machine (edgeinfer/data/runtimes.yaml ``llama.cpp``): peak RSS
of a fresh process with python + edgeinfer + llama_cpp imported and the tiny test decoder loaded through the
llamacpp backend (F32 GGUF, context 256, one slot, one prefill + decode), minus its weights (the GGUF's size,
mmapped and touched) and its KV cache (``kv_cache_bytes``). Writes bench/results/llamacpp_overhead.json.

    python bench/llamacpp_overhead.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20

CHILD = """
import json, numpy as np
import edgeinfer
from edgeinfer.contract import peak_rss_bytes
from edgeinfer.testing.llm import model_dir
from edgeinfer_llamacpp.convert import cached_scheme
gguf = cached_scheme(model_dir(), "fp32")
d = edgeinfer.backend("llamacpp").load_decoder(gguf, context=256)
d.decode([0], np.array([int(d.prefill(0, np.arange(1, 33)).argmax())]))
print(json.dumps({"peak_rss": peak_rss_bytes(), "weights": gguf.stat().st_size, "kv": d.kv_cache_bytes}))
"""


def main() -> None:
    runs = [json.loads(subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
                       .stdout.strip().splitlines()[-1]) for _ in range(3)]
    over = [(r["peak_rss"] - r["weights"] - r["kv"]) / MIB for r in runs]
    out = {"runs": runs, "overhead_mib": over, "overhead_mib_min": min(over),
           "what": "peak RSS (VmHWM) - GGUF size - kv_cache_bytes: python + edgeinfer + llama_cpp + compute buffers"}
    dst = ROOT / "bench" / "results" / "llamacpp_overhead.json"
    dst.write_text(json.dumps(out, indent=2) + "\n")
    print(f"llama.cpp overhead: {min(over):.0f} MiB (min of 3; {', '.join(f'{o:.0f}' for o in over)}) -> {dst}")


if __name__ == "__main__":
    from _common import arguments

    arguments(__doc__).parse_args()
    main()
