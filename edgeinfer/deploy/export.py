"""Hugging Face directory → ONNX (the common input format of the ONNX-based backends).

torch and transformers are imported here only, when an export is needed.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from edgeinfer.contract import remote_code
from edgeinfer.contract.helpers import first_line
from edgeinfer.errors import InputError, ModelError
from edgeinfer.files import temp_file

OPSET = 17


def hf_kind(hf_dir: Path) -> dict[str, Any]:
    """What the export needs to know from config.json: encoder inputs and the head, if any."""
    cfg_path = hf_dir / "config.json"
    if not cfg_path.is_file():
        raise InputError(f"{hf_dir} has no config.json; pass a Hugging Face model directory or an .onnx file")
    from edgeinfer.planning.models.hf import read_config

    cfg = read_config(cfg_path)
    if not isinstance(cfg, dict):
        raise ModelError(f"{cfg_path}: config.json is not a JSON object", "pass a valid Hugging Face config.json")
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list):
        archs = []
    classifier = any(isinstance(a, str) and a.endswith("ForSequenceClassification") for a in archs)
    inputs = ["input_ids", "attention_mask"]
    if cfg.get("type_vocab_size", 0) and cfg.get("model_type") in ("bert", "roberta", "xlm-roberta", "electra"):
        inputs.append("token_type_ids")
    return {
        "model_type": cfg.get("model_type", "?"),
        "classifier": classifier,
        "inputs": inputs,
        "output": "logits" if classifier else "last_hidden_state",
        "vocab": cfg["vocab_size"] if isinstance(cfg.get("vocab_size"), int) else 0,
    }


def export_hf_onnx(hf_dir: Path, out: Path, shapes: dict[str, list[int | str]] | None = None) -> Path:
    """Export an encoder/classifier HF directory to ONNX; ``shapes`` fixes input shapes
    (``{"input_ids": [1, 128]}``, applied to every input); without it batch and sequence are dynamic."""
    trust = remote_code.allowed(hf_dir)
    import numpy as np
    import torch
    import transformers
    from transformers import AutoModel, AutoModelForSequenceClassification

    kind = hf_kind(hf_dir)
    shape = _common_shape(shapes, kind["inputs"])
    loader = AutoModelForSequenceClassification if kind["classifier"] else AutoModel
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        hf = loader.from_pretrained(str(hf_dir), attn_implementation="eager", trust_remote_code=trust).eval()
    except Exception as e:
        if "weights only load failed" in str(e).lower():  # transformers loads .bin weights with weights_only=True
            raise ModelError(
                f"{hf_dir}: its weights file holds pickled Python objects, not just tensors, and "
                "torch.load(weights_only=True) refuses it (nothing was unpickled); use model.safetensors"
            ) from None
        raise ModelError(f"transformers cannot load {hf_dir}: {first_line(e)}") from None

    names, output = kind["inputs"], kind["output"]

    class Wrapped(torch.nn.Module):  # positional inputs, one named output
        def __init__(self) -> None:
            super().__init__()
            self.hf = hf

        def forward(self, *args):
            feeds = dict(zip(names, args))
            if "attention_mask" in feeds:
                feeds["attention_mask"] = traceable_mask(feeds["attention_mask"])
            return getattr(self.hf(**feeds), output)

    b = shape[0] if shape and isinstance(shape[0], int) else 2
    s = shape[1] if shape and isinstance(shape[1], int) else 16
    dummy = [torch.from_numpy(np.ones((b, s), dtype=np.int64)) for _ in names]
    axes: dict[str, dict[int, str]] = {}
    for n in names + [output]:
        dims = {}
        if not (shape and isinstance(shape[0], int)):
            dims[0] = "batch"
        if not (shape and isinstance(shape[1], int)) and n != "logits":
            dims[1] = "sequence"
        if dims:
            axes[n] = dims
    # a temporary named after this process: removed if the export is interrupted (Ctrl-C, SIGTERM),
    # swept by a later run if this one is killed outright
    with temp_file(out, "export") as tmp, torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about Python control flow: expected for static exports
        torch.onnx.export(
            Wrapped().eval(), tuple(dummy), str(tmp), input_names=names, output_names=[output],
            dynamic_axes=axes or None, opset_version=OPSET, dynamo=False,
        )
        tmp.replace(out)
    return out


def traceable_mask(mask: Any) -> Any:
    """The 2-D padding mask as the 4-D additive mask transformers passes through unchanged.

    transformers 5.5 (the newest optimum-intel 2.2 allows) builds the mask from
    ``inputs_embeds.shape[1]``, which ``torch.jit.trace`` (the legacy ONNX exporter) gives as a
    tensor; its backward-compatibility branch then reads that as ``cache_position`` and fails
    (``IndexError: tuple index out of range`` in ``masking_utils.sdpa_mask``). A 4-D mask is
    returned as it is; the values are those of transformers' own eager mask (0 kept, dtype min masked)."""
    import torch
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        return mask  # 4.x builds the extended mask itself from the 2-D one
    return (1.0 - mask[:, None, None, :].to(torch.float32)) * torch.finfo(torch.float32).min


def _common_shape(shapes: dict[str, list[int | str]] | None, names: list[str]) -> list[int | str] | None:
    if not shapes:
        return None
    unknown = set(shapes) - set(names)
    if unknown:
        raise InputError(f"--shape names unknown input(s) {', '.join(sorted(unknown))}; the model's inputs: "
                         f"{', '.join(names)}")
    distinct = {tuple(v) for v in shapes.values()}
    if len(distinct) != 1:
        raise InputError("token inputs share one shape; give the same NAMExBxS for every input (or just one)")
    shape = list(next(iter(distinct)))
    if len(shape) != 2:
        raise InputError(f"token inputs are [batch, sequence]; got shape {shape}")
    return shape
