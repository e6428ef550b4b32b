"""One copy of a decoder segment's source weights for all its graphs.

The simulator rebuilds each graph from its source ONNX (``.src.onnx``: :func:`.toolkit.source_model`), and a
segment has several graphs of the same layers: decode for 1, 4 and 8 sequences, prefill. Each exported ONNX held
the fp32 weights itself, 538 MB a graph for SmolLM2-135M (2.15 of its 3.2 GB rk3588 bundle). Here the
initializers of 1 KiB and more move to one file beside the sources, ``seg<k>.rknn.src.weights``, each distinct
tensor once (keyed by its bytes), and every graph's ONNX points at it as ONNX external data
(https://onnx.ai/onnx/repo-docs/ExternalData.html), which rknn-toolkit2's ``load_onnx`` reads. A board needs
none of it (``deploy --board-only`` leaves the file out with the sources: :data:`SUFFIX`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

SUFFIX = ".src.weights"
MIN_BYTES = 1024  # smaller tensors (norms, shapes) stay in the graph


class Store:
    """An append-only file of tensors, each stored once; :meth:`take` points a graph's initializers at it."""

    def __init__(self, path: Path):
        self.path = path
        self.index: dict[bytes, tuple[int, int]] = {}
        path.write_bytes(b"")

    def take(self, onnx_path: Path) -> None:
        """Rewrite ``onnx_path`` (whose external data, if torch wrote any, lies beside it) with its large
        initializers in this store."""
        import onnx
        from onnx.external_data_helper import set_external_data

        proto = onnx.load(str(onnx_path))
        with open(self.path, "ab") as f:
            for t in proto.graph.initializer:
                raw = t.raw_data
                if len(raw) < MIN_BYTES:
                    continue
                key = hashlib.sha256(raw).digest()
                if key not in self.index:
                    self.index[key] = (f.tell(), len(raw))
                    f.write(raw)
                offset, length = self.index[key]
                set_external_data(t, location=self.path.name, offset=offset, length=length)
                t.ClearField("raw_data")
        onnx_path.write_bytes(proto.SerializeToString())


def locations(onnx_path: Path) -> set[str]:
    """The external data files ``onnx_path`` refers to (relative to its folder); none for a self-contained one."""
    import onnx
    from onnx import TensorProto

    proto = onnx.load(str(onnx_path), load_external_data=False)
    return {e.value for t in proto.graph.initializer if t.data_location == TensorProto.EXTERNAL
            for e in t.external_data if e.key == "location"}


def link_beside(source: Path, model: Path) -> list[Path]:
    """Links, beside ``model`` (a copy or link of ``source`` elsewhere), to the external data files ``source``
    refers to, so that the toolkit finds them; returned for removal."""
    from edgeinfer.contract.helpers import inside

    links = []
    for name in sorted(locations(source)):
        target = inside(source.parent, name, "external data location", str(source))
        link = model.parent / name
        if not link.exists():
            link.symlink_to(target.resolve())
            links.append(link)
    return links
