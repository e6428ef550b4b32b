"""Fixtures of the onnxruntime plugin's tests."""

from __future__ import annotations

import pytest
from edgeinfer_onnxruntime import custom_ops


@pytest.fixture(params=list(custom_ops.ISAS))
def build(request, monkeypatch):
    """Each build of the own ops' library this CPU runs, pinned through $EDGEINFER_KERNEL_ISA."""
    monkeypatch.setenv(custom_ops.ISA_ENV, request.param)
    if custom_ops.isa() is None:
        pytest.skip(f"this CPU does not run the {request.param} build: {custom_ops.unavailable()}")
    return request.param
