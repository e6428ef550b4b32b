"""`edgeinfer deploy --json` for an OpenVINO board: stdout is the JSON and nothing else, and NNCF's bit-width
table and progress bar (native output of the conversion, printed on stdout by NNCF's own log handler) stay off
stderr too without --verbose. A process of its own: the point is what reaches file descriptors 1 and 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from edgeinfer.testing import models


def test_deploy_json_with_nncf_weight_compression_prints_only_the_json(tmp_path) -> None:
    model = models.mlp(tmp_path, batch=2).path  # the smallest model NNCF compresses (one MatMul)
    env = {k: v for k, v in os.environ.items()  # the libraries' defaults, and C stdio buffered as in a pipeline
           if k not in ("EDGEINFER_VERBOSE", "EDGEINFER_DEBUG", "PYTHONUNBUFFERED")}
    env["EDGEINFER_CACHE_DIR"] = str(tmp_path / "cache")
    args = ["deploy", str(model), "--board", "core-ultra-155h", "--quant", "w8a16", "-o", str(tmp_path / "bundle"),
            "--json"]
    proc = subprocess.run([sys.executable, "-m", "edgeinfer.cli", *args], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["backend"] == "openvino" and report["scheme"] == "w8a16" and report["golden"]["passed"]
    stamp = json.loads((tmp_path / "bundle" / "model.xml.stamp.json").read_text())
    assert stamp["method"].startswith("nncf.compress_weights")  # NNCF did run (and would have printed)
    for noise in ("nncf", "bitwidth", "Weight compression mode", "Applying Weight Compression", "━"):
        assert noise not in proc.stderr, proc.stderr
