"""edgeinfer's own onnxruntime ops (edgeinfer_onnxruntime/custom_ops.py, kernels/matmul.c), on onnxruntime
itself: x @ W equals numpy's float64 product of x and W as the op holds it (fp16-rounded; int8 times its block's
scale), for every row count (the one-row path, the multi-row passes and their remainders), column counts that fill
no whole panel, K that fills no whole block, leading dimensions and 1 or 2 threads, in each build this CPU runs
(AVX-512 and AVX2 here); the graph rewrite replaces only MatMuls over 2-D fp32 weights; a missing compiler, or a CPU
without the build a bundle needs, is one line."""

from __future__ import annotations

import os
import time

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


def q4_1(w: np.ndarray, block: int) -> np.ndarray:
    """W as MatMulW4 multiplies it, worked out here as llama.cpp's quantize_row_q4_1_ref does for each block of
    ``block`` rows and column: m = min, d = (max - m) / 15, both rounded to fp16, w = m + d round((w - m) / d)."""
    k, n = w.shape
    out = np.empty((k, n))
    for b in range(0, k, block):
        part = w[b:b + block].astype(np.float64)
        m = part.min(axis=0).astype(np.float16).astype(np.float64)
        d = ((part.max(axis=0) - m) / 15).astype(np.float16).astype(np.float64)
        d[d == 0] = 1
        out[b:b + block] = m + d * np.clip(np.rint((part - m) / d), 0, 15)
    return out


def test_pack_w4_puts_two_columns_a_byte_and_four_rows_of_a_column_side_by_side():
    """Q4_1 values (a GGUF's, dequantized) come back exactly: their blocks' fp16 minimum, scale and levels."""
    rng = np.random.default_rng(1)
    k, n = 70, 40  # K4 72: rows 70-71 padding; panel 1: columns 32-39, the rest padding; blocks 0-31, 32-63, 64-69
    u = rng.integers(0, 16, (96, n))
    u[[0, 32, 64]], u[[1, 33, 65]] = 0, 15  # Q4_1's every block holds level 0 (its minimum) and 15 (its maximum)
    d = rng.uniform(0.01, 0.1, (3, n)).astype(np.float16)
    m = -rng.uniform(0, 1, (3, n)).astype(np.float16)
    w = (np.repeat(m.astype(np.float32), 32, axis=0) + np.repeat(d.astype(np.float32), 32, axis=0) * u)[:k]
    packed, both = custom_ops.pack_w4(w, 32)
    assert packed.shape == (2, 36, 32) and packed.dtype == np.uint8
    assert both.shape == (2, 3, 2, 32) and both.dtype == np.float16  # Q4_1's: 5 bits a weight
    s, mins = both[:, :, 0], both[:, :, 1]  # a block's scales, then its minimums
    quads = packed.reshape(2, 18, 64)  # per panel and quad row: 64 bytes
    assert quads[0, 1, 4 * 5 + 2] & 15 == u[6, 5] and quads[0, 1, 4 * 5 + 2] >> 4 == u[6, 21]  # row 6
    assert quads[1, 16, 4 * 7 + 1] & 15 == u[65, 39]
    assert not (quads[1, :, :] >> 4).any()  # panel 1's columns 48-63: padding
    assert s[0, 2, 5] == d[2, 5] and s[1, 1, 7] == d[1, 39] and mins[0, 0, 21] == m[0, 21]
    assert not s[1, :, 8:].any() and not mins[1, :, 8:].any()
    np.testing.assert_array_equal(q4_1(w, 32), w)  # the reference's reading of them: exact too


