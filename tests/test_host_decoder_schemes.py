"""Decoder schemes on the host board: what the board lists is what the onnxruntime plugin converts, and the
fp16, int8 weight-only (w8a16), int8 (w8a8) and int4 with int8 activations (w4a8) builds of the tiny test
decoder deploy and pass the decoder golden check."""

from __future__ import annotations

import json
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


@pytest.mark.parametrize("quant, accuracy", [("w8a16", 4), ("w8a8", 4), ("w4a8", 4)])
def test_int8_decoders_deploy_for_host_and_pass_golden(tiny_qwen3_host_scheme_bundle, quant, accuracy):
    """Deployed once per session (the shared fixture; the conversion cached across runs), golden-checked on
    every deploy."""

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
    # int8 at 128 against 1.25x at 32: docs/planner.md#served-decoder-memory). w8a16: the same kernel over
    # each input's two int8 digits (int8_digits.py; onnxruntime has no fast 8-bit kernel for fp32 activations),
    # its output's two halves added after it; w8a8 runs it on one digit. w4a8: the builder's int4 (block 32, as
    # llama.cpp's Q4_0). fp16's two int8 planes (weight_planes.py): test_fp16_without_the_fp16_kernel_...
    bits, block = {"w8a16": (8, 128), "w8a8": (8, 128), "w4a8": (4, 32)}[quant]
    assert attrs == {("bits", bits), ("accuracy_level", accuracy), ("block_size", block)}
    assert stamp.get("int8_block_size") == (None if quant == "w4a8" else 128)
    nodes = graph.graph.node
    read = {n.input[0] for n in ops}
    halves = {n.output[0]: n.input[0] for n in nodes if n.op_type == "Reshape"}  # seen as [2, -1]
    summed = {halves[n.input[1]] for n in nodes  # an output whose two halves are added: [1, 1] @ them
              if n.op_type == "MatMul" and n.input[1] in halves} & {n.output[0] for n in ops}
    if quant == "w8a16":
        assert all(x.endswith("_digits") for x in read) and len(summed) == len(ops)
    else:
        assert not any(x.endswith("_digits") for x in read) and not summed
    # the token embedding looked up in int8 blocks, no fp32 table of vocabulary rows left in the file (the
    # builder's is fp32 whatever the precision: embedding.py)
    lookup = next(n for n in graph.graph.node if "input_ids" in n.input and "Gather" in n.op_type)
    assert lookup.op_type == "GatherBlockQuantized" and lookup.domain == "com.microsoft"
    assert stamp["embedding"].startswith("int8, block ")
    _graph_io_and_tables(out, graph)


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


