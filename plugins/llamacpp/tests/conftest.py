"""Session fixtures of the llamacpp plugin's tests: skipped, with the line that installs it, without llama_cpp."""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("llama_cpp") is None:
    pytest.skip("llama-cpp-python is not installed: pip install --no-binary llama-cpp-python "
                "llama-cpp-python==0.3.36 (make dev builds it from its source distribution)", allow_module_level=True)
