"""The Ascend decoder artifact, the scheme check and the device-memory check before a decoder loads.

Artifact (``convert_decoder``): a directory that is itself a Hugging Face model directory — config.json,
generation_config.json, tokenizer files and ``model.safetensors`` with the weights already in the
scheme's dtype (safetensors: tensors only, nothing is unpickled or executed when it loads) — plus
``ascend-decoder.json``: scheme, dtype, context and prefill buckets it was built for. ``w8a16`` stores
the weights in the activation dtype and the recipe; torchao quantizes the Linear layers when the
artifact opens (as the encoder path does: torchao's quantized tensors are not safetensors-serialisable).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from edgeinfer.contract import remote_code
from edgeinfer.contract.helpers import check_weight_index, read_artifact_manifest
from edgeinfer.errors import InputError, ModelError
from edgeinfer.planning.quant import normalize_scheme

from . import device as dev
from . import doctor
from .convert import INT8_METHOD, _torchao

MANIFEST = "ascend-decoder.json"
FORMAT = 1
SCHEMES = ("fp32", "fp16", "bf16", "w8a16")
# 310P (Atlas 300I Pro / Duo) computes in fp16, with no bf16: docs/board-facts.md#ascend-dtypes
SOC_SCHEMES = {"Ascend310": ("fp16", "w8a16")}
COPIED = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
          "chat_template.jinja")

__all__ = ["INT8_METHOD", "check_scheme", "convert_decoder", "read_manifest", "torchao"]


def torchao() -> Any:
    return _torchao()


def check_scheme(scheme: str, board: str | None, device: str) -> str:
    """The canonical scheme, or an InputError naming what the board (or the chip found) supports."""
    name = normalize_scheme(scheme).name
    allowed, where = SCHEMES, "the ascend decoder"
    soc = dev.soc_name(device)
    if board:
        from edgeinfer.planning.boards import get_board

        b = get_board(board)
        if b.backend != "ascend":
            raise InputError(f"board {b.name} is not an Ascend board (its backend is {b.backend})")
        runtime = b.backend_runtime or "torch-npu"
        allowed, where = tuple(b.supported_schemes(runtime)), f"board {b.name} ({runtime})"
    else:
        for prefix, schemes in SOC_SCHEMES.items():
            if soc.startswith(prefix):
                allowed, where = schemes, f"{soc} (no bf16 or fp32 compute)"
    usable = [s for s in allowed if s in SCHEMES]
    if name not in usable:
        raise InputError(f"{where} cannot run scheme {name!r}; it supports: {', '.join(usable)}")
    return name


def read_manifest(path: Path) -> dict[str, Any] | None:
    """The artifact's manifest when ``path`` is an artifact directory, else None."""
    return read_artifact_manifest(path, MANIFEST, FORMAT, "decoder artifact")


def convert_decoder(model: Path, scheme: str, context: int, out: Path, calibration: Any = None,
                    **options: Any) -> dict[str, Any]:
    """Write the decoder artifact for ``model`` at ``out`` (a directory); return stamp facts."""
    import torch
    from transformers import AutoModelForCausalLM

    from .decoder import SCHEME_DTYPE, parse_buckets
    from .decoder_model import check_architecture, check_context

    options.pop("target", None)  # deploy's board target; the scheme check below is what depends on the board
    model, out = Path(model), Path(out)
    if not (model / "config.json").is_file():
        raise ModelError(f"{model} is not a Hugging Face model directory (no config.json)")
    scheme = check_scheme(scheme, options.get("board"), "cpu")
    dtype = options.get("dtype") or SCHEME_DTYPE[scheme] or "fp32"
    buckets = parse_buckets(options.get("prefill_buckets"), context)
    if scheme == "w8a16":
        _torchao()  # fail before writing anything
    torch_dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    check_weight_index(model)
    hf = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch_dtype,
                                              trust_remote_code=remote_code.allowed(model))
    check_architecture(hf.config)
    check_context(hf.config, context)
    out.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(out, safe_serialization=True)
    for name in COPIED:
        if (model / name).is_file() and not (out / name).exists():
            shutil.copyfile(model / name, out / name)
    manifest = {"format": FORMAT, "kind": "ascend-decoder", "scheme": scheme, "dtype": dtype, "context": context,
                "prefill_buckets": list(buckets), "quant": INT8_METHOD if scheme == "w8a16" else None,
                "source": model.name}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    # the core's stamp records the scheme and the source itself
    stamped = ("format", "kind", "scheme", "source")
    facts = {"target": "torch", **{k: v for k, v in manifest.items() if k not in stamped}}
    if calibration is not None:
        facts["calibration"] = "not used: weight-only INT8 (torchao) is data-free"
    return facts


def memory_need(model: Path, scheme: str, dtype: str, context: int, slots: int) -> dict[str, int]:
    """The plan for this load on the NPU: weights, KV cache and workspace (activations + runtime), in bytes,
    from the planner's own formulas and its torch-npu runtime profile."""
    from edgeinfer.planning import planner
    from edgeinfer.planning.models import resolve
    from edgeinfer.planning.quant import kv_bytes_per_element

    spec = resolve(model)
    prof = planner.runtime_profile("torch-npu")
    weights, _ = planner.weights_bytes(spec, normalize_scheme(scheme), prof)
    kv = planner.kv_bytes(spec, context, slots, kv_bytes_per_element(dtype))
    act, _ = planner.activation_bytes(spec, context, slots, prof)
    runtime = int((prof.get("overhead_mib") or {"value": 0})["value"] * 2**20)
    return {"weights": int(weights), "kv_cache": int(kv), "workspace": int(act) + runtime}


def check_device_memory(model: Path, scheme: str, dtype: str, context: int, slots: int, device: str) -> None:
    """Before loading on ``device``: raise an InputError saying what to change when npu-smi's free memory on
    that chip is less than the plan. Silent when npu-smi is absent (the doctor reports that)."""
    text, _why = dev.run_npu_smi()
    if text is None:
        return
    need = memory_need(model, scheme, dtype, context, slots)
    problems = doctor.memory_problems(
        doctor.parse_npu_smi_info(text), dev.device_index(device), need, context=context, slots=slots,
        scheme=scheme, need_at=lambda ctx: sum(memory_need(model, scheme, dtype, ctx, slots).values()))
    if problems:
        raise InputError(problems[0].message, problems[0].fix)
