"""Resident memory of ``edgeinfer serve``'s HTTP (main) process, apart from its model workers (issue 30,
"Footprint": the HTTP process keeps torch, transformers and the model runtimes out).

For each of the tiny Qwen3 decoder bundle (host, onnxruntime fp32) and a MiniLM embedding bundle (onnxruntime
fp32; once without its id limits in the manifest, as bundles deployed before they were recorded, once with):
start ``edgeinfer serve``, answer one request, then read the main process's VmRSS / VmHWM and the
runtime libraries mapped into it (/proc/PID/status, /proc/PID/maps; Linux), and the same for its children.

    python bench/serve_main_rss.py

Writes bench/results/serve_main_rss.json and prints it.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
from _common import arguments  # noqa: E402


def children(pid: int) -> list[int]:
    return [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]


def measure(bundle: Path, path: str, body: dict, log: Path) -> dict:
    import httpx

    from edgeinfer.testing.serve import ServerProc, rss_kib, runtime_libraries

    with ServerProc([bundle], "--threads", "1", log=log) as s:
        r = httpx.post(s.url + path, json=body, timeout=120)
        if r.status_code != 200:
            raise SystemExit(f"the request failed: {r.status_code} {r.text[:300]}")
        pid = s.proc.pid
        return {"main": {**rss_kib(pid), "runtime_libraries": runtime_libraries(pid)},
                "children": [{**rss_kib(c), "runtime_libraries": [Path(p).name for p in runtime_libraries(c)]}
                             for c in children(pid)]}


def recorded_limits(bundle: Path, out: Path) -> Path:
    """A copy of ``bundle`` whose manifest records its id limits, as ``deploy`` writes them (the test helper's
    bundle, like one deployed before they were recorded, has none: serve reads them from the ONNX graph)."""
    import shutil

    from edgeinfer.model import bundle as bundle_mod
    from edgeinfer.run.once import onnx_index_limits

    shutil.copytree(bundle, out)
    manifest = bundle_mod.Bundle.open(out).manifest
    manifest.index_limits = onnx_index_limits([out / a for a in manifest.artifacts])
    bundle_mod.write(out, manifest)
    return out


def main() -> None:
    from edgeinfer.deploy.decoder import deploy_decoder
    from edgeinfer.testing import minilm
    from edgeinfer.testing.llm import model_dir
    from edgeinfer.testing.serve import minilm_bundle

    tmp = Path(tempfile.mkdtemp(prefix="serve-main-rss-"))
    decoder = tmp / "tiny-qwen3"
    deploy_decoder(model_dir(), "host", decoder, ctx=256)
    onnx = tmp / "minilm.onnx"
    minilm.export_onnx(onnx)
    encoder = minilm_bundle(onnx, tmp / "minilm-ort", "onnxruntime")
    recorded = recorded_limits(encoder, tmp / "minilm-ort-recorded")
    rows = {
        "tiny-qwen3 host bundle (chat)": measure(decoder, "/v1/chat/completions", {
            "model": "tiny-qwen3", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]},
            tmp / "decoder.log"),
        "minilm onnxruntime bundle (embeddings)": measure(encoder, "/v1/embeddings", {
            "model": encoder.name, "input": ["hello world"]}, tmp / "encoder.log"),
        "minilm onnxruntime bundle, id limits in its manifest (embeddings)": measure(
            recorded, "/v1/embeddings", {"model": recorded.name, "input": ["hello world"]}, tmp / "recorded.log"),
    }
    _common.write("serve_main_rss", {"unit": "KiB", "rows": rows})
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    arguments(__doc__).parse_args()
    main()
