"""edgeinfer's own onnxruntime ops for the host decoder classes onnxruntime has no fast CPU kernel for
(``kernels/matmul.c``): ``edgeinfer.MatMulF16`` (fp16, the weights read as fp16), ``edgeinfer.MatMulW8`` (w8a16,
int8 weights with an fp32 scale per block of 128, the activations as two int8 digits per block on the CPU's integer
dot products) and ``edgeinfer.MatMulW4`` (w4a16 and w4a8: int4 weights with a scale and a minimum per block of 32,
as llama.cpp's Q4_1, on the same two digits or on the high digit alone: int8 activations), where this machine can
build and run them (:func:`unavailable`): one library, built for AVX-512 (F, BW, VL, VNNI), for AVX2 (with FMA,
F16C), or as portable C (AArch64, x86-64 without AVX2), the best the CPU has (:func:`isa`), all over the same
packed weights. Deploy builds a graph of them where an AVX build runs (:func:`not_for_deploy`; the portable one
loads bundles copied from such a machine); elsewhere fp16 runs as two int8 planes
(:mod:`.weight_planes`) and w8a16 over its activations' two int8 digits (:mod:`.int8_digits`), both on
onnxruntime's int8 kernel, and w4a16 and w4a8 on the builder's symmetric int4 MatMulNBits. With them,
``edgeinfer.GroupQueryAttention`` (``kernels/attention.c``): the decoder's attention over its fp16 KV cache, in
fp32 (:func:`use_attention`); and ``edgeinfer.EmbedF16`` / ``EmbedW8`` (``kernels/embedding.c``): a tied model's
lookup read from the LM head's panels (``embedding.head_embedding``).

:func:`library` compiles the ops with the system C compiler (``$CC``, else ``cc``) once per source, compiler and
build into the cache (``~/.cache/edgeinfer/kernels/``; ``edgeinfer cache clear kernels`` removes it, and the next
load builds it again). :func:`use_kernels` rewrites the builder's fp32 graph: each MatMul over a 2-D fp32 weight
becomes one of the ops over the weight packed in panels of 32 output columns (:func:`pack_f16`, :func:`pack_w8`,
:func:`pack_w4`; for w4a16 and w4a8 the LM head MatMulW8, as llama.cpp's 4-bit mixes keep it in 8 bits or more).
A graph that uses any of them needs the library at load (:func:`own_ops`). Standard library at
import (blocks.py asks :func:`unavailable` for deploy's conversion key).
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from edgeinfer.contract import cache
from edgeinfer.contract.onnx_index import graph_ops
from edgeinfer.errors import BackendUnavailableError, ModelError

DOMAIN = "edgeinfer"
OPS = {"fp16": "MatMulF16", "w8a16": "MatMulW8", "w4a16": "MatMulW4", "w4a8": "MatMulW4"}  # scheme -> op
# the stamp target of a decoder graph that does not load without the library (own ops besides a lone attention op,
# which falls back to onnxruntime's): the backend's refuses_target asks library_problem for it, at load and in verify
TARGET = "cpu+edgeinfer-ops"
DIGITS = {"w4a16": 2, "w4a8": 1}  # MatMulW4's activation digits per scheme: two (fp32-like), or int8 alone
PANEL = 32  # output columns a panel (NR in the C source)
KERNELS = Path(__file__).with_name("kernels")
SOURCES = (KERNELS / "matmul.c", KERNELS / "attention.c", KERNELS / "embedding.c")  # one library; each includes ort.h
FLAGS = ["-std=gnu11", "-O3", "-fPIC", "-shared", "-fvisibility=hidden"]
# the library's builds, best first: the CPU flags each needs (as /proc/cpuinfo names them) and its compiler flags
ISAS = {
    "avx512": (("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "fma", "f16c"),
               ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mfma", "-mf16c"]),
    "avx2": (("avx2", "fma", "f16c"), ["-mavx2", "-mfma", "-mf16c"]),
    "portable": ((), []),  # plain C, the compiler's own vectorizing (NEON on AArch64); needs _Float16
}
X86_64 = ("x86_64", "amd64")  # platform.machine() of the CPUs the AVX builds are for
PORTABLE_ON = (*X86_64, "aarch64", "arm64")  # where compilers have _Float16 (kernels/half.h) by default
ISA_ENV = "EDGEINFER_KERNEL_ISA"  # pins one build (tests and benchmarks run the AVX2 one on an AVX-512 CPU)
STALE_S = 600  # an earlier build's folder is removed once it is this old

if TYPE_CHECKING:
    import numpy as np


def compiler() -> str | None:
    return shutil.which(os.environ.get("CC") or "cc")


@functools.lru_cache(maxsize=1)
def _cpu_flags() -> tuple[str, ...] | None:
    """The x86 CPU's flags as /proc/cpuinfo names them; none on another architecture (an emulator such as
    qemu-user shows the host's /proc/cpuinfo to an AArch64 process)."""
    if _arch() not in X86_64:
        return ()
    try:
        return tuple(next((ln.split(":", 1)[1].split() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                           if ln.startswith("flags")), []))
    except OSError:
        return None


