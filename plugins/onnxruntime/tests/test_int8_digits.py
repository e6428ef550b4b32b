"""w8a16's 8-bit MatMulNBits on the int8 kernel over two int8 digits of its input
(edgeinfer_onnxruntime/int8_digits.py): the rewritten graph, on onnxruntime itself, against x @ the int8 weights
the quantizer wrote, dequantized here with numpy (float64)."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def quantized(k: int, n: int, accuracy: int, block: int = 128, rank: int = 2, opset: int = 17):
    """A one-MatMul graph whose fp32 weight onnxruntime's own quantizer made 8-bit (as the plugin's
    quantize_int8 does), its input of ``rank`` dimensions."""
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    w = np.random.default_rng(k + n).standard_normal((k, n)).astype(np.float32)
    lead = ["b", "m"][-(rank - 1):]
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*lead, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*lead, n])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
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


def activations(shape: tuple[int, ...]) -> np.ndarray:
    """Values spread over orders of magnitude (as a hidden state's outliers are), one block all zeros."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape) * np.exp(2 * rng.standard_normal(shape))
    x.reshape(-1, shape[-1])[0, :32] = 0
    return x.astype(np.float32)


@pytest.mark.parametrize("k, n, block, shape, opset", [
    (256, 96, 128, (3, 256), 17),
    (200, 64, 128, (3, 200), 17),  # a last block of 72 activations, padded as the kernel pads it
    (256, 64, 32, (2, 3, 256), 17),  # a decoder's [batch, tokens, hidden] input
    (200, 64, 128, (2, 3, 200), 21),  # ReduceMax's axes as an input (opset 18 on)
])
def test_two_int8_digits_compute_what_fp32_activations_give(k, n, block, shape, opset):
    from edgeinfer_onnxruntime.int8_digits import split_digits

    model = quantized(k, n, accuracy=1, block=block, rank=len(shape), opset=opset)
    x = activations(shape)
    want = x.astype(np.float64) @ dequantized(model, k, n, block)
    one_digit = run(quantized(k, n, accuracy=4, block=block, rank=len(shape)), x)  # w8a8: int8 activations
    assert split_digits(model) == 1
    kernels = [{a.name: onnx.helper.get_attribute_value(a) for a in nd.attribute}
               for nd in model.graph.node if nd.op_type == "MatMulNBits"]
    assert [(a["bits"], a["accuracy_level"]) for a in kernels] == [(8, 4)]  # the int8 kernel, one packed weight
    onnx.checker.check_model(model)
    got = run(model, x)
    assert got.shape == want.shape
    err, err_one = np.abs(got - want).max(), np.abs(one_digit - want).max()
    # the second digit's rounding only: ~1/64516 of a block's largest activation, fp16 activations ~1/2048 of each
    assert err <= 2e-4 * np.abs(want).max(), (err, np.abs(want).max())
    assert err * 30 < err_one, (err, err_one)


def test_nodes_with_int8_activations_are_left_as_they_are():
    from edgeinfer_onnxruntime.int8_digits import split_digits

    model = quantized(256, 64, accuracy=4)
    before = model.SerializeToString()
    assert split_digits(model) == 0
    assert model.SerializeToString() == before


def test_an_input_read_by_several_nodes_is_split_once():
    from edgeinfer_onnxruntime.int8_digits import split_digits
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    rng = np.random.default_rng(2)
    ws = [rng.standard_normal((256, 64)).astype(np.float32) for _ in range(2)]
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w0"], ["y0"]),
                               helper.make_node("MatMul", ["x", "w1"], ["y1"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", 256])],
                              [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["m", 64]) for i in (0, 1)],
                              [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(ws)])
    q = MatMulNBitsQuantizer(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), bits=8,
                             block_size=128, is_symmetric=True, accuracy_level=1)
    q.process()
    model = q.model.model
    assert split_digits(model) == 2
    assert [n.op_type for n in model.graph.node].count("Round") == 1
    x = activations((4, 256))
    opts = ort.SessionOptions()
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    for got, w in zip(sess.run(None, {"x": x}), ws):
        want = x.astype(np.float64) @ w
        # the weights' own int8 rounding (per block of 128) dominates here: within 1 % of the output's range
        assert np.abs(got - want).max() <= 1e-2 * np.abs(want).max()
