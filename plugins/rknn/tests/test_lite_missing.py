"""On a board without rknn-toolkit-lite2, loading a .rknn on the NPU is exit 3, kind package_missing, naming it
(this x86 machine has no RKNNLite: the same import fails here as on such a board)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from edgeinfer.errors import BackendUnavailableError


def test_board_runtime_without_rknnlite_names_the_package(tmp_path: Path) -> None:
    if importlib.util.find_spec("rknnlite") is not None:
        pytest.skip("RKNNLite is installed here")
    from edgeinfer_rknn.session import LiteRuntime

    with pytest.raises(BackendUnavailableError) as e:
        LiteRuntime(tmp_path / "model.rknn", 0)
    assert (e.value.kind, e.value.exit_code) == ("package_missing", 3)
    assert "needs the Python package 'rknnlite', which is not installed" in e.value.message
    assert "pip install 'rknn-toolkit-lite2'" in e.value.hint
