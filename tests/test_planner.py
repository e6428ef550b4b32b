"""Planner: hand arithmetic and published measurements, never the code's own numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeinfer.errors import EdgeInferError, InputError
from edgeinfer.planning.planner import plan

GIB = 2**30


def test_breakdown_adds_up_and_kv_matches_hand_arithmetic():
    p = plan("Qwen/Qwen3-8B", "rk3588-16g", quant="w8a8", ctx=4096)
    bd = p.breakdown
    assert sum(bd.values()) == p.total_bytes == p.to_dict()["memory"]["total_bytes"]
    assert bd["kv_cache"] == 144 * 1024 * 4096  # 144 KiB/token (Qwen3-8B config.json) × 4096
    # rknn (the board's backend runtime): 8.191 B params × 1 byte, untied: no duplicate; its 151,936 × 4,096
    # embedding table is fp16 on the host (1 byte more each); per-channel fp32 scales ~6 MB
    assert bd["weights"] == pytest.approx(8.191e9 + 151936 * 4096 + 6e6, rel=0.001)
    assert bd["reserved"] == 1 * GIB
    assert p.fits and p.headroom_bytes == 16 * GIB - p.total_bytes


def test_fit_verdicts_and_family_suggestion():
    assert plan("Qwen/Qwen3-8B", "rk3588-16g", quant="w8a8", ctx=4096).fits
    p = plan("Qwen/Qwen3-8B", "rk3588-8g", quant="w8a8", ctx=4096)
    assert not p.fits and p.reasons
    assert p.suggestions.board == "rk3588-16g"  # 8.2 GB of int8 weights cannot fit 8 GiB
    assert p.suggestions.max_ctx is None and p.suggestions.quant is None


def test_max_ctx_suggestion_is_tight():
    p = plan("meta-llama/Llama-2-13b-hf", "rk3588-16g", quant="w8a8", ctx=4096)
    m = p.suggestions.max_ctx
    assert m is not None and 0 < m < 4096  # 13 GB weights + 800 KiB/token of KV
    assert plan("meta-llama/Llama-2-13b-hf", "rk3588-16g", quant="w8a8", ctx=m, suggest=False).fits
    assert not plan("meta-llama/Llama-2-13b-hf", "rk3588-16g", quant="w8a8", ctx=m + 1, suggest=False).fits


def test_quant_suggestion_on_rk3576():
    p = plan("Qwen/Qwen3-8B", "rk3576-8g", quant="w8a8", ctx=4096)
    # w4a16_g32 = 4 + 16/32 = 4.5 bpw: ~4.6 GB of weights fit 8 GiB; int8 (8.2 GB) does not
    assert not p.fits and p.suggestions.quant == "w4a16_g32"
    assert "w8a8" not in [q["quant"] for q in p.suggestions.quants_that_fit]


def test_w4a16_on_rk3588_is_an_error_naming_supported():
    with pytest.raises(InputError) as e:
        plan("Qwen/Qwen3-8B", "rk3588-8g", quant="w4a16")
    msg = e.value.one_line()
    assert e.value.exit_code == 2 and "w8a8" in msg and "w4a16" in msg


@pytest.mark.parametrize("kw", [{"ctx": 0}, {"ctx": -5}, {"batch": 0}, {"batch": -1}, {"quant": "w3a3"},
                                {"kv_dtype": "fp7"}, {"paging": 0}])
def test_bad_options_are_input_errors(kw):
    with pytest.raises(EdgeInferError) as e:
        plan("qwen3-0.6b", "rk3588-8g", **kw)
    assert e.value.exit_code == 2


def test_kv_scales_with_batch_and_dtype():
    a = plan("llama-3.1-8b", "atlas-800i-a2", ctx=1000, suggest=False).breakdown["kv_cache"]
    assert a == 128 * 1024 * 1000  # Llama-3-8B 128 KiB/token fp16 (vLLM #12330 sanity check)
    assert plan("llama-3.1-8b", "atlas-800i-a2", ctx=1000, batch=3, suggest=False).breakdown["kv_cache"] == 3 * a
    assert plan("llama-3.1-8b", "atlas-800i-a2", ctx=1000, kv_dtype="fp32",
                suggest=False).breakdown["kv_cache"] == 2 * a
    q8 = plan("llama-3.1-8b", "atlas-800i-a2", ctx=1000, kv_dtype="q8_0", suggest=False).breakdown["kv_cache"]
    assert q8 == pytest.approx(a * 34 / 64, rel=1e-6)  # q8_0: 34 B per 32 elements vs 2 B each


def test_llama_cpp_and_onnxruntime_decoders_hold_one_prefill_chunk_for_the_whole_batch():
    """llama.cpp reserves its compute buffer for n_ubatch tokens across every sequence: more slots add logits
    rows only, two arrays of them (runtimes.yaml logits_copies). The onnxruntime plugin's served decoders prefill
    one chunk a step across their sequences too (serve's scheduler), one array of logits rows."""
    one, four = (plan("qwen3-0.6b", "host", quant="fp16", ctx=1024, batch=b, runtime="llama.cpp", suggest=False)
                 for b in (1, 4))
    # by hand, Qwen3-0.6B (h 1024, 16 heads, 8 KV heads, head_dim 128, I 3072, V 151936), 512 tokens:
    # inputs 512·h·4 + ffn 512·(2h + 2I)·4 (larger than qkv + fused scores) + logits 2·B·V·4
    assert four.breakdown["activations"] == 512 * 1024 * 4 + 512 * (2048 + 6144) * 4 + 2 * 4 * 151936 * 4
    assert four.breakdown["activations"] - one.breakdown["activations"] == 2 * 3 * 151936 * 4
    ort = [plan("qwen3-0.6b", "host", quant="fp32", ctx=1024, batch=b, suggest=False) for b in (1, 4)]
    assert ort[1].breakdown["activations"] - ort[0].breakdown["activations"] == 3 * 151936 * 4


def test_onnxruntime_decoders_hold_one_row_of_attention_scores_and_encoders_all_of_them():
    """The onnxruntime plugin's decoders attend with its own op, one row of scores at a time, every scheme fp32
    included (runtimes.yaml decoder_fused_attention); encoders keep onnxruntime's, which holds them all."""
    def attention(model, quant, ctx):
        a = plan(model, "host", quant=quant, ctx=ctx, suggest=False).to_dict()["memory"]["details"]["activations"]
        return a["attention"], a["basis"]

    # by hand, Qwen3-0.6B (16 heads, 8 KV heads, head_dim 128) at ctx 4096, a prompt run 512 tokens at a time
    # (the plugin's PREFILL_CHUNK): qkv 512·(16 + 2·8)·128·4, scores 512·4096·2 fused (16·512·4096·4 materialised)
    qkv = 512 * 32 * 128 * 4
    for quant in ("fp32", "fp16", "w8a16", "w8a8", "w4a8"):
        assert attention("qwen3-0.6b", quant, 4096) == (qkv + 512 * 4096 * 2,
                                                         "prefill chunk of 512 tokens, fused attention")
    assert "attention scores materialised" in attention("all-minilm-l6-v2", "fp16", 128)[1]


def test_a_served_decoder_counts_its_tokenizer_in_the_http_process_and_llama_cpps_vocabulary_in_the_worker():
    """Qwen3-0.6B's 151,936-token vocabulary: the HTTP process keeps 424.9 bytes a token beyond the 3,072-token
    test tokenizer serve's own figure was measured with; llama.cpp's worker holds its own vocabulary, 321 bytes a
    token beyond the one its overhead was measured with (bench/results/tokenizer_memory.json); onnxruntime's none."""
    ll = plan("qwen3-0.6b", "host", quant="fp16", ctx=1024, batch=4, runtime="llama.cpp", suggest=False)
    served = ll.to_dict()["memory"]["served"]
    assert served["tokenizer_bytes"] == 63_252_313  # (151936 - 3072) × 424.9, by hand
    ort = plan("qwen3-0.6b", "host", quant="fp32", ctx=1024, batch=4, suggest=False)
    assert ort.to_dict()["memory"]["served"]["tokenizer_bytes"] == 63_252_313
    overhead = ll.to_dict()["memory"]["details"]["runtime"]
    assert ll.breakdown["runtime"] - int((overhead["overhead_mib"]) * 2**20) in (0, -1)
    assert "vocabulary 45.6 MiB" in overhead["source"]  # (151936 - 3072) × 321 bytes = 47,785,344
    assert "vocabulary" not in ort.to_dict()["memory"]["details"]["runtime"]["source"]


def test_the_served_plan_of_a_qwen_vocabulary_is_within_10_percent_of_the_measured_tree():
    """bench/serve_processes.py served a 2-layer random Qwen3 with Qwen's tokenizer (151,936 tokens) through the
    llamacpp backend, Q8_0, 16 slots × 256 (serve_processes-llamacpp-qwen-vocab-s57.json): the HTTP process's
    resident memory after the streams plus the worker's peak (the HTTP process's own peak is the tokenizer's
    parse, before the worker starts). The plan from the model's config.json alone is within 10% of it: it
    counts llama.cpp's own vocabulary and two batch × vocab logits arrays (runtimes.yaml)."""
    import tempfile

    from edgeinfer.planning.planner import plan as make_plan

    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 256,
           "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 64, "max_position_embeddings": 4096, "tie_word_embeddings": True}
    rows = json.loads((Path(__file__).parents[1] / "bench/results/serve_processes-llamacpp-qwen-vocab-s57.json")
                      .read_text())
    http = next(r for r in rows["after"] if "edgeinfer.cli serve" in r["cmdline"])
    worker = next(r for r in rows["after"] if r is not http)
    measured = http["VmRSS_bytes"] + worker["VmHWM_bytes"]
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "config.json").write_text(json.dumps(cfg))
        p = make_plan(d, "host", quant="gguf:Q8_0", ctx=256, batch=16, runtime="llama.cpp", suggest=False)
    assert 0.9 < p.to_dict()["memory"]["served"]["total_bytes"] / measured < 1.1


