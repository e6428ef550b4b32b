"""plan_paged_decoder and `edgeinfer plan --paging` on decoders (issue 17, docs/paging.md#decoders).

Expected figures are derived here independently: parameter counts from the torch modules of the
loaded models (``sum(p.numel())``), bandwidths and speed constants from the board YAML, the
formulas of docs/paging.md#decoders written out by hand.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from helpers import HEAVY, imported_modules

from edgeinfer.errors import InputError
from edgeinfer.planning.boards import boards_dirs
from edgeinfer.planning.decoder_paging import PagedDecoderPlan, plan_paged_decoder
from edgeinfer.testing.cli import run_cli
from edgeinfer.testing.llm import model_dir

GB = 1e9
TINY = str(model_dir())


def _board(name: str) -> dict:
    return yaml.safe_load((boards_dirs()[0] / f"{name}.yaml").read_text())


def _numel(module) -> int:
    return sum(p.numel() for p in module.parameters())


def _out_channels(module) -> int:
    import torch

    return sum(m.out_features for m in module.modules() if isinstance(m, torch.nn.Linear))


@pytest.fixture(scope="module")
def tiny_counts():
    """(per-layer params, per-layer Linear output rows, head params, lm_head rows) of tiny-qwen3, from torch."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    m = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32)
    layers = m.model.layers
    per = {_numel(layer) for layer in layers}
    outs = {_out_channels(layer) for layer in layers}
    assert len(per) == 1 and len(outs) == 1  # all layers alike
    head = _numel(m.model.norm) + m.lm_head.weight.numel()  # lm_head counted although tied
    return per.pop(), outs.pop(), head, m.lm_head.out_features, len(layers)


def test_fp16_segments_are_the_torch_parameter_counts(tiny_counts):
    per, _, head, _, n_layers = tiny_counts
    p = plan_paged_decoder(TINY, "rk3588-8g", scheme="fp16", context=64, window=2, segments=n_layers)
    assert isinstance(p, PagedDecoderPlan)
    assert p.segment_bytes == tuple([2 * per] * (n_layers - 1) + [2 * per + 2 * head])
    # tiny-qwen3 is Qwen3: q_norm and k_norm (head_dim each) are in the layer count
    assert per == 256 * 256 * 2 + 2 * 256 * 128 + 2 * 64 + 2 * 256 + 3 * 256 * 768


def test_w8a8_is_one_byte_plus_a_fp32_scale_per_output_channel(tiny_counts):
    per, outs, head, vocab, n_layers = tiny_counts
    p = plan_paged_decoder(TINY, "rk3588-8g", scheme="w8a8", context=64, window=1, segments=2)
    layer = per + 4 * outs
    assert p.segment_bytes == (2 * layer, 2 * layer + head + 4 * vocab)


@pytest.mark.parametrize("segments", [1, 3, 4])
def test_layers_are_grouped_like_numpy_array_split(tiny_counts, segments):
    per, _, head, _, n_layers = tiny_counts
    groups = [len(g) for g in np.array_split(np.arange(n_layers), segments)]
    p = plan_paged_decoder(TINY, "rk3588-8g", scheme="fp16", context=64, window=1, segments=segments)
    expected = [2 * per * g for g in groups]
    expected[-1] += 2 * head
    assert list(p.segment_bytes) == expected


