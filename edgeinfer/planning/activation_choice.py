"""The plan's weights with int8 activations, where its runtime decodes those faster: ``plan``'s
``suggestions.activations``.

A scheme names the bits of its weights and of its activations (w8a16: 8-bit weights, float activations). A
runtime can be fast at one and slow at the other: onnxruntime on a CPU has int8-activation kernels for 8- and
4-bit weights (``MatMulNBits`` at accuracy level 4, the activations quantized to int8 per block inside the kernel,
as llama.cpp's Q8_0 and Q4 dot products quantize theirs) and no fast one for float activations (bench/README.md,
"runtime_kernels.py"): host w4a16 decodes at about half of w4a8's speed, and w8a16 runs w8a8's kernel over two int8
digits of its activations (the onnxruntime plugin's int8_digits.py), more work per token than w8a8. The plan names
the scheme of its own runtime with the same weight bits and group and 8-bit activations when that fits at the
same context and batch and its decode estimate is at least ``runtime_choice.FASTER`` (1.2) times the plan's. The
price is the activations' rounding, which the deploy golden check measures against the fp32 reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edgeinfer.contract.schemes import normalize_scheme
from edgeinfer.errors import EdgeInferError
from edgeinfer.planning.runtime_choice import faster_plan


def int8_activations(p: Any, plan: Callable[..., Any]) -> dict[str, Any] | None:
    """The suggestion for plan ``p`` (a ``planner.Plan``; ``plan`` is ``planner.plan``), or None."""
    s = p.scheme
    if p.model.encoder or p.model.runtime or s.kind != "int" or s.act_bits <= 8 \
            or not p.estimates.decode_tokens_per_s or p.details.paging is not None:
        return None
    try:
        want = normalize_scheme(f"w{s.weight_bits}a8" + (f"_g{s.group_size}" if s.group_size else ""))
    except EdgeInferError:
        return None
    if want.family not in p.board.runtimes[p.runtime].schemes:
        return None
    found = faster_plan(p, plan, quant=want.name, runtime=p.runtime)
    return {"quant": want.name, **found[1]} if found else None
