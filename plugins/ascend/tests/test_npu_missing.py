"""Asking for an NPU where torch_npu is not installed is exit 3, kind package_missing, naming what to install."""

from __future__ import annotations

import pytest

from edgeinfer.errors import BackendUnavailableError


def test_npu_device_without_torch_npu_is_package_missing() -> None:
    from edgeinfer_ascend import device

    if device.torch_npu_installed():
        pytest.skip("torch_npu is installed here")
    with pytest.raises(BackendUnavailableError) as e:
        device.pick_device("npu:0")
    assert (e.value.kind, e.value.exit_code) == ("package_missing", 3)
    assert "needs the Python package 'torch_npu', which is not installed" in e.value.message
    assert "torch_npu release that matches your CANN" in e.value.hint
