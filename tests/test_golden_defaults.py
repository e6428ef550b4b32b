"""Default golden thresholds per scheme: activation quantization gets 0.98, everything else 0.99."""

import numpy as np
import pytest

from edgeinfer.deploy import golden


@pytest.mark.parametrize("scheme, expected", [
    ("w8a8", 0.98), ("w8a8_g128", 0.98), ("w4a8", 0.98),
    ("fp32", 0.99), ("fp16", 0.99), ("w8a16", 0.99), ("w4a16_g128", 0.99),
])
def test_default_threshold_per_scheme(scheme: str, expected: float) -> None:
    assert golden.default_threshold(scheme) == expected


def test_a_cosine_between_the_two_defaults_passes_int8_and_fails_fp16() -> None:
    """0.986, the worst token cosine of a correct int8 MiniLM on ordinary sentences (issue 12)."""
    ref = np.array([[1.0, 0.0]])
    angle = np.arccos(0.986)
    cand = np.array([[np.cos(angle), np.sin(angle)]])
    feeds = [{"x": np.zeros((1, 1))}]
    int8 = golden.compare([{"y": ref}], [{"y": cand}], feeds, golden.default_threshold("w8a8"))
    fp16 = golden.compare([{"y": ref}], [{"y": cand}], feeds, golden.default_threshold("fp16"))
    assert int8["passed"] and not fp16["passed"]
