"""ONNX reader: parameter bytes from initializers (external data too), inputs and outputs.

`onnx` is imported lazily: only .onnx inputs pay for it.
"""

from __future__ import annotations

from pathlib import Path

from edgeinfer.errors import ModelError
from edgeinfer.planning.models.spec import ModelSpec

# onnx TensorProto.DataType -> bytes per element
_ONNX_BYTES = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 16: 2,
               17: 1, 18: 1, 19: 1, 20: 1, 21: 0.5, 22: 0.5}
_NAMES = {1: "F32", 2: "U8", 3: "I8", 4: "U16", 5: "I16", 6: "I32", 7: "I64", 9: "BOOL", 10: "F16",
          11: "F64", 16: "BF16", 21: "U4", 22: "I4"}


def _dims(vi) -> list:
    out = []
    for d in vi.type.tensor_type.shape.dim:
        out.append(d.dim_value if d.HasField("dim_value") else (d.dim_param or None))
    return out


def read_onnx(path: Path) -> ModelSpec:
    try:
        import onnx  # noqa: PLC0415 - lazy on purpose
    except ImportError:
        raise ModelError("reading .onnx files needs the 'onnx' package", "pip install onnx") from None
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:
        raise ModelError(f"{path}: not a valid ONNX model ({type(e).__name__})",
                         "re-export the model") from None
    g = model.graph
    if not g.node and not g.initializer:
        raise ModelError(f"{path}: not a valid ONNX model (empty graph)", "re-export the model")
    per: dict[str, int] = {}
    types: dict[str, int] = {}
    total = 0
    for t in g.initializer:
        if not isinstance(t.name, str) or any(d < 0 for d in t.dims):
            raise ModelError(f"{path}: not a valid ONNX model (initializer {t.name!r} has a malformed name or "
                             f"negative dims {list(t.dims)})", "re-export the model")
        n = 1
        for d in t.dims:
            n *= int(d)
        nb = int(n * _ONNX_BYTES.get(t.data_type, 4))
        if t.data_location == onnx.TensorProto.EXTERNAL:
            info = {e.key: e.value for e in t.external_data}
            if "length" in info:
                nb = int(info["length"])
            loc = path.parent / info.get("location", "")
            if not loc.is_file():
                raise ModelError(f"{path}: external data file '{info.get('location')}' is missing",
                                 "keep the .onnx next to its external data")
        per[t.name] = nb
        tn = _NAMES.get(t.data_type, str(t.data_type))
        types[tn] = types.get(tn, 0) + nb
        total += n
    inits = set(per)
    spec = ModelSpec(name=path.stem, source=str(path), architecture="onnx", file_format="onnx")
    cfg = path.parent / "config.json"
    if cfg.is_file():
        from edgeinfer.planning.models.hf import read_config, spec_from_config
        try:
            spec = spec_from_config(read_config(cfg), path.stem, str(path))
            spec.file_format = "onnx"
        except ModelError as e:
            spec.notes.append(f"config.json next to the model ignored: {e.one_line()}")
    else:
        spec.notes.append("no config.json next to the .onnx: KV cache and activations are not modelled")
    spec.tensor_bytes = per
    spec.tensor_types = types
    spec.file_weight_bytes = sum(per.values())
    if spec.params_total and total and abs(total - spec.params_total) / spec.params_total > 0.02:
        spec.notes.append(f"file holds {total} parameters, config formula gives {spec.params_total}")
    spec.params_total = total
    if not spec.params_active:
        spec.params_active = total
    dominant = max(types, key=types.get) if types else None
    spec.file_scheme = {"F32": "fp32", "F16": "fp16", "BF16": "bf16", "I8": "w8a8", "U8": "w8a8"}.get(dominant or "")
    spec.native_dtype = spec.file_scheme
    spec.inputs = [{"name": i.name, "shape": _dims(i)} for i in g.input if i.name not in inits]
    spec.outputs = [{"name": o.name, "shape": _dims(o)} for o in g.output]
    if not cfg.is_file():
        # without a config, a graph that takes no past key/values is stateless: plan it like an encoder
        spec.encoder = not any("past" in i["name"] or "cache" in i["name"] for i in spec.inputs)
    return spec


def index_limits(path: Path) -> dict[str, int]:
    """Graph inputs used directly as row indices of an embedding table (Gather on an initializer)
    → the table's row count: token ids must lie in [0, rows). Empty when the file cannot tell. The weights
    are not read (edgeinfer/contract/onnx_index.py): ``serve``'s HTTP process calls this."""
    from edgeinfer.contract.onnx_index import embedding_index_limits

    try:
        return embedding_index_limits(path)
    except (OSError, ValueError, UnicodeDecodeError):  # not ONNX, or unreadable: the loader reports that properly
        return {}
