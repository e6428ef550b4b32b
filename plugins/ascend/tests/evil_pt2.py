"""Crafted torch.export archives for the malicious-file tests: each would create ``marker`` if code from it ran.

They are built from a real ``torch.export.save`` archive (the kit's MLP) by changing one thing, and
written with torch's own archive writer so that plain ``torch.export.load`` reads them (the tests
check that the live payloads do fire there).
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch.export.pt2_archive import PT2ArchiveWriter


class Payload:
    """Unpickling this creates ``marker`` (an open() for writing), i.e. proves code from the file ran."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        return {n.split("/", 1)[1]: z.read(n) for n in z.namelist() if not n.endswith("/")}


def write(out: Path, files: dict[str, bytes]) -> Path:
    buf = io.BytesIO()
    with PT2ArchiveWriter(buf) as w:
        for rel, blob in files.items():
            if rel not in (".data/version", ".data/serialization_id"):
                w.write_bytes(rel, blob)
    out.write_bytes(buf.getvalue())
    return out


def _torch_pickle(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _edit_json(files: dict[str, bytes], rel: str, change: Callable[[dict], None]) -> None:
    doc = json.loads(files[rel])
    change(doc)
    files[rel] = json.dumps(doc).encode()


def pickled_weight(files: dict[str, bytes], marker: Path) -> None:
    """A weight stored with use_pickle: torch.load(weights_only=False)."""
    def change(cfg):
        entry = next(iter(cfg["config"].values()))
        entry["use_pickle"] = True
        files["data/weights/" + entry["path_name"]] = _torch_pickle(Payload(marker))
    _edit_json(files, "data/weights/model_weights_config.json", change)


def pickled_sample_inputs(files: dict[str, bytes], marker: Path) -> None:
    """Sample inputs: the weights_only=True load fails, torch falls back to weights_only=False."""
    files["data/sample_inputs/model.pt"] = _torch_pickle(Payload(marker))


def opaque_constant(files: dict[str, bytes], marker: Path) -> None:
    """An opaque-object constant: plain pickle.loads."""
    import pickle

    def change(cfg):
        cfg["config"]["evil"] = {"path_name": "opaque_obj_0", "is_param": False, "use_pickle": True,
                                 "tensor_meta": None}
    _edit_json(files, "data/constants/model_constants_config.json", change)
    files["data/constants/opaque_obj_0"] = pickle.dumps(Payload(marker))


def guards_code(files: dict[str, bytes], marker: Path) -> None:
    """Guards code: exec'd by ExportedProgram.module(), run on every call."""
    def change(doc):
        doc["guards_code"] = [f"open({str(marker)!r}, 'w') is not None"]
    _edit_json(files, "models/model.json", change)


def sympy_expr(files: dict[str, bytes], marker: Path) -> None:
    """A symbolic dimension: sympy.sympify evaluates the string."""
    def change(doc):
        for value in doc["graph_module"]["graph"]["tensor_values"].values():
            for dim in value["sizes"]:
                if "as_expr" in dim:
                    dim["as_expr"]["expr_str"] = (
                        f"Symbol('s77', positive=True, integer=True) if open({str(marker)!r}, 'w') else 0")
    _edit_json(files, "models/model.json", change)


def set_expr(files: dict[str, bytes], expr: str) -> None:
    """Every symbolic dimension of the graph becomes ``expr``."""
    def change(doc):
        for value in doc["graph_module"]["graph"]["tensor_values"].values():
            for dim in value["sizes"]:
                if "as_expr" in dim:
                    dim["as_expr"]["expr_str"] = expr
    _edit_json(files, "models/model.json", change)


def power_tower(files: dict[str, bytes], marker: Path) -> None:
    """A symbolic dimension inside the vocabulary whose value sympy would compute for ever."""
    set_expr(files, "Integer(10)**Integer(10)**Integer(12)")


def aotinductor(files: dict[str, bytes], marker: Path) -> None:
    """Compiled AOTInductor code (a shared library torch would dlopen)."""
    files["data/aotinductor/model/model.so"] = b"\x7fELF not really"


def legacy_weights(files: dict[str, bytes], marker: Path) -> None:
    """The legacy weights layout: one pickled state dict."""
    files["data/weights/model.pt"] = _torch_pickle(Payload(marker))


def foreign_call(files: dict[str, bytes], marker: Path) -> None:
    """A graph node whose target is not an operator (torch.os.system, reachable by attribute)."""
    def change(doc):
        node = doc["graph_module"]["graph"]["nodes"][0]
        node["target"] = "torch.os.system"
    _edit_json(files, "models/model.json", change)


# payloads that fire against plain torch.export.load(...).module()(x)
LIVE = {"pickled_weight": pickled_weight, "pickled_sample_inputs": pickled_sample_inputs,
        "opaque_constant": opaque_constant, "guards_code": guards_code, "sympy_expr": sympy_expr}
# refused for what they are (no live payload built)
STATIC = {"power_tower": power_tower, "aotinductor": aotinductor, "legacy_weights": legacy_weights,
          "foreign_call": foreign_call}
ALL = {**LIVE, **STATIC}


def craft(base: Path, kind: str, out: Path, marker: Path) -> Path:
    files = members(base)
    ALL[kind](files, marker)
    return write(out, files)
