"""Testing tools for backend plugins: the conformance kit, small ONNX models, MiniLM helpers, test LLMs (llm).

Imports pytest and onnx; never imported by ``import edgeinfer``.
"""

from .conformance import GAP_KEYS, BackendConformance

__all__ = ["BackendConformance", "GAP_KEYS"]
