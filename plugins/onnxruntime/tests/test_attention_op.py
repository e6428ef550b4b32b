"""edgeinfer.GroupQueryAttention (kernels/attention.c) on onnxruntime itself: its output and the cache rows it
writes equal a float64 reference written here from the op's definition (rotate-half rotary at each token's
position, causal softmax attention, query head h on KV head h // (heads / kv heads)), for a first prompt of
several rows, a later prompt, and one-token steps of rows at different lengths, with past and present bound to
one buffer (as the decoder runs it) or not, 1 or 2 threads, in each build this CPU runs; it agrees with
onnxruntime's own com.microsoft.GroupQueryAttention; the rewrite takes only the nodes it computes.
edgeinfer.GroupQueryAttentionQ8 writes each new row as q8_0 blocks (every value within half a step of its block's
scale, the scale its block's largest magnitude / 127) and attends over the cache as those blocks hold it."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from edgeinfer_onnxruntime import custom_ops  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

pytestmark = pytest.mark.skipif(custom_ops.unavailable() is not None,
                                reason=f"no own ops here: {custom_ops.unavailable()}")

H, KVH, D, L, P = 6, 2, 20, 20, 32  # D = 20: two lanes of 8 and a remainder of 4; L = 20: two blocks of 8 and 4
CASES = {  # rows, new tokens, seqlens_k (each row's length after the step, minus one)
    "first prompt, three rows": (3, 4, [3, 3, 3]),
    "a later prompt": (1, 5, [17]),
    "one-token steps at different lengths": (3, 1, [0, 8, 19]),
}


def rotary(dtype, d=D):
    f = np.arange(P)[:, None] / 10000.0 ** (np.arange(0, d, 2) / d)
    return np.cos(f).astype(dtype), np.sin(f).astype(dtype)


def graph(ours: bool, d: int = D, separate: bool = False, scale: float = 0.0, q8: bool = False, heads=(H, KVH)):
    """One attention node: edgeinfer's (an fp16 cache; ``q8``: a q8_0 one) or onnxruntime's (an fp32 cache); the
    new tokens as one packed ``qkv`` or, ``separate``, as ``qn``, ``kn``, ``vn`` (the builder's Qwen3 layers,
    after the q/k norms); ``heads``: query heads, KV heads."""
    H, KVH = heads
    kv = TensorProto.UINT8 if q8 else TensorProto.FLOAT16 if ours else TensorProto.FLOAT
    w = d + d // 16 if q8 else d
    new = {"qn": H * d, "kn": KVH * d, "vn": KVH * d} if separate else {"qkv": (H + 2 * KVH) * d}
    inputs = [*(helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", "s", w]) for n, w in new.items()),
              helper.make_tensor_value_info("pk", kv, ["b", KVH, L, w]),
              helper.make_tensor_value_info("pv", kv, ["b", KVH, L, w]),
              helper.make_tensor_value_info("sl", TensorProto.INT32, ["b"]),
              helper.make_tensor_value_info("tot", TensorProto.INT32, [])]
    outputs = [helper.make_tensor_value_info(n, t, None) for n, t in (("o", TensorProto.FLOAT), ("k", kv), ("v", kv))]
    cos, sin = (t.astype(np.float16 if ours else np.float32) for t in rotary(np.float16, d))  # the same values
    tables = [numpy_helper.from_array(cos, "cos"), numpy_helper.from_array(sin, "sin")]
    names = [*(new if separate else ["qkv", "", ""]), "pk", "pv", "sl", "tot", "cos", "sin"]
    if ours:
        node = helper.make_node("GroupQueryAttentionQ8" if q8 else "GroupQueryAttention", names, ["o", "k", "v"],
                                domain="edgeinfer", num_heads=H, kv_num_heads=KVH, scale=scale)
    else:
        node = helper.make_node("GroupQueryAttention", names, ["o", "k", "v"], domain="com.microsoft", num_heads=H,
                                kv_num_heads=KVH, do_rotary=1)
    g = helper.make_graph([node], "g", inputs, outputs, tables)
    domain = "edgeinfer" if ours else "com.microsoft"
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)])


def run(model, qkv, pk, pv, seqlens, bound=True, threads=1, heads=(H, KVH)):
    """(output, key cache, value cache) after one run; ``bound``: present bound to the past arrays (written in
    place, as the decoder binds them)."""
    H, KVH = heads
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.register_custom_ops_library(str(custom_ops.library()))
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    d = qkv.shape[2] // (H + 2 * KVH)
    new = {"qkv": qkv}
    if "qkv" not in [i.name for i in sess.get_inputs()]:
        new = dict(zip(("qn", "kn", "vn"), np.split(qkv, [H * d, (H + KVH) * d], axis=2)))
    feeds = {**{n: np.ascontiguousarray(a) for n, a in new.items()}, "sl": np.asarray(seqlens, np.int32),
             "tot": np.array(max(seqlens) + 1, np.int32)}
    if not bound:
        return sess.run(None, {**feeds, "pk": pk, "pv": pv})
    k, v = pk.copy(), pv.copy()
    kv = [ort.OrtValue.ortvalue_from_numpy(a) for a in (k, v)]
    b = sess.io_binding()
    b.bind_output("o", "cpu")
    for name, value in zip(("pk", "pv"), kv):
        b.bind_ortvalue_input(name, value)
    for name, value in zip(("k", "v"), kv):
        b.bind_ortvalue_output(name, value)
    for name, a in feeds.items():
        b.bind_cpu_input(name, a)
    sess.run_with_iobinding(b)
    return b.copy_outputs_to_cpu()[0], k, v


def reference(qkv, pk, pv, seqlens, heads=(H, KVH)):
    """The op's definition in float64 over the cache as fp16 holds it."""
    H, KVH = heads
    d = pk.shape[3]
    cos, sin = (t.astype(np.float64) for t in rotary(np.float16, d))

    def rot(x, pos):
        x1, x2 = x[: d // 2], x[d // 2:]
        return np.concatenate([x1 * cos[pos] - x2 * sin[pos], x2 * cos[pos] + x1 * sin[pos]])

    rows, s_new, _ = qkv.shape
    x = qkv.astype(np.float64).reshape(rows, s_new, H + 2 * KVH, d)
    k, v = pk.astype(np.float64), pv.astype(np.float64)
    out = np.zeros((rows, s_new, H, d))
    for b in range(rows):
        p0 = seqlens[b] + 1 - s_new
        for s in range(s_new):
            for g in range(KVH):
                k[b, g, p0 + s] = rot(x[b, s, H + g], p0 + s).astype(np.float16)  # the cache holds fp16
                v[b, g, p0 + s] = x[b, s, H + KVH + g].astype(np.float16)
        for s in range(s_new):
            for h in range(H):
                g = h // (H // KVH)
                q = rot(x[b, s, h], p0 + s)
                w = k[b, g, : p0 + s + 1] @ q / np.sqrt(d)
                w = np.exp(w - w.max())
                out[b, s, h] = (w / w.sum()) @ v[b, g, : p0 + s + 1]
    return out.reshape(rows, s_new, H * d), k, v


def inputs(rows, s_new, seed=0, d=D, heads=(H, KVH)):
    H, KVH = heads
    rng = np.random.default_rng(seed)
    qkv = rng.standard_normal((rows, s_new, (H + 2 * KVH) * d)).astype(np.float32)
    pk, pv = (rng.standard_normal((rows, KVH, L, d)).astype(np.float16) for _ in range(2))
    return qkv, pk, pv


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("bound, threads, separate, d", [
    (True, 1, False, D), (True, 2, False, D), (False, 1, False, D), (True, 1, True, D),
    (True, 1, False, 32), (True, 2, True, 64),  # heads of a multiple of 8 and 32: eight scores and 32 columns a pass
    (True, 1, False, 40),  # 32 columns, then 8
])
def test_the_op_equals_its_definition_in_float64_and_writes_only_the_new_rows(case, bound, threads, separate, d,
                                                                             build):
    rows, s_new, seqlens = CASES[case]
    qkv, pk, pv = inputs(rows, s_new, d=d)
    out, k, v = run(graph(True, d, separate), qkv, pk, pv, seqlens, bound, threads)
    want, want_k, want_v = reference(qkv, pk, pv, seqlens)
    assert out.shape == (rows, s_new, H * d) and out.dtype == np.float32
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-5 * np.abs(want).max())
    # new keys: rotated in fp32 here and float64 there, then rounded to fp16: equal or one fp16 step apart
    np.testing.assert_allclose(k.astype(np.float64), want_k, rtol=2 ** -10, atol=0)
    np.testing.assert_array_equal(v, want_v.astype(np.float16))
    for b in range(rows):  # every other row of the cache is as it was
        p0 = seqlens[b] + 1 - s_new
        keep = np.ones(L, bool)
        keep[p0: seqlens[b] + 1] = False
        np.testing.assert_array_equal(k[b][:, keep], pk[b][:, keep])
        np.testing.assert_array_equal(v[b][:, keep], pv[b][:, keep])
    if not bound:
        assert not np.shares_memory(k, pk)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("separate", [False, True])
