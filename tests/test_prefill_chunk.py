"""The prefill chunk in the plan: ``plan --prefill-chunk N`` (what ``deploy --option prefill_chunk=N`` builds into
a decoder's graphs), and the larger chunk a layer-paged decoder's plan suggests and ``deploy --paging`` adopts
(docs/planner.md "Suggestions", docs/paging.md#decoders).

Expected figures come from the runtime profiles read here (edgeinfer/data/runtimes.yaml) and from the paged
prefill formula of docs/paging.md#decoders written out by hand: a prompt of ``ctx`` tokens pages every
non-resident segment in once per chunk, prefetched while the NPU computes (storage has its own bus), so it takes
max(ctx / unpaged prefill rate, passes × page-in per pass) with ``passes = ceil(ctx / chunk)``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from edgeinfer.deploy.decoder_paging import adopt_chunk
from edgeinfer.planning.planner import plan
from edgeinfer.testing.cli import run_cli

RUNTIMES = yaml.safe_load((Path(__file__).parents[1] / "edgeinfer/data/runtimes.yaml").read_text())
# Qwen3-8B w8a8 does not fit one 4 GiB NPU window of an RK3588: 19 of 36 layers resident, the rest from NVMe
PAGED = dict(model="Qwen/Qwen3-8B", board="rk3588-16g", quant="w8a8", ctx=4096, paging=19, storage="nvme")


def paged(**kw):
    args = {**PAGED, **kw}
    return plan(args.pop("model"), args.pop("board"), **args)


def test_the_plan_takes_the_runtimes_chunk_unless_told_another():
    default = plan("Qwen/Qwen3-0.6B", "rk3588-16g", quant="w8a8", ctx=1024)
    assert default.runtime == "rknn" and default.chunk == RUNTIMES["rknn"]["prefill_chunk"]
    assert default.details.activations.tokens_per_step == RUNTIMES["rknn"]["prefill_chunk"]
    asked = plan("Qwen/Qwen3-0.6B", "rk3588-16g", quant="w8a8", ctx=1024, prefill_chunk=128)
    assert asked.details.activations.tokens_per_step == 128 and asked.to_dict()["options"]["prefill_chunk"] == 128
    assert asked.breakdown["activations"] > default.breakdown["activations"]
    assert asked.breakdown["weights"] == default.breakdown["weights"]
    host = plan("Qwen/Qwen3-0.6B", "host", quant="fp32", ctx=1024)
    assert host.to_dict()["options"]["prefill_chunk"] == RUNTIMES[host.runtime]["prefill_chunk"]
    encoder = plan("all-minilm-l6-v2", "rk3588-8g", prefill_chunk=64)  # sees its whole sequence at once
    assert encoder.to_dict()["options"]["prefill_chunk"] is None
    assert encoder.details.activations.tokens_per_step == encoder.ctx


def test_cli_prefill_chunk_reaches_the_json_and_a_bad_one_is_one_line(capfd):
    ok = run_cli(capfd, "plan", "Qwen/Qwen3-0.6B", "--board", "host", "--prefill-chunk", "64", "--json")
    assert ok.returncode == 0, ok.stderr
    d = json.loads(ok.stdout)
    assert d["options"]["prefill_chunk"] == 64
    assert d["memory"]["details"]["activations"]["tokens_per_step"] == 64
    bad = run_cli(capfd, "plan", "Qwen/Qwen3-0.6B", "--board", "host", "--prefill-chunk", "0")
    assert bad.returncode == 2 and "--prefill-chunk must be a positive integer" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    huge = run_cli(capfd, "plan", "Qwen/Qwen3-0.6B", "--board", "host", "--prefill-chunk", "100000")
    assert huge.returncode == 2 and "--prefill-chunk 100000 is out of range: at most 65536" in huge.stderr
    assert len(huge.stderr.strip().splitlines()) == 1


def paged_prefill(p) -> float:
    """docs/paging.md#decoders by hand, from the plan's own page-in per pass and unpaged prefill rate."""
    c = p.details.paging
    passes = math.ceil(p.ctx / p.chunk)
    return p.ctx / max(p.ctx / p.estimates.prefill_tokens_per_s_unpaged, passes * c.stream_s_per_token)


def test_a_paged_decoders_prefill_pages_every_segment_in_once_per_chunk():
    p = paged()
    assert p.details.paging.storage == "nvme" and not p.details.paging.shared_bus
    assert p.estimates.prefill_tokens_per_s == pytest.approx(paged_prefill(p), rel=0.01)
    wide = paged(prefill_chunk=64)
    assert wide.estimates.prefill_tokens_per_s == pytest.approx(paged_prefill(wide), rel=0.01)
    assert wide.estimates.prefill_tokens_per_s > 3 * p.estimates.prefill_tokens_per_s  # 4x fewer passes


def test_a_storage_bound_paged_prefill_gets_the_smallest_chunk_at_the_unpaged_rate():
    p = paged()
    unpaged = p.estimates.prefill_tokens_per_s_unpaged
    assert p.estimates.prefill_tokens_per_s < 0.5 * unpaged  # 16-token chunks: storage-bound
    s = p.suggestions.prefill_chunk
    n = s["prefill_chunk"]
    at_n, below = paged(prefill_chunk=n, suggest=False), paged(prefill_chunk=n // 2, suggest=False)
    assert at_n.fits and s["prefill_tokens_per_s"] == at_n.estimates.prefill_tokens_per_s
    assert s["prefill_tokens_per_s"] >= 0.95 * unpaged > below.estimates.prefill_tokens_per_s
    assert s["total_bytes"] == at_n.total_bytes and s["activations_bytes"] == at_n.breakdown["activations"]
    assert s["speedup"] == pytest.approx(s["prefill_tokens_per_s"] / p.estimates.prefill_tokens_per_s, abs=0.01)


@pytest.mark.parametrize("kw", [dict(paging=None, storage=None), dict(prefill_chunk=512)],
                         ids=["unpaged", "already-at-the-unpaged-rate"])
def test_no_chunk_suggestion_where_prefill_does_not_page(kw):
    p = paged(**kw)
    assert p.suggestions.prefill_chunk is None


def test_cli_prints_the_suggested_chunk(capfd):
    r = run_cli(capfd, "plan", PAGED["model"], "--board", PAGED["board"], "--quant", "w8a8", "--ctx", "4096",
                "--paging", "19", "--storage", "nvme")
    assert r.returncode == 0, r.stderr
    n = paged().suggestions.prefill_chunk["prefill_chunk"]
    assert f"prefill faster: --prefill-chunk {n} (deploy --option prefill_chunk={n}" in r.stdout


def test_a_paged_build_without_a_chunk_takes_the_plans():
    p = paged()
    options: dict = {}
    notes: list[str] = []
    built = adopt_chunk(p, options, notes)
    n = p.suggestions.prefill_chunk["prefill_chunk"]
    assert options == {"prefill_chunk": n} and built.chunk == n
    assert built.details.paging.window == p.details.paging.window
    assert built.estimates.prefill_tokens_per_s == p.suggestions.prefill_chunk["prefill_tokens_per_s"]
    assert len(notes) == 1 and f"prefill chunk {n}" in notes[0]
    quiet = paged(prefill_chunk=512)
    assert adopt_chunk(quiet, options := {}, notes := []) is quiet and options == {} and notes == []
