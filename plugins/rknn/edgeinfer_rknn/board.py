"""On-board side: detection of a Rockchip board and the RKNNLite runtime (rknn-toolkit-lite2).

This is the only module that talks to RKNNLite. It is written against RKNNLite's documented
API: ``RKNNLite()``, ``load_rknn(path)``, ``init_runtime(core_mask=...)``,
``inference(inputs=[...], data_format=...)``, ``get_sdk_version()``, ``release()`` and, where
the installed version has them, ``eval_perf()`` / ``eval_memory()`` (with ``perf_debug`` /
``eval_mem`` passed to ``init_runtime``). No board is attached to the development machines,
so this path is exercised only on a board; the detection helpers take a ``root`` folder so
that tests can point them at a stand-in file tree.
"""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

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


class LiteRuntime:
    """One .rknn model loaded on the board's NPU through RKNNLite."""

    def __init__(self, artifact: Path, mask: int, perf: bool = False):
        from rknnlite.api import RKNNLite

        self._lite = RKNNLite(verbose=False)
        if self._lite.load_rknn(str(artifact)) != 0:
            self._lite.release()
            raise InputError(f"RKNNLite could not load {artifact.name}; convert it again for this board")
        params = inspect.signature(self._lite.init_runtime).parameters
        kwargs: dict[str, Any] = {"core_mask": mask}
        self.perf = perf and "perf_debug" in params
        if self.perf:
            kwargs["perf_debug"] = True
            if "eval_mem" in params:
                kwargs["eval_mem"] = True
        if self._lite.init_runtime(**kwargs) != 0:
            self._lite.release()
            raise InputError(
                f"RKNNLite could not start the NPU runtime for {artifact.name} (core_mask {mask:#x}); "
                "check that librknnrt.so matches the toolkit version that built the model"
            )

    def sdk_version(self) -> str:
        try:
            return str(self._lite.get_sdk_version())
        except Exception:
            return "unknown"

    def inference(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        fmt = ["nchw" if a.ndim == 4 else "nhwc" for a in arrays]
        outs = self._lite.inference(inputs=arrays, data_format=fmt)
        if outs is None:
            raise RuntimeError("RKNNLite inference returned nothing (see the runtime log above)")
        return list(outs)

    def eval_perf(self) -> Any:
        fn = getattr(self._lite, "eval_perf", None)
        return fn(is_print=False) if (fn and self.perf) else None

    def eval_memory(self) -> Any:
        fn = getattr(self._lite, "eval_memory", None)
        return fn(is_print=False) if (fn and self.perf) else None

    def release(self) -> None:
        self._lite.release()


_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}


def parse_perf_table(text: str) -> list[tuple[str, str, float, str]]:
    """Per-layer rows of an ``eval_perf()`` report (perf_debug=True):
    ``ID OpType DataType Target InputShape OutputShape Cycles Time(us) ... FullName``
    → (full name, op type, time in ms, target), slowest first."""
    rows = []
    for line in str(text).splitlines():
        parts = line.split()
        if len(parts) < 8 or not parts[0].isdigit():
            continue
        cyc = next((i for i, p in enumerate(parts) if re.fullmatch(r"\d+/\d+/\d+", p)), None)
        if cyc is None or cyc + 1 >= len(parts) or not re.fullmatch(r"[\d.]+", parts[cyc + 1]):
            continue
        rows.append((parts[-1], parts[1], float(parts[cyc + 1]) / 1e3, parts[3]))
    return sorted(rows, key=lambda r: r[2], reverse=True)


def parse_memory(text: Any) -> int | None:
    """``Total Memory: 19.12 MiB`` of an ``eval_memory()`` report, in bytes."""
    if isinstance(text, dict):
        for key in ("total_memory", "Total Memory", "total"):
            if isinstance(text.get(key), (int, float)):
                return int(text[key])
        text = "\n".join(f"{k}: {v}" for k, v in text.items())
    m = re.search(r"Total Memory:\s*([\d.]+)\s*(B|KiB|MiB|GiB|KB|MB|GB)", str(text))
    return int(float(m.group(1)) * _UNITS[m.group(2)]) if m else None