def test_the_op_agrees_with_onnxruntimes_own_attention_over_an_fp32_cache(case, separate):
    """com.microsoft.GroupQueryAttention with fp32 past/present: the same output within the fp16 cache's
    rounding (onnxruntime's CPU kernel takes several rows with several new tokens only as a first prompt, and with
    rotary a head of a multiple of 16 only)."""
    rows, s_new, seqlens = CASES[case]
    qkv, pk, pv = inputs(rows, s_new, seed=1, d=32)
    out, k, _ = run(graph(True, 32, separate), qkv, pk, pv, seqlens)
    theirs, their_k, _ = run(graph(False, 32, separate), qkv, pk.astype(np.float32), pv.astype(np.float32), seqlens)
    np.testing.assert_allclose(out, theirs, rtol=0, atol=2e-3 * np.abs(theirs).max())
    np.testing.assert_allclose(k.astype(np.float32), their_k, rtol=2 ** -11, atol=2 ** -24)  # fp16's rounding


def test_a_row_whose_new_tokens_do_not_fit_its_length_or_the_cache_is_refused():
    qkv, pk, pv = inputs(1, 3)
    for seqlens in ([1], [L]):  # 3 new tokens in a length of 2; a length of L + 1 in a cache of L
        with pytest.raises(Exception, match="seqlens_k"):
            run(graph(True), qkv, pk, pv, seqlens)


