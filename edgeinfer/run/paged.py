"""Layer-paged execution: run a model larger than memory as a chain of segments.

Three parts, all backend-agnostic (``onnx`` is imported inside the functions that need it):

* :func:`split_onnx` cuts an ONNX model into segments at layer boundaries, found from the node
  names of repeated blocks (``/encoder/layer.3/...``, ``/model/layers.7/...``, ``/h.2/...``) or at
  tensors the user names. Each segment is a valid ONNX model with only the initializers it uses;
  its inputs are the residual-stream tensor(s) from the segment before, the graph inputs it
  reads itself (``attention_mask``), and side tensors computed earlier from the inputs alone
  (an extended attention mask); its outputs are what later segments or the caller need.
* :class:`PagedSession` runs the segments in order on any backend, keeping at most ``window``
  segments loaded (an optional prefix pinned), loading the next one on one background thread
  while the current one runs, and accounting resident bytes and page-in times (``profile``).
* :func:`plan_paging` is the planner's side: resident memory with W segments, and decode /
  prefill estimates when every non-resident byte is streamed from storage once per token.

The cost model is written down in ``docs/paging.md``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported where arrays are made, so `edgeinfer plan --paging` stays light
    import numpy as np

from edgeinfer.contract.backend import Backend, CalibrationSet, Session, TensorSpec, _first_line
from edgeinfer.errors import BackendError, EdgeInferError, InputError, ModelError

INDEX = "segments.json"

# a repeated block in a node name: ".../layer.3/...", "/model/layers.7/...", "/transformer/h.2/...", "blocks_4"
_BLOCK = re.compile(r"(?:^|[/.])((?:[A-Za-z]+_)?(?:layers?|blocks?|h|block))[._](\d+)(?=[/._]|$)")


# ------------------------------------------------------------------------------------------------
# splitting
# ------------------------------------------------------------------------------------------------
@dataclass
class SegmentInfo:
    """One segment written by :func:`split_onnx`."""

    index: int
    path: Path
    inputs: list[str]
    outputs: list[str]
    blocks: list[str]  # block labels ("layer.3") it holds; empty for user cuts
    nodes: int
    weight_bytes: int  # raw bytes of the initializers it holds (shared ones counted in each user)
    file_bytes: int
    residual: list[str] = field(default_factory=list)  # activations it hands to the next segment
    side: list[str] = field(default_factory=list)  # input-only side tensors it hands on (masks)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = self.path.name
        return d


def _onnx():
    try:
        import onnx
    except ImportError:  # pragma: no cover - onnx is in every dev environment
        raise InputError("splitting a model needs the onnx package; pip install onnx") from None
    return onnx


def _load_model(model_path: Path) -> Any:
    onnx = _onnx()
    if not model_path.is_file():
        raise InputError(f"model file not found: {model_path}")
    try:
        return onnx.load(str(model_path))
    except Exception as e:
        raise ModelError(
            f"{model_path.name} is not a readable ONNX model ({_first_line(e)}); export it again") from None


def _subgraph_refs(node: Any) -> set[str]:
    """Outer-scope names read by the subgraphs of ``node`` (If/Loop/Scan bodies)."""
    refs: set[str] = set()
    for attr in node.attribute:
        graphs = list(attr.graphs) + ([attr.g] if attr.HasField("g") else [])
        for g in graphs:
            local = {i.name for i in g.input} | {i.name for i in g.initializer}
            for n in g.node:
                local.update(n.output)
            for n in g.node:
                refs.update(x for x in list(n.input) + sorted(_subgraph_refs(n)) if x and x not in local)
    return refs


def _node_inputs(node: Any) -> list[str]:
    ins = [x for x in node.input if x]
    extra = _subgraph_refs(node) if any(a.graphs or a.HasField("g") for a in node.attribute) else set()
    return ins + sorted(extra - set(ins))


def _fix_input_shapes(model: Any, shapes: Mapping[str, Sequence[int]]) -> None:
    names = {i.name: i for i in model.graph.input}
    for name, dims in shapes.items():
        if name not in names:
            raise InputError(f"shapes names unknown input {name!r}; the model's inputs are: {', '.join(names)}")
        vi = names[name]
        tdims = vi.type.tensor_type.shape.dim
        if len(tdims) != len(dims):
            raise InputError(f"shapes[{name!r}] = {list(dims)} has {len(dims)} dims; the input has {len(tdims)}")
        for d, v in zip(tdims, dims):
            d.Clear()
            d.dim_value = int(v)


class _Graph:
    """Producer/consumer maps of a model's main graph."""

    def __init__(self, model: Any):
        g = model.graph
        self.model = model
        self.nodes = list(g.node)
        self.inits = {t.name: t for t in g.initializer}
        self.graph_inputs = [i.name for i in g.input if i.name not in self.inits]
        self.graph_outputs = [o.name for o in g.output]
        self.producer: dict[str, int] = {}
        for i, n in enumerate(self.nodes):
            for o in n.output:
                if o:
                    self.producer[o] = i
        self.inputs_of = [_node_inputs(n) for n in self.nodes]
        self.is_const = [n.op_type == "Constant" and not n.input for n in self.nodes]
        self._input_deps: dict[str, frozenset[str]] = {}

    def ancestors(self, tensor: str) -> set[int]:
        seen: set[int] = set()
        stack = [tensor]
        while stack:
            t = stack.pop()
            i = self.producer.get(t)
            if i is None or i in seen:
                continue
            seen.add(i)
            stack.extend(self.inputs_of[i])
        return seen

    def input_deps(self, tensor: str) -> frozenset[str]:
        """Graph inputs whose values ``tensor`` depends on (through Shape/Size only does not count)."""
        if not self._input_deps:
            gi = set(self.graph_inputs)
            deps: dict[str, frozenset[str]] = {n: frozenset([n]) for n in gi}
            for i, n in enumerate(self.nodes):
                acc: set[str] = set()
                if n.op_type not in ("Shape", "Size"):  # a shape is not a value dependency
                    for x in self.inputs_of[i]:
                        acc |= deps.get(x, frozenset())
                f = frozenset(acc)
                for o in n.output:
                    deps[o] = f
            self._input_deps = deps
        return self._input_deps.get(tensor, frozenset())


def _blocks(graph: _Graph) -> tuple[list[str], list[int | None]]:
    """Block labels in order of first appearance, and each node's block index (None: outside blocks)."""
    order: dict[str, int] = {}
    per_node: list[int | None] = []
    for n in graph.nodes:
        m = None
        for m in _BLOCK.finditer(n.name or ""):
            pass  # the innermost (last) match names the block
        if m is None:
            per_node.append(None)
            continue
        prefix = (n.name or "")[: m.start(1)]
        label = f"{prefix}{m.group(1)}.{m.group(2)}"
        per_node.append(order.setdefault(label, len(order)))
    return list(order), per_node