@pytest.mark.parametrize("k, n", [(64, 32), (130, 50), (96, 200)])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("scheme", ["w4a16", "w4a8"])
def test_matmul_w4_equals_the_product_with_the_q4_1_weights(k, n, threads, scheme, build):
    """MatMulW4 (blocks of 32, a scale and a minimum each): numpy's product of x's two digits (w4a16) or its high
    digit alone (w4a8: int8 per block of 32) and the weights quantized here by hand (the minimums times the
    digits' sum, as Q4_1 x Q8_1 takes it)."""
    rng = np.random.default_rng(k + n)
    w = rng.standard_normal((k, n)).astype(np.float32)
    model = matmul_graph(w)
    assert custom_ops.use_kernels(model, scheme, 32) == 1
    node = model.graph.node[0]
    assert {a.name: a.i for a in node.attribute} == {"n": n, "block": 32, "digits": {"w4a16": 2, "w4a8": 1}[scheme]}
    assert [list(t.dims) for t in model.graph.initializer] == [
        [-(-n // 32), -(-k // 4) * 2, 32], [-(-n // 32), -(-k // 32), 2, 32]]
    s = session(model, threads)
    held_w = q4_1(w, 32)
    assert np.abs(held_w - w).max() <= (w.max() - w.min()) / 30 * 1.01  # half a level at most
    count = 2 if scheme == "w4a16" else 1
    for rows in [(1, 1), (1, 12), (2, 7), (1, 13), (3, 9), (2, 0)]:
        x = rng.standard_normal((*rows, k)).astype(np.float32)
        y = s.run(None, {"x": x})[0]
        assert y.shape == (*rows, n)
        np.testing.assert_allclose(y, digits(x, 32, count) @ held_w, rtol=0, atol=1e-5 * k)
        if scheme == "w4a8" and y.size:  # int8 activations: off fp32's product by what one digit drops
            assert np.abs(y - x @ held_w).max() > 1e-3


@pytest.mark.parametrize("scheme", ["w4a16", "w4a8"])
@pytest.mark.parametrize("block, k, held", [(16, 256, 16), (128, 256, 128), (128, 192, 64), (128, 200, 32)])
def test_matmul_w4_takes_other_block_sizes(block, k, held, scheme, build):
    """A scheme's group size (``w4a16_g128``, ``w4a8_g128``) reaches MatMulW4's blocks, halved while it does not
    divide a row (192 rows: 64), down to 32 (200 rows: 32, the last block padded); w4a8's activations are int8 per
    block of the same size."""
    rng = np.random.default_rng(block + k)
    w = rng.standard_normal((k, 40)).astype(np.float32)
    model = matmul_graph(w)
    assert custom_ops.use_kernels(model, scheme, block) == 1
    assert {a.name: a.i for a in model.graph.node[0].attribute}["block"] == held
    x = rng.standard_normal((1, 3, k)).astype(np.float32)
    y = session(model).run(None, {"x": x})[0]
    count = 2 if scheme == "w4a16" else 1
    np.testing.assert_allclose(y, digits(x, held, count) @ q4_1(w, held), rtol=0, atol=1e-5 * k)


def test_the_int4_classes_hold_the_lm_head_in_int8():
    """With a head block, the MatMul that makes the first output (the logits) becomes MatMulW8, the rest MatMulW4;
    a MatMulNBits is left as it is."""
    w = np.random.default_rng(2).standard_normal((64, 40)).astype(np.float32)
    model = matmul_graph(w, extra_matmul=True)  # proj (a weight), then scores (no initializer)
    model.graph.node.append(helper.make_node("MatMul", ["yy", "w2"], ["logits"], name="lm_head"))
    model.graph.initializer.append(numpy_helper.from_array(np.ones((40, 7), np.float32), "w2"))
    model.graph.output.insert(0, helper.make_tensor_value_info("logits", TensorProto.FLOAT, None))
    assert custom_ops.head_weight(model) == "w2"
    assert custom_ops.use_kernels(model, "w4a8", 32, 128) == 2
    assert [(n.name, n.op_type) for n in model.graph.node] == [
        ("proj_MatMulW4", "MatMulW4"), ("", "Transpose"), ("scores", "MatMul"), ("lm_head_MatMulW8", "MatMulW8")]
    assert {a.name: a.i for a in model.graph.node[3].attribute} == {"n": 7, "block": 128}
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    q = MatMulNBitsQuantizer(matmul_graph(w), block_size=32, is_symmetric=True, bits=4)
    q.process()
    assert custom_ops.use_kernels(q.model.model, "w4a16", 32, 128) == 0


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
    portable = " (loads bundles with them; deploy builds onnxruntime's forms on this CPU)"
    assert details["own_ops"] == ("edgeinfer.MatMulF16 (fp16), edgeinfer.MatMulW8 (w8a16), edgeinfer.MatMulW4 "
                                  f"(w4a16, w4a8), {custom_ops.isa()} build"
                                  + (portable if custom_ops.isa() == "portable" else ""))
    assert "warnings" not in details
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    details = OnnxRuntimeBackend().probe().details
    assert details["own_ops"].startswith("none: no C compiler")
    [warning] = details["warnings"]
    assert "int4" in warning["message"] and "apt install gcc" in warning["fix"]
    assert "deployed with the ops on another machine does not load here" in warning["message"]


def test_each_cpu_gets_the_best_build_it_runs_and_a_pinned_one_it_lacks_a_line_that_says_so(monkeypatch):
    """The CPU's flags stood in for (custom_ops._cpu_flags): this machine's own are one case only. A CPU without
    AVX2 (an older x86-64), an AArch64 board (its /proc/cpuinfo says Features, not flags) and a machine without
    /proc/cpuinfo get the portable build."""
    monkeypatch.delenv(custom_ops.ISA_ENV, raising=False)
    zen4 = ("fma", "f16c", "avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni")
    core_ultra = ("fma", "f16c", "avx2", "avx_vnni")  # Meteor Lake: AVX2 and AVX-VNNI, no AVX-512
    for flags, want in [(zen4, "avx512"), (core_ultra, "avx2"), (("fma", "f16c", "avx"), "portable"),
                        ((), "portable"), (None, "portable")]:
        monkeypatch.setattr(custom_ops, "_cpu_flags", lambda flags=flags: flags)
        assert custom_ops.isa() == want
        assert custom_ops.unavailable() is None
    monkeypatch.setattr(custom_ops, "_arch", lambda: "armv7l")  # a 32-bit ARM board: no _Float16 by default
    monkeypatch.setattr(custom_ops, "_cpu_flags", lambda: ())
    assert custom_ops.isa() is None
    assert custom_ops.unavailable() == ("no build of them for this armv7l CPU "
                                        "(the portable one: x86-64 and AArch64)")
    monkeypatch.setattr(custom_ops, "_arch", lambda: "x86_64")
    monkeypatch.setattr(custom_ops, "_cpu_flags", lambda: ("fma", "f16c", "avx"))
    monkeypatch.setenv(custom_ops.ISA_ENV, "avx2")
    assert custom_ops.unavailable() == "the CPU lacks avx2 (EDGEINFER_KERNEL_ISA=avx2)"
    with pytest.raises(BackendUnavailableError, match=r"cannot run here \(the CPU lacks avx2 \(EDGEINFER") as e:
        custom_ops.library()
    assert "\n" not in str(e.value)
    monkeypatch.setattr(custom_ops, "_cpu_flags", lambda: core_ultra)
    monkeypatch.setenv(custom_ops.ISA_ENV, "avx512")
    assert custom_ops.isa() is None
    assert custom_ops.unavailable() == ("the CPU lacks avx512f, avx512bw, avx512vl, avx512_vnni "
                                        "(EDGEINFER_KERNEL_ISA=avx512)")
    monkeypatch.setenv(custom_ops.ISA_ENV, "neon")
    assert custom_ops.unavailable() == ("EDGEINFER_KERNEL_ISA=neon names no build of them "
                                        "(one of avx512, avx2, portable)")


def test_each_build_is_its_own_library_and_replaces_its_older_ones(monkeypatch, tmp_path):
    """Older sources' and unnamed builds go once untouched for STALE_S; a fresher one may be another checkout's
    build in progress (two checkouts on one machine removed each other's while compiling), and stays."""
    monkeypatch.setenv("EDGEINFER_CACHE_DIR", str(tmp_path / "cache"))
    kernels = tmp_path / "cache" / "kernels"
    runs = custom_ops.builds()
    old = time.time() - custom_ops.STALE_S - 60
    for stale in [f"{b}-0000000000000000" for b in runs] + ["0123456789abcdef"]:  # older sources, unnamed builds
        (kernels / stale).mkdir(parents=True)
        (kernels / stale / "libedgeinfer_matmul.so").write_bytes(b"old")
        os.utime(kernels / stale, (old, old))
    building = kernels / f"{runs[0]}-1111111111111111"  # another checkout's, a minute old
    building.mkdir()
    os.utime(building, (time.time() - 60,) * 2)
    built = set()
    for b in custom_ops.ISAS:
        monkeypatch.setenv(custom_ops.ISA_ENV, b)
        if custom_ops.isa() is not None:
            built.add(custom_ops.library())
    assert len(built) == len(runs)
    assert sorted(kernels.iterdir()) == sorted([p.parent for p in built] + [building])


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


