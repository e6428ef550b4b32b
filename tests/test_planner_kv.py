"""The planner's KV cache for ``--board host`` equals, to the byte, what the decoder runtimes allocate.

``edgeinfer plan MODEL --board host --ctx N [--kv-dtype D] --json`` → ``memory.breakdown.kv_cache`` is
compared with ``Decoder.kv_cache_bytes`` of the transformers reference (fp32) and of the onnxruntime
decoder (the host board's backend; fp16, the plan's default, or fp32 with ``kv_dtype``), and both with
the bytes of the buffers actually allocated: the torch ``StaticCache`` tensors and the NumPy arrays
bound to onnxruntime.
"""

from __future__ import annotations

import json
import re

import pytest

import edgeinfer
from edgeinfer.cli import invoke
from edgeinfer.errors import InputError
from edgeinfer.testing import llm

CONTEXTS = (48, 300, 1024)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    # the Llama has untied embeddings and other head counts than the Qwen3: a second shape of KV cache
    return {"tiny-qwen3": llm.model_dir(),
            "random-llama": llm.random_llama(tmp_path_factory.mktemp("llm") / "llama", layers=3, hidden=96,
                                             heads=6, kv_heads=3)}


def _planned_kv(capsys, model, ctx: int, *opts: str) -> int:
    rc = invoke(["plan", str(model), "--board", "host", "--ctx", str(ctx), *opts, "--json"])
    out = capsys.readouterr().out
    assert rc == 0, out
    return json.loads(out)["memory"]["breakdown"]["kv_cache"]


def _allocated(decoder) -> int:
    """Bytes of the KV buffers the runtime holds, read from the buffers themselves."""
    if decoder.backend_name == "transformers":
        return sum(t.nbytes for c in decoder.caches for layer in c.layers for t in (layer.keys, layer.values))
    return sum(a.nbytes for slot in decoder._cache for kv in slot for a in kv)


@pytest.mark.parametrize("name", ["tiny-qwen3", "random-llama"])
def test_planned_kv_cache_equals_the_runtime_allocation(capsys, models, name):
    model = models[name]
    cfg = json.loads((model / "config.json").read_text())
    for ctx in CONTEXTS:
        planned = _planned_kv(capsys, model, ctx, "--kv-dtype", "fp32")
        # layers x (K, V) x KV heads x head_dim x positions x 4 bytes (fp32)
        assert planned == cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * ctx * 4
        for backend in ("transformers", "onnxruntime"):
            with edgeinfer.load(model, backend=backend, ctx=ctx, threads=1) as gen:
                assert gen.kv_cache_bytes == planned, (backend, ctx)
                assert _allocated(gen.decoder) == planned, (backend, ctx)
    if name != "tiny-qwen3":  # one fp16 export is enough (each costs a model-builder run on a cold cache)
        return
    ctx = CONTEXTS[-1]
    planned = _planned_kv(capsys, model, ctx)  # the host plan's own KV dtype: fp16, 2 bytes
    assert planned == cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * ctx * 2
    with edgeinfer.load(model, backend="onnxruntime", ctx=ctx, threads=1, kv_dtype="fp16") as gen:
        assert gen.kv_cache_bytes == _allocated(gen.decoder) == planned


def test_openvino_cpu_int8_blocks_are_planned_per_row_width(tmp_path) -> None:
    """The CPU build halves its blocks of 256 on rows 256 does not divide (SmolLM2-135M's 576-wide rows take
    blocks of 64, its 1536-wide down projection 256): each matrix is planned at its own block, 8 + 24 / block bits
    a weight (fp16 scale + u8 zero point per block), the embedding at the hidden rows' block."""
    import json

    from edgeinfer.planning.planner import plan

    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
           "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
           "head_dim": 64, "vocab_size": 49152, "tie_word_embeddings": True, "max_position_embeddings": 8192,
           "rms_norm_eps": 1e-5}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    p = plan(str(tmp_path), "core-ultra-155h", quant="w8a16", ctx=256, runtime="openvino-cpu")
    d = p.details.weights
    wide, down = 576 * (576 + 2 * 192 + 576 + 2 * 1536) * 30, 1536 * 576 * 30  # q, k, v, o, gate, up | down
    norms = 30 * 2 * 576 + 576
    bits_64, bits_256 = 8 + 24 / 64, 8 + 24 / 256
    body_bits = (wide * bits_64 + down * bits_256) / (wide + down)
    assert d.body == int((wide + down + norms) * body_bits / 8)
    assert d.embedding == int(49152 * 576 * bits_64 / 8) and d.embedding_bits == bits_64
    assert "64 on rows 256 does not divide" in d.basis


