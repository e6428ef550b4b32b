"""NPU load gauges from recorded RKNPU `load` files (fixtures/SOURCES.md names their public sources).
Expected values were read by hand from the fixture files."""

from __future__ import annotations

from pathlib import Path

import pytest
from edgeinfer_rknn import gauges

import edgeinfer

FIXTURES = Path(__file__).parent / "fixtures"


def _load(fixture: str) -> str:
    return (FIXTURES / fixture).read_text()


def test_three_busy_cores():
    assert gauges.parse_load(_load("recorded_rknpu_load_rk3588_busy.txt")) == {
        "core0": 0.63, "core1": 0.65, "core2": 0.64}


def test_padded_percentages_and_an_idle_core():
    assert gauges.parse_load(_load("recorded_rknpu_load_rk3588_mixed.txt")) == {
        "core0": 0.21, "core1": 0.11, "core2": 0.0}


def test_overflowed_core_is_left_out():
    assert gauges.parse_load(_load("recorded_rknpu_load_rk3588_overflow.txt")) == {"core0": 0.99, "core1": 0.99}


def test_single_core_npu():
    # rknpu_load_show on a one-core NPU (RK3566/RK3568): "NPU load: " then "%2.d%%" and a newline
    assert gauges.parse_load("NPU load: " + "%2d%%" % 7 + "\n") == {"npu": 0.07}


def test_not_a_load_line_raises():
    with pytest.raises(ValueError, match="not an RKNPU load line"):
        gauges.parse_load("Permission denied\n")


def _board(root: Path, rel: str, fixture: str) -> Path:
    f = root / rel
    f.parent.mkdir(parents=True)
    f.write_text(_load(fixture))
    return root


def test_readings_from_debugfs_then_procfs(tmp_path):
    debugfs = _board(tmp_path / "a", "sys/kernel/debug/rknpu/load", "recorded_rknpu_load_rk3588_mixed.txt")
    assert [(r.device, r.utilization) for r in gauges.readings(debugfs)] == [
        ("core0", 0.21), ("core1", 0.11), ("core2", 0.0)]
    procfs = _board(tmp_path / "b", "proc/debug/rknpu/load", "recorded_rknpu_load_rk3588_busy.txt")
    assert [r.utilization for r in gauges.readings(procfs)] == [0.63, 0.65, 0.64]
    assert all(r.memory_used_bytes is None for r in gauges.readings(procfs))  # the NPU shares the DDR


def test_no_driver_no_readings(tmp_path):
    assert gauges.readings(tmp_path) == []
    # this machine has no RKNPU: the backend reports nothing rather than failing
    assert edgeinfer.backend("rknn").device_readings(["0"]) == []
