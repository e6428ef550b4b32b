"""w8a16's 8-bit MatMulNBits as two 4-bit planes (edgeinfer_onnxruntime/int8_planes.py): the rewritten graph
computes x @ the int8 weights the quantizer wrote, dequantized here with numpy (float64), on onnxruntime itself."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def quantized(k: int, n: int, accuracy: int, block: int = 128):
    """A one-MatMul graph whose fp32 weight onnxruntime's own quantizer made 8-bit (as the plugin's
    quantize_int8 does)."""
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    w = np.random.default_rng(k + n).standard_normal((k, n)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    q = MatMulNBitsQuantizer(model, bits=8, block_size=block, is_symmetric=True, accuracy_level=accuracy)
    q.process()
    return q.model.model


def dequantized(model, k: int, n: int, block: int = 128) -> np.ndarray:
    """The weight [k, n] the 8-bit node holds: (q - 128) * its block's scale (MatMulNBits' default zero point)."""
    from onnx import numpy_helper

    [node] = model.graph.node
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    blocks = -(-k // block)
    q = inits[node.input[1]].reshape(n, blocks * block).astype(np.float64) - 128
    scale = np.repeat(inits[node.input[2]].reshape(n, blocks).astype(np.float64), block, axis=1)
    return (q * scale)[:, :k].T


def run(model, x: np.ndarray) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize("k, n", [(256, 96), (200, 64)])  # 200: a last block of 72 weights, padded
def test_two_4bit_planes_compute_the_8bit_weights_exactly(k, n):
    from edgeinfer_onnxruntime.int8_planes import split_planes

    model = quantized(k, n, accuracy=1)
    want_w = dequantized(model, k, n)
    x = np.random.default_rng(1).standard_normal((3, k)).astype(np.float32)
    want = x.astype(np.float64) @ want_w
    assert split_planes(model) == 1
    nodes = [(nd.op_type, {a.name: onnx.helper.get_attribute_value(a) for a in nd.attribute}.get("bits"))
             for nd in model.graph.node]
    assert nodes == [("MatMulNBits", 4), ("MatMulNBits", 4), ("Add", None)]
    assert not any(t.name.endswith("_Q8") for t in model.graph.initializer)  # the 8-bit weight is gone
    onnx.checker.check_model(model)
    got = run(model, x)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_nodes_with_int8_activations_are_left_as_they_are():
    from edgeinfer_onnxruntime.int8_planes import split_planes

    model = quantized(256, 64, accuracy=4)
    before = model.SerializeToString()
    assert split_planes(model) == 0
    assert model.SerializeToString() == before