def _builder_layer(separate: bool = False, **attrs):
    """One attention as kv_cache.kv_to_fp16 leaves the builder's: each fp32 input of the new tokens -> Cast fp16
    -> GroupQueryAttention (fp16 cache, cos/sin fp16) -> Cast fp32."""
    m = graph(False, separate=separate)
    g = m.graph
    node = g.node[0]
    kept = [a for a in node.attribute if a.name not in attrs]
    del node.attribute[:]
    node.attribute.extend(kept + [helper.make_attribute(k, v) for k, v in attrs.items()])
    for v in [*g.input, *g.output]:
        if v.name in ("pk", "pv", "k", "v"):
            v.type.tensor_type.elem_type = TensorProto.FLOAT16
    for t in g.initializer:
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), t.name))
    for i, name in enumerate(node.input[:3]):
        if name:
            node.input[i] = f"{name}16"
            cast = helper.make_node("Cast", [name], [f"{name}16"], to=TensorProto.FLOAT16, name=f"CastIn{i}")
            g.node.insert(0, cast)
    node.output[0] = "o16"
    g.node.append(helper.make_node("Cast", ["o16"], ["o"], to=TensorProto.FLOAT, name="CastOut"))
    return m


@pytest.mark.parametrize("separate", [False, True])
def test_the_rewrite_takes_the_casts_and_attention_the_fp16_cache_leaves_and_runs_the_same(separate):
    m = _builder_layer(separate)
    assert custom_ops.use_attention(m, head_size=D) == 1
    assert [(n.domain, n.op_type) for n in m.graph.node] == [("edgeinfer", "GroupQueryAttention")]
    node = m.graph.node[0]
    new = ["qn", "kn", "vn"] if separate else ["qkv", "", ""]
    assert list(node.input) == [*new, "pk", "pv", "sl", "tot", "cos", "sin"] and list(node.output) == ["o", "k", "v"]
    assert {a.name: helper.get_attribute_value(a) for a in node.attribute} == {
        "num_heads": H, "kv_num_heads": KVH, "scale": 0.0}
    rows, s_new, seqlens = CASES["one-token steps at different lengths"]
    qkv, pk, pv = inputs(rows, s_new, seed=2)
    np.testing.assert_array_equal(run(m, qkv, pk, pv, seqlens)[0],
                                  run(graph(True, separate=separate), qkv, pk, pv, seqlens)[0])
    # and back (where the library cannot be built at load): onnxruntime's op between the Casts, as before
    assert custom_ops.onnxruntime_attention(m) == 1
    assert not any(o.domain == "edgeinfer" for o in m.opset_import)
    assert [n.op_type for n in m.graph.node] == ["Cast"] * (3 if separate else 1) + ["GroupQueryAttention", "Cast"]
    gqa = m.graph.node[-2]
    assert gqa.domain == "com.microsoft" and {a.name: helper.get_attribute_value(a) for a in gqa.attribute} == {
        "num_heads": H, "kv_num_heads": KVH, "scale": 0.0, "do_rotary": 1, "rotary_interleaved": 0}
    assert [i.removesuffix("/fp16") for i in gqa.input[:3]] == new and list(m.graph.node[-1].output) == ["o"]


