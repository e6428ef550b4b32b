"""Commands that need one backend import only that one: `deploy`, `run`, `golden` and `doctor --board` on the
onnxruntime (host) board never import another plugin's backend module or SDK (a third party's TVM or a vendor
toolkit can take seconds to import, or fail)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# deploy → run → golden → doctor --board in one interpreter (one start-up), then sys.modules on stdout
SCRIPT = """
import json, sys
from edgeinfer import cli
bundle, x = sys.argv[1], sys.argv[2]
codes = [cli.invoke(args) for args in (
    ["deploy", "model.onnx", "--board", "host", "-o", bundle, "--json"],
    ["run", bundle, "--input", "x=" + x, "--json"],
    ["run", "model.onnx", "--input", "x=" + x, "--json"],
    ["golden", bundle],
    ["doctor", "--board", "host", "--json"],
)]
sys.stdout.write("\\nMODULES " + json.dumps({"codes": codes, "modules": sorted(sys.modules)}) + "\\n")
"""
OTHER_SDKS = ("openvino", "openvino_genai", "nncf", "rknn", "rknnlite", "torch", "transformers", "torch_npu", "tvm")


def test_one_backend_commands_import_only_that_backend(tmp_path: Path) -> None:
    import numpy as np

    from edgeinfer.testing.models import mlp

    m = mlp(tmp_path)
    m.path.rename(tmp_path / "model.onnx")
    np.save(tmp_path / "x.npy", m.feeds["x"])
    env = {k: v for k, v in os.environ.items() if k != "EDGEINFER_PLUGINS"}  # every installed plugin is there
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "b"), str(tmp_path / "x.npy")],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.rsplit("\nMODULES ", 1)[1])
    assert result["codes"] == [0, 0, 0, 0, 0], proc.stderr[-3000:]
    modules = set(result["modules"])
    assert "onnxruntime" in modules and "edgeinfer_onnxruntime.backend" in modules
    assert {m.split(".")[0] for m in modules} & set(OTHER_SDKS) == set()
    plugins = {m.split(".")[0] for m in modules if m.startswith("edgeinfer_")}
    assert {"edgeinfer_openvino", "edgeinfer_example"} <= plugins  # installed, their packages imported ...
    backend_modules = {m for m in modules if m.startswith("edgeinfer_") and "." in m}
    assert {m for m in backend_modules if not m.startswith("edgeinfer_onnxruntime.")} == set()  # ... nothing more
