"""The decoder golden check refuses a llama.cpp Q4_0 that is just worse than the fp32 reference, and keeps its Q8_0.

The model: a random Qwen3 of 4 layers, hidden 512 (``edgeinfer.testing.llm.random_qwen3``; the flat logits of
issue 30's 188 M random model, which llama.cpp's Q4_0 matched on 0-2 leading tokens and served). Measured
(deploy's 4 golden prompts × 32 tokens): Q4_0 chooses the reference's token at 75.8 % of the teacher-forced
steps (the w4a16 class needs 85 %), logits cosine min 0.940. The free-running check before it failed this one
only on a cosine of 0.9476 against 0.95 (over the few steps before the first difference), and passed the tiny
trained model's Q4_0 at 34 % leading agreement, which the teacher-forced check also passes (92 %, every other
choice at a reference margin <= 0.34, like the other w4a16 schemes: bench/results/decoder_golden_forced.json)."""

from __future__ import annotations

import re

import pytest

from edgeinfer.testing.cli import run_cli
from edgeinfer.testing.llm import random_qwen3

SHAPE = {"layers": 4, "hidden": 512, "heads": 8, "kv_heads": 4, "intermediate": 1536}


@pytest.fixture(scope="module")
def model():
    return random_qwen3(**SHAPE)


def test_q4_0_of_a_random_model_fails_the_golden_check_with_one_line(model, tmp_path, capfd):
    out = tmp_path / "q4"
    r = run_cli(capfd, "deploy", str(model), "--board", "host", "--runtime", "llama.cpp", "--quant", "gguf:Q4_0",
                "--ctx", "128", "-o", str(out))
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and "decoder golden check" in ln]
    assert r.returncode == 1 and not out.exists(), r.stderr[-2000:]
    assert len(lines) == 1 and "decoder golden check FAILED" in lines[0]
    assert re.search(r"— teacher-forced agreement \d+\.\d% < 85%", lines[0]), lines[0]  # the w4a16 class's minimum
    assert "Traceback" not in r.stderr
