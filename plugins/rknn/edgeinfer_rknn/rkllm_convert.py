"""Convert a Hugging Face causal LM to ``.rkllm`` with Rockchip's RKLLM toolkit (``from rkllm.api import RKLLM``).

The toolkit is not on PyPI: its x86_64 wheels are in https://github.com/airockchip/rknn-llm/tree/main/rkllm-toolkit/packages
(rkllm_toolkit-1.3.0, CPython 3.9-3.12; rknn-llm #507). It is not installed here, so :func:`convert_rkllm`
has never run: it follows the vendor's example
https://github.com/airockchip/rknn-llm/blob/878f9361fd3afa7e167b7079918918f78d2c1c2a/examples/rkllm_api_demo/export/export_rkllm.py
(load_huggingface → build → export_rkllm). It is meant for the rknn backend's ``convert_decoder`` to call
when given the convert option ``runtime="rkllm"`` (``edgeinfer deploy LLM --board rk3588-8g --option
runtime=rkllm``); that dispatch belongs to the RKNN decoder export and is not wired on this branch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgeinfer.errors import BackendError, BackendUnavailableError, InputError

ARTIFACT = "model.rkllm"
GET_TOOLKIT = ("install the RKLLM toolkit wheel for your Python from "
               "https://github.com/airockchip/rknn-llm/tree/main/rkllm-toolkit/packages (x86_64 Linux; not on PyPI)")
# rkllm.build quantized_dtype per target (SDK 1.3.0 table, as in the board profiles' rkllm runtimes)
DTYPES = {"rk3588": ("w8a8", "w8a8_g128", "w8a8_g256", "w8a8_g512"),
          "rk3576": ("w4a16", "w4a16_g32", "w4a16_g64", "w4a16_g128", "w8a8")}


def build_args(scheme: str, target: str, context: int, dataset: str | None) -> dict[str, Any]:
    """The keyword arguments of ``RKLLM.build`` for an edgeinfer scheme and target."""
    t = target.lower()
    if t not in DTYPES:
        raise InputError(f"RKLLM builds for {', '.join(DTYPES)}, not {target!r}")
    if scheme not in DTYPES[t]:
        raise InputError(f"RKLLM on {t} supports {', '.join(DTYPES[t])}, not {scheme}")
    return {"do_quantization": True, "optimization_level": 1, "quantized_dtype": scheme.upper(),
            "quantized_algorithm": "grq" if scheme.startswith("w4") else "normal", "target_platform": t.upper(),
            "num_npu_core": 3 if t == "rk3588" else 2, "extra_qparams": None, "dataset": dataset,
            "hybrid_rate": 0, "max_context": context}


def _toolkit() -> Any:
    try:
        from rkllm.api import RKLLM  # type: ignore[import-not-found]
    except ImportError:
        raise BackendUnavailableError("the RKLLM toolkit (package rkllm-toolkit, rkllm.api) is not installed",
                                      GET_TOOLKIT) from None
    return RKLLM


def _dataset(calibration: Sequence[str] | None, out: Path) -> str | None:
    """Calibration text as the toolkit's JSON dataset ([{"input": ..., "target": ""}, ...])."""
    if not calibration:
        return None
    path = out / "calibration.json"
    path.write_text(json.dumps([{"input": t, "target": ""} for t in calibration], ensure_ascii=False))
    return str(path)


def convert_rkllm(model: Path, scheme: str, context: int, out: Path, calibration: Sequence[str] | None = None,
                  target: str = "rk3588") -> dict[str, Any]:
    """Write ``out/model.rkllm``; return stamp facts. Never run here (no toolkit installed)."""
    RKLLM = _toolkit()
    args = build_args(scheme, target, context, _dataset(calibration, out))
    llm = RKLLM()
    for step, call in (("load_huggingface", lambda: llm.load_huggingface(model=str(model), device="cpu")),
                       ("build", lambda: llm.build(**args)),
                       ("export_rkllm", lambda: llm.export_rkllm(str(out / ARTIFACT)))):
        code = call()
        if code != 0:
            raise BackendError(f"RKLLM toolkit {step} failed (code {code}) for {model.name}")
    return {"target": target.lower(), "runtime": "rkllm", "scheme": scheme, "context": context}