def test_llama_has_no_qk_norm(tmp_path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    m = LlamaForCausalLM(cfg)
    cfg.save_pretrained(tmp_path)
    per = _numel(m.model.layers[0])
    head = _numel(m.model.norm) + _numel(m.lm_head)
    p = plan_paged_decoder(str(tmp_path), "rk3588-16g", scheme="fp16", context=32, window=1, segments=3)
    assert p.segment_bytes == (2 * per, 2 * per, 2 * per + 2 * head)


@pytest.mark.parametrize("window", [1, 2, 3])
def test_resident_bytes_are_the_pinned_prefix_and_the_largest_streamed_segment(window):
    # tiny-qwen3 fits the board: pages come from DRAM, no prefetch, so W-1 segments are pinned
    p = plan_paged_decoder(TINY, "rk3588-8g", scheme="fp16", context=64, window=window, segments=4)
    s = list(p.segment_bytes)
    assert p.resident_bytes == sum(s[:window - 1]) + max(s[window - 1:])
    assert p.resident_bytes == s[3] + s[0] * (window - 1)  # the last segment (with the head) is the largest


def test_kv_bytes_equal_the_planner_and_the_formula():
    from edgeinfer.planning.planner import plan

    p = plan_paged_decoder(TINY, "rk3588-8g", scheme="fp16", context=100, window=2, segments=4)
    # 2 (K, V) × layers × kv_heads × head_dim × ctx × 2 B
    assert p.kv_bytes == 2 * 4 * 2 * 64 * 100 * 2
    assert p.kv_bytes == plan(TINY, "rk3588-8g", quant="fp16", ctx=100, runtime="rknn").breakdown["kv_cache"]


def test_dram_page_in_adds_to_compute_when_the_model_fits_the_board():
    b = _board("rk3588-8g")
    bw = b["bandwidth_gbps"]["value"] * GB
    c = b["runtimes"]["rknn"]["speed"]["fp16"]
    p = plan_paged_decoder(TINY, "rk3588-8g", scheme="fp16", context=64, window=2, segments=4)
    total = sum(p.segment_bytes)
    compute = c["t0_ms"] / 1000 + (total + p.kv_bytes) / (c["bw_fraction"] * bw)
    page_in = 2 * sum(p.segment_bytes[1:]) / bw  # segment 0 pinned; a DRAM-to-DRAM copy reads and writes
    assert p.compute_s_per_token == pytest.approx(compute, rel=1e-9)
    assert p.page_in_s_per_token == pytest.approx(page_in, rel=1e-9)
    assert p.tokens_per_s == pytest.approx(1 / (compute + page_in), rel=1e-3)
    assert p.paged_cost_pct == pytest.approx(100 * page_in / (compute + page_in), abs=0.01)


def test_unpaged_is_all_resident_and_costs_nothing():
    p = plan_paged_decoder(TINY, "rk3588-8g", scheme="fp16", context=64, window=None, segments=4)
    assert p.resident_bytes == sum(p.segment_bytes) and p.window == 4
    assert p.page_in_s_per_token == 0 and p.paged_cost_pct == 0
    assert p.tokens_per_s == pytest.approx(1 / p.compute_s_per_token, rel=1e-3)


def test_storage_page_in_overlaps_compute_when_the_model_does_not_fit():
    # Qwen3-8B w8a8 does not fit an 8 GB board: non-resident segments stream from storage
    p = plan_paged_decoder("Qwen/Qwen3-8B", "rk3588-8g", scheme="w8a8", context=4096, window=12, segments=36,
                           storage="nvme")
    page_in = sum(p.segment_bytes[10:]) / (3.94 * GB)  # prefetch from storage: W-2 = 10 segments pinned
    assert p.page_in_s_per_token == pytest.approx(page_in, rel=1e-9)
    assert p.tokens_per_s == pytest.approx(1 / max(p.compute_s_per_token, page_in), rel=1e-3)
    assert p.resident_bytes == 11 * p.segment_bytes[0] + p.segment_bytes[-1]
    assert p.resident_bytes < 4 * 2**30  # inside one NPU IOMMU window


@pytest.mark.parametrize("kw, needle", [
    ({"segments": 5}, "segments must be 1..4"),
    ({"segments": 0}, "segments must be 1..4"),
    ({"window": 0}, "window must be a positive"),
])
def test_bad_arguments_are_input_errors(kw, needle):
    args = {"scheme": "fp16", "context": 64, "window": 1, "segments": 4, **kw}
    with pytest.raises(InputError, match=needle):
        plan_paged_decoder(TINY, "rk3588-8g", **args)


def test_cli_plan_paging_prints_the_cost_and_matches_the_api(capfd):
    proc = run_cli(capfd, "plan", TINY, "--board", "rk3588-8g", "--quant", "fp16", "--ctx", "64", "--paging", "2",
                     "--segments", "4", "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    pg = d["memory"]["details"]["paging"]
    api = plan_paged_decoder(TINY, "rk3588-8g", scheme="fp16", context=64, window=2, segments=4)
    assert d["options"]["runtime"] == "rknn"
    assert pg["npu_resident_bytes"] == api.resident_bytes and pg["segment_bytes"] == list(api.segment_bytes)
    assert pg["decode_tokens_per_s"] == pytest.approx(api.tokens_per_s)
    assert pg["paged_cost_pct"] == pytest.approx(api.paged_cost_pct)
    # weights in memory: the resident window + the host's fp16 embedding table
    assert d["memory"]["breakdown"]["weights"] == api.resident_bytes + 3072 * 256 * 2
    text = run_cli(capfd, "plan", TINY, "--board", "rk3588-8g", "--quant", "fp16", "--paging", "2", "--segments", "4")
    assert text.returncode == 0 and "paging costs" in text.stdout


def test_cli_plan_paging_refuses_the_vendor_runtime(capfd):
    proc = run_cli(capfd, "plan", "Qwen/Qwen3-8B", "--board", "rk3588-8g", "--runtime", "rkllm", "--paging", "4")
    assert proc.returncode == 2 and "rkllm runs whole models" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_plan_paging_imports_no_torch():
    code = ("import sys; sys.argv=['edgeinfer','plan','Qwen/Qwen3-8B','--board','rk3588-8g','--paging','4',"
            "'--json']\nfrom edgeinfer.cli import main\ntry:\n main()\nexcept SystemExit:\n pass")
    heavy = imported_modules(code) & set(HEAVY)
    assert not heavy, f"edgeinfer plan --paging pulled in {sorted(heavy)}"


def test_a_board_without_a_backend_runtime_keeps_the_generic_suggestion(tmp_path):
    from edgeinfer.planning.planner import plan

    b = tmp_path / "tiny-board.yaml"
    b.write_text(yaml.safe_dump({
        "name": "tiny-board", "title": "t", "family": "t", "backend": "x", "memory_kind": "shared",
        "memory_total_gib": {"value": 0.01, "source": "test"}, "os_reserve_gib": {"value": 0, "source": "test"},
        "runtimes": {"r": {"schemes": ["fp32"], "kinds": ["decoder"], "source": "test"}}, "default_runtime": "r"}))
    p = plan(TINY, str(b), ctx=1024)
    assert not p.fits and p.runtime == "r"  # no backend runtime: nothing to page a decoder on, no error


# --- plan's paging suggestion and `--paging auto`'s choice (planning.decoder_paging.choose) ---------------
TINY_WINDOW_GIB = 5 / 1024  # an NPU IOMMU window of 5 MiB: tiny-qwen3's 7.3 MiB of fp16 weights exceed it


def _tiny_window_board(tmp_path) -> str:
    data = _board("rk3588-8g")
    data["name"], data["npu_window_gib"]["value"] = "rk3588-tiny-window", TINY_WINDOW_GIB
    path = tmp_path / "rk3588-tiny-window.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _tiny_segments() -> list[int]:
    """fp16 bytes of tiny-qwen3's one-layer segments, from config.json: a Qwen3 block each, the last with the
    final norm and the (tied, copied) head."""
    c = json.loads((model_dir() / "config.json").read_text())
    h, d, i = c["hidden_size"], c["head_dim"], c["intermediate_size"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    block = h * q + 2 * h * kv + q * h + 2 * d + 3 * h * i + 2 * h
    return [2 * block] * 3 + [2 * (block + h + c["vocab_size"] * h)]


def test_choose_pages_a_decoder_only_when_its_weights_exceed_the_board_or_one_npu_window(tmp_path):
    from edgeinfer.planning.decoder_paging import choose
    from edgeinfer.planning.planner import plan

    assert choose(plan(TINY, "rk3588-8g", quant="fp16", ctx=16, runtime="rknn")) is None  # 7 MiB fit 4 GiB
    seg = _tiny_segments()
    # no prefetch (the pages come from DRAM): W-1 pinned + the largest streamed segment resident
    fits = [w for w in range(1, 4) if sum(seg[:w - 1]) + max(seg[w - 1:]) <= TINY_WINDOW_GIB * 2**30]
    p = plan(TINY, _tiny_window_board(tmp_path), quant="fp16", ctx=16, runtime="rknn")
    assert p.fits  # the window is a warning unpaged (a newer driver maps it); paging answers it
    assert choose(p) == (max(fits), 4)


def test_plan_suggests_the_paging_with_its_cost_in_text_and_json(tmp_path, capfd):
    board = _tiny_window_board(tmp_path)
    args = ("plan", TINY, "--board", board, "--quant", "fp16", "--ctx", "16", "--runtime", "rknn")
    d = json.loads(run_cli(capfd, *args, "--json").stdout)["suggestions"]["paging"]
    api = plan_paged_decoder(TINY, board, scheme="fp16", context=16, window=d["window"], segments=4)
    assert (d["window"], d["segments"]) == (2, 4) and "NPU IOMMU window" in d["why"]
    assert d["npu_resident_bytes"] == api.resident_bytes
    assert d["decode_tokens_per_s"] == pytest.approx(api.tokens_per_s)
    assert d["paged_cost_pct"] == pytest.approx(api.paged_cost_pct)
    text = run_cli(capfd, *args)
    assert text.returncode == 0 and "paging suggested" in text.stdout and "--paging 2 --segments 4" in text.stdout
    plain = json.loads(run_cli(capfd, "plan", TINY, "--board", "rk3588-8g", "--ctx", "16", "--runtime", "rknn",
                               "--json").stdout)
    assert plain["suggestions"]["paging"] is None


def test_resident_floor_never_exceeds_the_replayed_peak():
    """plan skips the paging windows whose floor already overflows the board or its NPU window (no schedule
    replay); the floor must stay at or under the peak the replay finds, with and without prefetch."""
    import random

    from edgeinfer.planning import decoder_segments as ds

    rng, tight = random.Random(7), 0
    for _ in range(400):
        n = rng.randint(2, 40)
        seg = [rng.randint(1, 1000) for _ in range(n)]
        if rng.random() < 0.3:  # a decoder: equal layers, the head in the last segment
            seg = [500] * (n - 1) + [500 + rng.randint(0, 900)]
        w = rng.randint(1, n - 1)
        floor = ds.resident_floor(seg, w)
        peaks = [ds.resident_bytes(seg, w, prefetch) for prefetch in (False, True)]
        assert floor <= min(peaks), (seg, w, floor, peaks)
        tight += floor == min(peaks)
    assert tight > 20, tight  # reached in some cases: a floor of 0 would hold and prune nothing
