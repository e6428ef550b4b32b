"""Device choice, fallback detection and machine diagnosis: pure functions over plain data.

Nothing here imports openvino: each function takes what the real ``Core`` reports
(``available_devices``, ``EXECUTION_DEVICES``, /proc/cpuinfo text) as arguments,
so tests can feed them the real Core's list and recorded stand-ins for absent hardware.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgeinfer.contract import Problem
from edgeinfer.errors import BackendUnavailableError, InputError

#: physical OpenVINO device families edgeinfer knows, in ``auto`` preference order
PREFERENCE = ("NPU", "GPU", "CPU")
#: OpenVINO virtual devices that take a device list: "AUTO:NPU,CPU", "HETERO:NPU,CPU", ...
VIRTUAL = ("AUTO", "HETERO", "MULTI")

NPU_DRIVER_FIX = (
    "install the Intel NPU driver (https://github.com/intel/linux-npu-driver/releases: intel-driver-compiler-npu, "
    "intel-fw-npu, intel-level-zero-npu and the level-zero loader) on a kernel >= 6.6 with the intel_vpu module, "
    "add your user to the 'render' group, then re-login"
)
GPU_DRIVER_FIX = (
    "install the Intel GPU compute runtime (intel-opencl-icd / intel-level-zero-gpu from "
    "https://github.com/intel/compute-runtime/releases) and add your user to the 'render' group"
)
FIXES = {"NPU": NPU_DRIVER_FIX, "GPU": GPU_DRIVER_FIX, "CPU": "reinstall openvino (pip install -U openvino)"}

_CORE_ULTRA = re.compile(r"Core\s*(\(TM\))?\s*Ultra", re.IGNORECASE)


def family(device: str) -> str:
    """'GPU.1' -> 'GPU'; 'npu' -> 'NPU'; '(CPU)' (as AUTO reports it) -> 'CPU'."""
    return clean(device).upper().split(".", 1)[0]


def clean(device: str) -> str:
    """An EXECUTION_DEVICES entry without the parentheses AUTO puts around it: '(CPU)' -> 'CPU'."""
    return device.strip().strip("()").strip()


def _available_families(available: Sequence[str]) -> list[str]:
    return [family(d) for d in available]


def select_device(requested: str | None, available: Sequence[str]) -> str:
    """The OpenVINO device string to compile for.

    ``None``, ``""`` and ``"auto"`` choose from ``available`` (``Core().available_devices``):
    NPU first, then GPU, then CPU. A plain name (``npu``, ``GPU.1``) must be available.
    ``AUTO:NPU,CPU`` / ``HETERO:...`` / ``MULTI:...`` pass through to OpenVINO's own virtual
    devices once every listed device is known and at least one of them is available.
    Unknown names raise :class:`InputError`; known but absent ones :class:`BackendUnavailableError`.
    """
    avail = [d.upper() for d in available]
    here = ", ".join(avail) or "none"
    choices = "CPU, GPU, NPU, auto, or AUTO:/HETERO:/MULTI: with a device list"
    req = (requested or "").strip()
    if req.lower() in ("", "auto"):
        fams = _available_families(avail)
        for want in PREFERENCE:
            if want in fams:
                # 'GPU' is OpenVINO's alias of the first GPU; keep the bare family name when present
                return want if want in avail else avail[fams.index(want)]
        raise BackendUnavailableError(
            f"OpenVINO reports no usable device (available: {here})", "reinstall openvino: pip install -U openvino"
        )
    upper = req.upper()
    head, colon, tail = upper.partition(":")
    if colon:
        if head not in VIRTUAL:
            raise InputError(f"unknown OpenVINO device {req!r}; use one of: {choices}")
        listed = [d.strip() for d in tail.split(",") if d.strip()]
        if not listed:
            raise InputError(f"device {req!r} lists no devices; write e.g. {head}:NPU,CPU")
        for d in listed:
            if family(d) not in PREFERENCE:
                raise InputError(f"unknown OpenVINO device {d!r} in {req!r}; use one of: {choices}")
        fams = _available_families(avail)
        if not any(family(d) in fams for d in listed):
            first = family(listed[0])
            raise BackendUnavailableError(
                f"none of the devices in {req!r} is available here (available: {here})", FIXES[first]
            )
        return f"{head}:{','.join(listed)}"
    if family(upper) not in PREFERENCE:
        raise InputError(f"unknown OpenVINO device {req!r} (available here: {here}); use one of: {choices}")
    if upper in avail or (upper in PREFERENCE and upper in _available_families(avail)):
        return upper
    raise BackendUnavailableError(
        f"OpenVINO device {upper} is not available on this machine (available: {here})",
        FIXES[family(upper)] if family(upper) not in _available_families(avail) else f"use one of {here}",
    )


def requested_primary(device: str) -> str:
    """The device a user asked for first: 'AUTO:NPU,CPU' -> 'NPU', 'GPU.1' -> 'GPU'."""
    head, colon, tail = device.upper().partition(":")
    if colon and head in VIRTUAL:
        listed = [d.strip() for d in tail.split(",") if d.strip()]
        return family(listed[0]) if listed else head
    return family(head)


def fallback_warning(device: str, execution_devices: Sequence[str]) -> str | None:
    """A warning when the compiled model does not run on the device asked for first
    (e.g. ``AUTO:NPU,CPU`` that silently ended up on the CPU), else None."""
    want = requested_primary(device)
    got = [family(d) for d in execution_devices]
    if not got or want in got:
        return None
    return (
        f"OpenVINO was asked for {want} ({device}) but executes the model on "
        f"{', '.join(clean(d) for d in execution_devices)}; "
        + (f"the NPU is missing or refused the model — {NPU_DRIVER_FIX}" if want == "NPU" else f"check {want}")
    )


def diagnose(cpu_model: str, devices: Sequence[str], accel_nodes: Sequence[str] = ()) -> list[Problem]:
    """Problems with their fixes, from the CPU model name (/proc/cpuinfo), the devices OpenVINO
    reports and the /dev/accel nodes the kernel exposes."""
    problems: list[Problem] = []
    fams = _available_families(devices)
    if not devices:
        problems.append(Problem("OpenVINO reports no devices at all", "reinstall openvino: pip install -U openvino"))
    if cpu_model and _CORE_ULTRA.search(cpu_model) and "NPU" not in fams:
        if accel_nodes:
            problems.append(
                Problem(
                    f"{cpu_model.strip()} has an NPU and the kernel exposes {', '.join(accel_nodes)}, "
                    "but OpenVINO sees no NPU device",
                    "install the user-space NPU driver (intel-level-zero-npu and the level-zero loader, "
                    "https://github.com/intel/linux-npu-driver/releases) matching this OpenVINO, and give your "
                    "user access to /dev/accel: sudo usermod -aG render $USER, then re-login",
                )
            )
        else:
            problems.append(
                Problem(
                    f"{cpu_model.strip()} has an NPU but OpenVINO sees no NPU device (no /dev/accel node)",
                    NPU_DRIVER_FIX,
                )
            )
    return problems


def cpu_model_name(cpuinfo_text: str) -> str:
    """The 'model name' line of /proc/cpuinfo text, or ''."""
    for line in cpuinfo_text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "model name":
            return value.strip()
    return ""


NPU_PROPERTIES = {
    "name": "FULL_DEVICE_NAME",
    "architecture": "DEVICE_ARCHITECTURE",
    "driver_version": "NPU_DRIVER_VERSION",
    "compiler_version": "NPU_COMPILER_VERSION",
    "total_memory_bytes": "NPU_DEVICE_TOTAL_MEM_SIZE",
    "gops": "DEVICE_GOPS",
}


def npu_details(get_property: Any) -> dict[str, Any]:
    """NPU facts through ``get_property(name)`` (``lambda p: core.get_property("NPU", p)``);
    properties the driver does not report are left out."""
    out: dict[str, Any] = {}
    for key, prop in NPU_PROPERTIES.items():
        try:
            value = get_property(prop)
        except Exception:
            continue
        out[key] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return out


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def _accel_nodes() -> list[str]:
    d = Path("/dev/accel")
    return sorted(str(p) for p in d.iterdir()) if d.is_dir() else []
