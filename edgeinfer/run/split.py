"""Split an ONNX model into segments at layer boundaries (for layer-paged execution).

:func:`split_onnx` finds the boundaries from the node names of repeated blocks
(``/encoder/layer.3/...``, ``/model/layers.7/...``, ``/h.2/...``) or at tensors the user names. Each
segment is a valid ONNX model with only the initializers it uses; its inputs are the residual-stream
tensor(s) from the segment before, the graph inputs it reads itself (``attention_mask``), and side
tensors computed earlier from the inputs alone (an extended attention mask); its outputs are what
later segments or the caller need. ``onnx`` is imported inside the functions that need it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported where arrays are made, so `edgeinfer plan --paging` stays light
    import numpy as np

from edgeinfer.contract.helpers import first_line
from edgeinfer.errors import EdgeInferError, InputError, ModelError

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
        raise InputError(f"model file not found: {model_path}", kind="model_not_found")
    try:
        return onnx.load(str(model_path))
    except Exception as e:
        raise ModelError(
            f"{model_path.name} is not a readable ONNX model ({first_line(e)}); export it again") from None


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
            raise ModelError(f"segment {k} is not a valid ONNX model ({first_line(e)}); report this model") from None
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
    shape): run the segments once on zeros on the reference backend and write the shapes they really
    have, so backends that need static shapes can convert every segment."""
    import numpy as np

    from edgeinfer.contract import registry
    from edgeinfer.contract.names import ENCODER_REFERENCE

    onnx = _onnx()
    try:
        ref = registry.get_backend(ENCODER_REFERENCE)
    except EdgeInferError:
        return
    env: dict[str, np.ndarray] = {}
    for name in graph.graph_inputs:
        tt = vis[name].type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        env[name] = np.zeros([d.dim_value for d in tt.shape.dim], dtype=dtype)
    for info in infos:
        with ref.load(info.path) as sess:
            env.update(sess.run({i.name: env[i.name] for i in sess.inputs}))
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
