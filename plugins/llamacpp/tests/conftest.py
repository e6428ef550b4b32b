"""The llamacpp plugin's tests skip, with the line that installs it, where llama-cpp-python is not installed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

HERE = Path(__file__).parent
WHY = ("llama-cpp-python is not installed: pip install --no-binary llama-cpp-python llama-cpp-python==0.3.36 "
       "(make dev builds it from its source distribution)")


def pytest_collection_modifyitems(config, items):
    if importlib.util.find_spec("llama_cpp") is not None:
        return
    for item in items:
        if HERE in Path(item.fspath).parents:
            item.add_marker(pytest.mark.skip(reason=WHY))
