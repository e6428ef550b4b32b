"""Testing tools for backend plugins: the conformance kit, small ONNX models, MiniLM helpers.

Imports pytest and onnx; never imported by ``import edgeinfer``.
"""

from edgeinfer.testing.conformance import GAP_KEYS, BackendConformance

__all__ = ["BackendConformance", "GAP_KEYS"]
