"""OpenVINO decoders on the CPU: GenAI's pipelines and the stepped stateful IR against the
transformers fp32 reference, the weight formats, the NPU pipeline's logic on the CPU, and many
sequences through the ContinuousBatchingPipeline.

Absent hardware: no NPU here. Tests named ``npu_pipeline_on_cpu`` run the NPU's static LLM
pipeline (NPUW) with ``NPUW_DEVICES=CPU`` — the NPU plugin's code, the CPU's arithmetic.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import yaml

import edgeinfer
from edgeinfer.contract import NativeDecoder, StepDecoder
from edgeinfer.contract.generation import GenerationOptions
from edgeinfer.errors import InputError
from edgeinfer.run.generation.golden import check, summary_line
from edgeinfer.testing import DecoderConformance
from edgeinfer.testing.decoder_conformance import PROMPTS, reference_greedy
from edgeinfer.testing.llm import model_dir
from edgeinfer.testing.mapped import mapped_rss

pytest.importorskip("openvino_genai")
pytest.importorskip("optimum.intel")

NEW = 32
CALIBRATION = ["The licence grants permission to use, copy and modify the software.",
               "Permission is hereby granted, free of charge, to any person obtaining a copy.",
               "def main():\n    return 0\n"]


@pytest.fixture(scope="session")
def reference() -> dict[str, list[int]]:
    from edgeinfer.run.generation.text import TextCodec

    codec = TextCodec(model_dir())
    return {p: reference_greedy(model_dir(), codec.encode(p), NEW) for p in PROMPTS}


class TestOpenVinoDecoders(DecoderConformance):
    backend_name = "openvino"
    device = "CPU"

    @pytest.fixture(scope="class")
    @classmethod
    def expected(cls, reference: dict[str, list[int]]) -> dict[str, list[int]]:
        return reference  # the kit's own reference (transformers generate, fp32), computed once per session


class TestOpenVinoSteppedDecoders(TestOpenVinoDecoders):
    load_options = {"loop": "steps"}


@pytest.fixture(scope="session")
def ov_backend():
    return edgeinfer.backend("openvino")


@pytest.fixture(scope="session")
def irs(tmp_path_factory, ov_backend) -> dict[str, tuple[Path, dict]]:
    """Every decoder format of the test model, converted once per session (one cached fp32 export)."""
    root = tmp_path_factory.mktemp("ov-decoders")
    out = {}
    for name, scheme, target, calib in (("fp32", "fp32", "cpu", None), ("fp16", "fp16", "npu", None),
                                        ("w8a16", "w8a16", "cpu", None), ("w4a16", "w4a16", "cpu", None),
                                        ("w4a16_npu", "w4a16", "npu", None),
                                        ("w4a16_awq", "w4a16", "cpu", CALIBRATION)):
        facts = ov_backend.convert_decoder(model_dir(), scheme, 128, root / name, calibration=calib, target=target)
        out[name] = (root / name, facts)
    return out


def _tokens(gen, prompt: str) -> list[int]:
    return gen.generate(prompt, max_new_tokens=NEW).token_ids


@pytest.mark.parametrize("name", ["fp32", "fp16"])
def test_lossless_ir_greedy_tokens_equal_transformers_fp32(irs, reference, name) -> None:
    with edgeinfer.load(irs[name][0], backend="openvino", device="CPU", ctx=128) as gen:
        for p in PROMPTS:
            assert _tokens(gen, p) == reference[p], p
        m = gen.generate(PROMPTS[0], max_new_tokens=NEW).metrics
    assert m.ttft_ms > 0 and m.decode_tokens_per_s > 0 and m.tpot_ms_p50 is not None  # GenAI's own figures


def test_an_fp16_ir_keeps_its_kv_cache_in_fp16_on_the_cpu_and_an_fp32_ir_in_fp32(irs) -> None:
    """The plan's KV dtype for an fp16 or w8a16 IR is fp16 (the bundle's kv_dtype); the CPU plugin's own default
    is f32, which fp32 and w4a16 keep. kv_precision given still wins."""
    be = edgeinfer.backend("openvino")
    loaded = {}
    for name, options in (("fp16", {}), ("fp32", {}), ("fp16", {"kv_precision": "f32"}), ("w8a16", {}),
                          ("w4a16", {})):
        d = be.load_decoder(irs[name][0], device="CPU", context=64, slots=2, **options)
        try:
            loaded[(name, bool(options))] = (d.kv_dtype, d.kv_cache_bytes)
        finally:
            d.close()
    assert loaded[("fp16", False)][0] == "fp16" and loaded[("fp32", False)][0] == "fp32"
    assert loaded[("w8a16", False)] == loaded[("fp16", False)] and loaded[("w4a16", False)] == loaded[("fp32", False)]
    assert loaded[("fp16", True)][0] == "fp32"
    assert loaded[("fp16", False)][1] * 2 == loaded[("fp16", True)][1] == loaded[("fp32", False)][1]


def test_the_plans_kv_dtype_is_the_cache_a_cpu_build_allocates(irs) -> None:
    """``kv_dtype`` (the plan's, which deploy records and every load passes) sets the cache of an IR built for the
    CPU: u8 takes 2 x 64 + 64/4 + 8 = 152 bytes a position of a KV head on the test model (4 layers, 2 KV heads of
    64), the size GenAI reports (bench/results/kv_openvino.json), against f16's 256. ``kv_precision`` still wins.
    An IR built for the NPU keeps the CPU's own default where it runs on the CPU: its plan was the NPU's."""
    be = edgeinfer.backend("openvino")

    def cache(name: str, **options) -> tuple[str, int]:
        d = be.load_decoder(irs[name][0], device="CPU", context=64, slots=2, **options)
        try:
            return d.kv_dtype, d.kv_cache_bytes
        finally:
            d.close()

    positions = 64 * 2  # context x slots, rounded to GenAI's blocks of 32 on the CPU
    assert cache("w8a16", kv_dtype="u8") == ("u8", 4 * 2 * 152 * positions)
    assert cache("w8a16", kv_dtype="fp16") == ("fp16", 4 * 2 * 256 * positions)
    assert cache("w8a16", kv_dtype="u8", kv_precision="f32")[0] == "fp32"
    assert cache("w4a16_npu", kv_dtype="fp16")[0] == cache("w4a16_npu")[0] == "fp32"
    with pytest.raises(InputError, match="kv_dtype must be one of fp32, fp16, bf16, u8, got 'q8_0'"):
        cache("w8a16", kv_dtype="q8_0")
    with pytest.raises(InputError, match="the NPU pipeline keeps its KV cache in fp16, not 'u8'"):
        be.load_decoder(irs["fp16"][0], device="NPU", context=64, npu_on_cpu=True, kv_dtype="u8")


def test_deploy_keeps_the_plans_u8_cache_and_every_load_allocates_it(tiny_qwen3_openvino_cpu_bundle, tmp_path):
    """``deploy --runtime openvino-cpu --option kv_dtype=u8`` of the bundle the fixture deployed with f16: the same
    conversion (the cache is chosen at load), golden-checked on the u8 cache; the manifest records u8 and a load of
    the bundle allocates it, at the plan's bytes (152 a position of a KV head here, 4 layers x 2 KV heads)."""
    from edgeinfer.deploy.decoder import deploy_decoder

    fixture = json.loads((tiny_qwen3_openvino_cpu_bundle / "manifest.json").read_text())
    out = tmp_path / "u8"
    deploy_decoder(model_dir(), "host", out, quant="w8a16", ctx=fixture["decoder"]["context"], runtime="openvino-cpu",
                   options={"kv_dtype": "u8"})
    manifest = json.loads((out / "manifest.json").read_text())
    assert fixture["decoder"]["kv_dtype"] == "fp16" and manifest["decoder"]["kv_dtype"] == "u8"
    assert manifest["plan"]["memory"]["details"]["kv_cache"]["bytes_per_element"] == 152 / 128
    with edgeinfer.load(out) as gen:
        assert gen.decoder.kv_dtype == "u8"
        assert gen.decoder.kv_cache_bytes == 4 * 2 * 152 * gen.decoder.context * gen.decoder.slots


def test_fp16_ir_npu_pipeline_on_cpu_equals_transformers_fp32(irs, reference) -> None:
    with pytest.warns(RuntimeWarning, match="asked for NPU"):  # the fallback is detected and said
        gen = edgeinfer.load(irs["fp16"][0], backend="openvino", device="NPU", ctx=128, npu_on_cpu=True)
    with gen:
        assert gen.decoder.execution_devices == ["CPU"]
        for p in PROMPTS:
            assert _tokens(gen, p) == reference[p], p


def test_int4_symmetric_ir_npu_pipeline_on_cpu(irs) -> None:
    """The form a real NPU needs (symmetric INT4) passes the NPU pipeline run on the CPU, with the
    tokens of the same IR on the CPU plugin."""
    path, facts = irs["w4a16_npu"]
    assert facts["weight_compression"]["mode"] == "int4_sym"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        npu = edgeinfer.load(path, backend="openvino", device="NPU", ctx=128, npu_on_cpu=True)
    with npu, edgeinfer.load(path, backend="openvino", device="CPU", ctx=128) as cpu:
        for p in PROMPTS[:2]:
            assert _tokens(npu, p)[:8] == _tokens(cpu, p)[:8], p


class _Recorded:
    """The transformers reference generator, each (prompt, options) generated once per session."""

    def __init__(self, gen):
        self.gen, self.seen = gen, {}

    def generate(self, prompt, options, **kw):
        key = (prompt, repr(options), repr(sorted(kw.items())))
        if key not in self.seen:
            self.seen[key] = self.gen.generate(prompt, options, **kw)
        return self.seen[key]


@pytest.fixture(scope="session")
def golden_reference():
    with edgeinfer.load(model_dir(), ctx=128) as ref:
        yield _Recorded(ref)


@pytest.mark.parametrize("name", ["w8a16", "w4a16", "w4a16_awq"])
def test_weight_compressed_irs_pass_the_decoder_golden_check(irs, golden_reference, name) -> None:
    scheme = irs[name][1]["scheme"]
    with edgeinfer.load(irs[name][0], backend="openvino", device="CPU", ctx=128, loop="steps") as got:
        report = check(got, golden_reference, list(PROMPTS), NEW, scheme)
    print(f"{name}: {summary_line(report)}")  # near-ties are reported in the line (pytest -s)
    for row in report["rows"]:
        if row["first_divergence"] is not None:
            print(f"  {row['prompt']!r}: first divergence at {row['first_divergence']}, reference margin "
                  f"{row['reference_margin_at_divergence']:.3f}, near-tie: {row['near_tie']}")
    assert report["passed"], summary_line(report)


def test_native_and_stepped_loops_agree_on_a_compressed_ir(irs) -> None:
    path = irs["w4a16"][0]
    with edgeinfer.load(path, backend="openvino", device="CPU", ctx=128) as native, \
            edgeinfer.load(path, backend="openvino", device="CPU", ctx=128, loop="steps") as steps:
        assert isinstance(native.decoder, NativeDecoder) and isinstance(steps.decoder, StepDecoder)
        for p in PROMPTS:
            assert _tokens(native, p) == _tokens(steps, p), p


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads /proc/self/smaps (Linux)")
def test_cpu_decoder_keeps_no_mapped_copy_of_the_ir_weights(irs) -> None:
    """The CPU plugin repacks the weights at the first inference; the mapped IR pages were a second copy in
    RSS (edgeinfer.contract.pages.drop_mapped)."""
    path = irs["fp32"][0]
    weights = (path / "openvino_model.bin").stat().st_size
    with edgeinfer.load(path, backend="openvino", device="CPU", ctx=128) as llm:
        _tokens(llm, PROMPTS[0])
        # the plugin reads some constants in place (the tied embedding's Gather: ~20% of this model's bytes),
        # so those pages come back; before the drop all of the .bin stayed resident
        assert mapped_rss(path, ".bin") < weights // 2


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads /proc/self/smaps (Linux)")
def test_a_prompt_does_not_bring_the_ir_weights_back(irs) -> None:
    """An fp16 IR on the CPU: the plugin packs its weights once for single-token steps and again for steps of
    7 to 64 tokens, reading the whole mapped .bin each time. Both happen at load now (GenAIDecoder.
    _pack_weights), with the pages dropped as they are read; before, the first long prompt of a served
    decoder made all of the .bin resident again."""
    path = irs["fp16"][0]
    weights = (path / "openvino_model.bin").stat().st_size
    with edgeinfer.load(path, backend="openvino", device="CPU", ctx=128, slots=2) as llm:
        assert mapped_rss(path, ".bin") < weights // 2
        # 23 tokens: steps of 7 to 64 tokens take the multi-row kernels (84 and 119 tokens did not, here)
        llm.generate(" ".join(["river"] * 8), max_new_tokens=2)
        assert mapped_rss(path, ".bin") < weights // 2


def test_conversion_facts_say_what_ran(irs) -> None:
    npu, cpu, awq = (irs[n][1]["weight_compression"] for n in ("w4a16_npu", "w4a16", "w4a16_awq"))
    assert (npu["mode"], npu["group_size"]) == ("int4_sym", 128)  # the NPU needs symmetric INT4
    assert (cpu["mode"], cpu["group_size"]) == ("int4_asym", 128)
    assert cpu["awq"] is False and cpu["scale_estimation"] is False and not cpu["data_aware"]
    assert awq["awq"] is True and awq["scale_estimation"] is True and awq["calibration_samples"] == 3
    w8 = irs["w8a16"][1]["weight_compression"]
    # the CPU's int8 in blocks of 256 (NNCF's INT8 is per channel only): every layer and the tied table, whose
    # rows (256 and 768 weights) 256 divides
    assert (w8["method"], w8["mode"], w8["group_size"], w8["channel_wise"], w8["smaller_blocks"]) == \
        ("int8 blocks (edgeinfer)", "int8_asym", 256, 0, 0)
    assert w8["weights"] == 4 * 7 + 1
    assert irs["fp16"][1]["target"] == "npu" and irs["fp32"][1]["context"] == 128


def test_many_sequences_through_continuous_batching(ov_backend, reference) -> None:
    from edgeinfer.run.generation.text import TextCodec

    codec = TextCodec(model_dir())
    d = ov_backend.load_decoder(model_dir(), device="CPU", context=128, slots=4)
    try:
        assert d.slots == 4 and d.kv_cache_bytes == 4 * 2 * 2 * 64 * 128 * 4 * 4  # 4 slots × 128 positions, f32
        got: dict[int, list[int]] = {0: [], 1: [], 2: []}

        def on_token(i: int, tok: int) -> bool:
            got[i].append(tok)
            return not (i == 2 and len(got[2]) >= 5)  # request 2 is stopped after 5 tokens

        opts = GenerationOptions(max_new_tokens=NEW)
        metrics = d.generate_native_batch([(codec.encode(p), opts) for p in PROMPTS], on_token)
    finally:
        d.close()
    assert got[0] == reference[PROMPTS[0]] and got[1] == reference[PROMPTS[1]]
    assert got[2] == reference[PROMPTS[2]][:5]
    assert len(metrics) == 3 and all(m["ttft_ms"] > 0 for m in metrics)


def test_npu_static_pipeline_config_comes_from_the_context() -> None:
    from edgeinfer_openvino.decoder_config import npu_properties

    assert npu_properties({}, 1024) == {"MAX_PROMPT_LEN": 896, "MIN_RESPONSE_LEN": 128}
    assert npu_properties({}, 128) == {"MAX_PROMPT_LEN": 96, "MIN_RESPONSE_LEN": 32}
    with pytest.raises(InputError, match="exceed the context"):
        npu_properties({"max_prompt_len": 120, "min_response_len": 16}, 128)


def test_prompt_longer_than_the_npu_prompt_length_is_an_input_error(irs) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        gen = edgeinfer.load(irs["fp16"][0], backend="openvino", device="NPU", ctx=64, npu_on_cpu=True)
    with gen, pytest.raises(InputError, match="MAX_PROMPT_LEN"):
        gen.generate_ids(list(range(3, 3 + 56)), GenerationOptions(max_new_tokens=2))  # 56 > 48 = 64 - 64 // 4


@pytest.mark.parametrize("options, match", [
    ({"npu_on_cpu": True, "npu_config": {"NPUW_LLM_OPTIMIZE_V_TENSOR": "NO"}}, "unknown NPU property"),
    ({"npu_on_cpu": True, "max_prompt_length": 64}, "unknown option 'max_prompt_length'"),
    ({"npu_on_cpu": True, "threads": 2}, "does not apply to the NPU"),
])
def test_option_typos_on_the_npu_path_are_input_errors(irs, options, match) -> None:
    with pytest.raises(InputError, match=match):
        edgeinfer.backend("openvino").load_decoder(irs["fp16"][0], device="NPU", context=64, **options)


def test_cpu_option_typos_are_input_errors(irs) -> None:
    be = edgeinfer.backend("openvino")
    with pytest.raises(InputError, match="kv_precision"):
        be.load_decoder(irs["fp32"][0], device="CPU", context=64, kv_precision="int3")
    with pytest.raises(InputError, match="is for NPU decoders"):
        be.load_decoder(irs["fp32"][0], device="CPU", context=64, min_response_len=8)
    with pytest.raises(InputError, match="not an OpenVINO decoder format"):
        be.convert_decoder(model_dir(), "w3a16", 64, irs["fp32"][0].parent / "bad")


def test_asymmetric_int4_is_refused_for_the_npu(irs) -> None:
    with pytest.raises(InputError, match="symmetric INT4"):
        edgeinfer.backend("openvino").load_decoder(irs["w4a16"][0], device="NPU", context=64, npu_on_cpu=True)


def test_generation_options_become_genai_generation_config() -> None:
    import openvino_genai as og
    from edgeinfer_openvino.decoder import generation_config

    opts = GenerationOptions(max_new_tokens=7, temperature=0.7, top_k=11, top_p=0.9, repetition_penalty=1.3,
                             seed=42, eos_token_ids=(2, 0))
    g = generation_config(og.GenerationConfig(), opts)
    assert (g.max_new_tokens, g.do_sample, g.top_k, g.rng_seed) == (7, True, 11, 42)
    assert g.temperature == pytest.approx(0.7) and g.top_p == pytest.approx(0.9)
    assert g.repetition_penalty == pytest.approx(1.3) and g.stop_token_ids == {0, 2} and not g.ignore_eos
    greedy = generation_config(og.GenerationConfig(), GenerationOptions(max_new_tokens=3, ignore_eos=True))
    assert not greedy.do_sample and greedy.ignore_eos


def test_the_openvino_gpu_board_runtime_builds_the_gpu_formats() -> None:
    """A Core Ultra board's openvino-gpu runtime: deploy passes target='npu' (the board's) and runtime=
    'openvino-gpu'; the export is the GPU's (asymmetric INT4, group 128), not the NPU's symmetric one."""
    from edgeinfer_openvino import decoder_export
    from edgeinfer_openvino.backend import OpenVinoBackend

    assert OpenVinoBackend.cannot_build("decoder", "openvino-gpu") is None
    assert "openvino-gpu" in OpenVinoBackend.cannot_build("encoder", "openvino-gpu")
    target, group, _ = decoder_export.check_convert("w4a16", {"target": "npu", "runtime": "openvino-gpu"})
    assert (target, group) == ("gpu", None)
    assert decoder_export.check_convert("w4a16", {"target": "npu"})[0] == "npu"
    cfg = decoder_export.weight_config("w4a16", target, group, 7 * 10**9, None, None, model_dir())
    assert (cfg.bits, cfg.sym, cfg.group_size) == (4, False, 128)
    with pytest.raises(InputError, match="runtime must be one of openvino-gpu"):
        decoder_export.check_convert("w4a16", {"target": "npu", "runtime": "rkllm"})


def test_a_w8a16_block_size_is_taken_for_the_cpu_and_refused_for_the_npu_and_gpu() -> None:
    """NNCF's INT8 (the NPU's and GPU's w8a16) is per channel only; the CPU's blocks take any size."""
    from edgeinfer_openvino import decoder_export

    assert decoder_export.check_convert("w8a16", {"target": "cpu", "group_size": 32})[:2] == ("cpu", 32)
    assert decoder_export.check_convert("w8a16", {"target": "npu", "group_size": -1})[:2] == ("npu", -1)
    for target in ("npu", "gpu"):
        with pytest.raises(InputError, match=f"w8a16 for target {target} is channel-wise"):
            decoder_export.check_convert("w8a16", {"target": target, "group_size": 128})


def test_a_cpu_build_loads_on_the_cpu_by_default_and_is_refused_for_the_npu(irs, monkeypatch) -> None:
    """w8a16 in int8 blocks (target cpu) ran only on the CPU: asking for the NPU is refused in one line, and where
    an NPU is listed (a stand-in name added to OpenVINO's device list) the default device is still the CPU."""
    from edgeinfer_openvino import decoder as decoder_module

    be = edgeinfer.backend("openvino")
    with pytest.raises(InputError, match="built for the CPU"):
        be.load_decoder(irs["w8a16"][0], device="NPU", context=64, npu_on_cpu=True)
    real = decoder_module.select_device
    asked: list[str | None] = []

    def with_npu_standin(requested, available):
        asked.append(requested)
        return real(requested, [*available, "NPU"])

    monkeypatch.setattr(decoder_module, "select_device", with_npu_standin)
    assert real(None, ["CPU", "NPU"]) == "NPU"  # what a plain default would have picked
    d = be.load_decoder(irs["w8a16"][0], device=None, context=64)
    try:
        assert asked == ["CPU"] and d.execution_devices == ["CPU"]
    finally:
        d.close()


def test_deploy_for_a_core_ultra_cpu_writes_int8_blocks_and_says_the_plan_is_the_npus(tmp_path) -> None:
    """`deploy --board core-ultra-155h -q w8a16 --option target=cpu`: the CPU's int8 blocks, golden-checked; the
    plan stays the board runtime's (openvino-npu), and deploy says so and names the board's runtimes."""
    from edgeinfer_openvino import decoder_export

    from edgeinfer.deploy.decoder import deploy_decoder

    res = deploy_decoder(model_dir(), "core-ultra-155h", tmp_path / "b", quant="w8a16", ctx=128,
                         options={"target": "cpu"})
    facts = decoder_export.read_facts(tmp_path / "b" / "decoder")
    assert facts["target"] == "cpu" and facts["weight_compression"]["method"] == "int8 blocks (edgeinfer)"
    assert res.golden["passed"] and res.manifest.target == "cpu"
    assert any("built for target cpu" in w and "openvino-npu" in w and "--runtime openvino-npu / openvino-gpu / "
               "openvino-cpu" in w for w in res.warnings), res.warnings


def test_deploy_for_the_openvino_cpu_runtime_plans_and_builds_the_cpus_int8_blocks(tmp_path) -> None:
    """`deploy --board core-ultra-155h --runtime openvino-cpu -q w8a16`: the same CPU build, now planned as the
    CPU's runtime (its fitted overhead and its per-layer term, the blocks' 8.09 bits a weight, no speed estimate)
    and without a warning."""
    from edgeinfer_openvino import decoder_export

    from edgeinfer.deploy.decoder import deploy_decoder

    res = deploy_decoder(model_dir(), "core-ultra-155h", tmp_path / "b", quant="w8a16", ctx=128,
                         runtime="openvino-cpu")
    facts = decoder_export.read_facts(tmp_path / "b" / "decoder")
    assert facts["target"] == "cpu" and facts["weight_compression"]["method"] == "int8 blocks (edgeinfer)"
    assert res.golden["passed"] and res.manifest.target == "cpu"
    plan = res.manifest.plan
    weights = plan["memory"]["breakdown"]["weights"]
    constants = Path(edgeinfer.__file__).parent / "data" / "speed_constants.json"
    ov = json.loads(constants.read_text())["overhead_mib"]["openvino-cpu"]  # bench/fit_speed.py's, on the host rows
    assert plan["build"]["runtime"] == "openvino-cpu"
    per_layer = yaml.safe_load((constants.parent / "runtimes.yaml").read_text())["openvino-cpu"]["layer_overhead_mib"]
    layers = json.loads((model_dir() / "config.json").read_text())["num_hidden_layers"]
    planned = plan["memory"]["breakdown"]["runtime"]
    fitted = ov["value"] * 2**20 + ov.get("weights_fraction", 0) * weights
    assert planned == pytest.approx(fitted + per_layer["value"] * 2**20 * layers, abs=2)
    assert plan["memory"]["details"]["runtime"]["layers_mib"] == pytest.approx(per_layer["value"] * layers)
    assert "8.09375 bits per weight" in plan["memory"]["details"]["weights"]["basis"]  # 8 + 24 / 256
    assert plan["estimates"]["decode_tokens_per_s"] is None  # no Core Ultra CPU measured
    assert not any("built for target" in w for w in res.warnings), res.warnings


def test_the_host_builds_the_openvino_cpu_runtime_through_this_plugin(tiny_qwen3_openvino_cpu_bundle) -> None:
    """`deploy --board host --runtime openvino-cpu`: the host's backend is onnxruntime, and this plugin builds the
    runtime (``Decoders.builds``) with the CPU's formats: the same int8 blocks, golden-checked, planned as
    openvino-cpu with a decode estimate from the host's measured rows."""
    from edgeinfer_openvino import decoder_export

    from edgeinfer.model.bundle import Bundle

    b = tiny_qwen3_openvino_cpu_bundle
    facts = decoder_export.read_facts(b / "decoder")
    assert facts["target"] == "cpu" and facts["weight_compression"]["method"] == "int8 blocks (edgeinfer)"
    manifest = Bundle.open(b).manifest
    assert manifest.decoder["golden"]["passed"] and manifest.decoder["runtime"] == "openvino-cpu"
    assert manifest.backend == "openvino"
    assert manifest.plan["build"]["runtime"] == "openvino-cpu" and manifest.plan["build"]["backend"] == "openvino"
    assert manifest.plan["estimates"]["decode_tokens_per_s"] > 0


@pytest.mark.parametrize("slots", [1, 4])
def test_a_cpu_decoder_leaves_the_tokenizer_irs_unopened(irs, ov_backend, slots) -> None:
    """GenAI compiles a bundle's tokenizer and detokenizer IRs whenever they are there; edgeinfer feeds and reads
    token ids, so the CPU pipelines (LLMPipeline, and the ContinuousBatchingPipeline for several slots) open the IR
    through a view without them: no page of them is mapped, and the IR's own weights are."""
    from edgeinfer_openvino.decoder_export import TOKENIZER_IRS

    ir = irs["w8a16"][0]
    assert all((ir / name).is_file() for name in TOKENIZER_IRS)  # the bundle keeps them
    d = ov_backend.load_decoder(ir, device="CPU", context=64, slots=slots)
    try:
        mapped = {Path(line.split()[-1]) for line in Path("/proc/self/maps").read_text().splitlines()
                  if line.split()[-1].startswith("/")}
        assert ir.resolve() / "openvino_model.bin" in mapped
        assert not {ir.resolve() / name for name in TOKENIZER_IRS} & mapped
        assert d.generate_native([5, 6, 7], GenerationOptions(max_new_tokens=3), lambda t: True)["generated_tokens"]
    finally:
        d.close()


def test_the_view_without_tokenizer_irs_links_everything_else(tmp_path) -> None:
    from edgeinfer_openvino.decoder_export import TOKENIZER_IRS, without_tokenizer_irs

    for name in ("openvino_model.xml", "openvino_model.bin", "config.json", *TOKENIZER_IRS):
        (tmp_path / name).write_text(name)
    with without_tokenizer_irs(tmp_path) as view:
        assert sorted(p.name for p in view.iterdir()) == ["config.json", "openvino_model.bin", "openvino_model.xml"]
        assert (view / "openvino_model.bin").read_text() == "openvino_model.bin"
    assert not view.exists() and (tmp_path / "openvino_tokenizer.bin").exists()
    for name in TOKENIZER_IRS:
        (tmp_path / name).unlink()
    with without_tokenizer_irs(tmp_path) as same:  # nothing to leave out: the directory itself
        assert same == tmp_path


def test_without_a_writable_tmp_the_ir_is_opened_as_it_is(tmp_path, monkeypatch) -> None:
    import tempfile

    from edgeinfer_openvino.decoder_export import TOKENIZER_IRS, without_tokenizer_irs

    for name in ("openvino_model.xml", *TOKENIZER_IRS):
        (tmp_path / name).write_text(name)

    def read_only(*args, **kwargs):
        raise PermissionError(30, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    with without_tokenizer_irs(tmp_path) as view:
        assert view == tmp_path


def test_a_decoder_bundle_loads_with_its_openvino_release_or_a_later_one(tiny_qwen3_openvino_cpu_bundle, tmp_path):
    """The decoder's stamp names the toolkit (it named none before: no release was checked); a bundle an earlier
    release converted loads, and one a later release converted is refused by verify and at load."""
    import shutil

    from edgeinfer.contract import stamp
    from edgeinfer.model import bundle as bundle_mod

    installed = edgeinfer.backend("openvino").versions()["toolkit"]
    data = stamp.read(tiny_qwen3_openvino_cpu_bundle / "decoder")
    assert data["versions"]["toolkit"] == installed and data["versions"]["openvino-tokenizers"]
    b = shutil.copytree(tiny_qwen3_openvino_cpu_bundle, tmp_path / "b")
    p = stamp.stamp_path(b / "decoder")
    for toolkit, refused in (("openvino 2024.4.0", False), ("openvino 9999.0.0", True)):
        p.write_text(json.dumps({**data, "versions": {**data["versions"], "toolkit": toolkit}}))
        bundle_mod.write(b, bundle_mod.read_manifest(b))  # sealed again
        report = bundle_mod.verify(b)
        assert report["ok"] and report["installed"] is not refused, report
        if refused:
            assert report["refused"] == [{"artifact": "decoder", "reason": (
                f"decoder was built with openvino 9999.0.0, newer than the installed {installed}; upgrade to "
                "openvino 9999.0.0 or later, or convert the model again here")}]
            with pytest.raises(InputError, match="newer than the installed"):
                edgeinfer.load(b)
        else:
            with edgeinfer.load(b) as gen:
                assert len(gen.generate("Hello", max_new_tokens=3).token_ids) == 3
