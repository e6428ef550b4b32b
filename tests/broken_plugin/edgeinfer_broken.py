"""A deliberately broken third-party backend, installed for tests as a distribution (edgeinfer-broken) with
an entry point in the ``edgeinfer`` group, as a third party's plugin is.

It runs ONNX models with onnx's reference evaluator; ``EDGEINFER_BROKEN_MODE`` picks how it misbehaves:
``ok`` (or unset) works; ``convert`` / ``open`` / ``infer`` raise there; ``package`` imports a module that is not
installed when opening; ``refuses`` raises InputError on purpose when opening; ``shapes`` / ``dtype`` / ``empty``
/ ``extra`` / ``none`` return wrong outputs; ``wrong`` returns outputs of the right form but wrong values.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from edgeinfer.contract import Backend, Probe, Session, Tensors, hookimpl
from edgeinfer.contract.onnx_io import onnx_io
from edgeinfer.errors import InputError

HERE = Path(__file__).resolve().parent


def mode() -> str:
    return os.environ.get("EDGEINFER_BROKEN_MODE", "ok")


class BrokenSession(Session):
    def __init__(self, path: Path):
        import onnx
        from onnx.reference import ReferenceEvaluator

        proto = onnx.load(str(path))
        super().__init__(*onnx_io(proto), device="CPU")
        self._ref = ReferenceEvaluator(proto)

    def infer(self, feeds: dict) -> Any:
        import numpy as np

        right = dict(zip([o.name for o in self.outputs], self._ref.run(None, feeds)))
        first = self.outputs[0].name
        wrong = {
            "infer": lambda: 1 / 0,
            "shapes": lambda: {**right, first: np.zeros((3, 3), dtype=np.float32)},
            "dtype": lambda: {k: v.astype(np.float64) for k, v in right.items()},
            "empty": lambda: {},
            "none": lambda: None,
            "extra": lambda: {**right, "debug_tensor": np.zeros(1, dtype=np.float32)},
            "wrong": lambda: {k: -v - 1 for k, v in right.items()},
        }
        return wrong[mode()]() if mode() in wrong else right


class BrokenBackend(Backend):
    name = "broken"
    tensors = Tensors(native=(".brk",), convert_options=("target",))

    def probe(self) -> Probe:
        return Probe(True, devices=["CPU"])

    def convert(self, model: Path, scheme: str, calibration: Any, out: Path, **options: Any) -> dict[str, Any]:
        if mode() == "convert":
            raise ValueError("vendor compiler crashed: unsupported layout NC4HW4")
        shutil.copyfile(model, out)
        inputs, outputs = onnx_io(__import__("onnx").load(str(out)))
        return {"target": "cpu", "inputs": inputs, "outputs": outputs}

    def open(self, artifact: Path, device: str | None, stamp: dict[str, Any], **options: Any) -> Session:
        if mode() == "open":
            raise RuntimeError("NPU device lost (vendor error 0x2a)")
        if mode() == "package":
            import edgeinfer_broken_vendor_runtime  # noqa: F401  # not installed anywhere
        if mode() == "refuses":
            raise InputError(f"{artifact.name} was compiled for another NPU; convert it again for this one")
        return BrokenSession(artifact)


@hookimpl
def register_backends(register):
    register(BrokenBackend)


@hookimpl
def register_boards(register):
    register(HERE / "broken-board.yaml")
    register(HERE / "broken-tiny-board.yaml")
