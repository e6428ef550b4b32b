"""The host fp16 class's own kernel (edgeinfer_onnxruntime/matmul_f16.py, kernels/matmul_f16.c), on onnxruntime
itself: x @ W for fp16 weights equals numpy's float64 product of x and the fp16-rounded W, for every row count
(the one-row path, the 12-row passes and their remainders), column counts that fill no whole panel, leading
dimensions and 1 or 2 threads; the graph rewrite replaces only MatMuls over 2-D fp32 weights; a missing
compiler is one line."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from edgeinfer_onnxruntime import matmul_f16  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from edgeinfer.errors import BackendUnavailableError  # noqa: E402

pytestmark = pytest.mark.skipif(matmul_f16.unavailable() is not None,
                                reason=f"no fp16 kernel here: {matmul_f16.unavailable()}")


def matmul_graph(w: np.ndarray, rank: int = 3, extra_matmul: bool = False):
    """x [..., K] @ w as the builder writes it (a MatMul over an fp32 initializer); optionally a MatMul of two
    activations after it, which has no weight to pack."""
    k, n = w.shape
    dims = ["a", "b", k][-rank:]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")]
    out = "y"
    if extra_matmul:
        nodes.append(helper.make_node("Transpose", ["y"], ["yt"], perm=list(range(rank - 2)) + [rank - 1, rank - 2]))
        nodes.append(helper.make_node("MatMul", ["y", "yt"], ["yy"], name="scores"))
        out = "yy"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                          [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def session(model, threads: int = 1):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.register_custom_ops_library(str(matmul_f16.library()))
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return x.astype(np.float64) @ w.astype(np.float16).astype(np.float64)


def test_pack_puts_each_panel_of_32_columns_row_after_row_and_pads_the_last_with_zeros():
    w = np.arange(5 * 40, dtype=np.float32).reshape(5, 40)
    p = matmul_f16.pack(w)
    assert p.shape == (2, 5, 32) and p.dtype == np.float16
    assert p[0, 3, 7] == w[3, 7] and p[1, 4, 7] == w[4, 39] and p[1, 2, 0] == w[2, 32]
    assert not p[1, :, 8:].any()


@pytest.mark.parametrize("k, n", [(64, 32), (130, 50), (48, 7), (96, 200)])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_kernel_equals_the_fp16_rounded_product(k, n, threads):
    rng = np.random.default_rng(k * n)
    w = rng.standard_normal((k, n)).astype(np.float32)
    model = matmul_graph(w)
    assert matmul_f16.use_kernel(model) == 1
    s = session(model, threads)
    for rows in [(1, 1), (1, 12), (2, 7), (1, 13), (3, 9), (2, 0)]:  # one row, whole passes, remainders, none
        x = rng.standard_normal((*rows, k)).astype(np.float32)
        y = s.run(None, {"x": x})[0]
        assert y.shape == (*rows, n)
        # fp32 accumulation of k products of magnitude ~1: error ~ k * 2**-24 * sqrt(k) at most
        np.testing.assert_allclose(y, reference(x, w), rtol=0, atol=1e-5 * k)


def test_a_two_dimensional_input_and_a_single_row():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((40, 33)).astype(np.float32)
    model = matmul_graph(w, rank=2)
    matmul_f16.use_kernel(model)
    x = rng.standard_normal((1, 40)).astype(np.float32)
    np.testing.assert_allclose(session(model).run(None, {"x": x})[0], reference(x, w), atol=1e-4)


def test_the_rewrite_packs_weights_only_and_drops_the_fp32_copy():
    w = np.ones((16, 8), np.float32)
    model = matmul_graph(w, extra_matmul=True)
    assert matmul_f16.use_kernel(model) == 1
    ops = [(n.op_type, n.domain) for n in model.graph.node]
    assert ops == [("MatMulF16", "edgeinfer"), ("Transpose", ""), ("MatMul", "")]  # y @ y^T has no weight
    assert [(t.name, t.data_type, list(t.dims)) for t in model.graph.initializer] == [
        ("w/f16_panels", TensorProto.FLOAT16, [1, 16, 32])]
    assert any(o.domain == "edgeinfer" for o in model.opset_import)
    x = np.ones((1, 2, 16), np.float32)
    # y = x @ w: 16 in each of 8 columns; y @ y^T: 8 * 16 * 16
    assert session(model).run(None, {"x": x})[0].tolist() == [[[2048.0, 2048.0], [2048.0, 2048.0]]]


def test_a_graph_needs_the_library_exactly_when_it_imports_the_domain(tmp_path):
    model = matmul_graph(np.ones((4, 4), np.float32))
    plain = tmp_path / "plain.onnx"
    onnx.save_model(model, str(plain))
    matmul_f16.use_kernel(model)
    kernel = tmp_path / "kernel.onnx"
    onnx.save_model(model, str(kernel))
    assert not matmul_f16.needs_library(plain) and matmul_f16.needs_library(kernel)


def test_a_weight_that_does_not_match_the_input_is_refused_by_the_kernel():
    model = matmul_graph(np.ones((16, 8), np.float32))
    matmul_f16.use_kernel(model)
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "k"  # onnxruntime's own check let through
    with pytest.raises(Exception, match="MatMulF16: x must be"):
        session(model).run(None, {"x": np.ones((1, 1, 15), np.float32)})


def test_the_library_is_built_once_and_a_missing_compiler_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGEINFER_CACHE_DIR", str(tmp_path / "cache"))
    first = matmul_f16.library()
    assert first.is_relative_to(tmp_path / "cache" / "kernels")
    stamp = first.stat().st_mtime_ns
    assert matmul_f16.library() == first and first.stat().st_mtime_ns == stamp
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert "no C compiler" in matmul_f16.unavailable()
    monkeypatch.setenv("EDGEINFER_CACHE_DIR", str(tmp_path / "empty"))
    with pytest.raises(BackendUnavailableError, match="need a C compiler") as e:
        matmul_f16.library()
    assert "\n" not in str(e.value)
