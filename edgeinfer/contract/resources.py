"""Accelerators as Ray custom resources: the names a fleet schedules by (docs/fleet.md).

A resource names one kind of schedulable accelerator unit: ``<vendor or SoC>_<unit>`` in lower case
letters, digits and ``_`` (``ascend_310p``, ``ascend_910b``, ``rk3588_npu``, ``intel_npu``, ``intel_gpu``).
Its count is the number of units a replica can hold one of (an Ascend chip as ``npu-smi`` lists it,
one RK3588 NPU, one OpenVINO device). A backend reports what its probe found through
``Backend.accelerators(probe)`` and says which resource a board needs in ``Backend.resource_names``.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

NAME = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)+$")


@dataclass(frozen=True)
class Accelerator:
    resource: str  # Ray custom resource name, NAME
    count: int  # schedulable units on this machine
    memory_bytes: int | None = None  # memory of one unit, when the unit has its own (None: shares the host's)
    source: str = ""  # where the figures came from (npu-smi, the device tree, the runtime's device list)

    def __post_init__(self) -> None:
        problem = name_problem(self.resource)
        if problem:
            raise ValueError(problem)
        if self.count < 1:
            raise ValueError(f"accelerator {self.resource!r}: count must be >= 1, got {self.count}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def name_problem(name: str) -> str | None:
    """Why ``name`` is not a valid resource name, or None."""
    if not isinstance(name, str) or not NAME.match(name):
        return (f"resource name {name!r} does not follow <vendor or soc>_<unit> in lower case letters, digits "
                "and '_' (e.g. ascend_310p, rk3588_npu, intel_npu)")
    if name in ("cpu", "gpu", "memory", "object_store_memory"):
        return f"resource name {name!r} is one of Ray's own"
    return None
