"""The host fp16 class as two int8 planes (edgeinfer_onnxruntime/weight_planes.py): on onnxruntime itself, a
MatMul's fp32 weight held as the quantizer's int8 plus the int8 of its residual gives x @ W (float64, numpy)
far closer than the int8 plane alone, and closer than fp16 weights do."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")



def run(model, x: np.ndarray) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]


def activations(shape: tuple[int, ...]) -> np.ndarray:
    """A hidden state's spread: values over orders of magnitude, one block of zeros."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape) * np.exp(2 * rng.standard_normal(shape))
    x.reshape(-1, shape[-1])[0, :32] = 0
    return x.astype(np.float32)


def weight(k: int, n: int) -> np.ndarray:
    """Weights spread over orders of magnitude within a block (a trained layer's outliers), one column zero."""
    rng = np.random.default_rng(k * n)
    w = rng.standard_normal((k, n)) * np.exp(rng.standard_normal((k, n)))
    w[:, 0] = 0
    return w.astype(np.float32)


def graph(w: np.ndarray, rank: int):
    from onnx import TensorProto, helper, numpy_helper

    k, n = w.shape
    lead = ["b", "m"][-(rank - 1):]
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*lead, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*lead, n])],
                          [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def planes(w: np.ndarray, rank: int, low: bool):
    """The plugin's conversion of a one-MatMul graph: 8-bit MatMulNBits (block 128, fp32 activations), the low
    plane when ``low``, then the input's two digits."""
    from edgeinfer_onnxruntime.int8_digits import split_digits
    from edgeinfer_onnxruntime.weight_planes import add_low_planes
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    q = MatMulNBitsQuantizer(graph(w, rank), bits=8, block_size=128, is_symmetric=True, accuracy_level=1)
    q.process()
    model = q.model.model
    assert add_low_planes(model, {"w": w} if low else {}) == int(low)
    split_digits(model)
    q.model.topological_sort()
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("k, n, shape", [(256, 96, (3, 256)), (200, 64, (2, 3, 200))])  # 200: a padded last block
def test_two_planes_compute_x_w_closer_than_fp16_weights(k, n, shape):
    w, x = weight(k, n), activations(shape)
    want = x.astype(np.float64) @ w.astype(np.float64)
    got = run(planes(w, len(shape), low=True), x)
    one_plane = run(planes(w, len(shape), low=False), x)  # w8a16
    fp16 = x.astype(np.float64) @ w.astype(np.float16).astype(np.float64)
    assert got.shape == want.shape
    err, err_one, err_fp16 = (np.abs(v - want).max() for v in (got, one_plane, fp16))
    assert err * 30 < err_one, (err, err_one)
    # the activations' second digit bounds it (~1/64516 of a block's largest activation), the weights' two planes
    # ~1/64516 of a block's largest weight; fp16 weights round each to 1/2048 of itself
    assert err < err_fp16 * 2, (err, err_fp16)
    assert err <= 2e-4 * np.abs(want).max()


def test_the_low_plane_is_the_residual_on_the_same_grid():
    from edgeinfer_onnxruntime.weight_planes import ZERO, residual

    w = weight(256, 8)
    blocks, block = 2, 128
    scales = np.abs(w.T.reshape(8, blocks, block)).max(axis=2) / 127
    scales[scales == 0] = 1
    hi = (np.clip(np.rint(w.T.reshape(8, blocks, block) / scales[..., None]), -127, 127) + ZERO).astype(np.uint8)
    lo, lo_scales = residual(w, hi, scales.reshape(-1), block)
    held = ((hi.astype(np.float64) - ZERO) * scales[..., None]
            + (lo.astype(np.float64) - ZERO) * lo_scales.reshape(8, blocks, 1))
    err = np.abs(held.reshape(8, -1).T - w)
    top = np.repeat(np.abs(w.T.reshape(8, blocks, block)).max(axis=2), block, axis=1).reshape(8, -1).T
    assert (err <= top / (2 * 127 * 254) * 1.001 + 1e-12).all()  # half a low step: the low scale ≤ 1/254 of the high
    assert (lo[0] == ZERO).all()  # the zero column: both planes zero


def test_a_weight_left_without_its_second_plane_is_refused(tmp_path, monkeypatch):
    """fp16 must not quietly hold a weight at int8 only: quantize_int8 counts the planes added."""
    from edgeinfer_onnxruntime import weights

    from edgeinfer.errors import ModelError

    path = tmp_path / "model.onnx"
    weights.save(graph(weight(256, 64), 2), path)
    monkeypatch.setattr(weights, "add_low_planes", lambda model, floats: 0)
    with pytest.raises(ModelError, match="second plane"):
        weights.quantize_int8(path, 128, activations_int8=False, low_planes=True)
    monkeypatch.undo()
    weights.quantize_int8(path, 128, activations_int8=False, low_planes=True)
    ops = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert ops.count("MatMulNBits") == 2 and "Add" in ops
