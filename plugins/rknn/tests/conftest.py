"""Fixtures shared by the rknn plugin's tests: the STAND-IN RKLLM runtime library."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

RUNTIME_STANDIN_SRC = Path(__file__).with_name("rkllm_standin.c")


@pytest.fixture(scope="session")
def standin_lib(tmp_path_factory) -> Path:
    """librkllmrt.so's stand-in, built from rkllm_standin.c (the real runtime is aarch64-only)."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the stand-in RKLLM runtime")
    out = tmp_path_factory.mktemp("rkllm-standin") / "librkllmrt_standin.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(out), str(RUNTIME_STANDIN_SRC), "-lpthread"],
                   check=True)
    return out
