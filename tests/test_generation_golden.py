"""The decoder golden check: verdicts on hand-made token/logit sequences, and on real runs."""

from __future__ import annotations

import numpy as np
import pytest

import edgeinfer
from edgeinfer.run.generation.golden import THRESHOLDS, check, compare_prompt, summary_line


def _logits(top: int, margin: float, vocab: int = 8) -> np.ndarray:
    x = np.zeros(vocab, dtype=np.float32)
    x[top] = 5.0
    x[(top + 1) % vocab] = 5.0 - margin
    return x


def test_identical_runs_pass_with_full_agreement():
    ref = [_logits(1, 2.0), _logits(3, 2.0)]
    row = compare_prompt("p", [1, 3], ref, [1, 3], [r.copy() for r in ref], THRESHOLDS["fp32"])
    assert row["agreement"] == 1.0 and row["first_divergence"] is None and row["problems"] == []
    assert row["cosine_min"] == pytest.approx(1.0) and row["top5_overlap"] == 1.0


def test_divergence_at_a_near_tie_is_reported_not_failed():
    ref = [_logits(1, 2.0), _logits(3, 0.01), _logits(5, 2.0)]  # step 1: reference almost tied (3 vs 4)
    flipped = ref[1].copy()
    flipped[4] += 0.02  # a rounding-sized change flips the choice to 4
    got = [ref[0].copy(), flipped, ref[2].copy()]  # teacher-forced: step 2 saw the reference's token 3
    row = compare_prompt("p", [1, 3, 5], ref, [1, 4, 5], got, THRESHOLDS["fp32"])
    assert row["first_divergence"] == 1 and row["near_tie"] is True and row["near_ties"] == 1
    assert row["reference_margin_at_divergence"] == pytest.approx(0.01, abs=1e-6)
    assert row["agreement"] == pytest.approx(1 / 3) and row["forced_agreement"] == pytest.approx(2 / 3)
    assert row["cosine_min"] > 0.9999
    assert row["problems"] == []


def test_divergence_with_a_clear_margin_fails():
    ref = [_logits(1, 2.0), _logits(3, 3.0)]
    got = [_logits(1, 2.0), _logits(4, 3.0)]
    row = compare_prompt("p", [1, 3], ref, [1, 4], got, THRESHOLDS["fp32"])
    assert row["near_tie"] is False and row["clear_misses"] == [1]
    assert any("another token at 1" in p for p in row["problems"])


def test_a_clear_miss_after_a_near_tie_fails():
    """What the free-running check let through: once the first difference was a near-tie, the steps after it
    were not judged. Teacher-forced, every step is."""
    ref = [_logits(1, 2.0), _logits(3, 0.01), _logits(5, 3.0)]
    flipped = ref[1].copy()
    flipped[4] += 0.02
    got = [ref[0].copy(), flipped, _logits(6, 3.0)]
    row = compare_prompt("p", [1, 3, 5], ref, [1, 4, 6], got, THRESHOLDS["w4a16"])
    assert row["first_divergence"] == 1 and row["near_ties"] == 1 and row["clear_misses"] == [2]
    assert not row["near_tie"] and any("another token at 2" in p for p in row["problems"])


def test_teacher_forced_agreement_below_the_minimum_fails_though_every_miss_is_a_near_tie():
    """The tiny model (fp32) checked against its own recorded run with its last token replaced: at that step it
    chooses its own (one miss in 12, inside a near-tie band made wide here; nothing after it sees the changed
    context); the pooled agreement decides."""
    import dataclasses

    from edgeinfer.contract.generation import GenerationOptions
    from edgeinfer.model.decoder_bundle import Recorded
    from edgeinfer.run.generation.golden import check_recorded, record
    from edgeinfer.testing.llm import model_dir

    loose = dataclasses.replace(THRESHOLDS["fp32"], min_cosine=-1.0, min_top5=0.0, near_tie=1e9)
    with edgeinfer.load(model_dir(), ctx=64, threads=1) as gen:
        (rec,) = record(gen, ["The licence grants"], 12)
        ids = list(rec.token_ids)
        ids[-1] = (ids[-1] + 1) % gen.decoder.vocab_size
        changed = [Recorded(rec.prompt, ids, rec.logits)]
        forced = gen.generate_ids(gen.prompt_ids(rec.prompt), GenerationOptions(max_new_tokens=12),
                                  record_logits=True, forced=ids)
        passes = check_recorded(gen, changed, 12, "fp32", thresholds=dataclasses.replace(loose, min_agreement=0.9))
        fails = check_recorded(gen, changed, 12, "fp32", thresholds=dataclasses.replace(loose, min_agreement=0.95))
    assert forced.token_ids == ids and len(forced.logits) == 12  # fed the given tokens, its own logits kept
    assert passes["forced_agreement"] == pytest.approx(11 / 12) and passes["passed"], summary_line(passes)
    assert not fails["passed"] and "teacher-forced agreement 91.7% < 95%" in summary_line(fails)


