"""edgeinfer's own onnxruntime ops (edgeinfer_onnxruntime/custom_ops.py, kernels/matmul.c), on onnxruntime
itself: x @ W equals numpy's float64 product of x and W as the op holds it (fp16-rounded; int8 times its block's
scale), for every row count (the one-row path, the multi-row passes and their remainders), column counts that fill
no whole panel, K that fills no whole block, leading dimensions and 1 or 2 threads, in each build this CPU runs
(AVX-512 and AVX2 here); the graph rewrite replaces only MatMuls over 2-D fp32 weights; a missing compiler, or a CPU
without the build a bundle needs, is one line."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from edgeinfer_onnxruntime import custom_ops  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from edgeinfer.errors import BackendUnavailableError  # noqa: E402

pytestmark = pytest.mark.skipif(custom_ops.unavailable() is not None,
                                reason=f"no fp16 kernel here: {custom_ops.unavailable()}")


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
    opts.register_custom_ops_library(str(custom_ops.library()))
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def held(w: np.ndarray, scheme: str, block: int = 0) -> np.ndarray:
    """W as the op multiplies it: fp16-rounded, or int8 per block of ``block`` rows and column times the block's
    max|w| / 127."""
    if scheme == "fp16":
        return w.astype(np.float16).astype(np.float64)
    k, n = w.shape
    out = np.empty((k, n))
    for b in range(0, k, block):
        part = w[b:b + block].astype(np.float64)
        scale = np.abs(part).max(axis=0) / 127
        scale[scale == 0] = 1
        out[b:b + block] = np.clip(np.rint(part / scale), -127, 127) * scale
    return out


def digits(x: np.ndarray, block: int, count: int = 2) -> np.ndarray:
    """x as MatMulW8 multiplies it: per row and block of ``block``, s = max|x| / 127, h = round(x / s),
    l = round(254 (x / s - h)), x = s (h + l / 254); with ``count`` 1 (MatMulW4 for w4a8) s h alone, h rounded
    from x times the fp32 reciprocal of s, as the kernels take it (a value halfway between two steps may round
    either way; two digits make up for it, one does not)."""
    out = np.empty(x.shape)
    for b in range(0, x.shape[-1], block):
        part = x[..., b:b + block].astype(np.float64)
        s = np.abs(part).max(axis=-1, keepdims=True) / 127
        s[s == 0] = 1
        h = np.clip(np.rint(part / s), -127, 127)
        if count == 1:
            s32 = np.abs(x[..., b:b + block]).max(axis=-1, keepdims=True) / np.float32(127)
            s32[s32 == 0] = 1
            s, h = s32.astype(np.float64), np.clip(np.rint(x[..., b:b + block] * (np.float32(1) / s32)), -127, 127)
        low = np.clip(np.rint((part / s - h) * 254), -127, 127) if count == 2 else 0
        out[..., b:b + block] = s * (h + low / 254)
    return out


def reference(x: np.ndarray, w: np.ndarray, scheme: str = "fp16", block: int = 0) -> np.ndarray:
    """x @ W as the op multiplies them: MatMulW8 takes x as two digits (in both builds), MatMulF16 x itself."""
    held_x = digits(x, block) if scheme == "w8a16" else x.astype(np.float64)
    return held_x @ held(w, scheme, block)


def test_pack_puts_each_panel_of_32_columns_row_after_row_and_pads_the_last_with_zeros():
    w = np.arange(5 * 40, dtype=np.float32).reshape(5, 40)
    [p] = custom_ops.pack_f16(w)
    assert p.shape == (2, 5, 32) and p.dtype == np.float16
    assert p[0, 3, 7] == w[3, 7] and p[1, 4, 7] == w[4, 39] and p[1, 2, 0] == w[2, 32]
    assert not p[1, :, 8:].any()
    u, scales = custom_ops.pack_w8(w - 100, block=4)  # rows 0-3 one block, row 4 the next (rows 5-7 padding)
    assert u.shape == (2, 8, 32) and u.dtype == np.uint8 and scales.shape == (2, 2, 32)
    assert scales[0, 0, 7] == pytest.approx(max(abs(w[:4, 7] - 100)) / 127)
    quads = u.reshape(2, 2, 32, 4)  # per panel: four rows of a column side by side
    assert (int(quads[1, 1, 7, 0]) - 128) * scales[1, 1, 7] == pytest.approx(w[4, 39] - 100, rel=1e-2)
    assert (quads[1, 1, :8, 1:] == 128).all()  # rows 5-7: zero weights, as q + 128
    assert not quads[1, :, 8:].any()  # columns 40-63: padding whose outputs are never stored


@pytest.mark.parametrize("scheme, block", [("fp16", 0), ("w8a16", 128), ("w8a16", 32)])
@pytest.mark.parametrize("k, n", [(64, 32), (130, 50), (48, 7), (96, 200)])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_kernel_equals_the_product_with_the_weights_it_holds(scheme, block, k, n, threads, build):
    rng = np.random.default_rng(k * n)
    w = rng.standard_normal((k, n)).astype(np.float32)
    model = matmul_graph(w)
    assert custom_ops.use_kernels(model, scheme, block) == 1
    s = session(model, threads)
    for rows in [(1, 1), (1, 12), (2, 7), (1, 13), (3, 9), (2, 0)]:  # one row, whole passes, remainders, none
        x = rng.standard_normal((*rows, k)).astype(np.float32)
        y = s.run(None, {"x": x})[0]
        assert y.shape == (*rows, n)
        # fp32 accumulation of k products of magnitude ~1: error ~ k * 2**-24 * sqrt(k) at most
        np.testing.assert_allclose(y, reference(x, w, scheme, block), rtol=0, atol=1e-5 * k)


def test_a_block_past_256_rows_keeps_its_int32_sums_in_range(build):
    """MatMulW8's AVX2 build sums a block in int32 and flushes it to fp32 every 256 rows: the largest weights
    and activations of a 1024-row block sum to 1024 * 127 * 32258 > 2^31 without that."""
    w = np.ones((1100, 40), np.float32)
    w[::2] = -1
    model = matmul_graph(w)
    custom_ops.use_kernels(model, "w8a16", 1024)
    x = np.where(np.arange(1100) % 2, 1.0, -1.0).astype(np.float32)[None, None] * np.ones((1, 2, 1), np.float32)
    y = session(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, reference(x, w, "w8a16", 1024), rtol=1e-6)
    assert y[0, 0, 0] == pytest.approx(1100)


def nbits_graph(w: np.ndarray, block: int = 32, symmetric: bool = True, bits: int = 4):
    """``matmul_graph(w)`` as onnxruntime's quantizer writes it for the builder's int4 (MatMulNBits, fp32
    activations)."""
    import logging

    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    q = MatMulNBitsQuantizer(matmul_graph(w), block_size=block, is_symmetric=symmetric, accuracy_level=1, bits=bits)
    q.process()
    return q.model.model


def nbits_weights(model, fp16_scales: bool = True) -> np.ndarray:
    """The [K, N] weight a symmetric 4-bit MatMulNBits holds, read from its initializers by hand: element k of
    column n is byte k // 2 of the column's bytes, low nibble first, times its block's scale after taking 8 off;
    the scales rounded to fp16 as MatMulW4 holds them (``fp16_scales``), else MatMulNBits' own fp32."""
    [node] = model.graph.node
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    k, n, block = attrs["K"], attrs["N"], attrs["block_size"]
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    b, scales = inits[node.input[1]].reshape(n, -1), inits[node.input[2]].reshape(n, -1)
    if fp16_scales:
        scales = scales.astype(np.float16).astype(np.float64)
    u = np.empty((n, b.shape[1] * 2))
    u[:, 0::2], u[:, 1::2] = b & 15, b >> 4
    return ((u - 8) * np.repeat(scales, block, axis=1)[:, :u.shape[1]]).T[:k]