def test_a_kv_dtype_the_runtime_does_not_build_is_refused_in_one_line(capsys):
    """runtimes.yaml's ``kv_dtypes``: onnxruntime and llama.cpp build fp16, q8_0 and fp32; q4_0 (a dtype the
    planner knows) is refused on both, as deploy would refuse it; a runtime that lists none takes any."""
    for runtime in ("onnxruntime", "llama.cpp"):
        rc = invoke(["plan", "qwen3-0.6b", "--board", "host", "--runtime", runtime, "--kv-dtype", "q4_0"])
        err = capsys.readouterr().err
        assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert f"runtime {runtime} keeps its KV cache in fp16, q8_0, fp32, not 'q4_0'" in err
    assert invoke(["plan", "qwen3-0.6b", "--board", "rk3588-8g", "--kv-dtype", "q4_0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["options"]["kv_dtype"] == "q4_0"


def _plan_json(capsys, *args: str) -> dict:
    rc = invoke(["plan", *args, "--json"])
    out = capsys.readouterr().out
    assert rc in (0, 1), out
    return json.loads(out)


def test_plan_names_the_smaller_kv_cache_where_the_cache_decides():
    """Qwen3-8B w4a8 at 32k positions on host: the fp16 KV cache is 4.5 GiB, 4 × 36 layers × 8 KV heads × 128 ×
    32768 × 2 bytes; the plan names q8_0 (34 bytes a block of 32 values), and that plan's cache is 17/32 of it.
    At 4k positions the cache is a small share of a plan that fits: nothing named. A runtime without kv_dtypes
    (RKLLM) names nothing."""
    from edgeinfer.planning.planner import plan

    p = plan("qwen3-8b", "host", quant="w4a8", ctx=32768)
    fp16_kv = 2 * 36 * 8 * 128 * 32768 * 2
    assert p.kv_dtype == "fp16" and p.breakdown["kv_cache"] == fp16_kv
    k = p.suggestions.kv_cache
    assert k["kv_dtype"] == "q8_0" and k["deploy_option"] == "kv_dtype=q8_0"
    assert k["kv_cache_bytes"] == fp16_kv * 17 // 32
    assert k["total_bytes"] == p.total_bytes - fp16_kv + k["kv_cache_bytes"]
    assert plan("qwen3-8b", "host", quant="w4a8", ctx=4096).suggestions.kv_cache is None
    assert plan("qwen3-8b", "rk3588-16g", ctx=32768).suggestions.kv_cache is None


def test_the_plan_text_says_what_the_smaller_kv_cache_saves(capsys):
    assert invoke(["plan", "qwen3-8b", "--board", "host", "--quant", "w4a8", "--ctx", "32768"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("smaller KV cache: --kv-dtype q8_0 (deploy --option kv_dtype=q8_0) → KV cache 2.39 GiB (this plan "
            "4.50 GiB fp16)") in out
    assert re.search(r"smaller KV cache: .*: fits, decode ≈ [\d.]+ tok/s \(this plan [\d.]+\)", out)


def test_the_decode_estimate_reads_a_q8_0_cache_at_the_pace_each_runtime_was_measured_at():
    """runtimes.yaml ``kv_read_bytes``: the decode estimate reads a q8_0 cache as the fp16-equivalent bytes a value
    measured (bench/results/kv_q8.json, kv_q8-llamacpp.json): onnxruntime's own op 1.40 (faster than
    fp16's 2), llama.cpp's 5.41 (slower); the memory is the q8_0 bytes on both."""
    from edgeinfer.planning.planner import plan

    def estimates(runtime, kv):
        p = plan("qwen3-8b", "host", quant="w4a8" if runtime == "onnxruntime" else "gguf:Q4_K_M", ctx=32768,
                 runtime=runtime, kv_dtype=kv, suggest=False)
        return p.breakdown["kv_cache"], p.estimates

    for runtime, read in (("onnxruntime", 1.40), ("llama.cpp", 5.41)):
        (f16_kv, f16), (q8_kv, q8) = estimates(runtime, "fp16"), estimates(runtime, "q8_0")
        assert q8_kv * 32 == f16_kv * 17 and f16.kv_bytes_per_token_at_ctx == f16_kv
        assert abs(q8.kv_bytes_per_token_at_ctx - f16_kv * read / 2) <= 1
        faster = q8.decode_tokens_per_s > f16.decode_tokens_per_s
        assert faster == (runtime == "onnxruntime")


def test_openvinos_u8_cache_is_planned_at_the_bytes_genai_reports():
    """OpenVINO's CPU cache in u8 (runtimes.yaml ``kv_dtypes`` of openvino-cpu): a position of a KV head takes
    2 x head + head/4 + 8 bytes, what GenAI reports it holding (152 at head size 64, 296 at 128:
    bench/results/kv_openvino.json). Qwen3-8B (36 layers, 8 KV heads of 128) at 32k positions on the Core Ultra's
    CPU: 36 x 8 x 296 bytes a position, against fp16's 36 x 8 x 512; with two sequences the plan names u8 as the
    smaller cache. q8_0, onnxruntime's and llama.cpp's, is not OpenVINO's."""
    from edgeinfer.planning.planner import plan

    def kv(dtype):
        return plan("qwen3-8b", "core-ultra-155h", runtime="openvino-cpu", quant="w8a16", ctx=32768, kv_dtype=dtype,
                    suggest=False).breakdown["kv_cache"]

    assert kv("u8") == 36 * 8 * 296 * 32768 and kv("fp16") == 36 * 8 * 512 * 32768
    p = plan("qwen3-8b", "core-ultra-155h", runtime="openvino-cpu", quant="w8a16", ctx=32768, batch=2)
    assert p.kv_dtype == "fp16" and p.suggestions.kv_cache["kv_dtype"] == "u8"
    assert p.suggestions.kv_cache["deploy_option"] == "kv_dtype=u8"
    with pytest.raises(InputError, match="runtime openvino-cpu keeps its KV cache in fp16, u8, fp32, not 'q8_0'"):
        plan("qwen3-8b", "core-ultra-155h", runtime="openvino-cpu", quant="w8a16", kv_dtype="q8_0")


def test_the_intel_npu_and_gpu_runtimes_keep_fp16_and_deploy_refuses_another_in_one_line(capsys):
    """GenAI's NPU pipeline keeps its cache in fp16 and the plugin loads GPU decoders with f16 (runtimes.yaml
    ``kv_dtypes``): u8 for the Core Ultra's default runtime (its NPU) is refused before anything is built, rather
    than recorded in a bundle that runs on this machine's CPU and would be refused on the NPU."""
    model = str(llm.model_dir())
    rc = invoke(["deploy", model, "--board", "core-ultra-155h", "--option", "kv_dtype=u8", "--dry-run"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert ("runtime openvino-npu keeps its KV cache in fp16, not 'u8' (use --kv-dtype fp16; deploy: --option "
            "kv_dtype=fp16)") in err
    rc = invoke(["plan", model, "--board", "core-ultra-258v", "--runtime", "openvino-gpu", "--kv-dtype", "u8"])
    assert rc == 2 and "runtime openvino-gpu keeps its KV cache in fp16, not 'u8'" in capsys.readouterr().err
