"""The compiled decoder (torch.compile, inductor on CPU: the graphs TorchAir builds on the NPU).

Compiling is the slow part (tens of seconds per graph on a loaded 2-core machine), so one decoder with
one prefill bucket is compiled once for the whole session and every test reads it.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgeinfer.testing.decoder_conformance import PROMPTS, reference_greedy

pytestmark = pytest.mark.slow  # compiles two graphs with inductor (about a minute here)

CONTEXT, BUCKET, NEW = 64, 16, 24


@pytest.fixture(scope="session")
def compiled(ascend, llm_dir):
    from edgeinfer.run.generation.generator import Generator
    from edgeinfer.run.generation.text import TextCodec

    d = ascend.load_decoder(llm_dir, context=CONTEXT, compile=True, prefill_buckets=[BUCKET])
    with Generator(d, TextCodec(llm_dir)) as g:
        yield g


def test_warm_up_compiles_each_bucket_and_the_decode_step_once(compiled):
    d = compiled.decoder
    assert d.compiled and d.warmup_s is not None
    assert d.compiles == {f"prefill/{BUCKET}": 1, "decode": 1}
    assert set(d.first_run_s) == {f"prefill/{BUCKET}", "decode"}


def test_greedy_tokens_equal_transformers_fp32(compiled, llm_dir):
    for prompt in PROMPTS:
        ids = compiled.prompt_ids(prompt)
        assert compiled.generate(prompt, max_new_tokens=NEW).token_ids == reference_greedy(llm_dir, ids, NEW)


def test_no_recompile_for_any_prompt_length(compiled):
    """Prompts of 1 to 40 tokens (one bucket step, several, and the tail that only fits the decode step)."""
    d = compiled.decoder
    rng = np.random.default_rng(0)
    for n in (1, 5, 16, 17, 40):
        d.reset(0)
        d.prefill(0, rng.integers(3, 3000, size=n))
        for _ in range(3):
            d.decode([0], rng.integers(3, 3000, size=1))
    d.reset(0)
    d.prefill(0, rng.integers(3, 3000, size=CONTEXT - 1))  # room 1: the last token goes through decode
    assert d.lengths[0] == CONTEXT - 1
    d.reset(0)
    assert d.compiles == {f"prefill/{BUCKET}": 1, "decode": 1}