def test_tied_embedding_held_twice_on_rkllm():
    # Qwen2.5-0.5B: 494,032,768 params, embedding 151936 × 896 = 136,134,656 (hand arithmetic)
    p = plan("qwen2.5-0.5b", "rk3588-8g", quant="w8a8", ctx=192, runtime="rkllm", suggest=False)
    assert p.breakdown["weights"] == 494_032_768 + 136_134_656


def test_encoder_has_no_kv():
    p = plan("all-minilm-l6-v2", "host", quant="fp32", ctx=128, batch=8, suggest=False)
    assert p.breakdown["kv_cache"] == 0
    assert p.breakdown["weights"] == pytest.approx(22.7e6 * 4, rel=0.005)  # 22.7 M params × 4 B
    assert p.estimates.decode_tokens_per_s is None


def test_moe_fit_uses_total_speed_uses_active():
    p = plan("Qwen/Qwen3-30B-A3B", "atlas-300i-a2-910b4", quant="fp16", ctx=256, suggest=False)
    assert p.breakdown["weights"] == pytest.approx(30.53e9 * 2, rel=0.002)
    assert not p.fits  # 61 GB of fp16 weights on a 32 GiB card
    assert p.estimates.weight_bytes_per_token == pytest.approx(3.04e9 * 2, rel=0.01)