def test_nan_logits_fail():
    ref = [_logits(1, 2.0)]
    bad = np.full(8, np.nan, dtype=np.float32)
    row = compare_prompt("p", [1], ref, [1], [bad], THRESHOLDS["fp32"])
    assert not row["finite"] and "non-finite logits" in row["problems"]


def test_real_runs_reference_against_itself_and_against_bf16():
    from edgeinfer.testing.llm import model_dir

    prompts = ["The licence grants", "Permission is hereby granted"]
    with edgeinfer.load(model_dir(), ctx=96) as ref, edgeinfer.load(model_dir(), ctx=96) as same:
        report = check(same, ref, prompts, 24, "fp32")
        assert report["passed"] and report["token_agreement"] == 1.0, summary_line(report)
        assert report["cosine_min"] > 0.99999
        with edgeinfer.load(model_dir(), ctx=96, dtype="bfloat16") as bf16:
            strict = check(bf16, ref, prompts, 24, "fp32")  # bf16 judged as if it were lossless
            loose = check(bf16, ref, prompts, 24, "bf16")
    assert strict["cosine_min"] < 0.9999 and not strict["passed"], summary_line(strict)
    assert loose["cosine_min"] == strict["cosine_min"]
    assert "decoder golden check" in summary_line(loose)


def test_the_batched_check_on_a_decoder_that_batches_without_graphs_of_its_own():
    """``check_batched`` is generic: on the transformers decoder (two slots), three recorded prompts run two per
    decode call, then the third alone, and each agrees with its own single-sequence run."""
    from edgeinfer.run.generation.golden import check_batched, record, thresholds_for
    from edgeinfer.testing.llm import model_dir

    prompts = ["The licence grants", "def main():", "Permission is hereby granted"]
    with edgeinfer.load(model_dir(), ctx=64, threads=1) as ref:  # one thread: the tiny model's fastest
        recorded = record(ref, prompts, 8)
    with edgeinfer.load(model_dir(), ctx=64, slots=2, threads=1) as two:
        calls: list[int] = []
        real = two.decoder.decode
        two.decoder.decode = lambda slots, ids: calls.append(len(slots)) or real(slots, ids)  # a spy: counts, runs
        report = check_batched(two.decoder, two.codec, recorded, 8, thresholds_for("fp32"))
    assert report["passed"] and report["slots"] == 2, report["rows"]
    assert [r["prompt"] for r in report["rows"]] == prompts
    assert [r["agreement"] for r in report["rows"]] == [1.0, 1.0, 1.0]
    assert 2 in calls and max(calls) == 2


def test_a_q8_0_kv_cache_is_judged_as_8_bit_weights_never_finer():
    from edgeinfer.run.generation.golden import THRESHOLDS, thresholds_for

    assert thresholds_for("fp16", "q8_0") == thresholds_for("gguf:F16", "q8_0") == THRESHOLDS["w8a16"]
    assert thresholds_for("fp32", "int8") == THRESHOLDS["w8a16"]
    assert thresholds_for("w8a8", "q8_0") == thresholds_for("gguf:Q8_0", "q8_0") == THRESHOLDS["w8a8"]
    assert thresholds_for("w4a16_g128", "q8_0") == THRESHOLDS["w4a16"]
    assert thresholds_for("fp16", "fp16") == thresholds_for("fp16") == THRESHOLDS["fp16"]
