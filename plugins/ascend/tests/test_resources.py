"""Ascend chips as Ray custom resources, from the probe of an `npu-smi` stand-in that prints recorded outputs
(no Ascend hardware here). Expected counts and memory were read by hand from the fixture files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from edgeinfer_ascend import resources

from edgeinfer.cli import invoke

FIXTURES = Path(__file__).parent / "fixtures"


def _npu_smi_standin(bin_dir: Path, fixture: str) -> None:
    exe = bin_dir / "npu-smi"
    exe.write_text(f"#!/bin/sh\ncat '{FIXTURES / fixture}'\n")
    exe.chmod(0o755)


@pytest.mark.parametrize("chip,want", [("910B4", "ascend_910b"), ("310P3", "ascend_310p"),
                                       ("Ascend910", "ascend_910"), ("310B1", "ascend_310b"), ("NA", None)])
def test_chip_names_to_resource_names(chip, want):
    assert resources.resource_name(chip) == want


@pytest.mark.parametrize("fixture,name,count,memory_mb", [
    # two 310P3 chips of one Duo card, 44280 and 43693 MB: the smaller is what every replica can count on
    ("recorded_npu_smi_310p3_atlas300i_duo.txt", "ascend_310p", 2, 43693),
    ("recorded_npu_smi_910b4.txt", "ascend_910b", 2, 32768),
    ("recorded_npu_smi_a3_ascend910_wide.txt", "ascend_910", 2, 65536),
])
def test_probe_of_npu_smi_standin_gives_one_unit_per_chip(ascend, tmp_path, monkeypatch, fixture, name, count,
                                                          memory_mb):
    _npu_smi_standin(tmp_path, fixture)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    [acc] = ascend.accelerators(ascend.probe())
    assert (acc.resource, acc.count, acc.memory_bytes) == (name, count, memory_mb * 2**20)


def test_ray_resources_command_with_npu_smi_standin(tmp_path, monkeypatch, capsys):
    _npu_smi_standin(tmp_path, "recorded_npu_smi_310p3_atlas300i_duo.txt")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert invoke(["ray-resources", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["resources"]["ascend_310p"] == 2
    assert report["labels"]["edgeinfer.io/ascend_310p-memory-mb"] == "43693"


def test_no_npu_smi_no_resource(ascend, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert ascend.accelerators(ascend.probe()) == []

