"""The Ascend decoder artifact, the scheme check and the device-memory check before a decoder loads.

Artifact (``convert_decoder``): a directory that is itself a Hugging Face model directory — config.json,
generation_config.json, tokenizer files and ``model.safetensors`` with the weights already in the
scheme's dtype (safetensors: tensors only, nothing is unpickled or executed when it loads) — plus
``ascend-decoder.json``: scheme, dtype, context and prefill buckets it was built for. ``w8a16`` stores
the weights in the activation dtype and the recipe (``int8``: the block); torchao quantizes the Linear layers
when the artifact opens (as the encoder path does: torchao's quantized tensors are not safetensors-serialisable).

w8a16 in blocks: each Linear's rows are cut into blocks of 128 weights with a scale each (halved to 64 or 32
where 128 does not divide a row, else the row is one block: :func:`edgeinfer.contract.helpers.row_block`),
and a tied LM head stays the embedding's table in the activation dtype. Per channel, as until 2026-12-06,
SmolLM2-135M-Instruct failed deploy's golden check (teacher-forced agreement 93.0 % < 93 %, a clear miss at a
margin of 0.50); in blocks it passes at 96.1 % (README.md, "w8a16"). Quantizing a tied head gave it an int8 copy
beside the table the lookup keeps, 28 MB more on that model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from edgeinfer.contract import normalize_scheme, remote_code
from edgeinfer.contract.helpers import check_weight_index, read_artifact_manifest, row_block
from edgeinfer.errors import InputError, ModelError

from . import device as dev
from .convert import torchao

MANIFEST = "ascend-decoder.json"
FORMAT = 1
SCHEMES = ("fp32", "fp16", "bf16", "w8a16")
# 310P (Atlas 300I Pro / Duo) computes in fp16, with no bf16: docs/board-facts.md#ascend-dtypes
SOC_SCHEMES = {"Ascend310": ("fp16", "w8a16")}
INT8_BLOCK = 128  # weights per int8 block of a row (w8a16)
# what an artifact without an ``int8`` recipe (written before 2026-12-06) was checked with: per channel, every Linear
PER_CHANNEL = {"block": 0, "tied_head": "int8"}
COPIED = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
          "chat_template.jinja")

__all__ = ["check_scheme", "convert_decoder", "int8_method", "int8_recipe", "quantize_int8", "read_manifest",
           "torchao"]


def check_scheme(scheme: str, device: str) -> str:
    """The canonical scheme, or an InputError naming what the chip found supports. (What a board's runtime
    supports is the core's rule: deploy refuses another scheme before converting.)"""
    name = normalize_scheme(scheme).name
    allowed, where = SCHEMES, "the ascend decoder"
    soc = dev.soc_name(device)
    for prefix, schemes in SOC_SCHEMES.items():
        if soc.startswith(prefix):
            allowed, where = schemes, f"{soc} (no bf16 or fp32 compute)"
    usable = [s for s in allowed if s in SCHEMES]
    if name not in usable:
        raise InputError(f"{where} cannot run scheme {name!r}; it supports: {', '.join(usable)}")
    return name


def int8_recipe(block: Any = None) -> dict[str, Any]:
    """The w8a16 recipe an artifact records: the block (``group_size`` option; 0 or -1: per channel) and what
    becomes of a tied LM head."""
    if block is None:
        return {"block": INT8_BLOCK, "tied_head": "table"}
    size = int(block) if isinstance(block, int) or str(block).lstrip("-").isdigit() else None
    if size is None or (size not in (0, -1) and (size < 32 or size % 32)):
        raise InputError(f"group_size must be a multiple of 32 (or -1: per channel), got {block!r}")
    return {"block": max(size, 0), "tied_head": "table"}


def int8_method(recipe: dict[str, Any]) -> str:
    form = f"in blocks of {recipe['block']}" if recipe["block"] else "per channel"
    head = ", a tied LM head kept as the table" if recipe.get("tied_head") == "table" else ""
    return f"torchao Int8WeightOnlyConfig (weight-only INT8 {form}, Linear layers{head})"


def quantize_int8(model: Any, recipe: dict[str, Any]) -> None:
    """Quantize ``model``'s Linear layers in place as ``recipe`` says: each layer's rows in blocks
    (:func:`edgeinfer.contract.helpers.row_block`), per channel where no block divides them."""
    import torch
    from torchao.quantization.granularity import PerGroup, PerRow

    quantize_, config = torchao()
    table = model.get_input_embeddings()
    head = model.get_output_embeddings()
    keep = head if (recipe.get("tied_head") == "table" and head is not None and table is not None
                    and head.weight is table.weight) else None

    def linear(m: Any) -> bool:
        return isinstance(m, torch.nn.Linear) and m is not keep

    for k in sorted({m.in_features for m in model.modules() if linear(m)}):
        size = row_block(k, recipe["block"]) if recipe["block"] else k
        granularity = PerRow() if size == k else PerGroup(size)
        quantize_(model, config(granularity=granularity),
                  filter_fn=lambda m, _fqn, k=k: linear(m) and m.in_features == k)


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
    scheme = check_scheme(scheme, "cpu")
    dtype = options.get("dtype") or SCHEME_DTYPE[scheme] or "fp32"
    buckets = parse_buckets(options.get("prefill_buckets"), context)
    if options.get("group_size") is not None and scheme != "w8a16":
        raise InputError(f"group_size sets w8a16's int8 blocks; scheme {scheme} has none (drop the option)")
    recipe = int8_recipe(options.get("group_size")) if scheme == "w8a16" else None
    if scheme == "w8a16":
        torchao()  # fail before writing anything
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
                "prefill_buckets": list(buckets), "quant": int8_method(recipe) if recipe else None,
                "source": model.name, **({"int8": recipe} if recipe else {})}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    # the core's stamp records the scheme and the source itself
    stamped = ("format", "kind", "scheme", "source")
    facts = {"target": "torch", **{k: v for k, v in manifest.items() if k not in stamped}}
    if calibration is not None:
        facts["calibration"] = "not used: weight-only INT8 (torchao) is data-free"
    return facts
