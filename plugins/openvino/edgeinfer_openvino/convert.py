"""Conversion helpers of the OpenVINO backend (:meth:`OpenVinoBackend.convert`): static reshapes, NNCF
post-training quantization and weight compression, and what they read from the model.

openvino, nncf and onnx are imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgeinfer.contract import CalibrationSet
from edgeinfer.contract.onnx_io import onnx_io
from edgeinfer.errors import InputError

from .session import port_name, reason

#: models above this many weights get channel-wise INT4 (group_size=-1), as the NPU needs
CHANNELWISE_ABOVE = 1_000_000_000


def onnx_dim_names(path: Path) -> dict[str, list[str | None]]:
    """Symbolic dim names (dim_param) of an ONNX model's inputs and outputs; {} if unreadable."""
    if path.suffix.lower() != ".onnx":
        return {}
    try:
        import onnx

        inputs, outputs = onnx_io(onnx.load(str(path), load_external_data=False))
    except Exception:
        return {}
    return {s.name: [d if isinstance(d, str) else None for d in s.shape] for s in inputs + outputs}


def weight_count(model: Any) -> int:
    """Number of floating-point weights (rank >= 2 constants) in an OpenVINO model."""
    import numpy as np
    total = 0
    for op in model.get_ops():
        if op.get_type_name() != "Constant":
            continue
        et = op.get_output_element_type(0)
        shape = op.get_output_shape(0)
        if et.is_real() and len(shape) >= 2:
            total += int(np.prod(list(shape)))
    return total


def int4_group_size(weights: int, requested: int | None = None) -> int:
    """Group size for INT4 weight compression: channel-wise (-1) above 1B weights, else 128."""
    if requested is not None:
        return int(requested)
    return -1 if weights > CHANNELWISE_ABOVE else 128


def reshape(ov: Any, ov_model: Any, shapes: Any) -> None:
    import numpy as np
    if not isinstance(shapes, Mapping):
        raise InputError(f"shapes must map input names to shapes, e.g. {{'input_ids': [1, 128]}}; got {shapes!r}")
    names = [port_name(p, i, "input") for i, p in enumerate(ov_model.inputs)]
    for name, shape in shapes.items():
        if name not in names:
            raise InputError(f"shapes: unknown input {name!r}; the model's inputs are: {', '.join(names)}")
        if not all(isinstance(d, (int, np.integer)) and d > 0 for d in shape):
            raise InputError(f"shapes: {name} must be a list of positive integers, got {list(shape)!r}")
    try:
        ov_model.reshape({name: ov.PartialShape([int(d) for d in shape]) for name, shape in shapes.items()})
    except Exception as e:
        raise InputError(f"the model cannot take shapes {dict(shapes)!r}: {reason(e)}") from None


def ptq(ov_model: Any, calibration: CalibrationSet | None, target: str, options: dict) -> tuple[Any, dict]:
    if calibration is None or len(calibration) == 0:
        raise InputError(
            "w8a8 (int8) quantization needs a calibration set of real inputs; pass one, or use w8a16 "
            "(weight-only, no calibration)"
        )
    import nncf

    model_type = str(options.get("model_type") or "").lower()
    if not model_type:
        softmax = any(op.get_type_name() == "Softmax" for op in ov_model.get_ops())
        model_type = "transformer" if softmax else "none"
    if model_type not in ("transformer", "none"):
        raise InputError(f"model_type must be 'transformer' or 'none', got {model_type!r}")
    samples = list(calibration)
    subset = int(options.get("subset_size") or len(samples))
    quantized = nncf.quantize(
        ov_model,
        nncf.Dataset(samples),
        subset_size=subset,
        model_type=nncf.ModelType.TRANSFORMER if model_type == "transformer" else None,
        target_device=nncf.TargetDevice.NPU if target == "npu" else nncf.TargetDevice.ANY,
    )
    return quantized, {
        "method": "nncf.quantize (post-training, static int8)",
        "calibration_samples": min(subset, len(samples)),
        "model_type": model_type,
    }


def compress(ov_model: Any, scheme: str, options: dict) -> tuple[Any, dict]:
    import nncf
    from nncf.quantization.advanced_parameters import AdvancedCompressionParameters, GroupSizeFallbackMode

    weights = weight_count(ov_model)
    if scheme == "w8a16":
        compressed = nncf.compress_weights(ov_model, mode=nncf.CompressWeightsMode.INT8_ASYM)
        return compressed, {"method": "nncf.compress_weights int8_asym", "weights": weights}
    group = int4_group_size(weights, options.get("group_size"))
    compressed = nncf.compress_weights(
        ov_model,
        mode=nncf.CompressWeightsMode.INT4_SYM,
        ratio=1.0,
        group_size=group,
        advanced_parameters=AdvancedCompressionParameters(
            group_size_fallback_mode=GroupSizeFallbackMode.ADJUST
        ),
    )
    return compressed, {"method": "nncf.compress_weights int4_sym", "group_size": group, "weights": weights}
