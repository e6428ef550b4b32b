"""ONNX graph inputs and outputs as TensorSpecs, for backends that read ONNX models.

``onnx`` and NumPy are imported inside the functions: ``import edgeinfer`` stays light.
"""

from __future__ import annotations

from typing import Any

from edgeinfer.contract.backend import TensorSpec


def onnx_spec(value_info: Any) -> TensorSpec:
    """A TensorSpec from an ONNX ``ValueInfoProto``: fixed dims as ints, named ones as strings, else None."""
    from onnx import helper

    t = value_info.type.tensor_type
    dims = tuple(int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim)
    try:
        dtype = _np_name(helper.tensor_dtype_to_np_dtype(t.elem_type))
    except (KeyError, TypeError):  # no NumPy equivalent (e.g. an undefined type): keep ONNX's number
        dtype = str(t.elem_type)
    return TensorSpec(value_info.name, dims, dtype)


def onnx_io(proto: Any) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The graph inputs (initializers left out) and outputs of an ONNX ``ModelProto`` as TensorSpecs."""
    inits = {i.name for i in proto.graph.initializer}
    inputs = [onnx_spec(v) for v in proto.graph.input if v.name not in inits]
    return inputs, [onnx_spec(v) for v in proto.graph.output]


def _np_name(dtype: Any) -> str:
    import numpy as np

    return np.dtype(dtype).name
