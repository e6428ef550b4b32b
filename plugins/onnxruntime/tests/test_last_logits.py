"""The LM head gathered to one position per row (last_logits.py), on one-head graphs built here."""

import numpy as np
import onnx
import onnxruntime as ort
from edgeinfer_onnxruntime.last_logits import INPUT, gather_last
from onnx import TensorProto, helper, numpy_helper

W = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
BIAS = np.arange(6, dtype=np.float32)


def head(path, after: str):
    """hidden [batch, seq, 4] -> MatMul -> ``after`` ("Add": a bias; "Transpose": batch and sequence swapped, which
    mixes positions) -> logits."""
    nodes = [helper.make_node("MatMul", ["hidden", "w"], ["m"])]
    nodes.append(helper.make_node("Add", ["m", "bias"], ["logits"]) if after == "Add"
                 else helper.make_node("Transpose", ["m"], ["logits"], perm=[1, 0, 2]))
    g = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["b", "s", 4])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "s", 6])],
                          initializer=[numpy_helper.from_array(W, "w"), numpy_helper.from_array(BIAS, "bias")])
    onnx.save_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_a_head_with_a_bias_gives_the_rows_last_index_names(tmp_path):
    graph = head(tmp_path / "bias.onnx", "Add")
    assert gather_last(graph, "logits") is True
    hidden = np.random.default_rng(1).standard_normal((2, 5, 4)).astype(np.float32)
    sess = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    (got,) = sess.run(["logits"], {"hidden": hidden, INPUT: np.array([[[1]], [[4]]], np.int64)})
    assert got.shape == (2, 1, 6)
    np.testing.assert_allclose(got[:, 0], np.stack([hidden[0, 1], hidden[1, 4]]) @ W + BIAS, rtol=1e-5)


def test_logits_not_from_a_head_through_positionwise_nodes_leave_the_graph_as_it_was(tmp_path):
    graph = head(tmp_path / "transpose.onnx", "Transpose")
    before = graph.read_bytes()
    assert gather_last(graph, "logits") is False
    assert graph.read_bytes() == before
