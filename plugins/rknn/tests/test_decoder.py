"""RKNN decoders in the rknn-toolkit2 simulator (target rk3588): the decoder conformance kit, fp16 greedy
tokens against transformers fp32, layer paging (W = 1, 2) against the unpaged decoder, w8a8 against the
decoder golden check, scheme refusals.

Expected tokens come from transformers' own ``generate`` (the kit's reference_greedy); expected weight
and KV bytes from the model's config.json, counted here by formula — never from the decoder under test.
Each artifact is converted once per session.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import numpy as np
import pytest

import edgeinfer
from edgeinfer.errors import InputError
from edgeinfer.planning.decoder_paging import plan_paged_decoder
from edgeinfer.run.generation import golden
from edgeinfer.run.generation.generator import Generator
from edgeinfer.run.generation.text import TextCodec
from edgeinfer.testing import DecoderConformance
from edgeinfer.testing.cli import run_cli
from edgeinfer.testing.decoder_conformance import PROMPTS, reference_greedy
from edgeinfer.testing.llm import model_dir

CTX = 64
PAGED_SEGMENTS = 3  # layers [0,2) [2,3) [3,4): array_split of 4 layers
PAGED_TOKENS = 3
CALIBRATION = ["The licence grants permission to use, copy and modify the software.",
               "Permission is hereby granted, free of charge, to any person obtaining a copy.",
               "def main():\n    print('hello world')\n    return 0",
               "THE SOFTWARE IS PROVIDED AS IS, WITHOUT WARRANTY OF ANY KIND."]


class TestRknnDecoders(DecoderConformance):
    backend_name = "rknn"
    device = "simulator"
    kv_bytes_per_element = 2  # the host KV cache is float16: what the NPU graph computes in
    context = CTX
    # keys read back from the cache instead of computed in the same call: another fp16 summation order,
    # measured 0.0078 (4 fp16 ulps at |logit| < 4) on the test model
    chunked_prefill_atol = 2e-2

    @pytest.fixture(scope="class")
    @classmethod
    def generator(cls, unpaged):
        """The kit's decoder (the Hugging Face directory on the simulator at this class's context, no options)
        is the module's ``unpaged`` one: every simulator load builds the model again (~8 s), so it loads once."""
        assert (cls.device, cls.context, cls.load_options) == ("simulator", CTX, {})
        return unpaged


@pytest.fixture(scope="session")
def rknn():
    return edgeinfer.backend("rknn")


@pytest.fixture(scope="session")
def config() -> dict:
    return json.loads((model_dir() / "config.json").read_text())


@pytest.fixture(scope="session")
def paged_artifact(rknn, tmp_path_factory):
    out = tmp_path_factory.mktemp("rknn-llm") / "fp16-paged"
    return rknn.quantize_decoder(model_dir(), "fp16", CTX, out, segments=PAGED_SEGMENTS)


@pytest.fixture(scope="session")
def unpaged(rknn):
    """The Hugging Face directory opened directly: converted once into the conversion cache (the same
    entry as the conformance kit's decoder)."""
    d = rknn.load_decoder(model_dir(), device="simulator", context=CTX)
    with Generator(d, TextCodec(model_dir())) as g:
        yield g


@pytest.fixture(scope="session")
def prompt_ids(unpaged) -> list[int]:
    return unpaged.prompt_ids(PROMPTS[0])


@pytest.fixture(scope="session")
def paged_reference(prompt_ids) -> list[int]:
    """transformers' greedy tokens for the paged tests (the same for every window): computed once."""
    return reference_greedy(model_dir(), prompt_ids, PAGED_TOKENS)


