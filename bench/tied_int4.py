"""A tied model's int4 conversion on the host: what its weights file holds and what one decoder process peaks at.

For each model and scheme: the onnxruntime plugin's deploy conversion (``decoder.convert``, cached per plugin
code by ``_common.onnxruntime_decoder``; no golden check, so SmolLM2-135M was measured too while its 4-bit
conversions failed it), the weights file's size and the op its token lookup runs; then ``--rounds`` fresh processes
that open the decoder (one slot of ``CTX``, one thread), prefill 32 token ids and decode 64 greedily, each
reporting its peak RSS (VmHWM). With ``--llama``: ``llama-server`` (one slot of ``CTX``, one thread) on
llama.cpp's own Q4_0 of each model after two 64-token requests, its VmHWM, for scale.

Run it from a worktree of another commit (``PYTHONPATH=WORKTREE/plugins/onnxruntime:WORKTREE``) for that code's
figures: the conversion is cached by the plugin's code, so each checkout converts its own.

    python bench/tied_int4.py [--models tiny,smollm2] [--schemes w4a16,w4a8] [--rounds 2] [--llama] [--out NAME]

Writes bench/results/NAME.json (default tied_int4).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import arguments, onnxruntime_decoder, write  # noqa: E402

CTX = 256
PORT = 8137
CHILD = r"""
import sys, numpy as np
from pathlib import Path
from edgeinfer.contract.registry import get_backend
from edgeinfer.contract.measure import peak_rss_bytes
dec = get_backend("onnxruntime").open_decoder(Path(sys.argv[1]), None, int(sys.argv[2]), 1, threads=1)
ids = np.random.default_rng(0).integers(100, int(sys.argv[3]), 32).astype(np.int64)
logits = dec.prefill(0, ids)
for _ in range(64):
    tok = int(np.argmax(logits.reshape(-1, logits.shape[-1])[-1]))
    logits = dec.decode([0], np.array([tok], np.int64))
print(peak_rss_bytes())
"""


def model_dir(name: str) -> Path:
    if name == "smollm2":
        import _smollm2

        return _smollm2.model_dir()
    from edgeinfer.testing import llm

    return llm.model_dir()


def lookup_op(decoder: Path) -> str:
    from edgeinfer_onnxruntime.custom_ops import DOMAIN

    from edgeinfer.contract.onnx_index import graph_ops

    ops = {op for domain, op in graph_ops(decoder / "model.onnx")}
    return next((f"{DOMAIN}.{op}" for op in ("EmbedW8", "EmbedF16") if op in ops),
                "GatherBlockQuantized" if "GatherBlockQuantized" in ops else "Gather")


def peak_rss(decoder: Path, vocab: int) -> int:
    out = subprocess.run([sys.executable, "-c", CHILD, str(decoder), str(CTX), str(vocab)], capture_output=True,
                         text=True, check=True).stdout
    return int(out.split()[-1])


def llama_server_peak(model: Path) -> dict:
    import _llamacpp

    bins = _llamacpp.binaries()
    gguf = _llamacpp.gguf(model, "Q4_0")
    proc = subprocess.Popen(_llamacpp.server_command(bins, gguf, PORT, 1, CTX, 1), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        body = json.dumps({"prompt": "Permission is hereby granted, free of charge, to any person obtaining",
                           "max_tokens": 64, "temperature": 0}).encode()
        for _ in range(2):
            urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{PORT}/v1/completions", body,
                                                          {"Content-Type": "application/json"}), timeout=120).read()
        status = Path(f"/proc/{proc.pid}/status").read_text()
        hwm = next(int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("VmHWM"))
    finally:
        proc.terminate()
        proc.wait()
    return {"gguf_bytes": gguf.stat().st_size, "peak_rss_bytes": hwm * 1024}


def main() -> None:
    ap = arguments(__doc__)
    ap.add_argument("--models", default="tiny,smollm2")
    ap.add_argument("--schemes", default="w4a16,w4a8")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--llama", action="store_true")
    ap.add_argument("--out", default="tied_int4")
    args = ap.parse_args()
    import edgeinfer_onnxruntime

    rows = []
    for name in args.models.split(","):
        model = model_dir(name)
        vocab = json.loads((model / "config.json").read_text())["vocab_size"]
        for scheme in args.schemes.split(","):
            decoder = onnxruntime_decoder("tied_int4", name, model, scheme, CTX)
            peaks = [peak_rss(decoder, vocab) for _ in range(args.rounds)]
            row = {"model": name, "scheme": scheme, "lookup": lookup_op(decoder),
                   "weights_file_bytes": (decoder / "model.onnx.data").stat().st_size,
                   "peak_rss_bytes": peaks, "peak_rss_mib_median": round(sorted(peaks)[len(peaks) // 2] / 2**20, 1)}
            print(json.dumps(row), file=sys.stderr)
            rows.append(row)
        if args.llama:
            rows.append({"model": name, "scheme": "llama-server Q4_0", **llama_server_peak(model)})
            print(json.dumps(rows[-1]), file=sys.stderr)
    write(args.out, {"plugin": str(Path(edgeinfer_onnxruntime.__file__).parent), "ctx": CTX, "rounds": args.rounds,
                     "rows": rows})


if __name__ == "__main__":
    main()