@pytest.mark.parametrize("model, board, quant, ctx, measured", [
    ("llama-3-8b", "rk3588-16g", "w8a8", 320, 3.79),          # rknn-llm README RKLLM 1.1.0
    ("tinyllama-1.1b", "rk3588-16g", "w8a8", 192, 24.43),     # rknn-llm benchmark.md v1.3.0
    ("phi-3-mini-4k-instruct", "rk3576-8g", "w4a16", 192, 6.58),
])
def test_decode_estimates_near_vendor_measurements(model, board, quant, ctx, measured):
    e = plan(model, board, quant=quant, ctx=ctx, runtime="rkllm", suggest=False).estimates  # RKLLM's figures
    assert e.decode_tokens_per_s == pytest.approx(measured, rel=0.15)
    assert e.runtime == "rkllm" and 0 < e.roofline_fraction <= 1
    assert e.decode_tokens_per_s <= e.roofline_tokens_per_s


def test_gguf_file_uses_exact_bytes(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("_readers", Path(__file__).with_name("test_model_readers.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    _write_gguf = mod._write_gguf

    p = tmp_path / "t.gguf"
    _write_gguf(p)
    pl = plan(str(p), "atlas-800i-a2", ctx=64, suggest=False)  # llama.cpp-cann takes F16 GGUF as stored
    assert pl.scheme.name == "fp16" and pl.runtime == "llama.cpp-cann"
    assert pl.breakdown["weights"] == 2560 + 8192 + 4352  # the file's tensor bytes, summed by hand
    assert pl.breakdown["kv_cache"] == 2 * 2 * 2 * 16 * 64 * 2  # 2 × layers × kv_heads × head_dim × ctx × 2 B


def test_plan_json_validates_against_schema():
    import jsonschema

    schema = json.loads((Path(__file__).parents[1] / "edgeinfer" / "schemas" / "plan.schema.json").read_text())
    for args in [("Qwen/Qwen3-8B", "rk3588-16g", "w8a8", 2048), ("qwen3-8b", "rk3588-8g", "w8a8", 2048),
                 ("all-minilm-l6-v2", "host", "fp32", 512), ("qwen3-4b", "core-ultra-258v", "w4a16", 2048),
                 ("qwen3-8b", "rk3588-8g", None, None), ("qwen3-8b", "rk3588-8g", "w8a8_g128", None)]:
        d = json.loads(plan(args[0], args[1], quant=args[2], ctx=args[3]).to_json())
        jsonschema.validate(d, schema)
        assert d["schema_version"] == "1.0"


def test_python_api_is_exposed():
    import edgeinfer

    p = edgeinfer.plan("qwen3-0.6b", "rk3588-4g", quant="w8a8", ctx=1024)
    assert p.fits


def test_a_quantized_onnxruntime_decoders_token_table_is_planned_in_the_plugins_int8_blocks(tmp_path):
    """The onnxruntime plugin looks a quantized decoder's tokens up in int8 with an fp32 scale per block of 128
    columns, 32 where 128 does not divide the width, and keeps the table fp32 where 32 does not either
    (embedding.py); a tied w8a16 head on its own matmuls is that table, held once, and so is the int4 classes'
    head, which they hold in int8 (MatMulW8); an untied int4 model's table keeps the int8 blocks, its head int8."""
    import json as _json

    def table(hidden: int, quant: str, tied: bool = True) -> tuple[float, int, int]:
        d = tmp_path / f"m{hidden}{tied}"
        d.mkdir(exist_ok=True)
        (d / "config.json").write_text(_json.dumps({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 4096, "hidden_size": hidden,
            "intermediate_size": 2 * hidden, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 1024, "tie_word_embeddings": tied}))
        w = plan(str(d), "host", quant=quant, ctx=256, suggest=False).details.weights
        return w.embedding_bits, w.embedding, w.lm_head

    # by hand: 4096 × hidden weights at 8 bits + 32 bits a block
    assert table(512, "w8a16") == (8.25, 4096 * 512 * 8.25 / 8, 0)
    assert table(576, "w8a16") == (9.0, 4096 * 576 * 9 / 8, 0)  # SmolLM2's width: blocks of 32
    assert table(576, "w4a8", tied=False) == (9.0, 4096 * 576 * 9 / 8, 4096 * 576 * 8.25 / 8)  # head: blocks of 128
    assert table(576, "w4a8") == (9.0, 4096 * 576 * 9 / 8, 0)  # the int8 head, repacked in blocks of 32, once
    assert table(512, "w4a16") == (8.25, 4096 * 512 * 8.25 / 8, 0)
    assert table(520, "w8a8")[:2] == (32.0, 4096 * 520 * 4)  # neither 128 nor 32 divides 520: fp32
    assert table(512, "fp16")[0] == 16  # float schemes keep their type


def test_a_served_decoder_takes_off_its_runtimes_measured_worker_saving():
    """A served decoder worker holds less than the bare decoder process its runtime's overhead was fitted on
    (no tokenizer, no manifest schema): onnxruntime and llama.cpp measured against their host rows
    (bench/serve_footprint.py, s67 runs), other runtimes the manifest schema's saving alone."""
    from edgeinfer.testing.serve import measured_runtime_served_worker_saving, measured_served_worker_saving

    def saving(runtime: str) -> int:
        p = plan("qwen3-0.6b", "host", quant="fp16", ctx=256, batch=4, runtime=runtime, suggest=False)
        return p.to_dict()["memory"]["served"]["worker_saving_bytes"]

    for runtime in ("onnxruntime", "llama.cpp"):
        measured = measured_runtime_served_worker_saving(runtime)
        assert 0.9 * measured <= saving(runtime) <= measured, runtime
    assert 0.9 * measured_served_worker_saving() <= saving("openvino-cpu") <= measured_served_worker_saving()
