"""A third party's test suite with no conftest: the kit's `slow` marker is registered by edgeinfer's pytest plugin
(the `pytest11` entry point), and the slow case deselects with `-m "not slow"`."""

from __future__ import annotations

import subprocess
import sys

THIRD_PARTY_TEST = '''
from edgeinfer.testing import BackendConformance


class TestMyBackendConformance(BackendConformance):
    backend_name = "example"
'''


def test_a_suite_without_conftest_knows_the_slow_marker(tmp_path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # the third party's own (empty) configuration
    (tmp_path / "test_mine.py").write_text(THIRD_PARTY_TEST)
    # collection imports the kit, whose slow case is marked: an unknown marker would be an error here
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "not slow", "-p", "no:cacheprovider",
         "--strict-markers", "-W", "error::pytest.PytestUnknownMarkWarning", "test_mine.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Unknown pytest.mark" not in out and "slow' not found" not in out
    assert "test_run_matches_numpy_reference" in out  # the kit's cases are collected ...
    assert "test_paged_minilm_matches_the_whole_model" not in out  # ... but the slow one deselects