def test_pack_w4_puts_two_columns_a_byte_and_four_rows_of_a_column_side_by_side():
    rng = np.random.default_rng(1)
    k, n = 70, 40  # K4 72: rows 70-71 padding; panel 1: columns 32-39, the rest padding
    u = rng.integers(0, 16, (n, 96))  # three blocks of 32 along K (70 rows used)
    b = (u[:, 0::2] | (u[:, 1::2] << 4)).astype(np.uint8).reshape(n, 3, 16)
    scales = rng.random(n * 3).astype(np.float32)
    packed, s = custom_ops.pack_w4(b, scales, k, n)
    assert packed.shape == (2, 36, 32) and packed.dtype == np.uint8 and s.shape == (2, 3, 32)
    assert s.dtype == np.float16  # Q4_0's scale type: 4.5 bits a weight
    quads = packed.reshape(2, 18, 64)  # per panel and quad row: 64 bytes
    assert quads[0, 1, 4 * 5 + 2] & 15 == u[5, 6] and quads[0, 1, 4 * 5 + 2] >> 4 == u[21, 6]  # row 6
    assert quads[1, 17, 4 * 7 + 1] & 15 == u[39, 69] and quads[1, 17, 4 * 7 + 2] & 15 == 8  # row 70: a zero weight
    assert not (quads[1, :, :] >> 4).any()  # panel 1's columns 48-63: padding
    assert s[0, 2, 5] == np.float16(scales[5 * 3 + 2]) and s[1, 1, 7] == np.float16(scales[39 * 3 + 1])
    assert not s[1, :, 8:].any()