@pytest.mark.parametrize("attrs, head_size", [
    ({"local_window_size": 8}, D), ({"softcap": 30.0}, D), ({"rotary_interleaved": 1}, D), ({"do_rotary": 0}, D),
    ({}, 2 * D),  # a rotary over half the head (partial rotary): the cos table is narrower than the head / 2
])
def test_the_rewrite_leaves_attention_it_does_not_compute(attrs, head_size):
    m = _builder_layer(**attrs)
    before = m.SerializeToString()
    assert custom_ops.use_attention(m, head_size=head_size) == 0
    assert m.SerializeToString() == before


def q8_rows(x):
    """``x`` [..., d] float32 as q8_0 rows (d int8 digits, then d / 32 fp16 scales), as ggml's quantize_row_q8_0_ref
    quantizes (scale = largest magnitude / 127, digits rounded half away from zero)."""
    blocks = x.reshape(*x.shape[:-1], -1, 32).astype(np.float32)
    d = np.abs(blocks).max(-1, keepdims=True) / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    y = blocks * inv
    digits = (np.sign(y) * np.floor(np.abs(y) + np.float32(0.5))).astype(np.int8).reshape(x.shape)
    return np.concatenate([digits.view(np.uint8), d[..., 0].astype(np.float16).view(np.uint8)], -1)


def q8_values(rows, d):
    """q8_0 rows back to float64 values."""
    digits = rows[..., :d].view(np.int8).astype(np.float64)
    scales = np.ascontiguousarray(rows[..., d:]).view(np.float16).astype(np.float64)
    return (digits.reshape(*digits.shape[:-1], -1, 32) * scales[..., None]).reshape(digits.shape)