def _lacks(build: str) -> list[str]:
    return [f for f in ISAS[build][0] if f not in (_cpu_flags() or ())]


def builds() -> list[str]:
    """The builds this CPU runs, best first."""
    return [b for b in ISAS if not _lacks(b) and (b != "portable" or _arch() in PORTABLE_ON)]


def _arch() -> str:
    return platform.machine().lower()


def isa() -> str | None:
    """The build this process runs: ``$EDGEINFER_KERNEL_ISA`` where set, else the best this CPU has; None where the
    pinned one does not run here (:func:`unavailable` says why)."""
    pinned = os.environ.get(ISA_ENV)
    if pinned:
        return pinned if pinned in builds() else None
    return next(iter(builds()), None)


def unavailable() -> str | None:
    """Why this machine cannot run the ops (one line), or None."""
    pinned = os.environ.get(ISA_ENV)
    if pinned and pinned not in ISAS:
        return f"{ISA_ENV}={pinned} names no build of them (one of {', '.join(ISAS)})"
    if isa() is None:
        if not pinned:
            return f"no build of them for this {_arch() or 'unknown'} CPU (the portable one: x86-64 and AArch64)"
        lacks = _lacks(pinned) or [f"x86-64 or AArch64 (this one is {_arch()})"]
        return f"the CPU lacks {', '.join(lacks)} ({ISA_ENV}={pinned})"
    if compiler() is None:
        return f"no C compiler ({os.environ.get('CC') or 'cc'}) to build it"
    return None


def not_for_deploy() -> str | None:
    """Why deploy builds onnxruntime's own forms here rather than a graph of these ops (one line), or None. The
    portable build loads a bundle with the ops, but deploy does not choose it: on this project's x86 machine its
    SSE2 code decoded SmolLM2-135M at 23-24 tok/s where onnxruntime's kernels (the int8-kernel forms) ran 56-87,
    and on AArch64 neither was timed (docs/generation.md)."""
    reason = unavailable()
    return reason or ("only their portable C build runs on this CPU" if isa() == "portable" else None)


def library_problem() -> str | None:
    """:func:`unavailable`'s reason as a bundle's load meets it, in one line that names the fix, or None (nothing
    is built)."""
    reason = unavailable()
    if reason is None:
        return None
    if isa() is None:
        return (f"this bundle's graph needs edgeinfer's own ops, which cannot run here ({reason}); deploy the model "
                "again on this machine")
    return (f"this bundle's graph uses edgeinfer's own ops, which need a C compiler to build {SOURCES[0].name} "
            f"({os.environ.get('CC') or 'cc'} not found); install one (apt install gcc) or deploy the model again on "
            "this machine")


