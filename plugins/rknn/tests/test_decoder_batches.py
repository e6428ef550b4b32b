"""RKNN decoders with batched decode graphs (convert option ``decode_batches``) in the rknn-toolkit2 simulator:
several sequences decoded in one call give each sequence the tokens (and logits) it gets alone, padding rows
write nothing, paging keeps working, more slots than the largest built batch are refused, and deploy's golden
check decodes its prompts together through the batched graphs.

Expected tokens come from transformers' own ``generate`` (the kit's reference_greedy); the artifact (two
segments, decode graphs for 1 and 4 sequences) is deployed once per module (through the conversion cache), its
golden check run on the module's four prompts.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import edgeinfer
from edgeinfer.errors import InputError
from edgeinfer.run.generation.text import TextCodec
from edgeinfer.testing.cli import run_cli
from edgeinfer.testing.decoder_conformance import PROMPTS, reference_greedy
from edgeinfer.testing.llm import model_dir

CTX = 16  # the longest prompt (6 tokens) and STEPS fit: the smallest graphs to convert and run
SEGMENTS = 2
BATCHES = "1,4"
STEPS = 5  # tokens per sequence: one from the prefill, then decode steps
# logits of one sequence through the [4,1] graph against the [1,1] graph: another fp16 summation order
# (the same bound as the conformance kit's chunked prefill on this model)
LOGITS_ATOL = 2e-2


@pytest.fixture(scope="module")
def rknn():
    return edgeinfer.backend("rknn")


PROMPT_TEXTS = [*PROMPTS[:3], "Permission is hereby granted"]


@pytest.fixture(scope="module")
def deployed(module_tmp):
    """``deploy`` to rk3588-8g, fp16 at ctx 16, with the module's prompts as golden inputs (STEPS tokens each)."""
    from edgeinfer.deploy.decoder import deploy_decoder

    root = module_tmp
    (root / "golden.txt").write_text("\n".join(PROMPT_TEXTS) + "\n")
    return deploy_decoder(model_dir(), "rk3588-8g", root / "tiny-qwen3-rknn", quant="fp16", ctx=CTX,
                          golden_inputs=root / "golden.txt", new_tokens=STEPS,
                          options={"segments": SEGMENTS, "decode_batches": BATCHES})


@pytest.fixture(scope="module")
def artifact(deployed):
    return deployed.bundle / "decoder"


@pytest.fixture(scope="module")
def decoder(rknn, artifact):
    d = rknn.load_decoder(artifact, device="simulator", context=CTX, slots=4)
    yield d
    d.close()


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    codec = TextCodec(model_dir())
    ids = [codec.encode(p) for p in PROMPT_TEXTS]
    assert len({len(i) for i in ids}) > 1  # the rows of one call are at different positions
    return ids


@pytest.fixture(scope="module")
def references(prompts) -> list[list[int]]:
    return [reference_greedy(model_dir(), p, STEPS) for p in prompts]


def run(d, slots: list[int], prompts: list[list[int]], steps: int) -> tuple[list[list[int]], list[np.ndarray]]:
    """Greedy tokens and every step's logits of ``prompts`` in ``slots``, their decode steps in one call."""
    logits = []
    for s, p in zip(slots, prompts):
        d.reset(s)
        logits.append(d.prefill(s, np.asarray(p, dtype=np.int64)))
    rows = [np.stack(logits)]
    tokens = [[int(np.argmax(x))] for x in logits]
    for _ in range(steps - 1):
        out = d.decode(slots, np.asarray([t[-1] for t in tokens], dtype=np.int64))
        rows.append(out)
        for t, x in zip(tokens, out):
            t.append(int(np.argmax(x)))
    return tokens, [np.stack([r[i] for r in rows]) for i in range(len(slots))]


def test_the_manifest_records_the_decode_batches(artifact):
    manifest = json.loads((artifact / "rknn-decoder.json").read_text())
    assert manifest["decode_batches"] == [1, 4]
    assert all((artifact / seg["decode4"]).is_file() for seg in manifest["segments"])


def test_paged_batched_decode_gives_the_same_tokens(rknn, artifact, prompts, references):
    d = rknn.load_decoder(artifact, device="simulator", context=CTX, slots=4, window=1)
    try:
        tokens, _ = run(d, [0, 1], prompts[:2], 2)
        stats = d.paging_stats()
    finally:
        d.close()
    assert tokens == [r[:2] for r in references[:2]]
    passes = 2 + 1  # a prefill pass per sequence, then one batched decode pass
    assert stats["window"] == 1 and stats["page_ins"] == passes * SEGMENTS


def test_each_sequence_of_a_batched_decode_gets_what_it_gets_alone(decoder, prompts, references):
    alone = [run(decoder, [0], [p], STEPS) for p in prompts[:3]]
    assert [a[0][0] for a in alone] == references[:3]
    # slot 3 holds a fourth sequence mid-way; the three others run as rows of the [4,1] graph (one padding row)
    decoder.reset(3)
    decoder.prefill(3, np.asarray(prompts[3], dtype=np.int64))
    kv3, length3 = decoder.kv[3].copy(), decoder.lengths[3]
    tokens, logits = run(decoder, [2, 0, 1], prompts[:3], STEPS)
    assert tokens == references[:3]
    for got, (_, want) in zip(logits, alone):
        np.testing.assert_allclose(got, want[0], atol=LOGITS_ATOL)
    assert decoder.lengths[3] == length3 and np.array_equal(decoder.kv[3], kv3)  # the padding row wrote nothing
    # and slot 3 goes on as if nothing had run beside it
    last = int(np.argmax(decoder.decode([3], np.asarray([references[3][0]]))[0]))
    assert last == references[3][1]