def layer_params(c: dict) -> int:
    """Parameters of one Qwen3 block, from config.json: attention, q/k norms, SwiGLU MLP, two RMSNorms."""
    h, d, i = c["hidden_size"], c["head_dim"], c["intermediate_size"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    return h * q + 2 * h * kv + q * h + 2 * d + 3 * h * i + 2 * h


def expected_segment_bytes(c: dict, ranges: list[tuple[int, int]], bytes_per_weight: int) -> list[int]:
    last = c["hidden_size"] + c["vocab_size"] * c["hidden_size"]  # final norm + head (tied: a copy on the NPU)
    return [((b - a) * layer_params(c) + (last if b == c["num_hidden_layers"] else 0)) * bytes_per_weight
            for a, b in ranges]


def test_fp16_greedy_tokens_equal_transformers_fp32(unpaged, prompt_ids, config):
    want = reference_greedy(model_dir(), prompt_ids, 24)
    assert unpaged.generate(PROMPTS[0], max_new_tokens=24).token_ids == want
    d = unpaged.decoder
    assert d.segment_bytes == expected_segment_bytes(config, [(0, 4)], 2)
    assert d.peak_resident_bytes == d.segment_bytes[0]  # one segment, loaded once
    kv = config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * config["head_dim"] * CTX * 2
    assert d.kv_cache_bytes == kv


def test_the_unpaged_plan_holds_the_weights_and_prefill_chunk_the_export_builds(unpaged, config):
    from edgeinfer_rknn.targets import CONVERSION_DEFAULTS

    from edgeinfer.planning.planner import plan

    p = plan(model_dir(), "rk3588-8g", quant="fp16", ctx=CTX, runtime="rknn")
    host_table = config["vocab_size"] * config["hidden_size"] * 2  # fp16 on the host, besides the NPU's head
    assert p.breakdown["weights"] == sum(expected_segment_bytes(config, [(0, 4)], 2)) + host_table
    assert p.breakdown["weights"] == sum(unpaged.decoder.segment_bytes) + host_table
    assert p.details.activations.tokens_per_step == CONVERSION_DEFAULTS["prefill_chunk"] == unpaged.decoder.chunk


def test_a_window_larger_than_the_segments_loads_everything_once(rknn, paged_artifact):
    d = rknn.load_decoder(paged_artifact, device="simulator", context=CTX, window=4)
    try:
        n = 2 * PAGED_SEGMENTS  # the decode and the prefill graph of every segment, at load
        assert d.window == PAGED_SEGMENTS and d.paging_stats()["page_ins"] == n
        logits = d.prefill(0, np.asarray([5, 6, 7], dtype=np.int64))
        d.decode([0], np.asarray([int(np.argmax(logits))]))
        assert logits.shape == (d.vocab_size,) and d.paging_stats()["page_ins"] == n
    finally:
        d.close()


@pytest.mark.parametrize("window", [1, 2])
def test_paged_decoder_gives_the_unpaged_tokens(rknn, paged_artifact, unpaged, paged_reference, config, window):
    want = unpaged.generate(PROMPTS[0], max_new_tokens=PAGED_TOKENS).token_ids
    assert want == paged_reference
    d = rknn.load_decoder(paged_artifact, device="simulator", context=CTX, window=window)
    with Generator(d, TextCodec(model_dir())) as g:
        got = g.generate(PROMPTS[0], max_new_tokens=PAGED_TOKENS).token_ids
        stats = d.paging_stats()
    assert got == want
    seg = expected_segment_bytes(config, [(0, 2), (2, 3), (3, 4)], 2)
    assert d.segment_bytes == seg
    # W-1 pinned (the first), one streaming slot: the largest resident set the schedule reaches
    assert d.peak_resident_bytes == sum(seg[:window - 1]) + max(seg[window - 1:])
    passes = PAGED_TOKENS  # one prefill pass, then one decode pass per further token
    # a pinned segment loads its prefill and its decode graph once; each streamed one, per pass, the pass's graph
    assert stats["page_ins"] == 2 * (window - 1) + passes * (PAGED_SEGMENTS - (window - 1))
    assert stats["pinned"] == window - 1 and stats["window"] == window
    assert d.kv_cache_bytes == unpaged.decoder.kv_cache_bytes
    # what `edgeinfer plan --paging W --segments 3` predicts for the board, against what ran
    plan = plan_paged_decoder(model_dir(), "rk3588-8g", scheme="fp16", context=CTX, window=window,
                              segments=PAGED_SEGMENTS)
    assert plan.resident_bytes == pytest.approx(d.peak_resident_bytes, rel=0.01)
    assert list(plan.segment_bytes) == pytest.approx(d.segment_bytes, rel=0.01)
    assert plan.kv_bytes == d.kv_cache_bytes


REBUILT = "edgeinfer: rebuilding from the recorded recipe for the simulator"  # what each rebuild logs


def test_simulator_page_ins_take_the_graphs_this_process_built(rknn, paged_artifact):
    """Window 1 pages every segment in on every pass, as on a board; the simulator builds each graph at most
    once in the process (its pool) instead of on every page-in, and labels its page-in times."""
    logs = sorted(paged_artifact.glob("seg*.rknn.log"))
    before = [log.read_text().count(REBUILT) for log in logs]
    d = rknn.load_decoder(paged_artifact, device="simulator", context=CTX, window=1)
    try:
        logits = d.prefill(0, np.asarray([5, 6, 7], dtype=np.int64))
        for _ in range(PAGED_TOKENS):
            logits = d.decode([0], np.asarray([int(np.argmax(logits))]))[0]
        stats = d.paging_stats()
    finally:
        d.close()
    assert stats["page_ins"] == (1 + PAGED_TOKENS) * PAGED_SEGMENTS  # every segment, every pass
    assert stats["page_outs"] == stats["page_ins"] - 1
    assert all(log.read_text().count(REBUILT) - b <= 1 for log, b in zip(logs, before))
    assert any(n.startswith("simulator figures: a page-in takes the segment graph") for n in stats["notes"])


def test_a_segments_graphs_share_one_copy_of_its_source_weights(paged_artifact, config):
    """Each segment's decode and prefill sources point at one weights file holding each of its weights once
    (norms of 64 weights, under 1 KiB, stay in the graphs), in fp32 as exported."""
    from edgeinfer_rknn import shared_weights

    manifest = json.loads((paged_artifact / "rknn-decoder.json").read_text())
    ranges = [tuple(s["layers"]) for s in manifest["segments"]]
    small = 2 * config["head_dim"]  # a layer's q and k norms
    for k, ((a, b), want) in enumerate(zip(ranges, expected_segment_bytes(config, ranges, 4))):
        store = paged_artifact / f"seg{k}.rknn.src.weights"
        sources = sorted(paged_artifact.glob(f"seg{k}.*.rknn.src.onnx"))
        assert len(sources) == 2  # decode, prefill
        assert all(shared_weights.locations(s) == {store.name} for s in sources)
        assert store.stat().st_size == want - 4 * small * (b - a)
        assert all(s.stat().st_size < 100_000 for s in sources)  # the graph alone


def test_a_new_process_rebuilds_the_graphs_from_the_shared_weights(paged_artifact, prompt_ids):
    """The simulator cannot run a .rknn: a process that did not build the graphs rebuilds them from the
    sources, which read the shared weights file, and gives transformers' tokens."""
    code = ("import json, sys, numpy as np, edgeinfer\n"
            "d = edgeinfer.backend('rknn').load_decoder(sys.argv[1], device='simulator', context=int(sys.argv[2]))\n"
            "logits = d.prefill(0, np.asarray(json.loads(sys.argv[3]), dtype=np.int64)); out = []\n"
            "for _ in range(3):\n"
            "    out.append(int(np.argmax(logits))); logits = d.decode([0], np.asarray([out[-1]]))[0]\n"
            "print(json.dumps(out))\n")
    logs = sorted(paged_artifact.glob("seg*.rknn.log"))
    before = [log.read_text().count(REBUILT) for log in logs]
    r = subprocess.run([sys.executable, "-c", code, str(paged_artifact), str(CTX), json.dumps(prompt_ids)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == reference_greedy(model_dir(), prompt_ids, 3)
    assert all(log.read_text().count(REBUILT) > b for log, b in zip(logs, before))  # every graph rebuilt


def test_a_pager_without_a_pool_loads_every_page_in_and_closes_what_it_evicts(rknn, tmp_path):
    """The board's pager (no pool: board_decoder's graphs, stood in for here) is the one paging always had."""
    from edgeinfer_rknn.decoder import SegmentPager

    class BoardGraphStandIn:
        def __init__(self, art):
            self.art, self.closed = art, False

        def close(self):
            self.closed = True

    segments = []
    for k in range(3):
        (tmp_path / f"seg{k}.decode.rknn").write_bytes(bytes([k]))
        segments.append({"decode": f"seg{k}.decode.rknn", "weight_bytes": 10 * (k + 1)})
    made: list[BoardGraphStandIn] = []
    pager = SegmentPager(rknn, tmp_path, segments, 1, "simulator", False,
                         lambda art: made.append(BoardGraphStandIn(art)) or made[-1])
    for _ in range(2):
        for k in range(3):
            assert pager.session(k, "decode") is made[-1]
    pager.release()
    assert [g.art.name for g in made] == [s["decode"] for s in segments] * 2
    assert all(g.closed for g in made) and pager.page_ins == 6 and pager.peak_resident_bytes == 30


def test_w8a8_passes_the_decoder_golden_check(rknn, tmp_path_factory):
    out = tmp_path_factory.mktemp("rknn-llm") / "w8a8"
    rknn.quantize_decoder(model_dir(), "w8a8", CTX, out, CALIBRATION)
    reference = edgeinfer.backend("transformers").load_decoder(model_dir(), context=CTX)
    d = rknn.load_decoder(out, device="simulator", context=CTX)
    with Generator(reference, TextCodec(model_dir())) as ref, Generator(d, TextCodec(model_dir())) as cand:
        report = golden.check(cand, ref, PROMPTS[:2], 16, "w8a8")
    print(golden.summary_line(report))  # near-ties are named in the line (pytest -s)
    for row in report["rows"]:
        print(row["prompt"], "first divergence", row["first_divergence"], "margin",
              row["reference_margin_at_divergence"], "near-tie", row["near_tie"])
    assert report["passed"], golden.summary_line(report)
    assert "near_ties" in report and report["cosine_min"] is not None


def test_w4a16_is_refused_on_rk3588_with_what_it_supports(rknn, tmp_path):
    with pytest.raises(InputError, match=r"rk3588 runs rknn decoders as fp16, w8a8.*rk3576"):
        rknn.quantize_decoder(model_dir(), "w4a16", 16, tmp_path / "d", target="rk3588")
    assert not (tmp_path / "d").exists()


@pytest.fixture
def cli(capfd):
    """``edgeinfer ARGS`` in this process (edgeinfer.testing.cli.run_cli): no interpreter start-up per call."""
    return functools.partial(run_cli, capfd)


def test_w4a16_deploy_to_rk3588_exits_2(tmp_path, cli):
    r = cli("deploy", str(model_dir()), "--board", "rk3588-8g", "--quant", "w4a16", "-o", str(tmp_path / "b"))
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("options, match", [({"segments": 5}, "segments must be an integer from 1 to the model's 4"),
                                            ({"prefill_chunk": 0}, "prefill_chunk must be a positive integer"),
                                            ({"decode_batches": "0,4"}, "decode_batches must be positive integers"),
                                            ({"quantized_method": "layer"}, "apply to quantized schemes only"),
                                            ({"auto_hybrid_cos_thresh": 0.99}, "apply to quantized schemes only")])
def test_bad_conversion_options_are_input_errors(rknn, tmp_path, options, match):
    with pytest.raises(InputError, match=match):
        rknn.quantize_decoder(model_dir(), "fp16", 16, tmp_path / "d", **options)


@pytest.mark.parametrize("thresh", ["x", 0, 1.5])
def test_a_bad_cosine_threshold_is_refused_before_any_export(rknn, tmp_path, thresh):
    with pytest.raises(InputError, match="auto_hybrid_cos_thresh must be a number above 0 and at most 1"):
        rknn.quantize_decoder(model_dir(), "w8a8", 16, tmp_path / "d", CALIBRATION, auto_hybrid_cos_thresh=thresh)
    assert not (tmp_path / "d").exists()


def test_int8_options_reach_every_graph_of_a_quantized_decoder(rknn, tmp_path, monkeypatch):
    """What a failing golden check's hint asks for (more layers kept in fp16, another calibration algorithm)
    reaches the toolkit call of each graph; the first call is stopped, the graphs' conversion is the encoders'
    (tests/test_rknn.py)."""
    seen = []

    def first_graph(model, scheme, calibration, out, **options):
        seen.append((scheme, options))
        raise InputError("stop after the first graph")

    monkeypatch.setattr(rknn, "quantize", first_graph)
    with pytest.raises(InputError, match="stop after the first graph"):
        rknn.quantize_decoder(model_dir(), "w8a8", 16, tmp_path / "d", CALIBRATION, auto_hybrid_cos_thresh="0.995",
                              quantized_algorithm="mmse", quantized_method="layer")
    assert seen == [("w8a8", {"target": "rk3588", "auto_hybrid": True, "auto_hybrid_cos_thresh": "0.995",
                              "quantized_algorithm": "mmse", "quantized_method": "layer"})]


@pytest.mark.slow
def test_deploy_of_the_test_llm_to_rk3588_writes_a_bundle_that_generates(tmp_path, cli):
    """`edgeinfer deploy` end to end: plan, rknn fp16 conversion, golden check in the simulator, bundle (decode
    graphs for one sequence: the batched ones are test_decoder_batches.py's)."""
    from edgeinfer.planning.boards import get_board

    if "decoder" not in get_board("rk3588-8g").runtimes["rknn"].kinds:
        pytest.skip("boards/rk3588-8g.yaml lists no decoder kind for its rknn runtime (planner data)")
    out = tmp_path / "bundle"
    r = cli("deploy", str(model_dir()), "--board", "rk3588-8g", "--ctx", str(CTX), "-o", str(out), "--json",
            "--option", "decode_batches=1")
    assert r.returncode == 0, r.stderr
    assert "batched" not in json.loads(r.stdout)["golden"]  # graphs for one sequence: nothing batched to check
    sc = json.loads(r.stdout)["speed_check"]  # the golden check's decode, timed in the simulator: not a board figure
    assert (sc["board"], sc["ran_on"], sc["board_figure"]) == ("rk3588-8g", "simulator", False)
    assert sc["ratio"] == pytest.approx(sc["decode_tokens_per_s"] / sc["predicted_decode_tokens_per_s"], rel=1e-3)
    g = cli("generate", str(out), "--prompt", PROMPTS[0], "--max-new-tokens", "8", "--json")
    assert g.returncode == 0, g.stderr
    ids = TextCodec(model_dir()).encode(PROMPTS[0])
    assert json.loads(g.stdout)["token_ids"] == reference_greedy(model_dir(), ids, 8)
    # for the board alone: the cached conversion without the segments' simulator sources, which this PC then needs
    slim = tmp_path / "board-only"
    r = cli("deploy", str(model_dir()), "--board", "rk3588-8g", "--ctx", str(CTX), "-o", str(slim), "--json",
            "--option", "decode_batches=1", "--board-only")
    assert r.returncode == 0, r.stderr
    left = json.loads(r.stdout)["left_out"]
    assert left and sorted(left) == sorted(str(f.relative_to(out)) for f in out.rglob("*.src.*"))
    assert not list(slim.rglob("*.src.*")) and cli("verify", str(slim)).returncode == 0
    # a new process: this one keeps the models the golden check just built, which the simulator takes over
    g = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "generate", str(slim), "--prompt", PROMPTS[0],
                        "--max-new-tokens", "2"], capture_output=True, text=True, timeout=600)
    assert g.returncode == 2 and "--board-only" in g.stderr and g.stderr.count("\n") == 1


def test_segments_follow_array_split_and_the_last_holds_the_head():
    from edgeinfer_rknn.decoder_segments import output_names, segment_ranges

    assert segment_ranges(4, 3) == [(0, 2), (2, 3), (3, 4)]
    assert [b - a for a, b in segment_ranges(36, 5)] == [8, 7, 7, 7, 7]
    assert output_names(3, 4, final=True)[0] == "logits" and output_names(0, 2, final=False)[0] == "hidden_2"


def test_host_inputs_pad_a_short_chunk_in_front_so_its_last_token_is_the_row_the_head_reads():
    from edgeinfer_rknn.decoder import step_inputs

    tables = {"embed": np.eye(6, 4, dtype=np.float16), "cos": np.arange(16, dtype=np.float32).reshape(8, 2),
              "sin": np.zeros((8, 2), np.float32)}
    hidden, cos, sin, mask = step_inputs(tables, [1, 2], pos=3, tokens=4, context=8)
    assert hidden.shape == (1, 4, 4) and not hidden[0, :2].any()  # padding rows first: zeros
    assert hidden[0, 2, 1] == 1 and hidden[0, 3, 2] == 1  # token 1 then token 2, the last in the last row
    assert cos[0, 2, 0] == 6 and cos[0, 3, 0] == 8  # rows 2 and 3 rotate as positions 3 and 4
    allowed = mask[0] == 0
    assert allowed[:, :3].all() and not allowed[:, 3:8].any()  # cache slots 0..2 only
    assert allowed[3, 10:12].all() and not allowed[2, 11]  # row 3 sees rows 2 and 3; row 2 not row 3
    assert not allowed[2:, 8:10].any()  # no real row attends a padding row


def test_an_allocation_larger_than_one_npu_iommu_window_is_refused():
    from edgeinfer_rknn.board_decoder import check_window

    check_window((4 << 30) - 1, "weights")
    with pytest.raises(InputError, match="4 GiB IOMMU window; convert with more segments"):
        check_window(4 << 30, "segment 0's weights")


LAYOUT_C = r"""
#include <stdio.h>
#include <stdint.h>
#include <stddef.h>
/* the structs as rknn_api.h declares them (github.com/airockchip/rknn-toolkit2, rknpu2 runtime include) */
typedef enum { F0 } rknn_tensor_format; typedef enum { T0 } rknn_tensor_type;
typedef enum { Q0 } rknn_tensor_qnt_type;
typedef struct { uint32_t index; uint32_t n_dims; uint32_t dims[16]; char name[256]; uint32_t n_elems; uint32_t size;
  rknn_tensor_format fmt; rknn_tensor_type type; rknn_tensor_qnt_type qnt_type; int8_t fl; int32_t zp; float scale;
  uint32_t w_stride; uint32_t size_with_stride; uint8_t pass_through; uint32_t h_stride; } rknn_tensor_attr;
typedef struct { void* virt_addr; uint64_t phys_addr; int32_t fd; int32_t offset; uint32_t size; uint32_t flags;
  void* priv_data; } rknn_tensor_mem;
typedef struct { uint32_t total_weight_size; uint32_t total_internal_size; uint64_t total_dma_allocated_size;
  uint32_t total_sram_size; uint32_t free_sram_size; uint32_t reserved[10]; } rknn_mem_size;
int main(void) {
  printf("%zu %zu %zu %zu %zu %zu\n", sizeof(rknn_tensor_attr), offsetof(rknn_tensor_attr, pass_through),
         offsetof(rknn_tensor_attr, h_stride), sizeof(rknn_tensor_mem), offsetof(rknn_tensor_mem, size),
         sizeof(rknn_mem_size));
  return 0;
}
"""


def test_board_ctypes_structs_have_the_c_layout(tmp_path):
    """The board path never runs here; its ctypes structs must at least lay out as the C compiler lays out
    the header's declarations (sizes and offsets on this machine's ABI)."""
    import ctypes
    import shutil

    from edgeinfer_rknn.board_decoder import MemSize, TensorAttr, TensorMem

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    (tmp_path / "layout.c").write_text(LAYOUT_C)
    subprocess.run([cc, str(tmp_path / "layout.c"), "-o", str(tmp_path / "layout")], check=True)
    want = subprocess.run([str(tmp_path / "layout")], capture_output=True, text=True, check=True).stdout.split()
    got = [ctypes.sizeof(TensorAttr), TensorAttr.pass_through.offset, TensorAttr.h_stride.offset,
           ctypes.sizeof(TensorMem), TensorMem.size.offset, ctypes.sizeof(MemSize)]
    assert [int(w) for w in want] == got