def library() -> Path:
    """The ops' shared library for this CPU (:func:`isa`), built on first use (about two seconds)."""
    problem = library_problem()
    if problem:
        raise BackendUnavailableError(problem)
    cc, build = compiler(), isa()
    flags = [*FLAGS, *ISAS[build][1]]
    out = cache.root() / "kernels" / f"{build}-{_key(cc, build)}" / "libedgeinfer_matmul.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    os.utime(out.parent)  # building now: fresh to the other processes' clean-up below
    for old in out.parent.parent.iterdir():  # this build's earlier sources or compilers, and unnamed older builds
        earlier = old.name.startswith(f"{build}-") or old.name.split("-")[0] not in ISAS
        if old != out.parent and earlier and _stale(old):
            shutil.rmtree(old, ignore_errors=True)
    with tempfile.NamedTemporaryFile(dir=out.parent, suffix=".so", delete=False) as tmp:
        pass
    proc = subprocess.run([cc, *flags, "-o", tmp.name, *map(str, SOURCES)], capture_output=True, text=True)
    if proc.returncode != 0:
        Path(tmp.name).unlink(missing_ok=True)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        raise BackendUnavailableError(f"{cc} could not build {', '.join(p.name for p in SOURCES)}: "
                                      f"{lines[-1] if lines else 'no output'}")
    os.replace(tmp.name, out)  # whole or absent, when two processes build it at once
    return out


def _stale(folder: Path) -> bool:
    """An earlier build's folder untouched for STALE_S: a fresher one may be another process's (another checkout or
    version of edgeinfer on this machine) building into it now."""
    try:
        return time.time() - folder.stat().st_mtime > STALE_S
    except OSError:
        return False


