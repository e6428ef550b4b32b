"""The host fp16 class on onnxruntime with fp16 weights read as fp16: the ``edgeinfer.MatMulF16`` custom op
(``kernels/matmul_f16.c``), where this machine can build and run it (:func:`unavailable`); else the two int8
planes of :mod:`.weight_planes`.

:func:`library` compiles the op with the system C compiler (``$CC``, else ``cc``) once per source and compiler
into the cache (``~/.cache/edgeinfer/kernels/``; ``edgeinfer cache clear kernels`` removes it, and the next load
builds it again). :func:`use_kernel` rewrites the builder's fp32 graph: each MatMul over a 2-D fp32 weight
becomes a ``MatMulF16`` over the weight packed in panels of 32 output columns (:func:`pack`). A graph that
imports the ``edgeinfer`` domain needs the library at load (:func:`needs_library`). Standard library at import
(blocks.py asks :func:`unavailable` for deploy's conversion key).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.contract import cache
from edgeinfer.errors import BackendUnavailableError

DOMAIN = "edgeinfer"
OP = "MatMulF16"
PANEL = 32  # output columns a panel (NR in the C source)
SOURCE = Path(__file__).with_name("kernels") / "matmul_f16.c"
FLAGS = ["-std=gnu11", "-O3", "-mavx512f", "-mfma", "-mf16c", "-fPIC", "-shared", "-fvisibility=hidden"]
CPU_FLAGS = ("avx512f", "fma", "f16c")

if TYPE_CHECKING:
    import numpy as np


def compiler() -> str | None:
    return shutil.which(os.environ.get("CC") or "cc")


def unavailable() -> str | None:
    """Why this machine cannot run the op (one line), or None."""
    try:
        flags = next((ln.split(":", 1)[1].split() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                      if ln.startswith("flags")), [])
    except OSError:
        return "no /proc/cpuinfo to check the CPU's AVX-512F on (Linux x86-64 only)"
    missing = [f for f in CPU_FLAGS if f not in flags]
    if missing:
        return f"the CPU lacks {', '.join(missing)}"
    if compiler() is None:
        return f"no C compiler ({os.environ.get('CC') or 'cc'}) to build it"
    return None


def library() -> Path:
    """The op's shared library, built on first use (about a second)."""
    cc = compiler()
    if cc is None:
        raise BackendUnavailableError(f"this bundle's fp16 MatMuls need a C compiler to build {SOURCE.name} "
                                      f"({os.environ.get('CC') or 'cc'} not found); install one (apt install gcc) "
                                      "or deploy the model again on this machine")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    key = hashlib.sha256(SOURCE.read_bytes() + repr((version, FLAGS)).encode()).hexdigest()[:16]
    out = cache.root() / "kernels" / key / "libedgeinfer_matmul_f16.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=out.parent, suffix=".so", delete=False) as tmp:
        pass
    proc = subprocess.run([cc, *FLAGS, "-o", tmp.name, str(SOURCE)], capture_output=True, text=True)
    if proc.returncode != 0:
        os.unlink(tmp.name)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        raise BackendUnavailableError(f"{cc} could not build {SOURCE.name}: {lines[-1] if lines else 'no output'}")
    os.replace(tmp.name, out)  # whole or absent, when two processes build it at once
    return out


def needs_library(graph: Path) -> bool:
    """Whether the ONNX graph file imports the op's domain (its weights left unread)."""
    import onnx

    return any(o.domain == DOMAIN for o in onnx.load(str(graph), load_external_data=False).opset_import)


def pack(w: np.ndarray) -> np.ndarray:
    """``w`` ([K, N], a MatMul's B) as fp16 panels ``[ceil(N / 32), K, 32]``, the last one zero-padded."""
    import numpy as np

    k, n = w.shape
    panels = -(-n // PANEL)
    padded = np.zeros((k, panels * PANEL), np.float16)
    padded[:, :n] = w
    return np.ascontiguousarray(padded.reshape(k, panels, PANEL).transpose(1, 0, 2))


def use_kernel(model: Any) -> int:
    """Rewrite every MatMul of ``model`` whose B is a 2-D fp32 initializer into a ``MatMulF16`` over it packed;
    the fp32 initializers it replaced are dropped. Returns the number of nodes rewritten."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    packed: dict[str, Any] = {}
    replaced: set[str] = set()
    nodes = []
    for n in graph.node:
        t = inits.get(n.input[1]) if n.op_type == "MatMul" and n.domain in ("", "ai.onnx") else None
        if t is None or t.data_type != TensorProto.FLOAT or len(t.dims) != 2:
            nodes.append(n)
            continue
        name = f"{t.name}/f16_panels"
        if name not in packed:
            packed[name] = numpy_helper.from_array(pack(numpy_helper.to_array(t)), name)
        nodes.append(helper.make_node(OP, [n.input[0], name], list(n.output), name=f"{n.name}_f16", domain=DOMAIN,
                                      n=int(t.dims[1])))
        replaced.add(t.name)
    used = {i for n in nodes for i in n.input}
    kept = [t for t in graph.initializer if t.name not in replaced or t.name in used]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept + list(packed.values()))
    done = len(nodes) - sum(n.op_type != OP or n.domain != DOMAIN for n in nodes)
    if done and not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return done
