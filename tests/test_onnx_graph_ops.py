"""onnx_index.graph_ops reads the ops of an ONNX file's main graph from the protobuf wire format, without onnx
(the onnxruntime plugin's decoder workers ask it which own ops a graph needs): the same (domain, op_type) pairs as
onnx's own parser, with weights inline or external; a file that is not ONNX is a ValueError, one line from the
plugin."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from edgeinfer.contract.onnx_index import graph_ops  # noqa: E402
from edgeinfer.errors import ModelError  # noqa: E402


def model(external: bool, tmp_path):
    then = helper.make_graph([helper.make_node("Identity", ["x"], ["t"], name="inner")], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
             helper.make_node("MatMulW8", ["y", "w"], ["z"], domain="edgeinfer", n=3, block=128),
             helper.make_node("GroupQueryAttention", ["z"], ["a"], domain="com.microsoft", num_heads=2),
             helper.make_node("If", ["c"], ["i"], then_branch=then, else_branch=then)]
    w = numpy_helper.from_array(np.ones((512, 512), np.float32), "w")  # 1 MiB: skipped, not read
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 512]),
                                       helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("i", TensorProto.FLOAT, None)], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("edgeinfer", 1)])
    path = tmp_path / "m.onnx"
    onnx.save_model(m, str(path), save_as_external_data=external, location="m.onnx.data", size_threshold=0)
    return path


@pytest.mark.parametrize("external", [False, True])
def test_the_main_graphs_ops_are_those_onnx_reads(external, tmp_path):
    path = model(external, tmp_path)
    expected = {(n.domain, n.op_type) for n in onnx.load(str(path), load_external_data=False).graph.node}
    assert graph_ops(path) == expected == {("", "MatMul"), ("edgeinfer", "MatMulW8"),
                                                ("com.microsoft", "GroupQueryAttention"), ("", "If")}


def test_a_file_that_is_not_onnx_is_one_line(tmp_path):
    path = model(False, tmp_path)
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(path.read_bytes()[:2000])  # ends inside the weights
    text = tmp_path / "notes.onnx"
    text.write_text("not a model\n" * 10)
    for bad in (cut, text):
        with pytest.raises(ValueError):
            graph_ops(bad)
    own_ops = pytest.importorskip("edgeinfer_onnxruntime.custom_ops").own_ops
    with pytest.raises(ModelError, match="not an ONNX model") as e:
        own_ops(cut)
    assert "\n" not in str(e.value)