@functools.lru_cache(maxsize=8)
def _key(cc: str, build: str) -> str:
    """The library's cache entry: the source, the compiler's version line and the flags (once per process)."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    text = b"".join(p.read_bytes() for p in sorted(KERNELS.glob("*.[ch]")))
    return hashlib.sha256(text + repr((version, FLAGS, ISAS[build][1])).encode()).hexdigest()[:16]


def own_ops(graph: Path) -> set[str]:
    """The ops of the ``edgeinfer`` domain the ONNX graph file uses (read without importing onnx, ~8 MiB of a
    serve decoder worker, and its weights unread): any of them needs the library at load."""
    try:
        return {op for domain, op in graph_ops(graph) if domain == DOMAIN}
    except ValueError as e:
        raise ModelError(f"{graph}: not an ONNX model ({e})") from None


def _panels(w: np.ndarray, dtype: Any) -> np.ndarray:
    """``w`` ([K, N]) as ``[ceil(N / 32), K, 32]`` of ``dtype``, the last panel zero-padded."""
    import numpy as np

    k, n = w.shape
    panels = -(-n // PANEL)
    padded = np.zeros((k, panels * PANEL), dtype)
    padded[:, :n] = w
    return np.ascontiguousarray(padded.reshape(k, panels, PANEL).transpose(1, 0, 2))


def pack_f16(w: np.ndarray) -> list[np.ndarray]:
    """``w`` ([K, N], a MatMul's B) as fp16 panels."""
    import numpy as np

    return [_panels(w, np.float16)]


def pack_w8(w: np.ndarray, block: int) -> list[np.ndarray]:
    """``w`` ([K, N]) as MatMulW8 holds it: int8 ``q`` symmetric per block of ``block`` rows and column, scale
    ``max|w| / 127`` (1 where the block is all zero), as onnxruntime's quantizer makes MatMulNBits' 8 bits; stored
    as ``q + 128`` (uint8) in panels ``[ceil(N / 32), K4, 32]``, K4 = K rounded up to 4, each panel's bytes four
    rows of a column side by side (``[K4 / 4][32][4]``: what one vpdpbusd multiplies); and the fp32 scales
    ``[panels, ceil(K / block), 32]``."""
    import numpy as np

    k, n = w.shape
    blocks = -(-k // block)
    padded = np.zeros((blocks * block, n), np.float32)
    padded[:k] = w
    s = np.abs(padded.reshape(blocks, block, n)).max(axis=1) / 127
    s[s == 0] = 1.0
    q = np.clip(np.rint(padded.reshape(blocks, block, n) / s[:, None, :]), -127, 127).reshape(-1, n)
    k4 = -(-k // 4) * 4  # <= blocks * block: a block is a multiple of 4
    # [P, K4, 32]; the padded columns hold 0: their outputs are never stored
    panels = _panels((q[:k4] + 128).astype(np.uint8), np.uint8)
    quads = panels.reshape(len(panels), k4 // 4, 4, PANEL).transpose(0, 1, 3, 2)
    return [np.ascontiguousarray(quads).reshape(len(panels), k4, PANEL), _panels(s, np.float32)]


def pack_w4(w: np.ndarray, block: int) -> list[np.ndarray]:
    """``w`` ([K, N]) as MatMulW4 holds it, as llama.cpp's Q4_1 quantizes (``quantize_row_q4_1_ref``, ggml-quants.c):
    per block of ``block`` rows and column a minimum ``m`` and a scale ``d = (max - m) / 15``, both fp16, and
    ``u = round((w - m) / d)`` in 0..15 (5 bits a weight at 32). Weights that are Q4_1 values already (a GGUF's,
    dequantized) come back exactly. ``u`` in panels ``[ceil(N / 32), K4 / 2, 32]`` (K4 = K rounded up to 4), each
    quad row's 64 bytes column ``c``'s four rows in the low nibbles of bytes ``4c .. 4c + 3`` and column ``c + 16``'s
    in their high nibbles (what one vpdpbusd multiplies after a mask and a shift); then the scales and the minimums
    side by side, ``[panels, blocks, 2, 32]`` (one stream of memory: kernels/matmul.c)."""
    import numpy as np

    k, n = w.shape
    blocks = -(-k // block)
    padded = np.empty((blocks * block, n), np.float32)
    padded[:k] = w
    padded[k:] = w[-1]  # past K: the last row again, so that no block's range grows (their activations are 0)
    wb = padded.reshape(blocks, block, n)
    m = wb.min(axis=1).astype(np.float16)
    d = ((wb.max(axis=1) - m.astype(np.float32)) / 15).astype(np.float16)
    d[d == 0] = 1  # a constant block: u = 0, w = m
    u = np.clip(np.rint((wb - m.astype(np.float32)[:, None]) / d.astype(np.float32)[:, None]), 0, 15)
    k4 = -(-k // 4) * 4  # <= blocks * block: a block is a multiple of 4
    panels = _panels(u.reshape(-1, n)[:k4].astype(np.uint8), np.uint8)  # [P, K4, 32]; padded columns 0
    quads = panels.reshape(len(panels), k4 // 4, 4, PANEL).transpose(0, 1, 3, 2)  # [P, K4 / 4, 32, 4]
    packed = quads[:, :, :16] | (quads[:, :, 16:] << 4)
    return [np.ascontiguousarray(packed).reshape(len(panels), k4 // 2, PANEL),
            np.ascontiguousarray(np.stack([_panels(d, np.float16), _panels(m, np.float16)], axis=2))]


# what a node becomes: its op, its packed weights' names, a function that packs them, the new node's attributes and
# the initializers it no longer reads; None to keep the node
Packing = tuple[str, list[str], Callable[[], list["np.ndarray"]], dict[str, int], list[str]]


def _matmul_packing(scheme: str, block: int, head: str | None,
                    head_block: int) -> Callable[[Any, dict[str, Any]], Packing | None]:
    """A MatMul over a 2-D fp32 initializer as ``scheme``'s op (:data:`OPS`; MatMulW8 and W4 in blocks of ``block``);
    the one over ``head`` (the LM head's weight) as MatMulW8 in blocks of ``head_block`` for w4a16 and w4a8."""
    from onnx import TensorProto, numpy_helper

    def packing(n: Any, inits: dict[str, Any]) -> Packing | None:
        t = inits.get(n.input[1]) if n.op_type == "MatMul" and n.domain in ("", "ai.onnx") else None
        if t is None or t.data_type != TensorProto.FLOAT or len(t.dims) != 2:
            return None
        op, size = ("MatMulW8", head_block) if t.name == head else (OPS[scheme], block)
        if op == "MatMulW4":
            size = w4_block(int(t.dims[0]), size)
        names = [f"{t.name}/{op}"] + ([f"{t.name}/{op}/scales"] if op != "MatMulF16" else [])

        def pack() -> list[np.ndarray]:
            w = numpy_helper.to_array(t)
            return pack_f16(w) if op == "MatMulF16" else (pack_w8 if op == "MatMulW8" else pack_w4)(w, size)

        attrs = {"n": int(t.dims[1]), **({"block": size} if op != "MatMulF16" else {}),
                 **({"digits": DIGITS[scheme]} if op == "MatMulW4" else {})}
        return op, names, pack, attrs, [t.name]

    return packing


def w4_block(k: int, block: int) -> int:
    """MatMulW4's block on rows of ``k`` weights: ``block``, halved while it does not divide ``k``, down to 32
    (then the last block is padded), as the planner's ``int4_blocks`` layout counts it (``halve_to``): SmolLM2's
    576-wide rows take blocks of 64 at a group of 128. Not ``contract.helpers.row_block``, which makes a row 32
    does not divide one block: the kernel's blocks are multiples of 4 rows."""
    while block > 32 and k % block:
        block //= 2
    return block


def head_weight(model: Any) -> str | None:
    """The name of the LM head's weight: the first 2-D initializer read by a MatMul on the way back from the graph's
    first output (the logits), or None."""
    graph = model.graph
    inits = {t.name for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    todo, seen = [graph.output[0].name], set()
    while todo:
        n = producer.get(todo.pop(0))
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        if n.op_type == "MatMul" and n.input[1] in inits:
            return n.input[1]
        todo.extend(n.input)
    return None


def use_kernels(model: Any, scheme: str, block: int = 0, head_block: int = 0) -> int:
    """Rewrite every MatMul of ``model`` whose B is a 2-D fp32 initializer into ``scheme``'s op (:data:`OPS`) over
    it packed (``block``: MatMulW8's and W4's); for w4a16 and w4a8 with a ``head_block`` the LM head's
    (:func:`head_weight`) into MatMulW8 in blocks of it. The fp32 initializers it replaced are dropped. Returns the
    number of nodes rewritten."""
    from onnx import helper, numpy_helper

    packing = _matmul_packing(scheme, block, head_weight(model) if scheme in DIGITS and head_block else None,
                              head_block)
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    packed: dict[str, Any] = {}
    replaced: set[str] = set()
    nodes, done = [], 0
    for n in graph.node:
        found = packing(n, inits)
        if found is None:
            nodes.append(n)
            continue
        done += 1
        op, names, pack, attrs, reads = found
        if names[0] not in packed:  # a weight two nodes read is packed once
            for name, a in zip(names, pack()):
                packed[name] = numpy_helper.from_array(a, name)
        nodes.append(helper.make_node(op, [n.input[0], *names], list(n.output), name=f"{n.name}_{op}",
                                      domain=DOMAIN, **attrs))
        replaced |= set(reads)
    used = {i for n in nodes for i in n.input}
    kept = [t for t in graph.initializer if t.name not in replaced or t.name in used]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept + list(packed.values()))
    if done and not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return done


# com.microsoft.GroupQueryAttention attributes the own op computes (any other value keeps onnxruntime's op)
_GQA_AS_OURS = {"do_rotary": 1, "rotary_interleaved": 0, "local_window_size": -1, "softcap": 0.0,
                "smooth_softmax": 0, "qk_output": 0}


def use_attention(model: Any, head_size: int) -> int:
    """Rewrite each ``com.microsoft.GroupQueryAttention`` of ``model`` that :func:`.kv_cache.kv_to_fp16` left
    between Casts (its fp32 query, key and value, or packed QKV, cast to fp16 in; its output cast back to fp32)
    into ``edgeinfer.GroupQueryAttention`` on the fp32 tensors (kernels/attention.c), the Casts dropped; nodes with
    attributes or inputs it does not compute (:data:`_GQA_AS_OURS`, position ids, a bias, a rotary narrower than
    ``head_size``) stay as they are. Returns the number of nodes rewritten."""
    from onnx import TensorProto, helper

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    readers: dict[str, list[Any]] = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)

    def cast(n: Any, to: int) -> bool:
        return n is not None and n.op_type == "Cast" and any(a.name == "to" and a.i == to for a in n.attribute)

    def cast_from(name: str) -> Any:  # the Cast to fp16 that makes ``name`` and feeds nothing else
        n = producer.get(name)
        return n if cast(n, TensorProto.FLOAT16) and len(readers[name]) == 1 else None

    drop, ours = set(), {}
    for n in graph.node:
        if n.op_type != "GroupQueryAttention" or n.domain != "com.microsoft":
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        casts_in = [cast_from(i) if i else None for i in n.input[:3]]
        outs = readers.get(n.output[0], [])
        cast_out = outs[0] if len(outs) == 1 and cast(outs[0], TensorProto.FLOAT) else None
        cos = inits.get(n.input[7]) if len(n.input) > 8 else None
        if (any(attrs.get(k, v) != v for k, v in _GQA_AS_OURS.items()) or any(n.input[9:]) or cast_out is None
                or any(bool(i) != (c is not None) for i, c in zip(n.input[:3], casts_in)) or casts_in[0] is None
                or (casts_in[1] is None) != (casts_in[2] is None)
                or cos is None or cos.data_type != TensorProto.FLOAT16 or cos.dims[-1] * 2 != head_size):
            continue
        drop |= {id(c) for c in [*casts_in, cast_out] if c is not None}
        ours[id(n)] = helper.make_node(
            "GroupQueryAttention", [c.input[0] if c is not None else "" for c in casts_in] + list(n.input[3:9]),
            [cast_out.output[0], *n.output[1:3]], name=f"{n.name}_own", domain=DOMAIN,
            num_heads=attrs["num_heads"], kv_num_heads=attrs["kv_num_heads"], scale=float(attrs.get("scale", 0.0)))
    nodes = [ours.get(id(n), n) for n in graph.node if id(n) not in drop]
    del graph.node[:]
    graph.node.extend(nodes)
    if ours and not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return len(ours)


def onnxruntime_attention(model: Any) -> int:
    """The inverse of :func:`use_attention`: each ``edgeinfer.GroupQueryAttention`` of ``model`` back to
    ``com.microsoft.GroupQueryAttention`` between Casts of its new tokens to fp16 and of its output to fp32, as the
    conversion writes it where the library does not build. Returns the number of nodes rewritten."""
    from onnx import TensorProto, helper

    nodes, done = [], 0
    for n in model.graph.node:
        if n.domain != DOMAIN or n.op_type != "GroupQueryAttention":
            nodes.append(n)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        ins = []
        for i, name in enumerate(n.input[:3]):
            ins.append(f"{name}/fp16" if name else "")
            if name:
                nodes.append(helper.make_node("Cast", [name], [f"{name}/fp16"], to=TensorProto.FLOAT16,
                                              name=f"{n.name}/CastIn{i}"))
        nodes.append(helper.make_node("GroupQueryAttention", [*ins, *n.input[3:]], [f"{n.output[0]}/fp16",
                                      *n.output[1:]], name=n.name, domain="com.microsoft", do_rotary=1,
                                      rotary_interleaved=0, **attrs))
        nodes.append(helper.make_node("Cast", [f"{n.output[0]}/fp16"], [n.output[0]], to=TensorProto.FLOAT,
                                      name=f"{n.name}/CastOut"))
        done += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    if not any(n.domain == DOMAIN for n in nodes):
        kept = [o for o in model.opset_import if o.domain != DOMAIN]
        del model.opset_import[:]
        model.opset_import.extend(kept)
    return done


def session_graph(graph: Path) -> tuple[str | bytes, str | None, str, bool]:
    """What a session of ``graph`` loads: the graph (its path, or the serialized model, its external data in
    ``graph``'s folder: onnxruntime's ``session.model_external_initializers_file_folder_path``), the library it
    registers (None where it uses no own op), a caveat (one line, or ""), and whether the own matmuls read the
    weights in place from onnxruntime's mapping. A graph whose only own op is the attention runs onnxruntime's
    instead where the library cannot be built: the same contract, every score held."""
    ops = own_ops(graph)
    try:
        lib = str(library()) if ops else None
    except BackendUnavailableError as e:
        if ops != {"GroupQueryAttention"}:
            raise
        import onnx

        model = onnx.load(str(graph), load_external_data=False)
        onnxruntime_attention(model)
        return model.SerializeToString(), None, (
            f"edgeinfer's attention op cannot run here ({unavailable() or e}): this decoder runs onnxruntime's "
            "GroupQueryAttention instead (slower, and more memory for long prompts)"), False
    matmuls = bool(ops & set(OPS.values()))
    caveat = ("this bundle's edgeinfer ops run their portable C build on this CPU, slower than the AVX builds it was "
              "deployed with; deploy the model again on this machine for onnxruntime's own kernels"
              if matmuls and isa() == "portable" else "")
    return str(graph), lib, caveat, matmuls
