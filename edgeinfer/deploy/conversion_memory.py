"""What converting a decoder for a runtime takes in memory, against what this machine has available: a warning
before a conversion that may not fit, where the runtime's profile says what its converter takes
(``runtimes.yaml`` ``conversion_peak``). rknn-toolkit2 held 6.8 GiB converting SmolLM2-135M
(plugins/rknn/README.md), and a conversion the kernel kills for memory ends a deploy without a word of why."""

from __future__ import annotations

from typing import Any

from edgeinfer.planning.boards import meminfo
from edgeinfer.planning.planner import runtime_profile

MIB, GIB = 2**20, 2**30


def shortfall(plan: Any, segments: int = 1) -> str | None:
    """The warning for converting ``plan``'s model (a ``planner.Plan``) for its runtime in ``segments`` layer-paged
    pieces, or None: the profile gives no ``conversion_peak``, or this machine has the memory it names."""
    peak = runtime_profile(plan.runtime).get("conversion_peak")
    if not peak:
        return None
    need = peak["fixed_mib"] * MIB + peak["per_fp32_byte"] * 4 * plan.model.params_total / max(1, segments)
    available = meminfo()[1]
    if need <= available:
        return None
    return (f"converting for {plan.runtime} may take about {need / GIB:.1f} GiB at its peak (estimated from the "
            f"conversions measured in runtimes.yaml conversion_peak); this machine has {available / GIB:.1f} GiB "
            "available, so the conversion may be killed for lack of memory: close other programs, or deploy on a "
            "machine with more memory")
