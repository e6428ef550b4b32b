"""Peak RSS of a decoder bundle against its weights + KV + the plan's runtime overhead, per backend.

Issue 30 §2: "find and remove duplicate weight copies in every backend's load path". For each board below
the model is deployed once (``deploy_decoder``; the conversion is cached), then in a fresh subprocess:
  baseline: python + edgeinfer + the backend's runtime imported (``edgeinfer.load`` of nothing: the imports only)
  load:     ``edgeinfer.load(bundle)`` and ``generate`` of ``NEW_TOKENS`` tokens, greedy
Peak RSS = ``edgeinfer.contract.measure.peak_rss_bytes`` of the child (VmHWM). Reported per backend:
  weights_bytes (the bundle's artifact files on disk), the plan's KV and runtime overhead for the bundle's context,
  peak_load_bytes, peak_baseline_bytes, rss_end_bytes (RSS after the tokens: what a serving worker keeps),
  ``rss_end_over_weights`` = (rss_end − peak_baseline) / weights, and
  ``excess_over_weights`` = (peak_load − peak_baseline) / weights:
  about 1 when the weights are held once; about 2 or more means a second copy somewhere on the load path.

Models: the committed tiny test decoder and (``--big``) a random Qwen3 of ~160 M parameters
(``edgeinfer.testing.llm.random_qwen3``, 12 layers, hidden 1024, MLP 3200: not 3072, the vocabulary size,
which onnxruntime-genai's builder would take for the LM head and which the onnxruntime plugin refuses).
Writes bench/results/decoder_footprint.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write  # noqa: E402

NEW_TOKENS = 8
CTX = 256
#: board -> quant: one per backend that runs decoders on this machine's CPU
BOARDS = {"host": None, "core-ultra-155h": "fp16", "atlas-300i-pro": None}
BACKEND_OF = {"host": "onnxruntime", "core-ultra-155h": "openvino", "atlas-300i-pro": "ascend"}

CHILD = r"""
import json, sys
mode, path, backend = sys.argv[1], sys.argv[2], sys.argv[3]
import edgeinfer
if mode == "baseline":
    import importlib
    importlib.import_module({"onnxruntime": "onnxruntime", "openvino": "openvino_genai",
                             "ascend": "torch"}[backend])
else:
    llm = edgeinfer.load(path)
    llm.generate("The licence grants", max_new_tokens=int(sys.argv[4]))
from edgeinfer.contract.measure import current_rss_bytes, peak_rss_bytes
print(json.dumps({"peak_rss_bytes": peak_rss_bytes(), "rss_bytes": current_rss_bytes()}))
"""


def child_rss(mode: str, path: Path | str, backend: str) -> dict:
    """The child's peak RSS (VmHWM) and its RSS at the end (after the tokens: what it keeps while serving)."""
    r = subprocess.run([sys.executable, "-c", CHILD, mode, str(path), backend, str(NEW_TOKENS)],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"{mode} child for {path} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def artifact_bytes(bundle: Path) -> int:
    """Bytes of the bundle's model files (weights and graph), not its tokenizer, golden tokens or stamps."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    names = manifest.get("files") or {}
    skip = ("tokenizer", "golden", "manifest.json")
    total = 0
    for f in bundle.rglob("*"):
        rel = f.relative_to(bundle).as_posix()
        if f.is_file() and not rel.startswith(skip) and not rel.endswith((".stamp.json", ".log", ".src.tar")):
            total += f.stat().st_size
    return total if total else sum(names.values()) if isinstance(names, dict) else 0


def measure(model: Path, board: str, quant: str | None, work: Path) -> dict:
    from edgeinfer.deploy.decoder import deploy_decoder

    out = work / f"{model.name}-{board}"
    res = deploy_decoder(model, board, out, quant=quant, ctx=CTX)
    mem = res.manifest.plan["memory"]["breakdown"] if hasattr(res.manifest, "plan") else {}
    backend = BACKEND_OF[board]
    weights = artifact_bytes(out)
    base = child_rss("baseline", "", backend)["peak_rss_bytes"]
    loaded = child_rss("load", out, backend)
    peak = loaded["peak_rss_bytes"]
    row = {"model": model.name, "board": board, "backend": backend, "scheme": res.manifest.scheme, "ctx": CTX,
           "weights_bytes": weights, "plan_weights_bytes": mem.get("weights"), "plan_kv_bytes": mem.get("kv_cache"),
           "plan_activations_bytes": mem.get("activations"), "plan_runtime_bytes": mem.get("runtime"),
           "peak_baseline_bytes": base, "peak_load_bytes": peak,
           "rss_end_bytes": loaded["rss_bytes"],
           "rss_end_over_weights": round((loaded["rss_bytes"] - base) / weights, 2),
           "excess_over_weights": round((peak - base) / weights, 2)}
    print(json.dumps(row), file=sys.stderr)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--big", action="store_true", help="also a random Qwen3 of ~160 M parameters")
    ap.add_argument("--boards", nargs="*", default=list(BOARDS), choices=list(BOARDS))
    ap.add_argument("--label", default="", help="a name for this run in the results (e.g. before / after)")
    args = ap.parse_args()
    from edgeinfer.testing.llm import model_dir, random_qwen3

    models = [model_dir()] + ([random_qwen3(layers=12, hidden=1024, heads=16, kv_heads=8, intermediate=3200)]
                              if args.big else [])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for m in models:
            for b in args.boards:
                rows.append(measure(m, b, BOARDS[b], Path(tmp)))
    name = "decoder_footprint" + (f"-{args.label}" if args.label else "")
    write(name, {"new_tokens": NEW_TOKENS, "rows": rows})


if __name__ == "__main__":
    main()
