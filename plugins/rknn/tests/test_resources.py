"""The RK3588 NPU as a Ray custom resource, from the board probe of a stand-in board file tree (no board here)."""

from __future__ import annotations

from pathlib import Path

import edgeinfer


def _board_root_standin(tmp_path: Path) -> Path:
    root = tmp_path / "board_root_standin"
    (root / "proc/device-tree").mkdir(parents=True)
    (root / "proc/device-tree/compatible").write_bytes(b"radxa,rock-5b\x00rockchip,rk3588\x00")
    return root


def test_board_probe_of_standin_tree_is_one_rk3588_npu(tmp_path):
    backend = edgeinfer.backend("rknn")
    [acc] = backend.accelerators(backend._probe_board(_board_root_standin(tmp_path)))
    assert (acc.resource, acc.count, acc.memory_bytes) == ("rk3588_npu", 1, None)  # shares the board's memory


def test_the_simulator_is_no_npu():
    backend = edgeinfer.backend("rknn")
    assert backend.accelerators(backend.probe()) == []  # this machine: simulator mode