def test_two_sequences_with_two_padding_rows(decoder, prompts, references):
    tokens, _ = run(decoder, [1, 3], [prompts[1], prompts[3]], STEPS)
    assert tokens == [references[1], references[3]]


def test_more_slots_than_the_largest_decode_batch_are_refused(rknn, artifact):
    with pytest.raises(InputError, match=r"decodes at most 4 sequence\(s\) at once .* not 5: use 4 slots or fewer"):
        rknn.load_decoder(artifact, device="simulator", context=CTX, slots=5)


@pytest.fixture(scope="module")
def bundle(deployed):
    return deployed.bundle


def test_serve_refuses_more_slots_than_the_bundle_decodes_in_one_line(bundle, capfd):
    r = run_cli(capfd, "serve", str(bundle), "--slots", "5", "--port", "0")
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "--slots 5: bundle tiny-qwen3-rknn decodes at most 4 sequences at once" in r.stderr


def test_generate_on_the_bundle_refuses_more_slots_than_built(bundle):
    from edgeinfer.model.bundle import Bundle
    from edgeinfer.run.bundle import open_generator

    with pytest.raises(InputError, match="--slots 8: bundle tiny-qwen3-rknn decodes at most 4"):
        open_generator(Bundle.open(bundle), slots=8)



def test_serve_plans_the_kv_cache_the_rknn_decoder_allocates(bundle, decoder):
    """The start-up log's planner figure for an RKNN bundle counts fp16 KV, as the decoder holds it."""
    from edgeinfer.model.bundle import Bundle
    from edgeinfer.serve.decoder_engine import open_served_decoder, planned_kv_bytes

    c = json.loads((model_dir() / "config.json").read_text())
    want = c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * c["head_dim"] * CTX * 4 * 2  # 4 slots, fp16
    llm = open_served_decoder(bundle, Bundle.open(bundle))
    assert planned_kv_bytes(llm, 4) == want == decoder.kv_cache_bytes


def test_the_serve_scheduler_decodes_the_rknn_streams_in_one_call(decoder, prompts, references):
    """``serve``'s scheduler over the RKNN decoder: three streams decode in one ``decode`` call per step (the
    [4,1] graph), and each stream's tokens are transformers' greedy tokens."""
    from edgeinfer.contract.generation import GenerationOptions
    from edgeinfer.run.generation.generator import Generator
    from edgeinfer.serve.decoder_scheduler import Scheduler

    sched = Scheduler(Generator(decoder, TextCodec(model_dir())))
    calls: list[int] = []
    real = decoder.decode
    decoder.decode = lambda slots, ids: calls.append(len(slots)) or real(slots, ids)  # a spy: counts, then runs
    try:
        for i, p in enumerate(prompts[:3]):
            sched.add(str(i), p, GenerationOptions(max_new_tokens=STEPS, ignore_eos=True))
        got: dict[str, list[int]] = {}
        while sched.busy:
            sched.step()
            for s in sched.decoding:
                got[s.rid] = s.history[len(s.prompt):]
    finally:
        del decoder.decode
    assert 3 in calls and max(calls) == 3
    assert [got[str(i)] for i in range(3)] == [r[:STEPS - 1] for r in references[:3]]


def test_deploy_golden_checks_the_batched_decode_graphs(deployed, references):
    """After the single-sequence check, deploy decodes the four golden prompts together ([4,1] graphs): each
    sequence agrees with the fp32 reference, and the report and its text line say so."""
    from edgeinfer.run.generation.golden import summary_line

    g = deployed.golden
    assert g["passed"] and g["batched"]["passed"]
    assert (g["batched"]["slots"], g["batched"]["prompts"]) == (4, 4)
    assert [(r["prompt"], r["agreement"], r["problems"]) for r in g["batched"]["rows"]] == \
        [(p, 1.0, []) for p in PROMPT_TEXTS]
    assert [r["tokens"] for r in g["batched"]["rows"]] == [len(r) for r in references]
    assert "batched decode (4 sequences per call) passed, token agreement 100.0%" in summary_line(g)
    assert deployed.manifest.decoder["golden"]["batched"] == g["batched"]


class RowsReversedDecoder:
    """TEST DOUBLE of a decoder's OUTPUT: the module's real RKNN decoder, whose batched decode calls return their
    rows in reverse order (each sequence gets another's logits), as a batched graph wired to the wrong slots
    would; one-sequence calls are untouched."""

    def __init__(self, real):
        self.real = real

    def __getattr__(self, name):
        return getattr(self.real, name)

    def decode(self, slots, ids):
        out = self.real.decode(slots, ids)
        return out[::-1] if len(slots) > 1 else out


def test_the_batched_golden_check_fails_a_batched_decode_that_mixes_up_rows(decoder, deployed):
    from edgeinfer.model.bundle import Bundle
    from edgeinfer.model.decoder_bundle import load_reference
    from edgeinfer.run.generation import golden

    recorded, t = load_reference(Bundle.open(deployed.bundle)), golden.thresholds_for("fp16")
    assert golden.check_batched(decoder, TextCodec(model_dir()), recorded, STEPS, t)["passed"]  # the real one
    report = golden.check_batched(RowsReversedDecoder(decoder), TextCodec(model_dir()), recorded, STEPS, t)
    assert report["slots"] == 4 and not report["passed"]
    failed = [r["prompt"] for r in report["rows"] if r["problems"]]
    assert failed  # and the golden line names each failing prompt with the batch size
    line = golden.summary_line({**deployed.golden, "passed": False, "batched": report})
    assert "batched decode (4 sequences per call) FAILED" in line
    assert all(f"{p!r} decoded 4 per call: " in line for p in failed)