def attend(qkv, kk, vv, seqlens, heads=(H, KVH)):
    """The op's output by its definition in float64 over caches ``kk``, ``vv`` (float64 [rows, KV heads, L, d]) that
    already hold the new rows."""
    H, KVH = heads
    rows, s_new, _ = qkv.shape
    d = kk.shape[3]
    want = np.zeros((rows, s_new, H * d))
    x = qkv.astype(np.float64).reshape(rows, s_new, H + 2 * KVH, d)
    cos, sin = (t.astype(np.float64) for t in rotary(np.float16, d))
    for b in range(rows):
        p0 = seqlens[b] + 1 - s_new
        for s in range(s_new):
            for h in range(H):
                pos, g = p0 + s, h // (H // KVH)
                q1, q2 = x[b, s, h, : d // 2], x[b, s, h, d // 2:]
                q = np.concatenate([q1 * cos[pos] - q2 * sin[pos], q2 * cos[pos] + q1 * sin[pos]])
                w = kk[b, g, : pos + 1] @ q / np.sqrt(d)
                w = np.exp(w - w.max())
                want[b, s, h * d: (h + 1) * d] = (w / w.sum()) @ vv[b, g, : pos + 1]
    return want


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("bound, threads, separate, d", [(True, 1, False, 32), (True, 2, True, 64),
                                                         (False, 1, False, 128)])
def test_the_q8_op_writes_q8_0_blocks_and_attends_over_them(case, bound, threads, separate, d, build):
    rows, s_new, seqlens = CASES[case]
    qkv, pk, pv = inputs(rows, s_new, seed=2, d=d)
    pk, pv = q8_rows(pk.astype(np.float32)), q8_rows(pv.astype(np.float32))
    out, k, v = run(graph(True, d, separate, q8=True), qkv, pk, pv, seqlens, bound, threads)
    assert k.dtype == np.uint8 and k.shape == (rows, KVH, L, d + d // 16)
    # the new rows: the float64 reference's keys (rotated) and values, each within half a step of its block's scale
    _, want_k, want_v = reference(qkv, q8_values(pk, d).astype(np.float16), q8_values(pv, d).astype(np.float16),
                                  seqlens)
    for b in range(rows):
        p0 = seqlens[b] + 1 - s_new
        new = slice(p0, seqlens[b] + 1)
        for got, want in ((k, want_k), (v, want_v)):
            x = want[b][:, new]
            top = np.abs(x.reshape(*x.shape[:-1], -1, 32)).max(-1)
            scales = np.ascontiguousarray(got[b][:, new, d:]).view(np.float16).astype(np.float64)
            np.testing.assert_allclose(scales, top / 127, rtol=2 ** -10)
            step = np.repeat(scales, 32, axis=-1)
            assert (np.abs(q8_values(got[b][:, new], d) - x) <= 0.51 * step + 1e-3 * np.abs(x)).all()
            keep = np.ones(L, bool)
            keep[new] = False
            src = pk if got is k else pv
            np.testing.assert_array_equal(got[b][:, keep], src[b][:, keep])  # the other rows as they were
    # the output: the definition over the cache as the op left it (the new rows as their blocks hold them)
    want = attend(qkv, q8_values(k, d), q8_values(v, d), seqlens)
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-5 * np.abs(want).max())
    # and the fp16 op's output on the same tokens, within what the q8_0 rounding moves
    f16_out, _, _ = run(graph(True, d, separate), qkv, q8_values(pk, d).astype(np.float16),
                        q8_values(pv, d).astype(np.float16), seqlens)
    np.testing.assert_allclose(out, f16_out, rtol=0, atol=3e-2 * np.abs(f16_out).max())


def test_the_q8_op_refuses_a_cache_row_that_is_not_q8_0_blocks():
    qkv, pk, pv = inputs(1, 1, d=32)
    model = graph(True, 32, q8=True)
    for t in model.graph.input[-4:-2]:  # pk, pv: a row of any width, so that the op sees it
        t.type.tensor_type.shape.dim[3].dim_param = "w"
    bad = np.zeros((1, KVH, L, 32 + 1), np.uint8)  # 33 bytes: not D + D / 16 for any D a multiple of 32
    with pytest.raises(Exception, match="q8_0"):
        run(model, qkv, bad, bad.copy(), [0])


@pytest.mark.parametrize("heads", [(2, 2), (4, 2), (6, 2), (8, 2), (10, 2), (14, 2), (16, 2)])
@pytest.mark.parametrize("q8", [False, True], ids=["fp16", "q8_0"])
def test_every_query_head_sharing_a_kv_head_attends_as_defined(heads, q8, build):
    """The query heads of one KV head are taken up to four a pass (1, 2, 3, 4 a KV head; 5 as 3 + 2, 7 as 4 + 3, 8
    as 4 + 4), in the scores' tiles of 8, 4 or 2 cache rows and their one-row tails (lengths 1, 9, 20)."""
    d = 64
    for case, (rows, s_new, seqlens) in CASES.items():
        qkv, pk, pv = inputs(rows, s_new, seed=3, d=d, heads=heads)
        if q8:
            pk, pv = q8_rows(pk.astype(np.float32)), q8_rows(pv.astype(np.float32))
        out, k, v = run(graph(True, d, q8=q8, heads=heads), qkv, pk, pv, seqlens, heads=heads)
        values = (lambda c: q8_values(c, d)) if q8 else (lambda c: c.astype(np.float64))
        want = attend(qkv, values(k), values(v), seqlens, heads)
        np.testing.assert_allclose(out, want, rtol=0, atol=2e-5 * np.abs(want).max(), err_msg=case)
