"""The ascend decoder on torch CPU (eager): the conformance kit, schemes against the golden check, the
static KV cache against the planner, scheme refusals, the artifact and per-op times.

Expected tokens come from transformers itself (the kit's reference_greedy, the transformers backend);
expected KV bytes from the planner (`edgeinfer plan`), never from the decoder under test.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgeinfer.errors import InputError
from edgeinfer.planning.planner import plan
from edgeinfer.run.generation import golden
from edgeinfer.testing import DecoderConformance
from edgeinfer.testing.decoder_conformance import PROMPTS, reference_greedy


class TestAscendDecoders(DecoderConformance):
    backend_name = "ascend"
    load_options = {"prefill_buckets": [16, 64], "threads": 1}


@pytest.mark.parametrize("scheme", ["fp16", "w8a16"])
def test_lossy_schemes_pass_the_decoder_golden_check(ascend_generator, reference_generator, scheme):
    report = golden.check(ascend_generator(scheme), reference_generator, PROMPTS, 24, scheme)
    assert report["passed"], golden.summary_line(report)


def test_bf16_greedy_against_the_fp32_reference(ascend_generator, reference_generator, llm_dir):
    """bf16 must pass the golden check; any token that differs from fp32 transformers must be at a
    near-tie of the reference (the report names the step and the reference's top-1/top-2 margin)."""
    report = golden.check(ascend_generator("bf16"), reference_generator, PROMPTS, 32, "bf16")
    print(golden.summary_line(report))
    for row in report["rows"]:
        print(row["prompt"], "first divergence", row["first_divergence"], "margin",
              row["reference_margin_at_divergence"])
    assert report["passed"], golden.summary_line(report)


def test_bf16_greedy_equals_transformers_own_bf16(ascend_generator, llm_dir):
    """bf16 cannot be held to fp32's tokens: transformers' own bf16 ``generate`` leaves the fp32 tokens at
    the same near-tie (new token 31 of "Permission is hereby granted", margin 0.036). What a bf16 path can
    be held to is transformers in bf16, token for token."""
    g = ascend_generator("bf16")
    for prompt in PROMPTS:
        ids = g.prompt_ids(prompt)
        assert g.generate(prompt, max_new_tokens=32).token_ids == reference_greedy(llm_dir, ids, 32, "bfloat16")


def test_kv_cache_bytes_equal_the_planners_figure(ascend_generator, llm_dir):
    for scheme, board in (("fp32", "atlas-300i-a2-910b4"), ("fp16", "atlas-300i-pro"), ("bf16", "atlas-800i-a2")):
        d = ascend_generator(scheme).decoder
        p = plan(llm_dir, board, quant=scheme, ctx=128, batch=1, kv_dtype=scheme, runtime="torch-npu")
        assert d.kv_cache_bytes == p.breakdown["kv_cache"], scheme


def test_two_slots_allocate_twice_the_planned_kv_and_never_grow(ascend, llm_dir):
    d = ascend.load_decoder(llm_dir, context=48, slots=2, scheme="fp16", prefill_buckets=[16])
    try:
        p = plan(llm_dir, "atlas-300i-pro", quant="fp16", ctx=48, batch=2, kv_dtype="fp16", runtime="torch-npu")
        assert d.kv_cache_bytes == p.breakdown["kv_cache"]
        caches = d.lm.k_cache + d.lm.v_cache
        before = [(t.data_ptr(), t.nbytes) for t in caches]
        assert sum(n for _, n in before) == d.kv_cache_bytes
        ids = np.arange(3, 40, dtype=np.int64)  # 37 tokens: three bucket-16 prefill steps
        d.prefill(0, ids)
        d.prefill(1, ids[:5])
        for _ in range(5):
            d.decode([1, 0], np.array([7, 9], np.int64))
        assert [(t.data_ptr(), t.nbytes) for t in d.lm.k_cache + d.lm.v_cache] == before
        assert d.lengths == [42, 10]
    finally:
        d.close()


def test_slots_decode_independently(ascend, llm_dir):
    """Two slots decoding together give each the logits it gets alone (idle rows write nothing)."""
    d = ascend.load_decoder(llm_dir, context=32, slots=2, prefill_buckets=[16])
    try:
        a, b = np.arange(5, 12, dtype=np.int64), np.arange(40, 44, dtype=np.int64)
        d.prefill(0, a)
        alone = d.decode([0], np.array([3], np.int64))[0]
        d.reset(0)
        d.prefill(0, a)
        d.prefill(1, b)
        together = d.decode([1, 0], np.array([8, 3], np.int64))
        np.testing.assert_allclose(together[1], alone, rtol=1e-4, atol=1e-4)
    finally:
        d.close()


def test_a_scheme_the_board_lacks_is_refused_with_the_supported_list(ascend, llm_dir):
    from edgeinfer.planning.boards import get_board
    from edgeinfer.planning.decision import decide
    from edgeinfer.planning.models import resolve

    # the board's rule is the core's (plan's and deploy's one decision): refused before anything converts
    with pytest.raises(InputError, match=r"board atlas-300i-pro does not support bf16 for decoder models "
                                         r"\(supported schemes: torch-npu: fp16, w8a16\)"):
        decide(resolve(str(llm_dir)), get_board("atlas-300i-pro"), runtime="torch-npu", quant="bf16")
    with pytest.raises(InputError, match=r"cannot run scheme 'w8a8'.*supports: fp32, fp16, bf16, w8a16"):
        ascend.load_decoder(llm_dir, context=16, scheme="w8a8")
    with pytest.raises(InputError, match="cannot run scheme 'w8a8'"):
        ascend.convert_decoder(llm_dir, "w8a8", 16, llm_dir.parent / "never-written")
    assert not (llm_dir.parent / "never-written").exists()


def test_artifact_loads_without_pickle_and_gives_the_same_tokens(ascend, llm_dir, tmp_path):
    out = tmp_path / "tiny-qwen3-ascend-fp16"
    facts = ascend.convert_decoder(llm_dir, "fp16", 64, out, prefill_buckets=[16, 32])
    assert facts["dtype"] == "fp16" and facts["prefill_buckets"] == [16, 32] and facts["context"] == 64
    assert "scheme" not in facts and "source" not in facts  # the core's stamp writes those
    manifest = json.loads((out / "ascend-decoder.json").read_text())
    assert manifest["scheme"] == "fp16" and manifest["dtype"] == "fp16"
    suffixes = {p.suffix for p in out.iterdir()}
    assert suffixes <= {".json", ".safetensors", ".jinja"}, suffixes  # no pickle-based weights
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert {str(f.get_slice(k).get_dtype()) for k in f.keys()} == {"F16"}
    d = ascend.load_decoder(out, context=64)
    try:
        assert d.scheme == "fp16" and d.buckets == (16, 32)
        prompt = np.arange(20, 31, dtype=np.int64)
        d.prefill(0, prompt)
        tokens = []
        for _ in range(8):
            logits = d.decode([0], np.array([tokens[-1] if tokens else 5], np.int64))
            tokens.append(int(logits[0].argmax()))
    finally:
        d.close()
    want = reference_greedy(llm_dir, [*prompt.tolist(), 5], 8)
    assert tokens[:4] == want[:4]  # fp16: the golden check covers the rest; first tokens must agree
    with pytest.raises(InputError, match="converted to fp16"):
        ascend.load_decoder(out, context=64, scheme="w8a16")


def test_op_times_per_phase(ascend_generator):
    d = ascend_generator("fp32").decoder
    ids = np.arange(10, 30, dtype=np.int64)
    for phase in ("prefill", "decode"):
        ops = d.op_times(phase, ids)
        assert ops and all(o.time_ms > 0 for o in ops)
        assert [o.time_ms for o in ops] == sorted((o.time_ms for o in ops), reverse=True)
        assert any("aten::" in o.name for o in ops)
    assert d.lengths[0] == 0  # profiling leaves the slot empty


def test_prefill_chunking_never_runs_a_bucket_past_the_context():
    from edgeinfer_ascend.decoder import chunks, parse_buckets

    assert list(chunks(37, 0, 48, (16,))) == [(0, 16, 16), (16, 16, 16), (32, 5, 16)]
    assert list(chunks(20, 0, 64, (16, 64))) == [(0, 20, 64)]
    # 24 positions left: one bucket of 16, then the last 4 one by one through the decode step
    assert list(chunks(20, 40, 64, (16, 64))) == [(0, 16, 16), (16, 1, None), (17, 1, None), (18, 1, None),
                                                  (19, 1, None)]
    assert parse_buckets("64, 8,500", 128) == (8, 64)
    assert parse_buckets(None, 32) == (16,)
    with pytest.raises(InputError, match="at least 2"):
        parse_buckets([1, 16], 64)


def test_on_cpu_it_says_once_that_it_is_for_checking_not_for_speed(ascend_generator, llm_dir, capfd):
    """No NPU here: generate says so on stderr (stdout stays the JSON), bench in its notes."""
    from edgeinfer.run.generation import bench
    from edgeinfer.testing.cli import run_cli

    p = run_cli(capfd, "generate", str(llm_dir), "--backend", "ascend", "--prompt", "Hi", "--max-new-tokens", "2",
                "--threads", "1", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["device"] == "cpu" and out["notes"] == [ascend_generator("bf16").decoder.caveat]
    assert p.stderr.count("for checking, not for speed") == 1 and "running on CPU through torch" in p.stderr
    report = bench.bench(ascend_generator("bf16"), "tiny", [4], new_tokens=2, repeat=1, warmup=0)
    assert [n for n in report["notes"] if "not for speed" in n] == [ascend_generator("bf16").decoder.caveat]
    assert ascend_generator("bf16").decoder.caveat.endswith("for checking, not for speed")


def test_serve_says_the_cpu_caveat_once_in_its_log_and_lists_it_in_ready(ascend_generator, caplog):
    """The decoder worker's "ready" message carries the decoder's caveat (the message is built here, as the
    worker builds it, without starting one): logged at the first start, not at a restart; /ready's notes."""
    import logging
    from types import SimpleNamespace

    from edgeinfer.serve.decoder_engine import Engine

    caveat = ascend_generator("bf16").decoder.caveat
    engine = Engine(SimpleNamespace(name="tiny"), slots=1, max_queue=1, prefill_chunk=None)
    info = {"pid": 1, "slots": 1, "caveat": caveat}
    with caplog.at_level(logging.WARNING):
        for restarts in (0, 1):
            engine.info, engine.restarts = info, restarts
            engine.on_message(("ready", info))
    assert [r.getMessage() for r in caplog.records if "not for speed" in r.getMessage()] == [f"tiny: {caveat}"]
    assert engine.to_json()["notes"] == [caveat]
