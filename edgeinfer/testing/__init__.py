"""Testing tools for backend plugins: the conformance kits (tensors and decoders), small ONNX models,
MiniLM helpers and the test LLMs (``llm``).

The kits import pytest and onnx when first used (``from edgeinfer.testing import BackendConformance``):
``edgeinfer.testing.pytest_plugin``, which pytest loads in every run, stays light. Never imported by
``import edgeinfer``. What they need: ``pip install 'edgeinfer[testing]'``.
"""

from typing import Any

__all__ = ["BackendConformance", "DecoderConformance", "GAP_KEYS"]


def __getattr__(name: str) -> Any:  # PEP 562: the kits load on first use
    if name in ("BackendConformance", "GAP_KEYS"):
        from edgeinfer.testing import conformance

        return getattr(conformance, name)
    if name == "DecoderConformance":
        from edgeinfer.testing.decoder_conformance import DecoderConformance

        return DecoderConformance
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
