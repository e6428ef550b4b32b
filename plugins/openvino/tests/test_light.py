"""The plugin is imported on CLI start and the backend class on first use: neither may import
openvino, nncf, onnx or torch (only probe/convert/open do)."""

import os
import subprocess
import sys

HEAVY = {"openvino", "nncf", "onnx", "torch", "onnxruntime"}


def test_plugin_and_backend_class_do_not_load_the_sdk():
    code = (
        "import edgeinfer, sys; b = edgeinfer.backend('openvino'); b.versions(); "
        "import edgeinfer_openvino.backend, edgeinfer_openvino.device; print(sorted(sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env=dict(os.environ, EDGEINFER_PLUGINS="openvino"))
    loaded = {m.split(".")[0] for m in eval(proc.stdout)}
    assert "edgeinfer_openvino" in loaded
    assert not loaded & HEAVY, loaded & HEAVY