@pytest.mark.parametrize("k, n", [(64, 32), (130, 50), (96, 200)])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("scheme", ["w4a16", "w4a8"])
def test_matmul_w4_equals_the_product_with_the_int4_weights_and_onnxruntimes_own_kernel(k, n, threads, scheme, build):
    """MatMulW4 over a MatMulNBits' weights (the builder's symmetric int4, block 32; the scales as fp16): numpy's
    product of x's two digits (w4a16) or its high digit alone (w4a8: int8 per block of 32) and the weights read by
    hand; and for w4a16 onnxruntime's MatMulNBits on fp32 activations and scales on the same x."""
    rng = np.random.default_rng(k + n)
    w = rng.standard_normal((k, n)).astype(np.float32)
    theirs = nbits_graph(w)
    ours = nbits_graph(w)
    assert custom_ops.use_kernels(ours, scheme) == 1
    assert {a.name: a.i for a in ours.graph.node[0].attribute}["digits"] == {"w4a16": 2, "w4a8": 1}[scheme]
    assert [(t.name, list(t.dims)) for t in ours.graph.initializer] == [
        (f"{ours.graph.node[0].input[1]}", [-(-n // 32), -(-k // 4) * 2, 32]),
        (f"{ours.graph.node[0].input[2]}", [-(-n // 32), -(-k // 32), 32])]  # MatMulNBits' own initializers gone
    s = session(ours, threads)
    ref = ort.InferenceSession(theirs.SerializeToString(), providers=["CPUExecutionProvider"])
    held_w = nbits_weights(theirs)
    assert np.abs(held_w - w).max() <= np.abs(w).max() / 7  # the quantized weights, read right
    assert np.abs(held_w - nbits_weights(theirs, fp16_scales=False)).max() <= np.abs(w).max() / 2**11
    for rows in [(1, 1), (1, 12), (2, 7), (1, 13), (3, 9), (2, 0)]:
        x = rng.standard_normal((*rows, k)).astype(np.float32)
        y = s.run(None, {"x": x})[0]
        assert y.shape == (*rows, n)
        np.testing.assert_allclose(y, digits(x, 32, 2 if scheme == "w4a16" else 1) @ held_w, rtol=0, atol=1e-5 * k)
        if scheme == "w4a16":  # onnxruntime's fp32 scales: each product off by the fp16 rounding of its scale
            bound = 1e-3 * np.sqrt(k) + 2.0**-11 * (np.abs(x) @ np.abs(held_w))
            assert (np.abs(y - ref.run(None, {"x": x})[0]) <= bound).all()
        elif y.size:  # int8 activations: off fp32's product by what one digit drops
            assert np.abs(y - x @ held_w).max() > 1e-3


@pytest.mark.parametrize("block", [16, 128])
def test_matmul_w4_takes_the_builders_other_block_sizes(block, build):
    """A scheme's group size (``w4a16_g128``) reaches the builder's int4 block: the op's blocks follow it."""
    rng = np.random.default_rng(block)
    w = rng.standard_normal((256, 40)).astype(np.float32)
    theirs, ours = nbits_graph(w, block=block), nbits_graph(w, block=block)
    assert custom_ops.use_kernels(ours, "w4a16") == 1
    assert {a.name: a.i for a in ours.graph.node[0].attribute}["block"] == block
    x = rng.standard_normal((1, 3, 256)).astype(np.float32)
    y = session(ours).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, digits(x, block) @ nbits_weights(theirs), rtol=0, atol=1e-5 * 256)


def test_the_w4_rewrite_leaves_what_matmul_w4_does_not_compute():
    w = np.random.default_rng(2).standard_normal((64, 40)).astype(np.float32)
    for model in (nbits_graph(w, symmetric=False), nbits_graph(w, bits=8), matmul_graph(w)):
        before = [(n.op_type, n.domain) for n in model.graph.node]
        assert custom_ops.use_kernels(model, "w4a16") == 0
        assert [(n.op_type, n.domain) for n in model.graph.node] == before


def test_a_two_dimensional_input_and_a_single_row(build):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((40, 33)).astype(np.float32)
    model = matmul_graph(w, rank=2)
    custom_ops.use_kernels(model, "fp16")
    x = rng.standard_normal((1, 40)).astype(np.float32)
    np.testing.assert_allclose(session(model).run(None, {"x": x})[0], reference(x, w), atol=1e-4)


def test_the_rewrite_packs_weights_only_and_drops_the_fp32_copy(build):
    w = np.ones((16, 8), np.float32)
    model = matmul_graph(w, extra_matmul=True)
    assert custom_ops.use_kernels(model, "fp16") == 1
    ops = [(n.op_type, n.domain) for n in model.graph.node]
    assert ops == [("MatMulF16", "edgeinfer"), ("Transpose", ""), ("MatMul", "")]  # y @ y^T has no weight
    assert [(t.name, t.data_type, list(t.dims)) for t in model.graph.initializer] == [
        ("w/MatMulF16", TensorProto.FLOAT16, [1, 16, 32])]
    assert any(o.domain == "edgeinfer" for o in model.opset_import)
    x = np.ones((1, 2, 16), np.float32)
    # y = x @ w: 16 in each of 8 columns; y @ y^T: 8 * 16 * 16
    assert session(model).run(None, {"x": x})[0].tolist() == [[[2048.0, 2048.0], [2048.0, 2048.0]]]


def test_a_graph_needs_the_library_exactly_when_it_uses_an_op_of_the_domain(tmp_path):
    model = matmul_graph(np.ones((4, 4), np.float32))
    plain = tmp_path / "plain.onnx"
    onnx.save_model(model, str(plain))
    custom_ops.use_kernels(model, "w8a16", 2)
    kernel = tmp_path / "kernel.onnx"
    onnx.save_model(model, str(kernel))
    assert custom_ops.own_ops(plain) == set() and custom_ops.own_ops(kernel) == {"MatMulW8"}


def test_a_weight_that_does_not_match_the_input_is_refused_by_the_kernel(build):
    model = matmul_graph(np.ones((16, 8), np.float32))
    custom_ops.use_kernels(model, "fp16")
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "k"  # onnxruntime's own check let through
    with pytest.raises(Exception, match="MatMulF16: x must be"):
        session(model).run(None, {"x": np.ones((1, 1, 15), np.float32)})


def test_the_library_is_built_once_and_a_missing_compiler_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGEINFER_CACHE_DIR", str(tmp_path / "cache"))
    first = custom_ops.library()
    assert first.is_relative_to(tmp_path / "cache" / "kernels")
    stamp = first.stat().st_mtime_ns
    assert custom_ops.library() == first and first.stat().st_mtime_ns == stamp
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert "no C compiler" in custom_ops.unavailable()
    monkeypatch.setenv("EDGEINFER_CACHE_DIR", str(tmp_path / "empty"))
    with pytest.raises(BackendUnavailableError, match="need a C compiler") as e:
        custom_ops.library()
    assert "\n" not in str(e.value)


def test_the_probe_names_the_ops_and_warns_with_a_fix_when_no_compiler_builds_them(monkeypatch, tmp_path):
    from edgeinfer_onnxruntime.backend import OnnxRuntimeBackend

    details = OnnxRuntimeBackend().probe().details
    assert details["own_ops"] == ("edgeinfer.MatMulF16 (fp16), edgeinfer.MatMulW8 (w8a16), edgeinfer.MatMulW4 "
                                  f"(w4a16, w4a8), {custom_ops.isa()} build")
    assert "warnings" not in details
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    details = OnnxRuntimeBackend().probe().details
    assert details["own_ops"].startswith("none: no C compiler")
    [warning] = details["warnings"]
    assert "int4" in warning["message"] and "apt install gcc" in warning["fix"]


def test_each_cpu_gets_the_best_build_it_runs_and_one_without_avx2_a_line_that_says_so(monkeypatch):
    """The CPU's flags stood in for (custom_ops._cpu_flags): this machine's own are one case only."""
    monkeypatch.delenv(custom_ops.ISA_ENV, raising=False)
    zen4 = ("fma", "f16c", "avx2", "avx512f", "avx512bw", "avx512_vnni")
    core_ultra = ("fma", "f16c", "avx2", "avx_vnni")  # Meteor Lake: AVX2 and AVX-VNNI, no AVX-512
    for flags, want in [(zen4, "avx512"), (core_ultra, "avx2"), (("fma", "f16c", "avx"), None)]:
        monkeypatch.setattr(custom_ops, "_cpu_flags", lambda flags=flags: flags)
        assert custom_ops.isa() == want
    assert custom_ops.unavailable() == "the CPU lacks avx2"
    with pytest.raises(BackendUnavailableError, match=r"cannot run here \(the CPU lacks avx2\); deploy") as e:
        custom_ops.library()
    assert "\n" not in str(e.value)
    monkeypatch.setattr(custom_ops, "_cpu_flags", lambda: core_ultra)
    monkeypatch.setenv(custom_ops.ISA_ENV, "avx512")
    assert custom_ops.isa() is None
    assert custom_ops.unavailable() == "the CPU lacks avx512f, avx512bw, avx512_vnni (EDGEINFER_KERNEL_ISA=avx512)"
    monkeypatch.setenv(custom_ops.ISA_ENV, "neon")
    assert custom_ops.unavailable() == "EDGEINFER_KERNEL_ISA=neon names no build of them (one of avx512, avx2)"


def test_the_two_builds_are_two_libraries_and_a_build_replaces_its_older_ones(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGEINFER_CACHE_DIR", str(tmp_path / "cache"))
    kernels = tmp_path / "cache" / "kernels"
    runs = custom_ops.builds()
    for stale in [f"{b}-0000000000000000" for b in runs] + ["0123456789abcdef"]:  # older sources, unnamed builds
        (kernels / stale).mkdir(parents=True)
        (kernels / stale / "libedgeinfer_matmul.so").write_bytes(b"old")
    built = set()
    for b in custom_ops.ISAS:
        monkeypatch.setenv(custom_ops.ISA_ENV, b)
        if custom_ops.isa() is not None:
            built.add(custom_ops.library())
    assert len(built) == len(runs)
    assert sorted(p.parent for p in built) == sorted(kernels.iterdir())


def test_the_weights_file_starts_each_large_tensor_on_2_mib_where_that_pads_it_by_an_eighth_at_most(tmp_path):
    """weights.save: a tensor of 2 MiB or more starts on a 2 MiB boundary of the external file when the padding
    before it is at most an eighth of it, every other on a 4 KiB page (so that onnxruntime maps it); small ones
    stay in the graph; onnxruntime reads every weight back as it was."""
    from edgeinfer_onnxruntime.weights import HUGE, PAGE, save

    rng = np.random.default_rng(5)
    shapes = [(1024, 1408), (1024, 1408), (1024, 704), (1024, 1408), (8, 8), (16, 100)]  # 5.5, 5.5, 2.75 MiB ...
    ws = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    nodes = [helper.make_node("MatMul", ["x" if s[0] == 1024 else "x16", f"w{i}"], [f"y{i}"])
             for i, s in enumerate(shapes) if s[0] != 8]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024]),
                                       helper.make_tensor_value_info("x16", TensorProto.FLOAT, [1, 16])],
                          [helper.make_tensor_value_info(n.output[0], TensorProto.FLOAT, None) for n in nodes],
                          [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(ws)])
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "model.onnx")
    stored = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)
    offsets = {t.name: {e.key: int(e.value) for e in t.external_data if e.key != "location"}
               for t in stored.graph.initializer}
    mib = 2**20
    # w0 at 0; w1 (5.5 MiB) at 6: 0.5 MiB of padding <= 5.5 / 8; w2 (2.75 MiB) right after w1, at 11.5: 12
    # would pad it by 0.5 > 2.75 / 8; w3 (5.5 MiB) at 14.25: 16 would pad it by 1.75 > 5.5 / 8
    assert [offsets[f"w{i}"]["offset"] for i in range(4)] == [0, 6 * mib, 11.5 * mib, 14.25 * mib]
    assert offsets["w1"]["offset"] % HUGE == 0 and all(offsets[f"w{i}"]["offset"] % PAGE == 0 for i in range(4))
    assert offsets["w4"] == {} and offsets["w5"]["offset"] % PAGE == 0  # 256 bytes in the graph; 6400 outside
    s = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    x, x16 = rng.standard_normal((1, 1024)).astype(np.float32), rng.standard_normal((1, 16)).astype(np.float32)
    for y, w in zip(s.run(None, {"x": x, "x16": x16}), [ws[0], ws[1], ws[2], ws[3], ws[5]]):
        np.testing.assert_allclose(y, (x16 if w.shape[0] == 16 else x) @ w, rtol=1e-4, atol=1e-3)


def tied_graph(w: np.ndarray, tied: bool = True):
    """A tied decoder's two ends as the builder writes them: the lookup of ``ids`` in a Transpose of the LM head's
    weight ``w`` ([hidden, vocab]), and the head, x @ w; with ``tied`` False the lookup reads a table of its own."""
    k, n = w.shape
    table = [] if tied else [numpy_helper.from_array(np.ascontiguousarray(w.T), "table")]
    nodes = ([helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0])] if tied else []) + [
        helper.make_node("Gather", ["wt" if tied else "table", "ids"], ["e"], name="/embed_tokens/Gather"),
        helper.make_node("MatMul", ["x", "w"], ["logits"], name="/lm_head/MatMul")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"]),
                                       helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", k])],
                          [helper.make_tensor_value_info("e", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w"), *table])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("scheme, k, block", [("fp16", 64, 0), ("w8a16", 256, 128), ("w8a16", 96, 32),
                                              ("w8a16", 576, 32)])
def test_a_tied_lookup_reads_the_heads_weights_and_gives_the_rows_a_table_of_its_own_gave(scheme, k, block, build):
    """EmbedF16 / EmbedW8 (kernels/embedding.c) against the lookup they replace (embedding.py: a Gather of fp16
    rows, or onnxruntime's GatherBlockQuantized of int8 rows in blocks of 128, else 32): the same numbers, bit for
    bit, and the head then multiplies in the lookup's blocks (576 rows: 32, not the head's 128)."""
    from edgeinfer_onnxruntime.embedding import embedding_fp16, head_embedding, quantize_embedding

    rng = np.random.default_rng(k)
    n = 100  # four panels, the last partly padding
    w = rng.standard_normal((k, n)).astype(np.float32)
    ids = np.array([[0, 31, 32, 99, 64, 7]])
    x = rng.standard_normal((1, 6, k)).astype(np.float32)

    own = tied_graph(w)
    custom_ops.use_kernels(own, scheme, 128)
    facts = head_embedding(own, "ids")
    op = {"fp16": "EmbedF16", "w8a16": "EmbedW8"}[scheme]
    assert f"edgeinfer.{op}" in facts["embedding"]
    assert [(n.op_type, n.domain) for n in own.graph.node] == [(op, "edgeinfer"),
                                                               (custom_ops.OPS[scheme], "edgeinfer")]
    assert len(own.graph.initializer) == (1 if scheme == "fp16" else 2)  # the head's: no table, no fp32 weight
    e, logits = session(own).run(None, {"ids": ids, "x": x})

    before = tied_graph(w)
    custom_ops.use_kernels(before, scheme, 128)
    (embedding_fp16(before, "ids") if scheme == "fp16" else quantize_embedding(before, "ids", 128))
    np.testing.assert_array_equal(e, session(before).run(None, {"ids": ids, "x": x})[0])
    assert e.shape == (1, 6, k)
    np.testing.assert_allclose(e[0], held(w, scheme, block).T[ids[0]], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(logits, reference(x, w, scheme, block), rtol=0, atol=1e-5 * k)


def test_an_untied_lookup_keeps_its_table_and_an_id_outside_the_vocabulary_is_refused(build):
    from edgeinfer_onnxruntime.embedding import head_embedding

    w = np.ones((64, 40), np.float32)
    untied = tied_graph(w, tied=False)
    custom_ops.use_kernels(untied, "fp16")
    assert head_embedding(untied, "ids") is None
    assert [n.op_type for n in untied.graph.node] == ["Gather", "MatMulF16"]
    tied = tied_graph(w)
    custom_ops.use_kernels(tied, "fp16")
    head_embedding(tied, "ids")
    s = session(tied)
    x = np.ones((1, 1, 64), np.float32)
    assert s.run(["e"], {"ids": np.array([[39]]), "x": x})[0].tolist() == [[[1.0] * 64]]
    for bad in (40, -1):
        with pytest.raises(Exception, match="outside the vocabulary"):
            s.run(["e"], {"ids": np.array([[bad]]), "x": x})


def tied_nbits_graph(w: np.ndarray, table: np.ndarray, block: int = 32):
    """A tied decoder's two ends as the builder writes them at int4: the lookup of ``ids`` in an fp32 ``table`` of
    its own ([vocab, hidden]), and the head as the 4-bit MatMulNBits of ``w`` ([hidden, vocab])."""
    model = nbits_graph(w, block=block)
    g = model.graph
    g.node.insert(0, helper.make_node("Gather", ["table", "ids"], ["e"], name="/embed_tokens/Gather"))
    g.initializer.append(numpy_helper.from_array(table, "table"))
    g.input.append(helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"]))
    g.output.insert(0, helper.make_tensor_value_info("e", TensorProto.FLOAT, None))
    return model


@pytest.mark.parametrize("scheme, k, block", [("w4a16", 256, 32), ("w4a8", 96, 32), ("w4a16", 576, 16),
                                              ("w4a16", 70, 32)])
def test_a_tied_int4_lookup_reads_the_heads_int4_rows(scheme, k, block, build):
    """EmbedW4 (kernels/embedding.c): the lookup of a tied model whose head the builder quantized to int4 reads the
    head's int4 (MatMulW4's packing), so the fp32 table is dropped and no int8 copy is made; the rows equal the
    head's columns read by hand from MatMulNBits' initializers (the class llama.cpp's Q4_0 looks tokens up in), and
    the head's logits are unchanged."""
    from edgeinfer_onnxruntime.embedding import head_embedding

    rng = np.random.default_rng(k + block)
    n = 100  # four panels, the last partly padding; columns 0-15 and 16-31 of a panel share bytes
    w = rng.standard_normal((k, n)).astype(np.float32)
    ids = np.array([[0, 15, 16, 31, 32, 99, 64, 7, 50]])
    x = rng.standard_normal((1, ids.shape[1], k)).astype(np.float32)
    ours = tied_nbits_graph(w, np.ascontiguousarray(w.T), block)
    assert custom_ops.use_kernels(ours, scheme) == 1
    facts = head_embedding(ours, "ids")
    assert facts == {"embedding": f"the LM head's weights, read by edgeinfer.EmbedW4 (tied: one table, int4 in "
                                  f"blocks of {block})"}
    assert [(n.op_type, n.domain) for n in ours.graph.node] == [("EmbedW4", "edgeinfer"), ("MatMulW4", "edgeinfer")]
    assert "table" not in {t.name for t in ours.graph.initializer} and len(ours.graph.initializer) == 2
    e, logits = session(ours).run(None, {"ids": ids, "x": x})
    held_w = nbits_weights(nbits_graph(w, block=block))  # [k, n], by hand
    assert e.shape == (1, ids.shape[1], k)
    np.testing.assert_allclose(e[0], held_w.T[ids[0]], rtol=1e-6, atol=1e-7)
    assert np.abs(e[0] - w.T[ids[0]]).max() <= np.abs(w).max() / 7  # the rows are the table's, at four bits
    plain = nbits_graph(w, block=block)
    custom_ops.use_kernels(plain, scheme)
    np.testing.assert_array_equal(logits, session(plain).run(None, {"x": x})[0])


def test_an_int4_lookup_over_another_table_keeps_it(build):
    """An untied model's table (not the head's int4) stays a lookup of its own: one row off by more than a scale is
    enough."""
    from edgeinfer_onnxruntime.embedding import head_embedding

    rng = np.random.default_rng(5)
    w = rng.standard_normal((64, 40)).astype(np.float32)
    table = np.ascontiguousarray(w.T).copy()
    table[39, 3] += 1.0  # the last row, which the check samples
    model = tied_nbits_graph(w, table)
    custom_ops.use_kernels(model, "w4a16")
    assert head_embedding(model, "ids") is None
    assert [n.op_type for n in model.graph.node] == ["Gather", "MatMulW4"]
