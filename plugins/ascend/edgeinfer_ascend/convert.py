"""Model inputs of the Ascend backend and its artifact format. Nothing loaded here runs code from the file.

Inputs (``convert``):

* a Hugging Face model directory (``config.json`` + ``model.safetensors`` or ``pytorch_model.bin``),
  or one weights file inside such a directory (``.safetensors``, ``.bin``, ``.pt``, ``.pth``: the
  ``config.json`` next to it describes the model). Non-safetensors weights load with
  ``torch.load(weights_only=True)``: a file holding arbitrary pickled objects is refused.
  DataParallel / DDP ``module.`` prefixes are stripped.
* a ``torch.export`` program (``.pt2``, written by ``torch.export.save``). ``torch.export.load``
  unpickles and ``exec``s parts of an archive, so programs are checked and rebuilt by
  :mod:`edgeinfer_ascend.pt2` first: pickled payloads, compiled code, guards code and
  non-ATen calls are refused or dropped.

An ``.onnx`` file is refused with a pointer to the right input.

Artifact (``.ascend``): a zip archive (stored, not compressed) holding ``manifest.json`` and either
``model.safetensors`` + ``config.json`` (kind ``hf``; weights already cast to the scheme's dtype)
or ``program.pt2`` (kind ``export``). Weight-only INT8 (``w8a16``) stores fp32 weights and the
recipe; torchao quantizes the Linear layers when the artifact is opened. The artifact's
``program.pt2`` goes through the same checks when it is opened: an artifact is a file like any other.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeinfer.contract import TensorSpec, remote_code
from edgeinfer.contract.helpers import first_line
from edgeinfer.errors import BackendUnavailableError, InputError, ModelError

from . import pt2

FORMAT = 1
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.pt", "model.pth")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
ONNX_HINT = (
    "the ascend backend runs PyTorch models through torch_npu, not ONNX: pass the Hugging Face model "
    "directory the ONNX was exported from (config.json + weights) or a torch.export program (.pt2, "
    "torch.export.save); to run this .onnx use --backend onnxruntime (or openvino / rknn)"
)


@dataclass
class Source:
    kind: str  # "hf" or "export"
    path: Path  # the directory (hf) or the .pt2 file (export)
    weights: Path | None = None  # hf: the weights file


def resolve(model: Path) -> Source:
    model = Path(model)
    if model.suffix.lower() == ".onnx":
        raise ModelError(f"{model.name} is an ONNX file; {ONNX_HINT}")
    if model.is_dir():
        if not (model / "config.json").is_file():
            raise ModelError(
                f"{model} has no config.json; pass a Hugging Face model directory or a .pt2 torch.export program"
            )
        weights = next((model / w for w in WEIGHT_FILES if (model / w).is_file()), None)
        if weights is None:
            sharded = sorted(model.glob("model-*.safetensors"))
            if not sharded:
                raise ModelError(f"{model} has no weights ({' / '.join(WEIGHT_FILES)}); download the model again")
            weights = model  # sharded safetensors: the directory itself
        remote_code.allowed(model)
        return Source("hf", model, weights)
    if model.suffix.lower() == ".pt2":
        return Source("export", model)
    if model.suffix.lower() in WEIGHT_SUFFIXES:
        if not (model.parent / "config.json").is_file():
            raise ModelError(
                f"{model.name} is a weights file with no config.json next to it; put it in its Hugging Face "
                "directory (config.json describes the architecture) or export the model with torch.export (.pt2)"
            )
        remote_code.allowed(model.parent)
        return Source("hf", model.parent, model)
    raise ModelError(
        f"{model.name}: the ascend backend takes a Hugging Face model directory, a weights file inside one, "
        "or a torch.export program (.pt2)"
    )


def strip_module_prefix(state: dict[str, Any]) -> dict[str, Any]:
    """Remove DataParallel / DistributedDataParallel ``module.`` prefixes (repeated wrapping too)."""
    out = {}
    for k, v in state.items():
        while k.startswith("module."):
            k = k[len("module.") :]
        out[k] = v
    return out


def load_state_dict(weights: Path) -> dict[str, Any]:
    """Tensors of a weights file (or a directory of safetensors shards); never unpickles objects."""
    import pickle
    import warnings

    import torch

    weights = Path(weights)
    if weights.is_dir():
        from safetensors.torch import load_file

        state: dict[str, Any] = {}
        for shard in sorted(weights.glob("model-*.safetensors")):
            state.update(load_file(str(shard)))
        return strip_module_prefix(state)
    if weights.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return strip_module_prefix(load_file(str(weights)))
        except Exception as e:
            raise ModelError(f"{weights.name} is not a readable safetensors file ({e}); download it again") from None
    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": noise next to the one-line error
            warnings.simplefilter("ignore")
            obj = torch.load(str(weights), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise ModelError(
            f"{weights.name} holds pickled Python objects, not just tensors, and torch.load(weights_only=True) "
            "refuses it (nothing was unpickled); save model.state_dict() or safetensors instead"
        ) from None
    except Exception as e:
        raise ModelError(f"{weights.name} is not a readable PyTorch weights file ({first_line(e)})") from None
    if isinstance(obj, dict):
        for key in ("state_dict", "model_state_dict", "model"):
            if key in obj and isinstance(obj[key], dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ModelError(f"{weights.name} is not a state dict (name -> tensor); save model.state_dict()")
    return strip_module_prefix(obj)


def build_hf(config: dict[str, Any], state: dict[str, Any]):
    """A transformers AutoModel from a config dict and a state dict (base-model prefix tolerated); a
    ``*ForSequenceClassification`` config keeps its head (the model's output is then ``logits``)."""
    from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification

    cfg = AutoConfig.for_model(**config)
    auto = AutoModelForSequenceClassification if is_classifier(config) else AutoModel
    model = auto.from_config(cfg, trust_remote_code=False)  # built from the dict: transformers' own class
    prefix = getattr(model, "base_model_prefix", "") or ""
    own = set(model.state_dict())
    fixed = {}
    for k, v in state.items():
        if k not in own and prefix and k.startswith(prefix + ".") and k[len(prefix) + 1 :] in own:
            k = k[len(prefix) + 1 :]
        fixed[k] = v
    missing = sorted(own - set(fixed))
    # buffers that are recomputed (position_ids...) may be absent from checkpoints
    buffers = {n for n, _ in model.named_buffers()}
    hard_missing = [k for k in missing if k not in buffers]
    if hard_missing:
        raise ModelError(
            f"weights do not match config.json ({cfg.model_type}): {len(hard_missing)} missing tensors, e.g. "
            f"{hard_missing[0]!r}; pass the matching Hugging Face directory"
        )
    model.load_state_dict({k: v for k, v in fixed.items() if k in own}, strict=False)
    return model.eval()


def is_classifier(config: dict[str, Any]) -> bool:
    """A sequence-classification model (a reranker or a text classifier): its head is kept."""
    archs = config.get("architectures") or []
    return any(isinstance(a, str) and a.endswith("ForSequenceClassification") for a in archs)


def forward_inputs(model) -> list[str]:
    """Token inputs the HF model's forward takes, in the edgeinfer order."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in params]


# --- artifact -------------------------------------------------------------------------------


def write_artifact(out: Path, manifest: dict[str, Any], files: dict[str, bytes]) -> None:
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr("manifest.json", json.dumps({"format": FORMAT, **manifest}, indent=1))
        for name, data in files.items():
            z.writestr(name, data)


def read_artifact(path: Path) -> tuple[dict[str, Any], zipfile.ZipFile]:
    try:
        z = zipfile.ZipFile(path)
        manifest = json.loads(z.read("manifest.json"))
    except (zipfile.BadZipFile, KeyError, ValueError, OSError):
        raise InputError(
            f"{path.name} is not an ascend artifact; create one with `edgeinfer quantize MODEL --backend ascend`"
        ) from None
    if manifest.get("format") != FORMAT:
        raise InputError(f"{path.name} has artifact format {manifest.get('format')}, expected {FORMAT}; "
                         "convert again")
    return manifest, z


def safetensors_bytes(state: dict[str, Any]) -> bytes:
    from safetensors.torch import save

    return save({k: v.detach().contiguous() for k, v in state.items()})


def load_safetensors_bytes(data: bytes) -> dict[str, Any]:
    from safetensors.torch import load

    return load(data)


def export_program_bytes(path: Path) -> bytes:
    import torch

    try:
        data = path.read_bytes()
    except OSError as e:
        raise ModelError(f"cannot read {path}: {e.strerror}") from None
    ep = pt2.load(data, path.name)
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    return buf.getvalue()


def load_program(data: bytes, name: str = "program.pt2"):
    """The program stored in an artifact, checked like any .pt2 (see :mod:`edgeinfer_ascend.pt2`)."""
    return pt2.load(data, name)


INT8_METHOD = "torchao Int8WeightOnlyConfig (weight-only INT8 per-channel, Linear layers)"


def torchao():
    try:
        import logging

        logging.getLogger("torchao").setLevel(logging.ERROR)
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except Exception as e:
        raise BackendUnavailableError(
            f"weight-only INT8 needs torchao ({type(e).__name__}: {first_line(e, 120)}); "
            "pip install torchao (from a clone: pip install './plugins/ascend[int8]')"
        ) from None
    return quantize_, Int8WeightOnlyConfig


def _np_dtype(t) -> str:
    import torch

    return {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "float32", torch.int64: "int64",
            torch.int32: "int32", torch.bool: "bool", torch.float64: "float64", torch.int8: "int8",
            torch.uint8: "uint8"}.get(t, "float32")


def export_specs(ep) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Input / output specs of a torch.export program from its placeholder metadata."""
    from torch.export.graph_signature import InputKind

    user = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    nodes = {n.name: n for n in ep.graph.nodes}

    def spec(name: str, val) -> TensorSpec:
        shape = tuple(int(d) if str(d).lstrip("-").isdigit() else str(d) for d in val.shape)
        return TensorSpec(name, shape, _np_dtype(val.dtype))

    inputs = [spec(n, nodes[n].meta["val"]) for n in user]
    out_node = next(n for n in ep.graph.nodes if n.op == "output")
    outs = [a for a in out_node.args[0]][: len(ep.graph_signature.user_outputs)]
    outputs = [spec(f"output_{i}" if len(outs) > 1 else "output", a.meta["val"]) for i, a in enumerate(outs)]
    return inputs, outputs

