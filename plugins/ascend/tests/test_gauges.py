"""Device gauges from recorded `npu-smi info` tables (fixtures/SOURCES.md names their public sources).
Expected values were read by hand from the fixture files."""

from __future__ import annotations

import os

import pytest
from edgeinfer_ascend import doctor, gauges

from .conftest import FIXTURES
from .test_doctor import _fake_npu_smi_standin

MIB = 1024 * 1024


def _readings(fixture: str):
    return gauges.chip_readings(doctor.parse_npu_smi_info((FIXTURES / fixture).read_text()))


def test_910b4_hbm_use_and_aicore_load():
    r = _readings("recorded_npu_smi_910b4.txt")
    assert [x.device for x in r] == ["0.0", "1.0"]
    assert [x.memory_used_bytes for x in r] == [26838 * MIB, 29356 * MIB]
    assert [x.memory_total_bytes for x in r] == [32768 * MIB, 32768 * MIB]
    assert [x.utilization for x in r] == [0.0, 0.0]


def test_310p3_ddr_memory_per_chip():
    r = _readings("recorded_npu_smi_310p3_atlas300i_duo.txt")
    assert [x.device for x in r] == ["2.0", "2.1"]
    assert [(x.memory_used_bytes, x.memory_total_bytes) for x in r] == [(1529 * MIB, 44280 * MIB),
                                                                          (1412 * MIB, 43693 * MIB)]


def test_a3_wide_layout_two_chips_per_npu():
    r = _readings("recorded_npu_smi_a3_ascend910_wide.txt")
    assert [x.device for x in r] == ["0.0", "0.1"]
    assert [x.memory_used_bytes for x in r] == [3419 * MIB, 2874 * MIB]
    assert all(x.memory_total_bytes == 65536 * MIB for x in r)


def test_aicore_percent_becomes_a_ratio():
    text = (FIXTURES / "recorded_npu_smi_910b4.txt").read_text()
    row = "| 0           0    / 0          26838/ 32768"
    busy = text.replace(row, "| 57" + row[4:])
    assert busy != text
    [first, second] = gauges.chip_readings(doctor.parse_npu_smi_info(busy))
    assert first.utilization == pytest.approx(0.57) and second.utilization == 0.0


def test_backend_reads_npu_smi_and_is_silent_without_it(tmp_path, monkeypatch, ascend):
    _fake_npu_smi_standin(tmp_path, "recorded_npu_smi_910b4.txt")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}/usr/bin:/bin")
    assert [x.memory_used_bytes for x in ascend.device_readings([""])] == [26838 * MIB, 29356 * MIB]
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert ascend.device_readings([""]) == []
