"""Decoder schemes on the host board: what the board lists is what the onnxruntime plugin converts, and the
fp16, int8 weight-only (w8a16), int8 (w8a8), int4 weight-only (w4a16) and int4 with int8 activations (w4a8) builds
of the tiny test decoder deploy and pass the decoder golden check."""

from __future__ import annotations

import json
import math
import os

import pytest

from edgeinfer.contract.schemes import normalize_scheme
from edgeinfer.errors import InputError
from edgeinfer.planning.boards import host_board
from edgeinfer.planning.decision import encoder_schemes
from edgeinfer.planning.host_bandwidth import HostBandwidth
from edgeinfer.testing.fixtures import DECODER_BUNDLE_CTX
from edgeinfer.testing.llm import model_dir


def _ort_backend():
    from edgeinfer_onnxruntime.backend import OnnxRuntimeBackend

    return OnnxRuntimeBackend


def test_the_host_board_lists_what_the_onnxruntime_plugin_converts_and_nothing_else():
    board = host_board(HostBandwidth(gbps=10.0, source="test"))
    listed = [normalize_scheme(s).family for s in board.runtimes[board.default_runtime].schemes]
    backend = _ort_backend()
    decoders = list(backend.decoders.schemes)
    assert set(decoders) <= set(listed), f"the board misses decoder schemes: {set(decoders) - set(listed)}"
    assert set(listed) <= set(decoders) | set(encoder_schemes(backend.tensors)), listed
    assert {"fp16", "w8a16", "w8a8", "w4a8"} <= set(decoders)


def _graph(bundle):
    import onnx

    return onnx.load(str(bundle / "decoder" / "model.onnx"), load_external_data=False)


@pytest.mark.parametrize("quant, accuracy", [("w8a8", 4)])
def test_int8_activation_decoders_deploy_for_host_and_pass_golden(tiny_qwen3_host_scheme_bundle, quant, accuracy):
    """Deployed once per session (the shared fixture; the conversion cached across runs), golden-checked on
    every deploy. (w4a8's int8 activations: MatMulW4 on one digit, below.)"""

    result = tiny_qwen3_host_scheme_bundle(quant)
    out = result.bundle
    assert result.golden["passed"] is True and result.manifest.decoder["golden"]["passed"] is True
    stamp = json.loads((out / "decoder.stamp.json").read_text())
    assert stamp["scheme"] == quant
    graph = _graph(out)
    ops = [n for n in graph.graph.node  # w8a16's [1, 1] @ two halves (below) multiplies no weight
           if n.op_type in ("MatMul", "MatMulNBits") and n.input[0] != "digits_ones"]
    named = ("bits", "accuracy_level", "block_size")
    attrs = {(a.name, a.i) for n in ops for a in n.attribute if a.name in named}
    assert ops and all(n.op_type == "MatMulNBits" for n in ops)
    # level 4: int8 activations in the kernel; block 128, the host's int8 block (MLAS's packed copy 1.06x the
    # int8 at 128 against 1.25x at 32: docs/planner.md#served-decoder-memory); w8a8 runs it on one digit of its
    # input (w8a16's two digits where edgeinfer's own op cannot be built: test_without_a_c_compiler_...). w4a8:
    # the builder's int4 (block 32, as llama.cpp's Q4_0)
    bits, block = {"w8a8": (8, 128), "w4a8": (4, 32)}[quant]
    assert attrs == {("bits", bits), ("accuracy_level", accuracy), ("block_size", block)}
    assert stamp.get("int8_block_size") == (None if quant == "w4a8" else 128)
    assert not any(n.input[0].endswith("_digits") for n in ops)
    # the token embedding looked up in int8 blocks, no fp32 table of vocabulary rows left in the file (the
    # builder's is fp32 whatever the precision: embedding.py)
    lookup = next(n for n in graph.graph.node if "input_ids" in n.input and "Gather" in n.op_type)
    assert lookup.op_type == "GatherBlockQuantized" and lookup.domain == "com.microsoft"
    assert stamp["embedding"].startswith("int8, block ")
    _graph_io_and_tables(out, graph)
    from edgeinfer_onnxruntime import custom_ops

    if custom_ops.unavailable() is None:
        layers = json.loads((out / "decoder" / "genai_config.json").read_text())["model"]["decoder"]
        _own_attention(graph, stamp, layers["num_hidden_layers"])


def _own_attention(graph, stamp, layers):
    """Each layer's attention is edgeinfer.GroupQueryAttention (kernels/attention.c) straight on the fp32 query,
    key and value (Qwen3: after the q/k norms) and output: no Cast around it."""
    attention = [n for n in graph.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(attention) == layers and {n.domain for n in attention} == {"edgeinfer"}
    assert "edgeinfer.GroupQueryAttention" in stamp["attention"]
    casts = [n for n in graph.graph.node if n.op_type == "Cast"]
    assert not {o for c in casts for o in c.output} & {i for n in attention for i in n.input[:3]}
    assert not {i for c in casts for i in c.input} & {n.output[0] for n in attention}


def _graph_io_and_tables(out, graph):
    """No fp32 table of vocabulary rows left in the file; the step loop binds int64 ids and float32 logits
    whatever the weights are; the KV cache is the plan's fp16."""
    import onnx

    model = json.loads((out / "decoder" / "genai_config.json").read_text())["model"]
    table = sorted([model["vocab_size"], model["decoder"]["hidden_size"]])
    assert not [t.name for t in graph.graph.initializer
                if t.data_type == onnx.TensorProto.FLOAT and sorted(t.dims) == table]
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.graph.input, *graph.graph.output]}
    assert types["input_ids"] == onnx.TensorProto.INT64 and types["logits"] == onnx.TensorProto.FLOAT
    assert {t for n, t in types.items() if "key" in n or "value" in n} == {onnx.TensorProto.FLOAT16}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["decoder"]["kv_dtype"] == manifest["plan"]["options"]["kv_dtype"] == "fp16"


