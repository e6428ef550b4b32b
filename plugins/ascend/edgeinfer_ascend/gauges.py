"""Chip load and memory for /metrics, from ``npu-smi info``
(parsed by :func:`edgeinfer_ascend.doctor.parse_npu_smi_info`).

Per chip: ``AICore(%)`` as the utilisation, and the memory pair the doctor picks (``HBM-Usage(MB)`` on cards
with HBM, else the DDR ``Memory-Usage(MB)`` of 310P cards); npu-smi's MB are MiB.
"""

from __future__ import annotations

from edgeinfer.contract.backend import DeviceReading

from . import device as dev
from . import doctor

MIB = 1024 * 1024
NPU_SMI_TIMEOUT_S = 3.0  # scrape-time budget; npu-smi info usually answers well within a second


def chip_readings(info: doctor.NpuSmiInfo) -> list[DeviceReading]:
    """One reading per chip, named ``<npu>.<chip>`` as npu-smi numbers them."""
    return [
        DeviceReading(
            f"{c.npu}.{c.chip}",
            utilization=c.aicore_pct / 100.0 if c.aicore_pct is not None else None,
            memory_used_bytes=c.memory_used_mb * MIB if c.memory_used_mb is not None else None,
            memory_total_bytes=c.memory_total_mb * MIB if c.memory_total_mb else None,
        )
        for c in info.chips
    ]


def readings() -> list[DeviceReading]:
    """Every chip npu-smi lists now; [] when npu-smi is absent or fails."""
    text, _why = dev.run_npu_smi(timeout=NPU_SMI_TIMEOUT_S)
    return chip_readings(doctor.parse_npu_smi_info(text)) if text is not None else []