def test_fp16_deploys_on_the_fp16_kernel_and_passes_golden(tiny_qwen3_host_scheme_bundle):
    """Where the CPU has AVX-512F and a C compiler is found (this project's machines), every MatMul over a
    weight is an edgeinfer.MatMulF16 over the weight as fp16 panels of 32 columns (matmul_f16.py)."""
    import onnx
    from edgeinfer_onnxruntime import matmul_f16

    if matmul_f16.unavailable():
        pytest.skip(f"no fp16 kernel here: {matmul_f16.unavailable()}")
    result = tiny_qwen3_host_scheme_bundle("fp16")
    out = result.bundle
    assert result.golden["passed"] is True and result.manifest.decoder["golden"]["passed"] is True
    stamp = json.loads((out / "decoder.stamp.json").read_text())
    assert stamp["scheme"] == "fp16" and "edgeinfer.MatMulF16" in stamp["then"]
    graph = _graph(out)
    inits = {t.name: t for t in graph.graph.initializer}
    assert not [n.name for n in graph.graph.node if n.op_type in ("MatMul", "MatMulNBits") and n.input[1] in inits]
    kernels = [n for n in graph.graph.node if n.op_type == "MatMulF16"]
    cfg = json.loads((out / "decoder" / "genai_config.json").read_text())["model"]
    # a layer: the builder's fused qkv, o, gate, up, down; and the LM head
    assert len(kernels) == 5 * cfg["decoder"]["num_hidden_layers"] + 1
    for n in kernels:
        w = inits[n.input[1]]
        cols = next(a.i for a in n.attribute if a.name == "n")
        assert n.domain == "edgeinfer" and w.data_type == onnx.TensorProto.FLOAT16
        assert w.dims[0] == -(-cols // 32) and w.dims[2] == 32
    assert stamp["embedding"].startswith("fp16")
    _fp16_lookup(graph)
    _graph_io_and_tables(out, graph)


def test_fp16_without_the_fp16_kernel_deploys_as_two_int8_planes_and_passes_golden(tmp_path):
    """Where the op cannot be built (here: no C compiler, ``CC`` naming none), fp16 falls back to two int8 planes
    a weight (weight_planes.py): w8a16's nodes, each beside a node over its weight's residual plane on the
    undivided input, the two outputs added. In a new process: the conversion key reads the machine at import."""
    import subprocess
    import sys

    out = tmp_path / "planes"
    env = {**os.environ, "CC": str(tmp_path / "no-such-cc")}
    proc = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "deploy", str(model_dir()), "--board", "host",
                           "--quant", "fp16", "--ctx", str(DECODER_BUNDLE_CTX), "-o", str(out), "--json"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["golden"]["passed"] is True
    stamp = json.loads((out / "decoder.stamp.json").read_text())
    assert "second int8 plane" in stamp["then"] and "MatMulF16" not in stamp["then"]
    graph = _graph(out)
    nodes = graph.graph.node
    ops = [n for n in nodes if n.op_type in ("MatMul", "MatMulNBits") and n.input[0] != "digits_ones"]
    assert ops and all(n.op_type == "MatMulNBits" for n in ops) and not any(n.domain == "edgeinfer" for n in nodes)
    low = [n for n in ops if n.input[1].endswith("_lo")]
    high = [n for n in ops if n not in low]
    assert len(low) == len(high) and {n.input[0] + "_digits" for n in low} == {n.input[0] for n in high}
    adds = {frozenset(n.input) for n in nodes if n.op_type == "Add"}
    pairs = {frozenset((lo.output[0].removesuffix("_lo") + "_hi", lo.output[0])) for lo in low}
    assert pairs <= adds, "each weight's two planes' products are added"
    assert {h.output[0] for h in high} == {lo.output[0].removesuffix("_lo") + "_hi_digits" for lo in low}
    _fp16_lookup(graph)
    _graph_io_and_tables(out, graph)


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


def test_the_host_plan_holds_fp16_decoder_weights_as_two_int8_planes_and_adds_serves_processes():
    """The onnxruntime plugin holds an fp16 decoder's weights as two int8 planes packed by MLAS (8.5 bits each:
    weight_planes.py) and its embedding as fp16 rows, so the host plan counts 17 bits a weight for the body and
    the tied LM head, 16 for the table; a served decoder adds serve's own processes to the breakdown."""
    from edgeinfer.planning.planner import plan
    from edgeinfer.testing.serve import measured_served_worker_saving

    fp16 = plan(str(model_dir()), "host", quant="fp16", ctx=512, batch=4, suggest=False)
    fp32 = plan(str(model_dir()), "host", quant="fp32", ctx=512, batch=4, suggest=False)
    w8a16 = plan(str(model_dir()), "host", quant="w8a16", ctx=512, batch=4, suggest=False)
    w16, w8 = fp16.details.weights, w8a16.details.weights  # w8a16: one such plane
    assert abs(w16.body - 2 * w8.body) <= 1 and abs(w16.lm_head - 2 * w8.lm_head) <= 1
    assert w16.embedding == fp32.details.weights.embedding_duplicate // 2 and w16.embedding_bits == 16
    assert "two int8 planes" in w16.basis
    served = fp16.to_dict()["memory"]["served"]
    decoder = sum(v for k, v in fp16.breakdown.items() if k != "reserved")
    # a served worker loads without the manifest's schema: a little less than a decoder process of its own
    lighter = decoder - served["decoder_process_bytes"]
    assert 0.9 * measured_served_worker_saving() <= lighter <= measured_served_worker_saving(), lighter
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

    assert tiny_qwen3_host_scheme_bundle("w8a16").manifest  # the block-128 conversion is in the cache
    backend = _ort_backend()
    monkeypatch.setattr(ort_decoder, "INT8_BLOCK", 32)
    monkeypatch.setattr(backend, "decoders", dataclasses.replace(
        backend.decoders, defaults={**backend.decoders.defaults, "int8_block_size": 32}))
    old = deploy_decoder(model_dir(), "host", tmp_path / "g32", quant="w8a16", ctx=DECODER_BUNDLE_CTX)
    monkeypatch.undo()
    again = deploy_decoder(model_dir(), "host", tmp_path / "g128", quant="w8a16", ctx=DECODER_BUNDLE_CTX)
    assert again.cached is True
    for result, block in ((old, 32), (again, 128)):
        assert json.loads((result.bundle / "decoder.stamp.json").read_text())["int8_block_size"] == block
        blocks = {a.i for n in _graph(result.bundle).graph.node if n.op_type == "MatMulNBits" for a in n.attribute
                  if a.name == "block_size"}
        assert blocks == {block}


def test_the_host_plan_holds_int8_weights_as_the_runtime_does():
    """The host plan's int8 weights are what onnxruntime holds for the bundles deploy builds at block 128
    (bench/results/int8_block.json): w8a8 as MLAS's packed copy, int8 + a float scale and a float block sum
    per block of 128 (8.5 bits per weight), and w8a16 the same (int8_digits.py: the int8 kernel over two digits of
    the activations); the runtime profile's block is the plugin's."""
    from edgeinfer_onnxruntime.blocks import INT8_BLOCK

    from edgeinfer.planning.planner import plan, runtime_profile

    assert runtime_profile("onnxruntime")["int8_blocks"]["block"] == INT8_BLOCK == 128
    int4 = plan(str(model_dir()), "host", quant="w4a16", ctx=256, suggest=False).details.weights  # 4 bits, as named
    for quant, bits in (("w8a8", 8.5), ("w8a16", 8.5)):
        w = plan(str(model_dir()), "host", quant=quant, ctx=256, suggest=False).details.weights
        assert f"× {bits:g} bits per weight" in w.basis and "blocks of 128" in w.basis, w.basis
        assert w.body / int4.body == pytest.approx(bits / 4, rel=1e-6), (quant, w.body, int4.body)


def test_the_host_plan_holds_w4a8_weights_as_mlas_packs_them_for_int8_kernels():
    """w4a8 (4-bit weights, int8 activations): MLAS repacks each block of 32 with a float scale and a float block
    sum (4 + 64/32 = 6 bits per weight: the 210.8 M random Qwen3 held 44-45 MiB more than as w4a16, 1.8 bits a
    weight; docs/planner.md); w4a16 keeps 4; the block is the plugin's int4 block."""
    from edgeinfer_onnxruntime.blocks import DEFAULT_BLOCK

    from edgeinfer.planning.planner import plan, runtime_profile

    assert runtime_profile("onnxruntime")["int4_blocks"]["block"] == DEFAULT_BLOCK == 32
    int4 = plan(str(model_dir()), "host", quant="w4a16", ctx=256, suggest=False).details.weights
    w = plan(str(model_dir()), "host", quant="w4a8", ctx=256, suggest=False).details.weights
    assert "× 6 bits per weight" in w.basis and "blocks of 32" in w.basis, w.basis
    assert w.body / int4.body == pytest.approx(6 / 4, rel=1e-6), (w.body, int4.body)
