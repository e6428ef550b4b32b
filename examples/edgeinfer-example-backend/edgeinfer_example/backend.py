"""Runs ONNX models with ``onnx.reference.ReferenceEvaluator``: slow, exact, dependency-free."""

from __future__ import annotations

import shutil
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.contract import Backend, Probe, Problem, Session, TensorSpec

_DTYPES = {1: "float32", 6: "int32", 7: "int64", 10: "float16", 11: "float64", 9: "bool"}


def _specs(values) -> list[TensorSpec]:
    specs = []
    for v in values:
        t = v.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim)
        specs.append(TensorSpec(v.name, dims, _DTYPES.get(t.elem_type, str(t.elem_type))))
    return specs


class ExampleSession(Session):
    def __init__(self, path: Path):
        import onnx
        from onnx.reference import ReferenceEvaluator

        proto = onnx.load(str(path))
        inits = {i.name for i in proto.graph.initializer}
        super().__init__(_specs(v for v in proto.graph.input if v.name not in inits), _specs(proto.graph.output),
                         "CPU")
        self._ref = ReferenceEvaluator(proto)
        self._names = [o.name for o in self.outputs]

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self._names, self._ref.run(None, feeds)))


class ExampleBackend(Backend):
    name = "example"
    native_suffixes = (".onnx",)
    schemes = ("fp32",)
    gaps = {"op_profile": "onnx's reference evaluator has no per-op timer"}

    def versions(self) -> dict[str, str]:
        return {"edgeinfer-example-backend": version("edgeinfer-example-backend"),
                "toolkit": f"onnx {version('onnx')}"}

    def probe(self) -> Probe:
        try:
            import onnx.reference  # noqa: F401
        except ImportError as e:
            return Probe(False, problems=[Problem(f"onnx does not import: {e}", "pip install 'onnx>=1.15'")])
        return Probe(True, versions={"onnx": version("onnx")}, devices=["CPU"])

    def convert(self, model: Path, scheme: str, calibration, out: Path, **options: Any) -> dict[str, Any]:
        import onnx

        onnx.checker.check_model(str(model))  # raises on a corrupt file; the core reports it in one line
        shutil.copyfile(model, out)
        session = ExampleSession(out)
        return {"target": "cpu", "inputs": session.inputs, "outputs": session.outputs}

    def open(self, artifact: Path, device: str | None, **options: Any) -> Session:
        return ExampleSession(artifact)
