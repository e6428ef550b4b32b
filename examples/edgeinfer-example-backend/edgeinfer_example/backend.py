"""Runs ONNX models with ``onnx.reference.ReferenceEvaluator``: slow, exact, dependency-free."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.contract import Backend, Probe, Problem, Session, Tensors
from edgeinfer.contract.helpers import check_device, first_line, package_version
from edgeinfer.contract.onnx_io import onnx_io
from edgeinfer.errors import ModelError

if TYPE_CHECKING:
    import numpy as np


class ExampleSession(Session):
    def __init__(self, path: Path):
        import onnx
        from onnx.reference import ReferenceEvaluator

        proto = onnx.load(str(path))
        super().__init__(*onnx_io(proto), device="CPU")
        self._ref = ReferenceEvaluator(proto)
        self._names = [o.name for o in self.outputs]

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self._names, self._ref.run(None, feeds)))


class ExampleBackend(Backend):
    name = "example"
    # scheme fp32, no convert/open options (the core refuses every option before calling us): the defaults
    tensors = Tensors(native=(".onnx",), gaps={"op_profile": "onnx's reference evaluator has no per-op timer"})

    def versions(self) -> dict[str, str]:
        return {"edgeinfer-example-backend": package_version("edgeinfer-example-backend", "?"),
                "toolkit": f"onnx {package_version('onnx', 'missing')}"}

    def probe(self) -> Probe:
        try:
            import onnx.reference  # noqa: F401
        except ImportError as e:
            return Probe(False, problems=[Problem(f"onnx does not import: {e}", "pip install 'onnx>=1.15'")])
        return Probe(True, versions={"onnx": package_version("onnx", "?")}, devices=["CPU"])

    def convert(self, model: Path, scheme: str, calibration, out: Path, **options: Any) -> dict[str, Any]:
        import onnx

        try:
            onnx.checker.check_model(str(model))
        except Exception as e:  # the user's file, said on purpose (exit 2); anything else we raise is exit 3
            raise ModelError(f"{model.name} is not a valid ONNX model: {first_line(e)}") from None
        shutil.copyfile(model, out)
        session = ExampleSession(out)
        return {"target": "cpu", "inputs": session.inputs, "outputs": session.outputs}

    def open(self, artifact: Path, device: str | None, stamp: dict[str, Any], **options: Any) -> Session:
        check_device(device, ("cpu",), self.name)
        return ExampleSession(artifact)
