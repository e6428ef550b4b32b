"""Convert a Hugging Face causal LM to ``.rkllm`` with Rockchip's RKLLM toolkit (``from rkllm.api import RKLLM``).

The rknn backend's ``convert_decoder`` calls :func:`convert_rkllm` when given the convert option
``runtime="rkllm"`` (``edgeinfer deploy LLM --board rk3588-8g --runtime rkllm``). The calls follow the
vendor's example (load_huggingface → build → export_rkllm, calibration as ``[{"input": ..., "target": ...}]``)
https://github.com/airockchip/rknn-llm/blob/cb5b341364311065fd19eddd631a79a9f0c5afe1/examples/DeepSeek-R1-Distill-Qwen-1.5B_Demo/export/export_rkllm.py

The toolkit is not on PyPI and exists for x86_64 Linux only: its wheels are in
https://github.com/airockchip/rknn-llm/tree/main/rkllm-toolkit/packages (rknn-llm #507, #185). It is not
installed here, so this module has only run against a stand-in package in the tests
(``plugins/rknn/tests/rkllm_toolkit_standin``), never against the real toolkit.

The artifact directory holds ``model.rkllm`` and the model's ``config.json`` (the RKLLM runtime does not say
its vocabulary size). Its stamp says ``runtime: rkllm`` and, under ``unchecked``, why deploy's golden
check cannot run: the RKLLM runtime (``librkllmrt.so``) exists for aarch64 boards only.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgeinfer.contract.helpers import package_version
from edgeinfer.errors import BackendError, BackendUnavailableError, InputError

from .targets import GET_TOOLKIT, TOOLKIT

ARTIFACT = "model.rkllm"
RUNTIMES = ("rknn", "rkllm")  # the rknn backend's decoder runtimes: its own RKNN graphs, Rockchip's RKLLM
UNCHECKED = ("the RKLLM runtime (librkllmrt.so) runs on aarch64 boards only, so a .rkllm model cannot be "
             "compared with the fp32 reference here")
# rkllm.build quantized_dtype per target (SDK 1.3.0 table, as in the board profiles' rkllm runtimes)
DTYPES = {"rk3588": ("w8a8", "w8a8_g128", "w8a8_g256", "w8a8_g512"),
          "rk3576": ("w4a16", "w4a16_g32", "w4a16_g64", "w4a16_g128", "w8a8")}
OPTIMIZATION_LEVEL = 1  # the vendor examples' value


def runtime_of(value: Any) -> str:
    """The decoder convert option ``runtime``: rknn (default) or rkllm; anything else is an input error."""
    runtime = "rknn" if value is None else str(value).lower()
    if runtime not in RUNTIMES:
        raise InputError(f"runtime must be one of {', '.join(RUNTIMES)}, not {value!r}")
    return runtime


def is_rkllm(path: Path) -> bool:
    """A ``.rkllm`` file, or an artifact directory written by :func:`convert_rkllm`."""
    return path.suffix.lower() == ".rkllm" or (path.is_dir() and (path / ARTIFACT).is_file())


def rkllm_file(path: Path) -> Path:
    return path / ARTIFACT if path.is_dir() else path


def build_args(scheme: str, target: str, context: int, dataset: str | None) -> dict[str, Any]:
    """The keyword arguments of ``RKLLM.build`` for an edgeinfer scheme and target."""
    t = target.lower()
    if t not in DTYPES:
        raise InputError(f"RKLLM builds for {', '.join(DTYPES)}, not {target!r}")
    if scheme not in DTYPES[t]:
        raise InputError(f"RKLLM on {t} supports {', '.join(DTYPES[t])}, not {scheme}")
    return {"do_quantization": True, "optimization_level": OPTIMIZATION_LEVEL, "quantized_dtype": scheme.upper(),
            "quantized_algorithm": "grq" if scheme.startswith("w4") else "normal", "target_platform": t.upper(),
            "num_npu_core": 3 if t == "rk3588" else 2, "extra_qparams": None, "dataset": dataset,
            "hybrid_rate": 0, "max_context": context}


def _toolkit() -> Any:
    try:
        from rkllm.api import RKLLM  # type: ignore[import-not-found]
    except ImportError:
        raise BackendUnavailableError(f"{TOOLKIT} is not installed", GET_TOOLKIT) from None
    return RKLLM


def _dataset(calibration: Sequence[str] | None, tmp: Path) -> str | None:
    """Calibration text as the toolkit's JSON dataset ([{"input": ..., "target": ""}, ...])."""
    if not calibration:
        return None
    path = tmp / "calibration.json"
    path.write_text(json.dumps([{"input": t, "target": ""} for t in calibration], ensure_ascii=False))
    return str(path)


def convert_rkllm(model: Path, scheme: str, context: int, out: Path, calibration: Sequence[str] | None = None,
                  target: str = "rk3588", **options: Any) -> dict[str, Any]:
    """Write ``out/model.rkllm`` (and the model's config.json); return stamp facts."""
    if options:
        raise InputError(f"{', '.join(sorted(options))} do not apply to runtime rkllm (RKLLM runs whole models); "
                         "drop them or use runtime rknn")
    args = build_args(scheme, target, context, None)
    RKLLM = _toolkit()
    llm = RKLLM()
    with tempfile.TemporaryDirectory(prefix="edgeinfer-rkllm-") as tmp:
        args["dataset"] = _dataset(calibration, Path(tmp))
        for step, call in (("load_huggingface", lambda: llm.load_huggingface(model=str(model), device="cpu")),
                           ("build", lambda: llm.build(**args)),
                           ("export_rkllm", lambda: llm.export_rkllm(str(out / ARTIFACT)))):
            code = call()
            if code != 0:
                raise BackendError(f"RKLLM toolkit {step} failed (code {code}) for {model.name}")
    if not (out / ARTIFACT).is_file():
        raise BackendError(f"the RKLLM toolkit reported success but wrote no {ARTIFACT} for {model.name}")
    shutil.copy2(model / "config.json", out / "config.json")
    from edgeinfer.contract import __version__

    # no "toolkit" version: the stamp check compares it with the board's rknn runtime, which does not load this
    versions = {"edgeinfer": __version__, "edgeinfer-rknn": package_version("edgeinfer-rknn", "?"),
                "rkllm-toolkit": package_version("rkllm-toolkit", "?")}
    return {"target": target.lower(), "runtime": "rkllm", "versions": versions, "unchecked": UNCHECKED}
