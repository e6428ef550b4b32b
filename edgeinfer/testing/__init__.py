"""Testing tools for backend plugins: the conformance kits (tensors and decoders), small ONNX models,
MiniLM helpers and the test LLMs (``llm``).

Imports pytest and onnx; never imported by ``import edgeinfer``.
"""

from edgeinfer.testing.conformance import GAP_KEYS, BackendConformance
from edgeinfer.testing.decoder_conformance import DecoderConformance

__all__ = ["BackendConformance", "DecoderConformance", "GAP_KEYS"]
