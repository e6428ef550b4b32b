"""The Rockchip board: detection of the SoC, librknnrt.so, the NPU driver, the DDR governor and RKNNLite's
version, and the NPU core masks. The detection helpers take a ``root`` folder so that tests can point
them at a stand-in file tree. Running a model on the board is in :mod:`.session` (RKNNLite) and
:mod:`.board_decoder` (librknnrt's C API).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from edgeinfer.errors import InputError

# RKNNLite.NPU_CORE_* values (the same numbers as RKNN.NPU_CORE_*)
CORE_MASKS = {"auto": 0x0, "0": 0x1, "1": 0x2, "2": 0x4, "0_1": 0x3, "0_1_2": 0x7, "all": 0xFFFF}
SOCS = ("rk3588", "rk3576", "rk3568", "rk3566", "rk3562", "rv1106", "rv1103", "rv1126b", "rk2118")
RUNTIME_DIRS = ("usr/lib", "usr/lib64", "usr/lib/aarch64-linux-gnu", "usr/local/lib", "lib")
DRIVER_FILES = ("sys/kernel/debug/rknpu/version", "proc/debug/rknpu/version", "sys/module/rknpu/version")
DMC_GOVERNOR = "sys/class/devfreq/dmc/governor"
PINNED_GOVERNORS = ("userspace", "performance")


def core_mask(value: Any) -> int:
    key = str(value if value is not None else "auto").strip().lower().replace(",", "_")
    if key not in CORE_MASKS:
        raise InputError(f"unknown core_mask {value!r}; use one of: {', '.join(CORE_MASKS)}")
    return CORE_MASKS[key]


def soc(root: Path = Path("/")) -> str | None:
    """The Rockchip SoC named in the device tree (``rockchip,rk3588`` ...), or None."""
    try:
        compatible = (root / "proc/device-tree/compatible").read_bytes().decode("ascii", "replace")
    except OSError:
        return None
    for entry in compatible.split("\x00"):
        m = re.fullmatch(r"rockchip,(r[kv]\d+\w*)", entry.strip())
        if m:
            name = m.group(1)
            for s in SOCS:  # rk3588s → rk3588
                if name.startswith(s):
                    return s
            return name
    return None


def runtime_library(root: Path = Path("/")) -> Path | None:
    dirs = [root / d for d in RUNTIME_DIRS]
    dirs += [Path(p) for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p and root == Path("/")]
    for d in dirs:
        if (d / "librknnrt.so").exists():
            return d / "librknnrt.so"
    return None


def is_board(root: Path = Path("/")) -> bool:
    return soc(root) is not None or runtime_library(root) is not None


def runtime_version(lib: Path | None) -> str | None:
    """``librknnrt version: 2.3.0 (...)`` as embedded in the library."""
    if lib is None:
        return None
    try:
        data = lib.read_bytes()
    except OSError:
        return None
    m = re.search(rb"librknnrt version: ?([0-9][\w.+-]*(?: \([^)]*\))?)", data)
    return m.group(1).decode() if m else "unknown"


def driver_version(root: Path = Path("/")) -> str | None:
    for rel in DRIVER_FILES:
        try:
            text = (root / rel).read_text().strip()
        except OSError:
            continue
        m = re.search(r"v?(\d+\.\d+\.\d+)", text)
        return m.group(1) if m else text
    return None


def ddr_governor(root: Path = Path("/")) -> str | None:
    try:
        return (root / DMC_GOVERNOR).read_text().strip()
    except OSError:
        return None


def lite_version() -> str | None:
    from edgeinfer.contract.helpers import package_version

    return package_version("rknn-toolkit-lite2") or package_version("rknn_toolkit_lite2")