def _assign_blocks(graph: _Graph, segments: int) -> tuple[list[int], list[list[str]]]:
    labels, per_node = _blocks(graph)
    if len(labels) < 2:
        raise InputError(
            "found no repeated blocks in the node names (like /layers.3/ or /encoder/layer.3/); "
            "name the boundary tensors with --cut instead"
        )
    if segments > len(labels):
        raise InputError(
            f"--segments {segments} is more than the model's {len(labels)} blocks; use at most {len(labels)}")
    group = [b * segments // len(labels) for b in range(len(labels))]
    seg_of: list[int] = []
    for i, blk in enumerate(per_node):
        before = max((seg_of[graph.producer[x]] for x in graph.inputs_of[i] if x in graph.producer), default=0)
        if blk is None:
            seg_of.append(before)
            continue
        s = group[blk]
        if s < before:
            raise ModelError(
                f"node {graph.nodes[i].name!r} of block {labels[blk]} reads a tensor from a later block; "
                "the blocks are not in order: name the boundary tensors with --cut instead"
            )
        seg_of.append(s)
    names = [[labels[b] for b in range(len(labels)) if group[b] == s] for s in range(segments)]
    return seg_of, names


def _assign_cuts(graph: _Graph, cuts: Sequence[str]) -> list[int]:
    seg_of: list[int | None] = [None] * len(graph.nodes)
    for k, cut in enumerate(cuts):
        if cut not in graph.producer:
            if cut in graph.inits or cut in graph.graph_inputs:
                raise InputError(
                    f"--cut {cut!r} is a model input or weight, not an activation; cut at a block's output")
            raise InputError(f"--cut {cut!r}: no tensor of that name in the model; name a node output (see netron)")
        anc = graph.ancestors(cut)
        new = [i for i in anc if seg_of[i] is None]
        if not new or all(graph.is_const[i] for i in new):
            raise InputError(f"--cut {cut!r} leaves an empty segment: it is computed before the previous cut; "
                             "list cuts in model order")
        for i in new:
            seg_of[i] = k
    rest = len(cuts)
    if all(s is not None for s in seg_of):
        raise InputError(f"--cut {cuts[-1]!r} leaves nothing after it (it is the model output); drop it")
    return [rest if s is None else s for s in seg_of]


def _crossing(graph: _Graph, seg_of: Sequence[int], k: int) -> list[str]:
    """Activations produced at or before segment ``k`` and read after it (Constant outputs excluded)."""
    out: list[str] = []
    seen: set[str] = set()
    for i, s in enumerate(seg_of):
        if s <= k:
            continue
        for x in graph.inputs_of[i]:
            p = graph.producer.get(x)
            if p is not None and seg_of[p] <= k and not graph.is_const[p] and x not in seen:
                seen.add(x)
                out.append(x)
    return out


def _check_boundaries(graph: _Graph, seg_of: Sequence[int], cuts: Sequence[str]) -> None:
    """A cut is a real boundary when everything else that crosses it is a side tensor: one that
    depends on strictly fewer graph inputs than the cut tensor (a mask made from attention_mask)."""
    for k, cut in enumerate(cuts):
        mine = graph.input_deps(cut)
        bad = [t for t in _crossing(graph, seg_of, k) if t != cut and not graph.input_deps(t) < mine]
        if bad:
            raise InputError(
                f"--cut {cut!r} is not a layer boundary: {len(bad)} other activation(s) cross it too "
                f"(e.g. {bad[0]!r}); cut at a block's output (the residual stream)"
            )


def _value_infos(model: Any) -> dict[str, Any]:
    onnx = _onnx()
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        inferred = model
    g = inferred.graph
    vis = {v.name: v for v in g.value_info}
    vis.update({v.name: v for v in g.input})
    vis.update({v.name: v for v in g.output})
    return vis


def _tensor_bytes(t: Any) -> int:
    onnx = _onnx()
    if t.HasField("raw_data"):
        return len(t.raw_data)
    try:
        return int(onnx.numpy_helper.to_array(t).nbytes)
    except Exception:
        return 0


def split_onnx(
    model_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    segments: int | None = None,
    cuts: Sequence[str] | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> list[SegmentInfo]:
    """Split ``model_path`` into segments written as ``out_dir/segment_NN.onnx``.

    Give ``segments`` (automatic boundaries between repeated blocks, grouped as evenly as
    possible) or ``cuts`` (tensor names, in model order; each must be a real boundary).
    ``shapes`` fixes input dimensions first (static segments for backends that need them).
    An index ``segments.json`` is written next to the segments.
    """
    onnx = _onnx()
    src = Path(model_path)
    if (segments is None) == (not cuts):
        raise InputError("give either a number of segments or the tensors to cut at, not both or neither")
    if segments is not None and (isinstance(segments, bool) or not isinstance(segments, int) or segments < 1):
        raise InputError(f"segments must be a positive integer, got {segments!r}")
    model = _load_model(src)
    if shapes:
        _fix_input_shapes(model, shapes)
    graph = _Graph(model)
    if cuts:
        cuts = list(cuts)
        if len(set(cuts)) != len(cuts):
            raise InputError("a tensor is named twice in --cut; name each boundary once")
        seg_of = _assign_cuts(graph, cuts)
        _check_boundaries(graph, seg_of, cuts)
        n = len(cuts) + 1
        block_names: list[list[str]] = [[] for _ in range(n)]
    else:
        assert segments is not None
        seg_of, block_names = _assign_blocks(graph, segments)
        n = segments
    vis = _value_infos(model)
    # only the value_info the model itself carries: inferred shapes inside a segment would let a
    # runtime fuse differently than in the whole model (onnxruntime's SkipLayerNorm fusion does)
    orig_vis = {v.name: v for v in model.graph.value_info}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    consumers_after: dict[str, int] = {}  # tensor -> last segment that reads it
    for i, s in enumerate(seg_of):
        if graph.is_const[i]:
            continue
        for x in graph.inputs_of[i]:
            consumers_after[x] = max(consumers_after.get(x, -1), s)
    g_out = set(graph.graph_outputs)
    infos: list[SegmentInfo] = []
    produced_before: set[str] = set()
    for k in range(n):
        idx = [i for i, s in enumerate(seg_of) if s == k and not graph.is_const[i]]
        if not idx:
            raise InputError(f"segment {k} would be empty; use fewer segments or other cuts")
        own_out = {o for i in idx for o in graph.nodes[i].output if o}
        reads: list[str] = []
        for i in idx:
            reads += [x for x in graph.inputs_of[i] if x not in own_out and x not in reads]
        consts = sorted({graph.producer[x] for x in reads
                         if x in graph.producer and graph.is_const[graph.producer[x]]})
        const_out = {o for c in consts for o in graph.nodes[c].output}
        inits = [graph.inits[x] for x in reads if x in graph.inits]
        inputs = [x for x in reads if x not in graph.inits and x not in const_out]
        missing = [x for x in inputs if x not in produced_before and x not in graph.graph_inputs]
        if missing:
            raise ModelError(f"segment {k} reads {missing[0]!r}, which no earlier segment produces; "
                             "the split does not follow the model's order")
        outputs = [o for i in idx for o in graph.nodes[i].output
                   if o and (o in g_out or consumers_after.get(o, -1) > k)]
        for name in inputs + outputs:
            if name not in vis or not vis[name].type.tensor_type.elem_type:
                raise ModelError(f"cannot infer the type of tensor {name!r} at a segment boundary; "
                                 "run onnx shape inference on the model (or export it with static shapes)")
        nodes = [graph.nodes[c] for c in consts] + [graph.nodes[i] for i in idx]
        inner = {o for nd in nodes for o in nd.output} - set(outputs)
        g = onnx.helper.make_graph(
            nodes,
            f"{model.graph.name or 'model'}_segment_{k}",
            [vis[x] for x in inputs],
            [vis[x] for x in outputs],
            initializer=inits,
            value_info=[orig_vis[x] for x in sorted(inner) if x in orig_vis],
        )
        seg = onnx.helper.make_model(g, opset_imports=list(model.opset_import))
        seg.ir_version = model.ir_version
        seg.functions.extend(model.functions)
        try:
            onnx.checker.check_model(seg)
        except Exception as e:
            raise ModelError(f"segment {k} is not a valid ONNX model ({_first_line(e)}); report this model") from None
        path = out / f"segment_{k:02d}.onnx"
        weight_bytes = sum(_tensor_bytes(t) for t in inits)
        if weight_bytes > 1_800_000_000:  # protobuf's 2 GiB limit: weights go to a side file
            onnx.save(seg, str(path), save_as_external_data=True, location=path.name + ".data")
        else:
            onnx.save(seg, str(path))
        file_bytes = path.stat().st_size + _size(path.with_name(path.name + ".data"))
        crossing = _crossing(graph, seg_of, k) if k < n - 1 else []
        residual = [t for t in crossing if graph.producer.get(t) is not None and seg_of[graph.producer[t]] == k]
        side = [t for t in crossing if t not in residual]
        if cuts and k < n - 1:
            residual, side = [cuts[k]], [t for t in crossing if t != cuts[k]]
        infos.append(SegmentInfo(k, path, inputs, outputs, block_names[k], len(nodes), weight_bytes, file_bytes,
                                 residual, side))
        produced_before |= set(outputs)
    if all(_is_static(vis[x]) for x in graph.graph_inputs) and not all(
            _is_static(vis[x]) for i in infos for x in i.inputs + i.outputs):
        _concrete_boundaries(infos, graph, vis)
    (out / INDEX).write_text(json.dumps({
        "source": src.name, "segments": [i.to_json() for i in infos],
        "model_inputs": graph.graph_inputs, "model_outputs": graph.graph_outputs,
    }, indent=2) + "\n")
    return infos


def _is_static(vi: Any) -> bool:
    dims = vi.type.tensor_type.shape.dim
    return all(d.HasField("dim_value") and d.dim_value > 0 for d in dims)


def _concrete_boundaries(infos: Sequence[SegmentInfo], graph: _Graph, vis: Mapping[str, Any]) -> None:
    """Static inputs but boundary shapes shape inference could not settle (an Expand to a computed
    shape): run the segments once on zeros with onnxruntime and write the shapes they really have,
    so backends that need static shapes (RKNN) can convert every segment."""
    import numpy as np

    onnx = _onnx()
    try:
        import onnxruntime as ort
    except ImportError:
        return
    env: dict[str, np.ndarray] = {}
    for name in graph.graph_inputs:
        tt = vis[name].type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        env[name] = np.zeros([d.dim_value for d in tt.shape.dim], dtype=dtype)
    for info in infos:
        sess = ort.InferenceSession(str(info.path), providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        env.update(zip(names, sess.run(names, {i.name: env[i.name] for i in sess.get_inputs()})))
    for info in infos:
        seg = onnx.load(str(info.path))
        for vi in list(seg.graph.input) + list(seg.graph.output):
            if vi.name in env and not _is_static(vi):
                dims = vi.type.tensor_type.shape.dim
                for d, v in zip(dims, env[vi.name].shape):
                    d.Clear()
                    d.dim_value = int(v)
        onnx.checker.check_model(seg)
        onnx.save(seg, str(info.path))
        info.file_bytes = _size(info.path)


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def artifact_bytes(path: Path) -> int:
    """Bytes a loaded artifact occupies on storage: the file plus its weight side files
    (OpenVINO ``.bin``, ONNX external ``.data``); build logs, stamps and recipes do not count."""
    total = _size(path)
    for side in (path.with_suffix(".bin"), path.with_name(path.name + ".data")):
        if side != path:
            total += _size(side)
    return total


# ------------------------------------------------------------------------------------------------
# deploy / quick-try helpers
# ------------------------------------------------------------------------------------------------
def _segment_calibration(paths: Sequence[Path], calibration: CalibrationSet, model_inputs: Sequence[str]
                         ) -> list[CalibrationSet]:
    """Each segment's calibration feeds: the set run through the fp32 segments before it (onnxruntime)."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise InputError("calibrating a segmented model needs onnxruntime on the converting machine; "
                         "pip install onnxruntime") from None
    sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in paths]
    per_seg: list[list[dict[str, np.ndarray]]] = [[] for _ in paths]
    for feeds in calibration:
        env: dict[str, np.ndarray] = dict(feeds)
        for k, s in enumerate(sessions):
            want = {i.name: env[i.name] for i in s.get_inputs()}
            per_seg[k].append(want)
            names = [o.name for o in s.get_outputs()]
            env.update(zip(names, s.run(names, want)))
    return [CalibrationSet(x) for x in per_seg]


def deploy_segments(
    backend: Backend,
    model_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    scheme: str | None,
    calibration: CalibrationSet | None,
    segments: int | None = None,
    cuts: Sequence[str] | None = None,
    **quantize_options: Any,
) -> list[Path]:
    """Split ``model_path``, convert every segment with ``backend.quantize`` into ``out_dir``
    (``segment_NN<suffix>`` plus each artifact's side files and stamp), return the artifact paths
    in order. ``shapes`` in ``quantize_options`` fixes the model's input shapes before splitting
    (segments then get static shapes everywhere). Calibration feeds are propagated through the
    fp32 segments so every segment is calibrated on its own inputs."""
    import shutil
    import tempfile

    out = Path(out_dir)
    shapes = quantize_options.pop("shapes", None)
    with tempfile.TemporaryDirectory(prefix="edgeinfer-split-") as tmp:
        infos = split_onnx(model_path, tmp, segments=segments, cuts=cuts, shapes=shapes)
        out.mkdir(parents=True, exist_ok=True)  # only once the split is known to work
        calib = _segment_calibration([i.path for i in infos], calibration, []) if calibration is not None else None
        suffix = backend.native_suffixes[0] if backend.native_suffixes else ".onnx"
        paths = []
        for info in infos:
            dst = out / f"segment_{info.index:02d}{suffix}"
            paths.append(backend.quantize(info.path, scheme, calib[info.index] if calib else None, dst,
                                          **quantize_options))
        shutil.copyfile(Path(tmp) / INDEX, out / INDEX)
    return paths


def open_paged(
    model: str | os.PathLike[str],
    backend: str | None = None,
    device: str | None = None,
    window: int = 1,
    segments: int | None = None,
    cuts: Sequence[str] | None = None,
    prefetch: bool = True,
    resident_prefix: int | None = None,
    scheme: str | None = None,
    **options: Any,
) -> PagedSession:
    """``edgeinfer run MODEL.onnx --paging W --segments N``: split, convert (cached) and open paged."""
    import hashlib

    from edgeinfer.contract import registry as plugins

    from edgeinfer.contract import stamp
    from edgeinfer.run.loading import cache_dir

    src = Path(model)
    if not src.is_file():
        raise InputError(f"model file not found: {src}")
    if src.suffix.lower() != ".onnx":
        raise InputError(f"--paging splits ONNX models; {src.name} is not .onnx (deploy a paged bundle instead)")
    if segments is None and not cuts:
        raise InputError("--paging needs --segments N or --cut TENSOR")
    be = plugins.get_backend(backend or "onnxruntime")
    key = hashlib.sha256(json.dumps({
        "sha256": stamp.sha256_file(src), "backend": be.name, "versions": be.versions(), "scheme": scheme,
        "segments": segments, "cuts": list(cuts or []), "shapes": options.get("shapes"),
    }, sort_keys=True, default=str).encode()).hexdigest()[:24]
    folder = cache_dir() / "paged" / be.name / key
    done = folder / ".complete"
    if done.exists():
        paths = [folder / p for p in json.loads(done.read_text())]
    else:
        conv = {k: options.pop(k) for k in ("shapes", "target") if k in options}
        try:
            paths = deploy_segments(be, src, folder, scheme, None, segments=segments, cuts=cuts, **conv)
        except BaseException:  # a bad --cut, or interrupted: no half-split model left in the cache
            shutil.rmtree(folder, ignore_errors=True)
            raise
        done.write_text(json.dumps([p.name for p in paths]))
    return PagedSession.from_artifacts(be, paths, device=device, window=window, prefetch=prefetch,
                                       resident_prefix=resident_prefix, **options)


# ------------------------------------------------------------------------------------------------
# the paged session
# ------------------------------------------------------------------------------------------------
class PagingError(BackendError):
    """Loading a segment failed (in the background or in line)."""


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def next_use(k: int, pos: int, n: int) -> int:
    """Steps from position ``pos`` (the segment running now) until segment ``k`` runs again, cyclic."""
    return (k - pos) % n if k != pos else 0


def simulate(segment_bytes: Sequence[int], window: int, prefetch: bool, resident_prefix: int | None = None,
             runs: int = 3) -> dict[str, Any]:
    """The schedule :class:`PagedSession` follows, without loading anything: loads per run and
    bytes paged in during the last (steady-state) run, peak resident bytes and segments."""
    n = len(segment_bytes)
    st = _Schedule(n, window, prefetch, resident_prefix)
    loads: list[list[int]] = []
    for _ in range(runs):
        this: list[int] = []
        for i in range(n):
            this += st.acquire(i)
            this += st.prefetch_after(i)
        loads.append(this)
        st.running = None
    peak_bytes = max(sum(segment_bytes[k] for k in s) for s in st.history) if st.history else 0
    return {"loads_per_run": [len(x) for x in loads], "steady_loads": loads[-1],
            "steady_bytes": sum(segment_bytes[k] for k in loads[-1]),
            "peak_resident_bytes": peak_bytes, "peak_resident_segments": max(len(s) for s in st.history),
            "prefetch_effective": st.prefetch, "pinned": st.pinned}


class _Schedule:
    """Which segments are resident, which to evict (farthest next use; pinned prefix never),
    which to prefetch. Pure bookkeeping, shared by PagedSession and :func:`simulate`."""

    def __init__(self, n: int, window: int, prefetch: bool, resident_prefix: int | None):
        window = min(window, n)
        self.n, self.window = n, window
        self.prefetch = prefetch and window < n and window - (resident_prefix or 0) >= 2
        if resident_prefix is None:  # fill the window: 1 slot streams (2 with prefetch), the rest stay
            resident_prefix = max(0, window - (2 if self.prefetch else 1)) if window < n else 0
        self.pinned = resident_prefix
        self.resident: set[int] = set()  # loaded or being loaded
        self.running: int | None = None
        self.history: list[frozenset[int]] = []

    def _room(self, target: int, pos: int, strict: bool) -> int | None | bool:
        """Make room for ``target``; return the victim (or True when no eviction is needed, None when impossible)."""
        if len(self.resident) < self.window:
            return True
        cands = [k for k in self.resident if k >= self.pinned and k != self.running and k != target]
        if not cands:
            return None
        victim = max(cands, key=lambda k: next_use(k, pos, self.n))
        if strict and next_use(victim, pos, self.n) <= next_use(target, pos, self.n):
            return None
        return victim

    def _admit(self, k: int, victim: int | bool) -> list[int]:
        if victim is not True:
            self.resident.discard(victim)  # type: ignore[arg-type]
            self.evicted.append(victim)  # type: ignore[arg-type]
        self.resident.add(k)
        self.history.append(frozenset(self.resident))
        assert len(self.resident) <= self.window
        return [k]

    evicted: list[int]

    def acquire(self, i: int) -> list[int]:
        """Segment ``i`` is about to run: load it in line if it is not resident (or in flight)."""
        self.evicted = []
        self.running = i
        if i in self.resident:
            return []
        victim = self._room(i, i, strict=False)
        if victim is None:  # pragma: no cover - window >= 1 and nothing else running
            raise RuntimeError("no segment can be evicted")
        return self._admit(i, victim)

    def prefetch_after(self, i: int) -> list[int]:
        """While ``i`` runs: the next segment that is not resident, if there is room for it."""
        self.evicted = []
        if not self.prefetch:
            return []
        for step in range(1, self.n):
            k = (i + step) % self.n
            if k not in self.resident:
                break
        else:
            return []
        victim = self._room(k, i, strict=True)
        if victim is None:
            return []
        return self._admit(k, victim)


class PagedSession(Session):
    """A segmented model run segment by segment with at most ``window`` segments loaded.

    ``resident_prefix`` first segments are loaded once and never evicted (they count within the
    window). With ``prefetch`` (needs window >= 2) one background thread loads the next segment
    while the current one runs. Resident bytes are the artifact bytes of loaded segments
    (:func:`artifact_bytes`); ``profile_notes()`` reports them with page-in times per segment.
    """

    def __init__(
        self,
        backend: Backend,
        artifacts: Sequence[str | os.PathLike[str]],
        device: str | None = None,
        window: int = 1,
        prefetch: bool = True,
        resident_prefix: int | None = None,
        **options: Any,
    ):
        paths = [Path(a) for a in artifacts]
        if not paths:
            raise InputError("a paged model needs at least one segment artifact")
        for p in paths:
            if not p.exists():
                raise InputError(f"segment artifact not found: {p}")
        for name, v, lo in (("window", window, 1), ("resident_prefix", resident_prefix, 0)):
            if name == "resident_prefix" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise InputError(f"paging {name} must be an integer >= {lo}, got {v!r}")
        n = len(paths)
        self._notes: list[str] = []
        window = min(window, n)
        if resident_prefix is not None and resident_prefix >= window and window < n:
            raise InputError(f"resident_prefix {resident_prefix} leaves no room to page: it must be smaller than "
                             f"the window ({window})")
        self._backend, self._paths, self._device, self._options = backend, paths, device, options
        limit = _backend_limit(backend, device)
        if limit is not None:
            max_window, background_ok, why = limit
            if max_window is not None and window > max_window:
                self._notes.append(f"window {window} reduced to {max_window}: {why}")
                window = max_window
                if resident_prefix is not None:
                    resident_prefix = min(resident_prefix, max(0, window - 1))
            if prefetch and not background_ok:
                self._notes.append(f"prefetch off: {why}")
                prefetch = False
        self._sched = _Schedule(n, window, prefetch, resident_prefix)
        if prefetch and not self._sched.prefetch and window < n:
            self._notes.append("prefetch needs two free slots in the window (the next segment loads while the "
                               "current one is resident): running without it")
        self.window, self.resident_prefix = window, self._sched.pinned
        self.prefetch = self._sched.prefetch
        self._sizes = [artifact_bytes(p) for p in paths]
        self._sessions: dict[int, Session] = {}
        self._inflight: tuple[int, Future] | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgeinfer-prefetch") if self.prefetch \
            else None
        self._lock = threading.Lock()
        self.reset_stats()
        self.peak_resident_bytes = 0
        self.peak_resident_segments = 0
        self._seg_inputs: list[list[TensorSpec]] = []
        self._seg_outputs: list[list[TensorSpec]] = []
        try:
            self._learn_specs()
            for k in range(self.resident_prefix):
                self._ensure(k, pos=0)
        except BaseException:
            self.release()
            raise
        inputs, outputs = self._model_io()
        super().__init__(inputs, outputs, device=self._device_name())
        self.backend_name = backend.name

    @classmethod
    def from_artifacts(
        cls, backend: Backend, artifacts: Sequence[str | os.PathLike[str]], **options: Any
    ) -> PagedSession:
        """What ``Bundle.load`` calls for a segmented bundle (``manifest.paging`` spread into the
        keywords). Facts a manifest may record about the split (``segments``, ``cuts``) are not
        load options and are dropped here."""
        for informational in ("segments", "cuts", "index"):
            options.pop(informational, None)
        return cls(backend, artifacts, **options)

    # --- set-up ---------------------------------------------------------------------------------
    def _learn_specs(self) -> None:
        """Input/output specs of every segment: from the stamps when they record both, else by
        loading each segment once (the loads count as page-ins; the first ``window`` stay)."""
        from edgeinfer.contract import stamp

        stamps = [stamp.read(p) or {} for p in self._paths]
        if all(s.get("inputs") and s.get("outputs") for s in stamps):
            self._seg_inputs = [[TensorSpec.from_json(x) for x in s["inputs"]] for s in stamps]
            self._seg_outputs = [[TensorSpec.from_json(x) for x in s["outputs"]] for s in stamps]
            return
        for k in range(len(self._paths)):
            sess = self._ensure(k, pos=k)
            self._seg_inputs.append(list(sess.inputs))
            self._seg_outputs.append(list(sess.outputs))
        self._sched.running = None

    def _model_io(self) -> tuple[list[TensorSpec], list[TensorSpec]]:
        produced: dict[str, TensorSpec] = {}
        inputs: list[TensorSpec] = []
        seen: set[str] = set()
        for ins, outs in zip(self._seg_inputs, self._seg_outputs):
            for s in ins:
                if s.name not in produced and s.name not in seen:
                    seen.add(s.name)
                    inputs.append(s)
            for s in outs:
                produced[s.name] = s
        read_later: set[str] = set()
        outputs: list[TensorSpec] = []
        for k in range(len(self._paths) - 1, -1, -1):
            outputs = [s for s in self._seg_outputs[k] if s.name not in read_later] + outputs
            read_later |= {s.name for s in self._seg_inputs[k]}
        self._last_reader = {}
        for k, ins in enumerate(self._seg_inputs):
            for s in ins:
                self._last_reader[s.name] = k
        return inputs, outputs

    def _device_name(self) -> str:
        for s in self._sessions.values():
            return s.device
        return self._device or ""

    # --- loading --------------------------------------------------------------------------------
    def _load(self, k: int) -> tuple[Session, float, int | None]:
        rss0 = _rss_bytes()
        t = time.perf_counter()
        sess = self._backend.load(self._paths[k], device=self._device, **self._options)
        dt = time.perf_counter() - t
        rss1 = _rss_bytes()
        return sess, dt, (rss1 - rss0) if rss0 is not None and rss1 is not None else None

    def _record(self, k: int, seconds: float, rss_delta: int | None, background: bool) -> None:
        self.page_in_s[k].append(seconds)
        if rss_delta is not None and not background:  # a background load overlaps compute: no honest delta
            self.rss_delta_bytes[k] = rss_delta

    def _account(self) -> None:
        held = self._sched.resident
        b = sum(self._sizes[k] for k in held)
        self.peak_resident_bytes = max(self.peak_resident_bytes, b)
        self.peak_resident_segments = max(self.peak_resident_segments, len(held))
        if len(held) > self.window:  # pragma: no cover - the schedule asserts this too
            raise BackendError(f"paging: {len(held)} segments resident, more than the window {self.window}")

    def _evict(self) -> None:
        for v in self._sched.evicted:
            sess = self._sessions.pop(v, None)
            if sess is not None:
                sess.close()
                self.page_outs += 1

    def _ensure(self, k: int, pos: int) -> Session:
        """Segment ``k`` resident now: take it from the prefetch, or load it in line (a stall)."""
        if self._inflight is not None and self._inflight[0] == k:
            return self._wait_inflight()
        if k in self._sessions:
            self._sched.running = k
            return self._sessions[k]
        if self._inflight is not None:  # a prefetch of something else: let it land first
            self._wait_inflight()
        self._sched.acquire(k)
        self._evict()
        self._account()
        t = time.perf_counter()
        try:
            sess, dt, rss = self._load(k)
        except BaseException:
            self._sched.resident.discard(k)
            raise
        self.stall_s += time.perf_counter() - t
        self._sessions[k] = sess
        self._record(k, dt, rss, background=False)
        if not getattr(self, "device", ""):  # specs came from the stamps: the device is known now
            self.device = sess.device
        return sess

    def _wait_inflight(self) -> Session:
        assert self._inflight is not None
        k, fut = self._inflight
        t = time.perf_counter()
        try:
            sess, dt, rss = fut.result()
        except EdgeInferError as e:
            self._inflight = None
            self._sched.resident.discard(k)
            raise PagingError(f"paging: loading segment {k} ({self._paths[k].name}) in the background failed: "
                              f"{e.one_line()}") from e
        except BaseException as e:
            self._inflight = None
            self._sched.resident.discard(k)
            raise PagingError(f"paging: loading segment {k} ({self._paths[k].name}) in the background failed: "
                              f"{type(e).__name__}: {_first_line(e)}") from e
        self.stall_s += time.perf_counter() - t
        self._inflight = None
        self._sessions[k] = sess
        self._record(k, dt, rss, background=True)
        self.prefetched += 1
        return sess

    def _prefetch_after(self, i: int) -> None:
        if self._pool is None or self._inflight is not None:
            return
        got = self._sched.prefetch_after(i)
        if not got:
            return
        self._evict()
        self._account()
        k = got[0]
        self._inflight = (k, self._pool.submit(self._load, k))

    # --- running --------------------------------------------------------------------------------
    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        env: dict[str, np.ndarray] = dict(feeds)
        out_names = {s.name for s in self.outputs}
        n = len(self._paths)
        with self._lock:
            t_run = time.perf_counter()
            for i in range(n):
                sess = self._ensure(i, pos=i)
                self._sched.running = i
                self._prefetch_after(i)
                sub = {s.name: env[s.name] for s in self._seg_inputs[i]}
                t = time.perf_counter()
                env.update(sess.run(sub))
                self.compute_s[i].append(time.perf_counter() - t)
                for name in [x for x in env if self._last_reader.get(x, -1) <= i and x not in out_names]:
                    del env[name]
            self._sched.running = None
            self.runs += 1
            self.run_s.append(time.perf_counter() - t_run)
        return {s.name: env[s.name] for s in self.outputs}

    def wait_prefetch(self) -> None:
        """Wait for a background load in flight (it stays resident); errors surface at its use."""
        if self._inflight is not None:
            self._inflight[1].exception()

    # --- reporting ------------------------------------------------------------------------------
    def reset_stats(self) -> None:
        n = len(self._paths)
        self.page_in_s: list[list[float]] = [[] for _ in range(n)]
        self.compute_s: list[list[float]] = [[] for _ in range(n)]
        self.rss_delta_bytes: list[int | None] = [None] * n
        self.stall_s = 0.0
        self.prefetched = 0
        self.page_outs = 0
        self.runs = 0
        self.run_s: list[float] = []

    @property
    def resident_segments(self) -> list[int]:
        return sorted(self._sched.resident)

    @property
    def resident_bytes(self) -> int:
        return sum(self._sizes[k] for k in self._sched.resident)

    @property
    def segment_bytes(self) -> list[int]:
        return list(self._sizes)

    def stats(self) -> dict[str, Any]:
        page_in = sum(sum(x) for x in self.page_in_s)
        return {
            "segments": len(self._paths),
            "window": self.window,
            "prefetch": self.prefetch,
            "resident_prefix": self.resident_prefix,
            "runs": self.runs,
            "page_ins": sum(len(x) for x in self.page_in_s),
            "prefetched": self.prefetched,
            "page_outs": self.page_outs,
            "page_in_ms_mean": [round(1e3 * sum(x) / len(x), 3) if x else None for x in self.page_in_s],
            "page_in_ms_total": round(1e3 * page_in, 3),
            "compute_ms_mean": [round(1e3 * sum(x) / len(x), 3) if x else None for x in self.compute_s],
            "stall_ms_total": round(1e3 * self.stall_s, 3),
            "hidden_fraction": round(max(0.0, 1 - self.stall_s / page_in), 4) if page_in > 0 else None,
            "resident_segments": self.resident_segments,
            "resident_bytes": self.resident_bytes,
            "peak_resident_bytes": self.peak_resident_bytes,
            "peak_resident_segments": self.peak_resident_segments,
            "segment_bytes": self.segment_bytes,
            "rss_delta_bytes": self.rss_delta_bytes,
            "accounting": "resident bytes = artifact bytes of loaded (and loading) segments; rss_delta_bytes "
                          "= process RSS change over in-line loads only (background loads overlap compute)",
            "notes": list(self._notes),
        }

    def profile_notes(self) -> dict[str, Any]:
        notes: dict[str, Any] = {"paging": self.stats()}
        for s in self._sessions.values():
            inner = s.profile_notes()
            if inner:
                notes["segment_notes"] = inner
            break
        return notes

    def release(self) -> None:
        if self._inflight is not None:
            k, fut = self._inflight
            self._inflight = None
            try:
                sess, _, _ = fut.result()
                sess.close()
            except BaseException:
                pass
            self._sched.resident.discard(k)
        for k in list(self._sessions):
            self._sessions.pop(k).close()
        self._sched.resident.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def _backend_limit(backend: Backend, device: str | None) -> tuple[int | None, bool, str] | None:
    """(largest window or None, whether background loading may be used, why) for runtimes with
    limits; None when there are none.

    A backend may declare ``paging_limit(device)`` returning that tuple. The RKNN toolkit's
    simulator is handled here: several simulator models do coexist in one process (checked with
    rknn-toolkit2 2.5.0: three resident segments gave the same outputs), but every toolkit call
    holds a process-wide stdout/stderr capture lock, so a background rebuild cannot overlap a
    running segment (and would swallow the main thread's output into the toolkit log)."""
    fn = getattr(backend, "paging_limit", None)
    if callable(fn):
        return fn(device)
    if backend.name == "rknn":
        mode = getattr(backend, "mode", None)
        if (device or "").lower() == "simulator" or (callable(mode) and mode() == "simulator"):
            return (None, False, "the rknn-toolkit2 simulator serialises every toolkit call behind one "
                                  "process-wide output-capture lock, so a background page-in cannot overlap "
                                  "compute; its page-in is a rebuild from the recipe, not a board load")
    return None


# ------------------------------------------------------------------------------------------------
# planning
# ------------------------------------------------------------------------------------------------
# storage read bandwidth assumed when a board profile gives none (interface maxima: optimistic)
STORAGE_GBPS = {
    "dram": (None, "page cache in DRAM: the board's memory bandwidth"),
    "nvme": (3.94, "PCIe 3.0 x4 interface maximum (RK3588 has PCIe 3.0 x4); real drives reach less"),
    "emmc": (0.40, "eMMC 5.1 HS400 interface maximum (400 MB/s); real parts read 250-330 MB/s"),
    "sd": (0.104, "SD UHS-I SDR104 interface maximum (104 MB/s)"),
}
_LAYER_KEY = re.compile(r"(?:layers?|blk|h|block)\.(\d+)\.")


def layer_bytes(spec: Any, weights_total: int) -> tuple[list[int], int]:
    """Bytes per layer and the bytes outside the layers (embeddings, final norm, head).

    Exact per-tensor bytes when the model file gave them and ``weights_total`` matches them;
    otherwise the body is shared equally among ``spec.layers``."""
    layers = max(int(getattr(spec, "layers", 0) or 0), 1)
    tb = getattr(spec, "tensor_bytes", None) or {}
    if tb and abs(sum(tb.values()) - weights_total) <= 0.01 * max(weights_total, 1):
        per = [0] * layers
        rest = 0
        for name, b in tb.items():
            m = _LAYER_KEY.search(name)
            if m and int(m.group(1)) < layers:
                per[int(m.group(1))] += b
            else:
                rest += b
        if sum(per):
            return per, weights_total - sum(per)
    emb = int(getattr(spec, "embedding_params", 0) or 0)
    head = 0 if getattr(spec, "tied_embeddings", False) or getattr(spec, "encoder", False) else int(
        getattr(spec, "lm_head_params", 0) or 0)
    total_p = int(getattr(spec, "params_total", 0) or 0)
    outside = int(weights_total * (emb + head) / total_p) if total_p else 0
    body = weights_total - outside
    return [body // layers] * layers, outside


def segment_bytes_from_layers(per_layer: Sequence[int], outside: int, segments: int) -> list[int]:
    """Group layers contiguously (as :func:`split_onnx` does) and put the non-layer bytes half in
    the first segment (embeddings) and half in the last (final norm, head)."""
    n_l = len(per_layer)
    segments = max(1, min(segments, n_l))
    seg = [0] * segments
    for b, x in enumerate(per_layer):
        seg[b * segments // n_l] += x
    seg[0] += outside // 2
    seg[-1] += outside - outside // 2
    return seg


def plan_paging(
    segment_bytes: Sequence[int],
    window: int,
    *,
    other_resident_bytes: int = 0,
    capacity_bytes: int | None = None,
    npu_window_bytes: int | None = None,
    storage_gbps: float | None = None,
    storage_source: str = "",
    compute_s_per_token: float | None = None,
    prefill_s_per_token: float | None = None,
    prompt_tokens: int = 0,
    batch: int = 1,
    prefetch: bool = True,
    resident_prefix: int | None = None,
    init_s_per_segment: float = 0.0,
    shared_bus: bool = False,
    prefill_chunk: int | None = None,
) -> dict[str, Any]:
    """The paging cost model (docs/paging.md).

    Resident = the peak bytes of the ``window`` segments the schedule keeps (see :func:`simulate`)
    + ``other_resident_bytes`` (KV cache, activations, runtime, OS). Per decode step the schedule
    pages in ``steady_bytes`` (every non-resident byte, once per token) at ``storage_gbps``;
    prefetch overlaps that with compute only when a segment's compute takes at least as long as
    its load: step = max(compute, stream) with prefetch, compute + stream without. With
    ``shared_bus`` (weights paged from DRAM into the NPU's buffers) the copy reads and writes the
    same memory the compute is reading: twice the bytes, and no overlap. Prefill streams the
    bytes once per pass (one pass per ``prefill_chunk`` tokens of the prompt).
    """
    n = len(segment_bytes)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise InputError(f"--paging must be a positive window size (segments resident), got {window!r}")
    w = min(window, n)
    sim = simulate(segment_bytes, w, prefetch, resident_prefix)
    stream = sim["steady_bytes"]
    resident_w = sim["peak_resident_bytes"]
    out: dict[str, Any] = {
        "window": window, "segments": n, "segment_bytes": list(segment_bytes),
        "largest_segment_bytes": max(segment_bytes) if n else 0,
        "resident_weight_bytes": resident_w, "resident_total_bytes": resident_w + other_resident_bytes,
        "streamed_bytes_per_token": stream, "loads_per_token": len(sim["steady_loads"]),
        "prefetch": sim["prefetch_effective"], "storage_gbps": storage_gbps, "storage_source": storage_source,
        "fits": None, "reasons": [], "npu_window_ok": None,
    }
    if capacity_bytes is not None:
        out["fits"] = out["resident_total_bytes"] <= capacity_bytes
        if not out["fits"]:
            out["reasons"].append(f"{w} resident segment(s) + the rest need "
                                  f"{out['resident_total_bytes'] / 2**30:.2f} GiB, more than the board's "
                                  f"{capacity_bytes / 2**30:.2f} GiB; use a smaller window "
                                  "or more segments")
    if npu_window_bytes is not None:
        out["npu_window_bytes"] = npu_window_bytes
        out["npu_window_ok"] = resident_w <= npu_window_bytes
        if not out["npu_window_ok"]:
            out["reasons"].append(f"the resident window ({resident_w / 2**30:.2f} GiB) exceeds one "
                                  f"{npu_window_bytes / 2**30:g} GiB NPU IOMMU window; use a smaller window or "
                                  "more segments")
            out["fits"] = False
    if storage_gbps:
        load_s = (2 if shared_bus else 1) * stream / (storage_gbps * 1e9)
        load_s += init_s_per_segment * len(sim["steady_loads"])
        overlap = out["prefetch"] and not shared_bus
        out["stream_s_per_token"] = load_s
        out["shared_bus"] = shared_bus
        if compute_s_per_token is not None:
            step = max(compute_s_per_token, load_s) if overlap else compute_s_per_token + load_s
            out["compute_s_per_token"] = compute_s_per_token
            out["decode_tokens_per_s"] = round(batch / step, 4) if step > 0 else None
            out["bound"] = "storage" if load_s > compute_s_per_token else "compute"
            hidden = min(load_s, compute_s_per_token) if overlap else 0.0
            out["load_hidden_fraction"] = round(hidden / load_s, 4) if load_s > 0 else 1.0
        if prefill_s_per_token is not None and prompt_tokens:
            passes = -(-prompt_tokens // prefill_chunk) if prefill_chunk else 1
            comp = prefill_s_per_token * prompt_tokens
            total = max(comp, passes * load_s) if overlap else comp + passes * load_s
            out["prefill_passes"] = passes
            out["prefill_tokens_per_s"] = round(prompt_tokens / total, 2) if total > 0 else None
    return out


def _storage(board: Any, storage: str | None) -> tuple[float | None, str, str]:
    if storage is None:
        storage = "board" if getattr(board, "storage_gbps", None) else "emmc"
    if storage == "board":
        if not getattr(board, "storage_gbps", None):
            raise InputError(f"board {board.name} gives no storage bandwidth; pass --storage nvme|emmc|sd|dram")
        return board.storage_gbps.value, storage, board.storage_gbps.source
    if storage == "dram":
        gbps = board.bandwidth_gbps.value if getattr(board, "bandwidth_gbps", None) else None
        return gbps, storage, STORAGE_GBPS["dram"][1]
    if storage in STORAGE_GBPS:
        gbps, src = STORAGE_GBPS[storage]
        return gbps, storage, src
    raise InputError(f"unknown storage {storage!r}; use one of: board, {', '.join(STORAGE_GBPS)}")


def _plan_segments(p: Any, segments: int | None) -> list[int]:
    spec = p.model
    weights = int(p.details.get("weights", {}).get("total_bytes_unpaged", p.breakdown["weights"]))
    if not getattr(spec, "layers", 0) and not segments:
        raise InputError(f"the layer count of {spec.name} is unknown (an ONNX file gives none); pass --segments N")
    if segments is not None and (isinstance(segments, bool) or not isinstance(segments, int) or segments < 1):
        raise InputError(f"--segments must be a positive integer, got {segments!r}")
    per_layer, outside = layer_bytes(spec, weights)
    if not getattr(spec, "layers", 0):
        per_layer, outside = [weights // segments] * segments, weights - weights // segments * segments
    return segment_bytes_from_layers(per_layer, outside, segments or len(per_layer))


def _prefill_chunk(runtime: str) -> int:
    from edgeinfer.planning.planner import runtime_profile

    return int(runtime_profile(runtime).get("prefill_chunk", 512))


def _paging_inputs(p: Any, storage: str | None) -> dict[str, Any]:
    board, est = p.board, p.estimates
    gbps, name, src = _storage(board, storage)
    npu = int(board.npu_window_gib.value * 2**30) if getattr(board, "npu_window_gib", None) else None
    return {
        "capacity_bytes": p.capacity_bytes, "npu_window_bytes": npu, "storage_gbps": gbps,
        "storage_source": f"{name}: {src}",
        "compute_s_per_token": p.batch / est["decode_tokens_per_s"] if est.get("decode_tokens_per_s") else None,
        "prefill_s_per_token": 1 / est["prefill_tokens_per_s"] if est.get("prefill_tokens_per_s") else None,
        "prompt_tokens": p.ctx, "batch": p.batch, "shared_bus": name == "dram",
        "prefill_chunk": None if p.model.encoder else _prefill_chunk(p.runtime),
    }


def apply_to_plan(p: Any, window: int, segments: int | None = None, storage: str | None = None) -> dict[str, Any]:
    """Turn a planner ``Plan`` into its paged form: weights become the resident window, the
    verdict checks the resident total and the NPU window, estimates get the streamed bytes."""
    seg = _plan_segments(p, segments)
    weights = int(p.breakdown["weights"])
    other = sum(v for k, v in p.breakdown.items() if k != "weights")
    res = plan_paging(seg, window, other_resident_bytes=other, **_paging_inputs(p, storage))
    res["storage"] = res["storage_source"].split(":")[0]
    p.details["paging"] = res
    p.details["weights"] = {**p.details.get("weights", {}), "total_bytes_unpaged": weights,
                            "paged": f"{min(window, len(seg))} of {len(seg)} segments resident"}
    p.breakdown["weights"] = res["resident_weight_bytes"]
    # the verdict: resident memory instead of the whole model; paging answers the weights-window limit
    gib = 2**30
    p.reasons = [r for r in p.reasons if not r.startswith("needs ")]
    if p.total_bytes > p.capacity_bytes:
        p.reasons.append(f"needs {p.total_bytes / gib:.2f} GiB with {min(window, len(seg))} segment(s) resident, "
                         f"the board has {p.capacity_bytes / gib:.2f} GiB; use a smaller --paging window")
    p.reasons += [r for r in res["reasons"] if "IOMMU" in r]
    p.warnings = [w for w in p.warnings if not w.startswith("weights exceed one")]
    p.fits = not p.reasons
    est = p.estimates
    est["paging"] = {k: res.get(k) for k in ("window", "segments", "streamed_bytes_per_token", "loads_per_token",
                                             "stream_s_per_token", "decode_tokens_per_s", "prefill_tokens_per_s",
                                             "bound", "load_hidden_fraction", "prefetch", "storage_gbps",
                                             "storage_source")}
    if res.get("decode_tokens_per_s") is not None:
        est["decode_tokens_per_s_unpaged"] = est.get("decode_tokens_per_s")
        est["decode_tokens_per_s"] = res["decode_tokens_per_s"]
    if res.get("prefill_tokens_per_s") is not None:
        est["prefill_tokens_per_s_unpaged"] = est.get("prefill_tokens_per_s")
        est["prefill_tokens_per_s"] = res["prefill_tokens_per_s"]
    return res


def suggest_window(p: Any, segments: int | None = None, storage: str | None = None) -> dict[str, Any] | None:
    """The largest paging window (fastest) whose resident memory fits the board and, where the
    board has one, the NPU window; None when the layers are unknown or even W=1 does not fit."""
    try:
        seg = _plan_segments(p, segments)
        inputs = _paging_inputs(p, storage)
    except EdgeInferError:
        return None
    weights = int(p.details.get("weights", {}).get("total_bytes_unpaged", p.breakdown["weights"]))
    other = sum(v for k, v in p.breakdown.items() if k != "weights")
    for w in range(len(seg), 0, -1):
        res = plan_paging(seg, w, other_resident_bytes=other, **inputs)
        if res["fits"] is not False:
            if w == len(seg) and res["resident_weight_bytes"] >= weights and not p.fits:
                continue  # everything resident is the unpaged plan, which does not fit
            return {"window": w, "segments": len(seg), "resident_total_bytes": res["resident_total_bytes"],
                    "streamed_bytes_per_token": res["streamed_bytes_per_token"],
                    "decode_tokens_per_s": res.get("decode_tokens_per_s"), "storage": res["storage_source"]}
    return None