def _fp16_lookup(graph):
    """fp16 rows looked up, then cast to fp32."""
    import onnx

    lookup = next(n for n in graph.graph.node if "input_ids" in n.input and "Gather" in n.op_type)
    inits = {t.name: t for t in graph.graph.initializer}
    assert lookup.op_type == "Gather" and inits[lookup.input[0]].data_type == onnx.TensorProto.FLOAT16
    cast = next(n for n in graph.graph.node if n.input and n.input[0] == lookup.output[0])
    assert cast.op_type == "Cast" and cast.attribute[0].i == onnx.TensorProto.FLOAT


@pytest.mark.parametrize("quant", ["fp16", "w8a16"])
def test_fp16_and_w8a16_deploy_on_edgeinfers_own_ops_and_pass_golden(tiny_qwen3_host_scheme_bundle, quant):
    """Where the CPU has AVX-512 (with VNNI) and a C compiler is found (this project's machines), every MatMul
    over a weight is an edgeinfer.MatMulF16 over the weight as fp16 panels of 32 columns, or an edgeinfer.MatMulW8
    over int8 panels and their fp32 scales per block of 128 (custom_ops.py)."""
    import onnx
    from edgeinfer_onnxruntime import custom_ops

    if custom_ops.unavailable():
        pytest.skip(f"no own ops here: {custom_ops.unavailable()}")
    result = tiny_qwen3_host_scheme_bundle(quant)
    out = result.bundle
    assert result.golden["passed"] is True and result.manifest.decoder["golden"]["passed"] is True
    stamp = json.loads((out / "decoder.stamp.json").read_text())
    op = {"fp16": "MatMulF16", "w8a16": "MatMulW8"}[quant]
    assert stamp["scheme"] == quant and f"edgeinfer.{op}" in stamp["then"]
    graph = _graph(out)
    inits = {t.name: t for t in graph.graph.initializer}
    assert not [n.name for n in graph.graph.node if n.op_type in ("MatMul", "MatMulNBits") and n.input[1] in inits]
    kernels = [n for n in graph.graph.node if n.op_type == op]
    cfg = json.loads((out / "decoder" / "genai_config.json").read_text())["model"]
    # a layer: the builder's fused qkv, o, gate, up, down; and the LM head
    assert len(kernels) == 5 * cfg["decoder"]["num_hidden_layers"] + 1
    for n in kernels:
        w = inits[n.input[1]]
        attrs = {a.name: a.i for a in n.attribute}
        assert n.domain == "edgeinfer" and w.dims[0] == -(-attrs["n"] // 32) and w.dims[2] == 32
        if quant == "fp16":
            assert w.data_type == onnx.TensorProto.FLOAT16 and len(n.input) == 2
        else:
            scales = inits[n.input[2]]
            assert w.data_type == onnx.TensorProto.UINT8 and attrs["block"] == 128  # q + 128, K rounded up to 4
            assert scales.data_type == onnx.TensorProto.FLOAT and list(scales.dims) == [
                w.dims[0], -(-w.dims[1] // 128), 32]
    _own_attention(graph, stamp, cfg["decoder"]["num_hidden_layers"])
    # the test model is tied: its lookup reads the LM head's packed weights (kernels/embedding.c), no table of its
    # own beside them
    lookup = next(n for n in graph.graph.node if "input_ids" in n.input and n.op_type != "Shape")
    head = next(n for n in kernels if n.output[0] == "logits")
    embed = {"fp16": "EmbedF16", "w8a16": "EmbedW8"}[quant]
    assert (lookup.domain, lookup.op_type) == ("edgeinfer", embed) and list(lookup.input) == ["input_ids",
                                                                                            *head.input[1:]]
    attrs = {a.name: a.i for a in lookup.attribute}
    table = cfg["vocab_size"] * cfg["decoder"]["hidden_size"]
    assert attrs["n"] == cfg["vocab_size"] and attrs["k"] == cfg["decoder"]["hidden_size"]
    assert attrs.get("block") == {a.name: a.i for a in head.attribute}.get("block")
    assert f"edgeinfer.{embed}" in stamp["embedding"]
    assert [t.name for t in graph.graph.initializer if math.prod(t.dims) >= table] == [head.input[1]]
    _graph_io_and_tables(out, graph)


def _deployed_on_own_ops(tiny_qwen3_host_scheme_bundle, quant: str):
    """tiny-qwen3's ``quant`` bundle (skipped where the own ops cannot be built), golden passed; and its stamp."""
    from edgeinfer_onnxruntime import custom_ops

    if custom_ops.unavailable():
        pytest.skip(f"no own ops here: {custom_ops.unavailable()}")
    result = tiny_qwen3_host_scheme_bundle(quant)
    assert result.golden["passed"] is True
    return result.bundle, json.loads((result.bundle / "decoder.stamp.json").read_text())


@pytest.mark.parametrize("quant, digits, acts", [("w4a16", 2, "fp32 activations"),
                                                  ("w4a8", 1, "int8 activations per block")])
def test_int4_deploys_on_edgeinfers_own_int4_op_and_passes_golden(tiny_qwen3_host_scheme_bundle, quant, digits, acts):
    """Where the own ops build, each MatMul of the builder's fp32 graph is an edgeinfer.MatMulW4 over its weights
    in blocks of 32 with an fp16 scale and minimum each, as llama.cpp's Q4_1 (custom_ops.py), its input as two int8
    digits per block (w4a16) or the high one alone (w4a8: int8 per block of 32, as llama.cpp takes its activations);
    the LM head is int8 (MatMulW8, blocks of 128), as llama.cpp's 4-bit mixes keep it in 8 bits or more, and the
    tied model's lookup reads it (edgeinfer.EmbedW8): no table of its own is left."""
    import onnx

    out, stamp = _deployed_on_own_ops(tiny_qwen3_host_scheme_bundle, quant)
    assert stamp["precision"] == "fp32" and stamp["int4_block_size"] == 32 and stamp["scheme"] == quant
    assert (f"int4 weights in blocks of 32, a scale and a minimum each, each MatMul an edgeinfer.MatMulW4 on {acts}, "
            "the LM head int8 in blocks of 128") in stamp["then"]
    graph = _graph(out)
    inits = {t.name: t for t in graph.graph.initializer}
    assert not [n.name for n in graph.graph.node if n.op_type in ("MatMul", "MatMulNBits")]
    kernels = [n for n in graph.graph.node if n.op_type == "MatMulW4"]
    cfg = json.loads((out / "decoder" / "genai_config.json").read_text())["model"]
    assert len(kernels) == 5 * cfg["decoder"]["num_hidden_layers"]  # qkv, o, gate, up, down
    for n in kernels:
        w, scales = (inits[i] for i in n.input[1:3])
        attrs = {a.name: a.i for a in n.attribute}
        assert n.domain == "edgeinfer" and attrs["block"] == 32 and w.data_type == onnx.TensorProto.UINT8
        assert attrs["digits"] == digits
        assert w.dims[0] == -(-attrs["n"] // 32) and w.dims[2] == 32
        assert scales.data_type == onnx.TensorProto.FLOAT16 and len(n.input) == 3  # the minimums beside the scales
        assert list(scales.dims) == [w.dims[0], -(-w.dims[1] * 2 // 32), 2, 32]
    [head] = [n for n in graph.graph.node if n.op_type == "MatMulW8"]
    assert head.name.startswith("/lm_head/") and {a.name: a.i for a in head.attribute}["block"] == 128
    lookup = next(n for n in graph.graph.node if "input_ids" in n.input and n.op_type != "Shape")
    assert (lookup.op_type, lookup.domain) == ("EmbedW8", "edgeinfer") and lookup.input[1:] == head.input[1:]
    assert stamp["embedding"] == ("the LM head's weights, read by edgeinfer.EmbedW8 (tied: one table, int8 in "
                                  "blocks of 128)")
    assert not [t.name for t in graph.graph.initializer if "embed_tokens" in t.name]
    _own_attention(graph, stamp, cfg["decoder"]["num_hidden_layers"])
    _graph_io_and_tables(out, graph)


@pytest.mark.parametrize("quant, read", [("w8a16", True), ("w4a16", True), ("w8a8", False)])
def test_only_a_graph_on_the_own_ops_reads_its_weights_file_whole_before_onnxruntime_maps_it(
        tiny_qwen3_host_scheme_bundle, monkeypatch, quant, read):
    """The own ops compute from onnxruntime's mapping of the weights file, so it is read whole first and the
    kernel caches it in large folios (pages.read_whole); onnxruntime's own kernels repack their weights."""
    from edgeinfer_onnxruntime import custom_ops

    import edgeinfer
    from edgeinfer.contract import pages

    if read and custom_ops.unavailable():
        pytest.skip(f"no own ops here: {custom_ops.unavailable()}")
    decoder = tiny_qwen3_host_scheme_bundle(quant).bundle / "decoder"
    calls = []
    monkeypatch.setattr(pages, "read_whole", lambda path, *a: calls.append(path) or 0)
    edgeinfer.backend("onnxruntime").load_decoder(decoder, context=DECODER_BUNDLE_CTX).release()
    assert calls == ([decoder / "model.onnx.data"] if read else [])


def _deploy_in_a_new_process(tmp_path, quant, **env):
    """``edgeinfer deploy`` of the tiny decoder in a new process with ``env`` set (the conversion key reads the
    machine at import); the golden check passed; the bundle's stamp and graph."""
    import subprocess
    import sys

    out = tmp_path / quant
    proc = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "deploy", str(model_dir()), "--board", "host",
                           "--quant", quant, "--ctx", str(DECODER_BUNDLE_CTX), "-o", str(out), "--json"],
                          capture_output=True, text=True, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["golden"]["passed"] is True
    return json.loads((out / "decoder.stamp.json").read_text()), _graph(out)


def _deploy_without_a_c_compiler(tmp_path, quant):
    """The deploy of the tiny decoder in a process whose ``CC`` names no compiler: the int8-kernel form."""
    stamp, graph = _deploy_in_a_new_process(tmp_path, quant, CC=str(tmp_path / "no-such-cc"))
    assert "edgeinfer." not in stamp["then"]
    nodes = graph.graph.node
    ops = [n for n in nodes if n.op_type in ("MatMul", "MatMulNBits") and n.input[0] != "digits_ones"]
    assert ops and all(n.op_type == "MatMulNBits" for n in ops) and not any(n.domain == "edgeinfer" for n in nodes)
    _graph_io_and_tables(tmp_path / quant, graph)
    return stamp, graph, ops


def test_the_avx2_build_of_the_own_ops_deploys_w8a16_and_passes_golden(tmp_path, monkeypatch):
    """The library's AVX2 build (what an Intel Core Ultra's CPU runs; pinned here with EDGEINFER_KERNEL_ISA),
    whose MatMulW8 multiplies on vpmaddwd instead of VNNI: the same graph, checked against the fp32 reference by
    deploy's golden check on that build."""
    from edgeinfer_onnxruntime import custom_ops

    monkeypatch.setenv(custom_ops.ISA_ENV, "avx2")
    if custom_ops.unavailable():
        pytest.skip(f"no AVX2 build here: {custom_ops.unavailable()}")
    stamp, graph = _deploy_in_a_new_process(tmp_path, "w8a16")
    assert "edgeinfer.MatMulW8" in stamp["then"]
    assert sum(n.op_type == "MatMulW8" and n.domain == "edgeinfer" for n in graph.graph.node) > 0
    assert not [n.name for n in graph.graph.node if n.op_type in ("MatMul", "MatMulNBits")
                and n.input[1] in {t.name for t in graph.graph.initializer}]


def test_a_bundle_with_the_own_ops_runs_on_their_portable_build_and_says_so(tmp_path, monkeypatch):
    """A w4a16 bundle deployed with the own ops, copied to a CPU where only their portable C build runs (an
    AArch64 board, an x86-64 CPU without AVX2; pinned here with EDGEINFER_KERNEL_ISA): the same greedy tokens as
    on this machine's own build, its golden check passes there, and generate notes the slower build; deploy on
    such a CPU builds onnxruntime's forms (custom_ops.not_for_deploy)."""
    import subprocess
    import sys

    from edgeinfer_onnxruntime import custom_ops

    stamp, _ = _deploy_in_a_new_process(tmp_path, "w4a16")
    assert "edgeinfer.MatMulW4" in stamp["then"]
    portable = {**os.environ, custom_ops.ISA_ENV: "portable"}

    def cli(*args, env=None):
        proc = subprocess.run([sys.executable, "-m", "edgeinfer.cli", *args, "--json"], capture_output=True,
                              text=True, env=env or dict(os.environ))
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout)

    gen = ["generate", str(tmp_path / "w4a16"), "--prompt", "The licence grants", "--max-new-tokens", "16"]
    here, there = cli(*gen), cli(*gen, env=portable)
    assert there["token_ids"] == here["token_ids"] and len(here["token_ids"]) == 16
    assert any("portable C build" in n for n in there.get("notes", [])) and not here.get("notes")
    assert cli("golden", str(tmp_path / "w4a16"), env=portable)["passed"] is True
    monkeypatch.setenv(custom_ops.ISA_ENV, "portable")
    assert custom_ops.unavailable() is None
    assert custom_ops.not_for_deploy() == "only their portable C build runs on this CPU"


def test_without_a_c_compiler_int4_keeps_the_builders_symmetric_int4_and_passes_golden(tmp_path):
    """Where the own ops cannot be built, w4a8 is the builder's own int4 on onnxruntime's MatMulNBits (4 bits, no
    zero points: symmetric, blocks of 32, int8 activations at accuracy level 4), its head included, not MatMulW4's
    Q4_1 blocks; deploy's golden check passes it."""
    stamp, graph = _deploy_in_a_new_process(tmp_path, "w4a8", CC=str(tmp_path / "no-such-cc"))
    assert stamp["precision"] == "int4" and stamp["int4_block_size"] == 32 and "then" not in stamp
    nodes = graph.graph.node
    ops = [n for n in nodes if n.op_type in ("MatMul", "MatMulNBits")]
    assert ops and all(n.op_type == "MatMulNBits" for n in ops) and not any(n.domain == "edgeinfer" for n in nodes)
    named = ("bits", "block_size", "accuracy_level")
    attrs = {(a.name, a.i) for n in ops for a in n.attribute if a.name in named}
    assert attrs == {("bits", 4), ("block_size", 32), ("accuracy_level", 4)}
    assert all(len([i for i in n.input if i]) == 3 for n in ops)  # x, weights, scales: no zero points


def _summed_halves(nodes, ops):
    """The outputs of ``ops`` whose two halves (a [2, -1] Reshape) are added by a [1, 1] @ them after it."""
    halves = {n.output[0]: n.input[0] for n in nodes if n.op_type == "Reshape"}
    return {halves[n.input[1]] for n in nodes if n.op_type == "MatMul" and n.input[1] in halves} & {
        n.output[0] for n in ops}


def test_without_a_c_compiler_fp16_runs_as_two_int8_planes_and_passes_golden(tmp_path):
    """fp16's fallback: two int8 planes a weight (weight_planes.py): w8a16's fallback nodes (MatMulNBits 8-bit
    on the int8 kernel over each input's two int8 digits, int8_digits.py, the output's two halves added after
    it), each beside a node over its weight's residual plane on the undivided input, the two outputs added. One
    deploy covers both fallbacks' machinery (w8a16's is the same quantizer and digit split without the planes)."""
    stamp, graph, ops = _deploy_without_a_c_compiler(tmp_path, "fp16")
    assert "second int8 plane" in stamp["then"]
    nodes = graph.graph.node
    low = [n for n in ops if n.input[1].endswith("_lo")]
    high = [n for n in ops if n not in low]
    assert len(low) == len(high) and {n.input[0] + "_digits" for n in low} == {n.input[0] for n in high}
    adds = {frozenset(n.input) for n in nodes if n.op_type == "Add"}
    pairs = {frozenset((lo.output[0].removesuffix("_lo") + "_hi", lo.output[0])) for lo in low}
    assert pairs <= adds, "each weight's two planes' products are added"
    assert {h.output[0] for h in high} == {lo.output[0].removesuffix("_lo") + "_hi_digits" for lo in low}
    assert len(_summed_halves(nodes, high)) == len(high)
    _fp16_lookup(graph)
    assert {n.domain for n in nodes if n.op_type == "GroupQueryAttention"} == {"com.microsoft"}
    assert "attention" not in stamp


def test_a_bundle_whose_only_own_op_is_the_attention_runs_onnxruntimes_where_no_compiler_builds_it(
        tiny_qwen3_host_scheme_bundle, tmp_path):
    """w8a8's graph uses the own attention op only: on a machine with no C compiler and no built library (an empty
    cache), the decoder runs onnxruntime's attention in its place (custom_ops.session_graph), says so once, and
    the bundle's golden check still passes there; the bundle's files are left as they were. fp16's own matmuls
    have no such stand-in: refused in one line (exit 3), and verify says so without loading it."""
    import subprocess
    import sys

    from edgeinfer_onnxruntime import custom_ops

    if custom_ops.unavailable():
        pytest.skip(f"no own ops here: {custom_ops.unavailable()}")
    bundle = tiny_qwen3_host_scheme_bundle("w8a8").bundle
    before = {p.name: p.stat().st_mtime_ns for p in (bundle / "decoder").iterdir()}
    env = {**os.environ, "CC": str(tmp_path / "no-such-cc"), "EDGEINFER_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "golden", str(bundle), "--json"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and json.loads(proc.stdout)["passed"] is True, proc.stderr[-2000:]
    assert "onnxruntime's GroupQueryAttention instead" in json.loads(proc.stdout)["caveat"]  # for scripts too
    proc = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "generate", str(bundle), "Hello",
                           "--max-new-tokens", "2"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "onnxruntime's GroupQueryAttention instead" in proc.stderr and "no C compiler" in proc.stderr
    assert {p.name: p.stat().st_mtime_ns for p in (bundle / "decoder").iterdir()} == before
    fp16 = tiny_qwen3_host_scheme_bundle("fp16").bundle
    proc = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "golden", str(fp16)], capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 3 and "C compiler" in proc.stderr and "Traceback" not in proc.stderr
    # the stamps say which bundle needs the library, so verify tells them apart before a load
    assert json.loads((bundle / "decoder.stamp.json").read_text())["target"] == "cpu"
    assert json.loads((fp16 / "decoder.stamp.json").read_text())["target"] == custom_ops.TARGET
    proc = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "verify", str(bundle), "--json"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and json.loads(proc.stdout)["refused"] == [], proc.stderr
    proc = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "verify", str(fp16), "--json"],
                          capture_output=True, text=True, env=env)
    (refused,) = json.loads(proc.stdout)["refused"]
    assert proc.returncode == 3 and refused["artifact"] == "decoder"
    assert refused["reason"].startswith("this bundle's graph uses edgeinfer's own ops, which need a C compiler")


def test_the_plans_kv_dtype_is_what_the_opened_decoder_allocates(tiny_qwen3_host_bundle):
    """``plan`` states the KV dtype, deploy records it, and open_decoder allocates exactly that: the cache's
    element type and its bytes (the planner's formula at the loaded context and slots)."""
    import numpy as np

    from edgeinfer.model.bundle import Bundle
    from edgeinfer.planning.planner import plan
    from edgeinfer.run.bundle import open_generator

    planned = plan(str(model_dir()), "host", ctx=DECODER_BUNDLE_CTX, batch=2)
    assert planned.kv_dtype == "fp16"
    bundle = Bundle.open(tiny_qwen3_host_bundle)
    assert bundle.manifest.decoder["kv_dtype"] == planned.kv_dtype
    with open_generator(bundle, slots=2) as gen:
        d = gen.decoder
        assert d.kv_dtype == planned.kv_dtype
        assert {a.dtype for kv in d._cache for a in kv} == {np.dtype(np.float16)}
        assert d.kv_cache_bytes == planned.breakdown["kv_cache"]
    with pytest.raises(InputError, match="keeps its KV cache in fp16, not fp32"):  # built in: not chosen at load
        open_generator(bundle, kv_dtype="fp32")
    # fp32, the default scheme, attends with the own op too, and with nothing else of edgeinfer's: its bundles load
    # where no C compiler builds the library, on onnxruntime's op (custom_ops.session_graph)
    from edgeinfer_onnxruntime import custom_ops

    if not custom_ops.unavailable():
        stamp = json.loads((tiny_qwen3_host_bundle / "decoder.stamp.json").read_text())
        _own_attention(_graph(tiny_qwen3_host_bundle), stamp, 4)
        assert custom_ops.own_ops(tiny_qwen3_host_bundle / "decoder" / "model.onnx") == {"GroupQueryAttention"}


def test_the_host_plan_holds_fp16_and_w8a16_weights_as_the_own_ops_do_and_adds_serves_processes():
    """The onnxruntime plugin holds an fp16 decoder's weights as fp16 (MatMulF16); w8a16's as int8 with a 4-byte
    scale per block of 128 (MatMulW8: 8.25 bits); a tied model's table once, in the LM head (EmbedF16 / EmbedW8),
    where fp32 holds it twice. So against fp32's 32 bits the host plan counts half the body and table for fp16,
    8.25/32 for w8a16, and no second table. A served decoder adds serve's own processes to the breakdown."""
    from edgeinfer.planning.planner import plan
    from edgeinfer.testing.serve import measured_runtime_served_worker_saving

    fp16 = plan(str(model_dir()), "host", quant="fp16", ctx=512, batch=4, suggest=False)
    fp32 = plan(str(model_dir()), "host", quant="fp32", ctx=512, batch=4, suggest=False)
    w8a16 = plan(str(model_dir()), "host", quant="w8a16", ctx=512, batch=4, suggest=False)
    w16, w8, w32 = fp16.details.weights, w8a16.details.weights, fp32.details.weights
    # fp32: the file's exact bytes, 4 a parameter; the tied table once in the file and once more for the LM head
    table = w32.embedding_duplicate / 4
    body = (w32.file_bytes - w32.embedding_duplicate) / 4
    assert w16.body == body * 2 and w16.embedding == table * 2 and w16.embedding_bits == 16
    assert abs(w8.body - body * 8.25 / 8) <= 1 and abs(w8.embedding - table * 8.25 / 8) <= 1
    assert w16.lm_head == w8.lm_head == 0 and w32.embedding_duplicate > 0
    assert "MatMulF16" in w16.basis
    served = fp16.to_dict()["memory"]["served"]
    decoder = sum(v for k, v in fp16.breakdown.items() if k != "reserved")
    # a served worker holds less than the host rows' decoder process (no manifest schema, no tokenizer)
    lighter = decoder - served["decoder_process_bytes"]
    saving = measured_runtime_served_worker_saving("onnxruntime")
    assert 0.9 * saving <= lighter <= saving, lighter
    assert served["total_bytes"] == served["decoder_process_bytes"] + served["serve_processes_bytes"]
    # the HTTP process (request helpers start only for large or chat requests; a decoder worker needs no resource
    # tracker), as measured by bench/serve_footprint.py --tiny --label s57-starlette
    import json
    import statistics
    from pathlib import Path

    results = Path(__file__).parents[1] / "bench/results/serve_footprint-s57-starlette.json"
    rows = json.loads(results.read_text())["rows"]
    measured = statistics.median(r["serve_processes_peak_bytes"] for r in rows)
    assert 0.9 < served["serve_processes_bytes"] / measured < 1.1, (served["serve_processes_bytes"], measured)
    assert served["serve_processes_bytes"] < 150 * 2**20  # no request helper (75 MiB each) counted
    # serve --in-process: one interpreter less, never more than bench/serve_processes.py measured it save
    from edgeinfer.testing.serve import measured_in_process_saving

    saved = measured_in_process_saving()
    assert 0.9 * saved <= served["total_bytes"] - served["in_process_total_bytes"] <= saved


def test_a_conversion_cached_under_another_int8_block_is_not_reused(tiny_qwen3_host_scheme_bundle, tmp_path,
                                                                     monkeypatch):
    """The host's int8 block is part of the conversion cache key (``Decoders.defaults``): with the plugin's
    int8 block set back to 32, deploy does not reuse the block-128 conversion the fixture cached (the bundle holds
    block-32 weights: converted now, or a block-32 conversion an earlier run left in the cache); with 128 again,
    the cached block-128 conversion is reused."""
    import dataclasses

    import edgeinfer_onnxruntime.decoder as ort_decoder

    from edgeinfer.deploy.decoder import deploy_decoder
    from edgeinfer.testing.llm import model_dir

    assert tiny_qwen3_host_scheme_bundle("w8a8").manifest  # the block-128 conversion is in the cache
    backend = _ort_backend()
    monkeypatch.setattr(ort_decoder, "INT8_BLOCK", 32)
    monkeypatch.setattr(backend, "decoders", dataclasses.replace(
        backend.decoders, defaults={**backend.decoders.defaults, "int8_block_size": 32}))
    old = deploy_decoder(model_dir(), "host", tmp_path / "g32", quant="w8a8", ctx=DECODER_BUNDLE_CTX)
    monkeypatch.undo()
    again = deploy_decoder(model_dir(), "host", tmp_path / "g128", quant="w8a8", ctx=DECODER_BUNDLE_CTX)
    assert again.cached is True
    for result, block in ((old, 32), (again, 128)):
        assert json.loads((result.bundle / "decoder.stamp.json").read_text())["int8_block_size"] == block
        blocks = {a.i for n in _graph(result.bundle).graph.node if n.op_type == "MatMulNBits" for a in n.attribute
                  if a.name == "block_size"}
        assert blocks == {block}


def test_the_host_plan_holds_int8_weights_as_the_runtime_does():
    """The host plan's int8 weights are what onnxruntime holds for the bundles deploy builds at block 128
    (bench/results/int8_block.json): w8a8 as MLAS's packed copy, int8 + a float scale and a float block sum
    per block of 128 (8.5 bits per weight), and w8a16 as its own op holds it, int8 + a float scale per block of
    128 (8.25 bits: custom_ops.py); the runtime profile's block is the plugin's."""
    from edgeinfer_onnxruntime.blocks import INT8_BLOCK

    from edgeinfer.planning.planner import plan, runtime_profile

    assert runtime_profile("onnxruntime")["int8_blocks"]["block"] == INT8_BLOCK == 128
    int4 = plan(str(model_dir()), "host", quant="w4a16", ctx=256, suggest=False).details.weights  # 5 bits
    for quant, bits in (("w8a8", 8.5), ("w8a16", 8.25)):
        w = plan(str(model_dir()), "host", quant=quant, ctx=256, suggest=False).details.weights
        assert f"× {bits:g} bits per weight" in w.basis and "blocks of 128" in w.basis, w.basis
        assert w.body / int4.body == pytest.approx(bits / 5, rel=1e-6), (quant, w.body, int4.body)


@pytest.mark.parametrize("quant", ["w4a16_g128"])
def test_int4_in_blocks_of_128_deploys_smaller_passes_golden_and_is_planned_as_held(tiny_qwen3_host_scheme_bundle,
                                                                                     quant):
    """``w4a16_g128``: the same Q4_1 form in blocks of 128 (every row of tiny-qwen3 is 256 or 768 wide: none
    halved), 4.25 bits a weight where the default's blocks of 32 take 5; the head stays int8. It passes the golden
    check on this trained model (SmolLM2-135M, whose weights are already Q4_1 in blocks of 32, fails it:
    docs/generation.md), and the plan's weights are the file's within 10 %."""

    from edgeinfer.planning.planner import plan

    out, stamp = _deployed_on_own_ops(tiny_qwen3_host_scheme_bundle, quant)
    assert stamp["int4_block_size"] == 128 and stamp["scheme"] == quant
    assert "int4 weights in blocks of 128 (halved, to 32, on rows it does not divide), a scale and a minimum" in (
        stamp["then"])
    graph = _graph(out)
    blocks = {next(a.i for a in n.attribute if a.name == "block")
              for n in graph.graph.node if n.op_type == "MatMulW4"}
    assert blocks == {128}
    [head] = [n for n in graph.graph.node if n.op_type == "MatMulW8"]
    assert {a.name: a.i for a in head.attribute}["block"] == 128
    on_disk = (out / "decoder" / "model.onnx.data").stat().st_size
    default = (tiny_qwen3_host_scheme_bundle("w4a16").bundle / "decoder" / "model.onnx.data").stat().st_size
    assert on_disk < 0.95 * default, (on_disk, default)
    w = plan(str(model_dir()), "host", quant=quant, ctx=256, suggest=False).details.weights
    assert w.basis == ("parameter counts × 4.25 bits per weight (w4a16_g128 as the runtime holds it: int4 in blocks "
                       "of 128 weights + 4 bytes per block; the LM head int8)")
    assert 0.9 < (w.body + w.embedding) / on_disk <= 1.0, (w, on_disk)


def test_the_host_plan_holds_int4_weights_as_matmul_w4_reads_them_in_place(tiny_qwen3_host_scheme_bundle):
    """w4a16 and w4a8 run on the plugin's own MatMulW4 over the weights file itself, no packed copy: both planned at
    the 5 bits that file holds, the int4 and an fp16 scale and minimum per block of 32 (MLAS's copy for int8
    activations is the fallback form where the ops cannot be built, not planned); the block is the plugin's int4
    block. The tied table is the int8 head (EmbedW8), counted once at 8.25 bits: the plan's weights are within 10 %
    of the bundle's weights file (its norms, rotary tables and padding are not planned)."""
    from edgeinfer_onnxruntime.blocks import DEFAULT_BLOCK

    from edgeinfer.planning.planner import plan, runtime_profile

    assert runtime_profile("onnxruntime")["int4_blocks"]["block"] == DEFAULT_BLOCK == 32
    int4 = plan(str(model_dir()), "host", quant="w4a16", ctx=256, suggest=False).details.weights
    w = plan(str(model_dir()), "host", quant="w4a8", ctx=256, suggest=False).details.weights
    held = "(w4a8 as the runtime holds it: int4 in blocks of 32 weights + 4 bytes per block; the LM head int8)"
    assert w.basis == f"parameter counts × 5 bits per weight {held}"
    assert int4.basis == f"parameter counts × 5 bits per weight {held.replace('w4a8', 'w4a16')}"
    assert (w.body, w.embedding, w.lm_head) == (int4.body, int4.embedding, int4.lm_head)
    assert int4.lm_head == 0 and int4.embedding_bits == 8.25
    planned = int4.body + int4.embedding
    on_disk = (tiny_qwen3_host_scheme_bundle("w4a16").bundle / "decoder" / "model.onnx.data").stat().st_size
    assert 0.9 < planned / on_disk <= 1.0, (planned, on_disk)


def test_a_decoder_on_the_own_ops_loads_without_importing_onnx(tiny_qwen3_host_scheme_bundle):
    """A serve decoder worker reads which own ops its graph needs from the file itself (onnx_index.graph_ops):
    importing onnx cost each worker ~8 MiB of RSS."""
    import subprocess
    import sys

    decoder = tiny_qwen3_host_scheme_bundle("w8a16").bundle / "decoder"
    code = ("import sys; sys.modules['onnx'] = None; import edgeinfer; edgeinfer.backend('onnxruntime')"
            f".load_decoder({str(decoder)!r}, context={DECODER_BUNDLE_CTX}).release(); print('loaded')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "loaded", proc.stderr[-2000:]


def test_a_q8_0_kv_cache_deploys_on_the_own_attention_passes_golden_and_is_planned_as_allocated(
        tiny_qwen3_host_scheme_bundle, tmp_path):
    """``--option kv_dtype=q8_0``: every layer attends with edgeinfer.GroupQueryAttentionQ8 over uint8 rows of
    64 int8 digits and two fp16 scales (68 bytes for the tiny model's 64 values, where fp16 takes 128); the golden
    check passes, by 8-bit bounds; the plan states q8_0 and counts exactly the bytes the opened decoder allocates,
    68/128 of the fp16 bundle's; a Hugging Face directory is not opened with it (deploy builds it)."""
    import numpy as np
    from edgeinfer_onnxruntime import custom_ops

    import edgeinfer
    from edgeinfer.deploy.decoder import deploy_decoder
    from edgeinfer.model.bundle import Bundle
    from edgeinfer.planning.planner import plan
    from edgeinfer.run.bundle import open_generator
    from edgeinfer.run.generation.golden import THRESHOLDS

    if custom_ops.unavailable():
        pytest.skip(f"no own ops here: {custom_ops.unavailable()}")
    out = tmp_path / "q8"
    result = deploy_decoder(model_dir(), "host", out, quant="fp16", ctx=DECODER_BUNDLE_CTX,
                            options={"kv_dtype": "q8_0"})
    assert result.golden["passed"] is True
    assert result.golden["thresholds"] == THRESHOLDS["w8a16"].__dict__  # fp16 weights on an 8-bit cache
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["decoder"]["kv_dtype"] == manifest["plan"]["options"]["kv_dtype"] == "q8_0"
    graph = _graph(out)
    attention = [n for n in graph.graph.node if "GroupQueryAttention" in n.op_type]
    assert len(attention) == 4 and {(n.domain, n.op_type) for n in attention} == {("edgeinfer",
                                                                                    "GroupQueryAttentionQ8")}
    kv = [v for v in graph.graph.input if v.name.startswith("past_key_values.")]
    assert len(kv) == 8 and {v.type.tensor_type.elem_type for v in kv} == {onnx_uint8()}
    assert {v.type.tensor_type.shape.dim[3].dim_value for v in kv} == {68}
    fp16 = Bundle.open(tiny_qwen3_host_scheme_bundle("fp16").bundle)
    with open_generator(Bundle.open(out), slots=2) as q8, open_generator(fp16, slots=2) as f16:
        assert q8.decoder.kv_dtype == "q8_0" and f16.decoder.kv_dtype == "fp16"
        assert {a.dtype for k in q8.decoder._cache for a in k} == {np.dtype(np.uint8)}
        assert q8.decoder.kv_cache_bytes * 128 == f16.decoder.kv_cache_bytes * 68
        assert manifest["plan"]["memory"]["breakdown"]["kv_cache"] * 2 == q8.decoder.kv_cache_bytes  # one slot
        assert plan(str(model_dir()), "host", quant="fp16", ctx=DECODER_BUNDLE_CTX, batch=2,
                    kv_dtype="q8_0").breakdown["kv_cache"] == q8.decoder.kv_cache_bytes
    with pytest.raises(InputError, match="deploy"):
        edgeinfer.load(str(model_dir()), backend="onnxruntime", ctx=64, kv_dtype="q8_0")


def onnx_uint8():
    from onnx import TensorProto

    return TensorProto.UINT8


def test_without_a_c_compiler_a_q8_0_kv_cache_is_refused_in_one_line(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "deploy", str(model_dir()), "--board", "host",
                           "--ctx", str(DECODER_BUNDLE_CTX), "--option", "kv_dtype=q8_0", "-o", str(tmp_path / "b")],
                          capture_output=True, text=True, env={**os.environ, "CC": str(tmp_path / "no-such-cc")})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "q8_0 KV cache" in proc.stderr and "kv_dtype=fp16" in proc.stderr and not (tmp_path / "b").exists()


def test_a_q8_0_kv_cache_for_heads_that_are_not_blocks_of_32_is_refused_before_exporting(tmp_path, monkeypatch):
    """A random Llama with heads of 16 values: deploy with ``kv_dtype=q8_0`` exits 2 in one line naming the head
    size, and the model builder never runs (its export takes minutes on a large model)."""
    from edgeinfer_onnxruntime import builder, decoder

    from edgeinfer.testing.llm import random_llama

    model = random_llama(tmp_path / "llama", layers=1, hidden=96, heads=6, kv_heads=3)
    ran = []
    monkeypatch.setattr(decoder, "export", lambda *a, **k: ran.append(a))
    monkeypatch.setattr(builder, "export", lambda *a, **k: ran.append(a))
    with pytest.raises(InputError, match="head size is 16"):
        decoder.convert(model, "fp16", 64, tmp_path / "out", None, "q8_0")
    assert not ran
