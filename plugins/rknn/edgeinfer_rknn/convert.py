"""ONNX → ``.rknn``: what the conversion reads from the ONNX graph (static input shapes, output specs, the
``dynamic_input`` shape sets), the build with its fusion-rule retries and the conversion error. The toolkit
calls themselves are in :mod:`.toolkit`."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edgeinfer.contract import TensorSpec
from edgeinfer.contract.helpers import first_line
from edgeinfer.contract.onnx_io import onnx_spec
from edgeinfer.errors import BackendUnavailableError, InputError, ModelError

from . import toolkit as tk


def _read_onnx(model: Path) -> Any:
    try:
        import onnx
    except ImportError:
        raise BackendUnavailableError("converting for rknn reads ONNX, and the onnx package is not installed",
                                      "pip install './plugins/rknn[convert]' (or: pip install onnx)") from None

    try:
        proto = onnx.load(str(model))
        onnx.checker.check_model(proto)
    except Exception as e:
        raise ModelError(f"{model.name} is not a valid ONNX model ({first_line(e)}); export it again") from None
    return proto


def _graph_inputs(proto: Any) -> list[Any]:
    inits = {i.name for i in proto.graph.initializer}
    return [i for i in proto.graph.input if i.name not in inits]


def static_inputs(proto: Any, shapes: Mapping[str, Sequence[int]] | None, model_name: str) -> list[TensorSpec]:
    """Input specs with every dimension fixed, from the model or the ``shapes`` option."""
    shapes = dict(shapes or {})
    graph_inputs = _graph_inputs(proto)
    names = [i.name for i in graph_inputs]
    unknown = [n for n in shapes if n not in names]
    if unknown:
        raise InputError(f"shapes names unknown input(s) {', '.join(unknown)}; the model's inputs are: "
                         f"{', '.join(names)}")
    specs = []
    for vi in graph_inputs:
        spec = onnx_spec(vi)
        dims = spec.shape
        if vi.name in shapes:
            want = [int(d) for d in shapes[vi.name]]
            if len(want) != len(dims) or any(isinstance(d, int) and d != w for d, w in zip(dims, want)):
                raise InputError(f"shapes[{vi.name!r}] = {want} does not fit the model's input shape {list(dims)}")
            if any(w <= 0 for w in want):
                raise InputError(f"shapes[{vi.name!r}] = {want}: every dimension must be a positive size")
            dims = tuple(want)
        if not all(isinstance(d, int) and d > 0 for d in dims):
            raise InputError(
                f"RKNN needs static input shapes, but {vi.name!r} of {model_name} is {list(dims)}; "
                f"pass shapes={{'{vi.name}': [...]}} (and dynamic_input for several shape sets)"
            )
        specs.append(TensorSpec(vi.name, tuple(dims), spec.dtype))
    return specs


def output_specs(proto: Any) -> list[TensorSpec]:
    return [onnx_spec(o) for o in proto.graph.output]


def _dynamic_sets(value: Any, inputs: list[TensorSpec]) -> list[list[list[int]]]:
    """Normalize ``dynamic_input``: a list of shape sets, each a list (input order) or a dict by name."""
    if not isinstance(value, (list, tuple)) or not value:
        raise InputError("dynamic_input must be a non-empty list of shape sets, e.g. [[[1,64]], [[1,128]]]")
    sets = []
    for i, entry in enumerate(value):
        if isinstance(entry, Mapping):
            missing = [s.name for s in inputs if s.name not in entry]
            if missing:
                raise InputError(f"dynamic_input set {i} lacks input(s) {', '.join(missing)}")
            entry = [entry[s.name] for s in inputs]
        if len(entry) != len(inputs):
            raise InputError(f"dynamic_input set {i} has {len(entry)} shapes; the model has {len(inputs)} inputs")
        shapes = []
        for spec, shape in zip(inputs, entry):
            shape = [int(d) for d in shape]
            if len(shape) != len(spec.shape):
                raise InputError(f"dynamic_input set {i}: {spec.name!r} needs {len(spec.shape)} dimensions, got "
                                 f"{shape}")
            shapes.append(shape)
        sets.append(shapes)
    return sets


def _build_with_retries(model: Path, proto: Any, recipe: tk.Recipe, src: Path, tmp: Path, log: Path
                        ) -> tuple[Any, list[str]]:
    """Build; when the toolkit crashes inside a fusion rule, disable that rule and build again."""
    retried: list[str] = []
    while True:
        work = Path(tempfile.mkdtemp(prefix="work-", dir=tmp))
        try:
            return tk.build(src / "model.onnx", recipe, src, log, work), retried
        except tk.BuildError as e:
            if e.stage == "build" and e.rule and e.rule not in recipe.disable_rules \
                    and len(retried) < tk.MAX_RULE_RETRIES:
                with open(log, "a") as f:
                    f.write(f"\nedgeinfer: build crashed in fusion rule {e.rule!r}; retrying with it disabled\n")
                recipe.disable_rules.append(e.rule)
                retried.append(e.rule)
                continue
            raise


def _conversion_error(model: Path, proto: Any, e: tk.BuildError, log: Path) -> ModelError:
    text = log.read_text(errors="replace") if log.exists() else ""
    ops = tk.ops_named_in_log(text, proto)
    extra = f"; unsupported operators: {', '.join(ops)}" if ops else ""
    return ModelError(f"rknn-toolkit2 could not convert {model.name} ({e.stage}): {e.message}{extra}; "
                      f"full toolkit log: {log}")
