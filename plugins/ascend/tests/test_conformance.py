"""The shared conformance kit. The ascend backend takes torch.export programs, not ONNX, so the
kit converts its models from their .pt2 variants (same weights, same NumPy references)."""

from __future__ import annotations

from edgeinfer.testing import BackendConformance


class TestAscendConformance(BackendConformance):
    backend_name = "ascend"
    load_options = {"warmup": False}
