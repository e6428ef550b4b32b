"""Layer-paged execution (edgeinfer.run.paged): split, paged sessions on every installed backend, the
window invariant, background-load errors, bad cuts, the CLI and the planner's cost model."""

from __future__ import annotations

import functools
import json
import threading
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.contract import registry as plugins
from edgeinfer.errors import EdgeInferError, InputError
from edgeinfer.planning import paging
from edgeinfer.run import paged as paged_mod
from edgeinfer.run import segments as seg_mod
from edgeinfer.run import split as split_mod
from edgeinfer.testing.cli import run_cli
from edgeinfer.testing.models import deep_stack

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

LAYERS, DIM = 12, 32




def numpy_deep_stack(x: np.ndarray, path: Path) -> np.ndarray:
    """The reference computed from the weights with NumPy (independent of onnxruntime)."""
    w = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
    for i in range(LAYERS):
        x = x + np.maximum(x @ w[f"layers.{i}.weight"] + w[f"layers.{i}.bias"], 0)
    return x * w["head.scale"]


def ort_run(path: Path, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.fixture(scope="module")
def deep(tmp_path_factory) -> Path:
    return deep_stack(tmp_path_factory.mktemp("deep") / "deep.onnx")


@pytest.fixture(scope="module")
def deep6(deep, tmp_path_factory) -> list[split_mod.SegmentInfo]:
    return split_mod.split_onnx(deep, tmp_path_factory.mktemp("deep6"), segments=6)


@pytest.fixture()
def x() -> np.ndarray:
    return np.random.default_rng(5).standard_normal((3, DIM)).astype(np.float32)


class CountingBackend:
    """The real onnxruntime backend, counting live sessions and load threads from the outside."""

    def __init__(self, fail_segment: str | None = None):
        self.inner = plugins.get_backend("onnxruntime")
        self.name = "onnxruntime"
        self.live = 0
        self.max_live = 0
        self.loads: list[str] = []
        self.threads: set[str] = set()
        self.fail_segment = fail_segment
        self._lock = threading.Lock()

    def __getattr__(self, name):  # the rest of the contract (paging_limit, artifact_files, ...) is the real one
        return getattr(self.inner, name)

    def load(self, artifact, device=None, **options):
        if self.fail_segment and Path(artifact).name == self.fail_segment and \
                threading.current_thread() is not threading.main_thread():
            raise RuntimeError("disk read error while loading (injected)")
        sess = self.inner.load(artifact, device=device, **options)
        with self._lock:
            self.live += 1
            self.max_live = max(self.max_live, self.live)
            self.loads.append(Path(artifact).name)
            self.threads.add(threading.current_thread().name)
        release = sess.release

        def counted_release():
            with self._lock:
                self.live -= 1
            release()

        sess.release = counted_release
        return sess


# --- splitting ---------------------------------------------------------------------------------------


def test_split_finds_the_blocks_and_every_segment_is_valid_and_chains(deep, deep6):
    assert len(deep6) == 6
    assert [s.blocks for s in deep6][0] == ["/layers.0", "/layers.1"]
    for k, seg in enumerate(deep6):
        model = onnx.load(str(seg.path))
        onnx.checker.check_model(model, full_check=True)
        if k:
            assert seg.inputs == deep6[k - 1].outputs == [f"/layers.{2 * k - 1}/out"]
    assert deep6[-1].outputs == ["y"]
    index = json.loads((deep6[0].path.parent / split_mod.INDEX).read_text())
    assert [s["path"] for s in index["segments"]] == [f"segment_{k:02d}.onnx" for k in range(6)]


def test_segments_hold_only_the_weights_they_use(deep, deep6):
    whole = onnx.load(str(deep))
    total = sum(onnx.numpy_helper.to_array(t).nbytes for t in whole.graph.initializer)
    assert sum(s.weight_bytes for s in deep6) == total
    for k, seg in enumerate(deep6):
        names = {t.name for t in onnx.load(str(seg.path)).graph.initializer}
        want = {f"layers.{i}.{w}" for i in (2 * k, 2 * k + 1) for w in ("weight", "bias")}
        assert names == want | ({"head.scale"} if k == 5 else set())


def test_chained_segments_equal_the_whole_model_bitwise(deep, deep6, x):
    env = {"x": x}
    for seg in deep6:
        sess = ort.InferenceSession(str(seg.path), providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        env.update(zip(names, sess.run(names, {i.name: env[i.name] for i in sess.get_inputs()})))
    assert np.array_equal(env["y"], ort_run(deep, {"x": x})[0])
    np.testing.assert_allclose(env["y"], numpy_deep_stack(x, deep), rtol=1e-4, atol=1e-4)


def test_user_cuts_make_the_segments_they_name(deep, tmp_path, x):
    segs = split_mod.split_onnx(deep, tmp_path, cuts=["/layers.3/out", "/layers.7/out"])
    assert [s.inputs for s in segs] == [["x"], ["/layers.3/out"], ["/layers.7/out"]]
    be = plugins.get_backend("onnxruntime")
    with paged_mod.PagedSession.from_artifacts(be, [s.path for s in segs], window=1) as sess:
        assert np.array_equal(sess.run({"x": x})["y"], ort_run(deep, {"x": x})[0])


@pytest.mark.parametrize(
    ("cuts", "words"),
    [
        (["/layers.3/nope"], "no tensor of that name"),
        (["/layers.3/relu"], "not a layer boundary"),  # the block input crosses it as well
        (["x"], "model input or weight"),
        (["layers.2.weight"], "model input or weight"),
        (["/layers.7/out", "/layers.3/out"], "model order"),
        (["y"], "leaves nothing after it"),
    ],
)
def test_bad_cuts_are_one_line_input_errors(deep, tmp_path, cuts, words):
    with pytest.raises(InputError) as e:
        split_mod.split_onnx(deep, tmp_path, cuts=cuts)
    assert words in e.value.one_line() and "\n" not in str(e.value)


def test_bad_segment_counts(deep, tmp_path):
    with pytest.raises(InputError, match="more than the model's 12 blocks"):
        split_mod.split_onnx(deep, tmp_path, segments=13)
    with pytest.raises(InputError, match="either a number of segments or the tensors"):
        split_mod.split_onnx(deep, tmp_path)
    with pytest.raises(InputError, match="positive integer"):
        split_mod.split_onnx(deep, tmp_path, segments=0)


def test_a_model_without_blocks_asks_for_cuts(tmp_path):
    from edgeinfer.testing import models

    kit = models.mlp(tmp_path)
    with pytest.raises(InputError, match="no repeated blocks"):
        split_mod.split_onnx(kit.path, tmp_path / "out", segments=2)


# --- the paged session ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("window", "prefetch"),
                         [(1, False), (2, False), (2, True), (3, True), (4, False), (6, True)])
def test_paged_outputs_are_bitwise_and_the_window_holds(deep, deep6, x, window, prefetch):
    be = CountingBackend()
    ref = ort_run(deep, {"x": x})[0]
    with paged_mod.PagedSession(be, [s.path for s in deep6], window=window, prefetch=prefetch) as sess:
        for _ in range(3):
            assert np.array_equal(sess.run({"x": x})["y"], ref)
        st = sess.stats()
        assert len(sess.resident_segments) <= window
    assert be.max_live <= window  # counted outside the session: never more than W loaded at once
    assert st["peak_resident_segments"] <= window
    assert be.live == 0  # close released everything


def test_steady_state_pages_in_every_non_resident_segment_once_per_run(deep6, x):
    """Documented policy: W-1 segments stay (W-2 with prefetch), the rest stream once per run."""
    for window, prefetch, per_run in ((1, False, 6), (2, False, 5), (4, False, 3), (4, True, 4), (6, True, 0)):
        be = CountingBackend()
        with paged_mod.PagedSession(be, [s.path for s in deep6], window=window, prefetch=prefetch) as sess:
            sess.run({"x": x})
            sess.wait_prefetch()  # the next run's first segment may be loading in the background
            before = len(be.loads)
            for _ in range(3):
                sess.run({"x": x})
            sess.wait_prefetch()
            assert (len(be.loads) - before) / 3 == per_run, (window, prefetch)


def test_prefetch_loads_on_one_background_thread(deep6, x):
    be = CountingBackend()
    with paged_mod.PagedSession(be, [s.path for s in deep6], window=3, prefetch=True) as sess:
        for _ in range(2):
            sess.run({"x": x})
        assert sess.stats()["prefetched"] > 0
    background = be.threads - {threading.main_thread().name}
    assert len(background) == 1 and next(iter(background)).startswith("edgeinfer-prefetch")


def test_background_load_failure_is_a_clear_error(deep6, x):
    be = CountingBackend(fail_segment="segment_03.onnx")
    with pytest.raises(EdgeInferError) as e:
        with paged_mod.PagedSession(be, [s.path for s in deep6], window=3, prefetch=True) as sess:
            sess.run({"x": x})  # segments load in line once at open (specs), then in the background
    msg = e.value.one_line()
    assert "segment 3" in msg and "background" in msg and "disk read error" in msg


def test_bad_paging_options(deep6):
    be = plugins.get_backend("onnxruntime")
    paths = [s.path for s in deep6]
    with pytest.raises(InputError, match="window must be an integer >= 1"):
        paged_mod.PagedSession.from_artifacts(be, paths, window=0)
    with pytest.raises(InputError, match="leaves no room to page"):
        paged_mod.PagedSession.from_artifacts(be, paths, window=2, resident_prefix=2)
    with pytest.raises(InputError, match="segment artifact not found"):
        paged_mod.PagedSession.from_artifacts(be, paths + [paths[0].with_name("missing.onnx")])


# --- MiniLM, the real model ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm_feeds():
    from edgeinfer.testing import minilm

    return minilm.tokenize(minilm.heldout_sentences(4))


@pytest.fixture(scope="module")
def minilm_split(minilm_onnx, module_tmp):
    return split_mod.split_onnx(minilm_onnx, module_tmp / "minilm6", segments=6)


def test_minilm_splits_into_its_six_layers_with_the_mask_carried(minilm_split):
    assert [s.blocks for s in minilm_split] == [[f"/bert/encoder/layer.{k}"] for k in range(6)]
    for k, seg in enumerate(minilm_split[1:], start=1):
        assert seg.inputs[0] == f"/bert/encoder/layer.{k - 1}/output/LayerNorm/LayerNormalization_output_0"
        assert len(seg.inputs) == 2  # the residual stream and the extended attention mask (a side tensor)
    assert minilm_split[0].side == [] and minilm_split[1].side == [minilm_split[2].inputs[1]]
    assert minilm_split[0].weight_bytes > 5 * minilm_split[1].weight_bytes  # embeddings live in segment 0


def test_minilm_paged_on_onnxruntime_is_bitwise(minilm_onnx, minilm_split, minilm_feeds):
    ref = ort_run(minilm_onnx, minilm_feeds)[0]
    be = plugins.get_backend("onnxruntime")
    with paged_mod.PagedSession.from_artifacts(be, [s.path for s in minilm_split], window=2, prefetch=True) as sess:
        for _ in range(2):
            assert np.array_equal(sess.run(minilm_feeds)["last_hidden_state"], ref)


def test_minilm_cut_at_a_layer_output_and_a_bad_cut(minilm_onnx, tmp_path, minilm_feeds):
    good = "/bert/encoder/layer.2/output/LayerNorm/LayerNormalization_output_0"
    segs = split_mod.split_onnx(minilm_onnx, tmp_path / "ok", cuts=[good])
    assert len(segs) == 2 and segs[0].residual == [good] and len(segs[0].side) == 1
    with pytest.raises(InputError, match="not a layer boundary"):
        split_mod.split_onnx(minilm_onnx, tmp_path / "bad",
                          cuts=["/bert/encoder/layer.2/attention/self/query/MatMul_output_0"])


# (every backend's paged runs, of the deep stack and of MiniLM, its profile notes and feed checks are in the
# conformance kit: edgeinfer.testing.conformance)


# --- CLI --------------------------------------------------------------------------------------------------


@pytest.fixture
def cli(capfd):
    """``edgeinfer ARGS`` in this process (edgeinfer.testing.cli.run_cli): what the command answers."""
    return functools.partial(run_cli, capfd)


def test_cli_run_paged_matches_the_plain_run(deep, tmp_path, x, cli):
    np.save(tmp_path / "x.npy", x)
    env = {"EDGEINFER_CACHE_DIR": str(tmp_path / "cache")}
    paged = cli("run", str(deep), "--backend", "onnxruntime", "--paging", "2", "--segments", "4",
                    "-i", f"x={tmp_path / 'x.npy'}", "--out", str(tmp_path / "paged"), "--json", env=env)
    assert paged.returncode == 0, paged.stderr
    report = json.loads(paged.stdout)
    assert report["paging"]["segments"] == 4 and report["paging"]["window"] == 2
    assert np.array_equal(np.load(tmp_path / "paged" / "y.npy"), ort_run(deep, {"x": x})[0])


def test_cli_bad_cut_is_exit_2_one_line(deep, tmp_path, x, cli):
    np.save(tmp_path / "x.npy", x)
    r = cli("run", str(deep), "--backend", "onnxruntime", "--paging", "1", "--cut", "/layers.3/relu",
                "-i", f"x={tmp_path / 'x.npy'}", env={"EDGEINFER_CACHE_DIR": str(tmp_path / "cache")})
    assert r.returncode == 2
    assert r.stderr.strip().startswith("error:") and "not a layer boundary" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


# --- the planner's side ------------------------------------------------------------------------------------


def test_cost_model_streams_every_non_resident_byte_once_per_token():
    seg = [100] * 10
    # W=4 without prefetch: 3 segments stay, 7 stream; 700 B at 1 GB/s = 0.7 us, added to 1 us of compute
    p = paging.plan_paging(seg, 4, storage_gbps=1.0, compute_s_per_token=1e-6, prefetch=False)
    assert p["streamed_bytes_per_token"] == 700 and p["loads_per_token"] == 7
    assert p["decode_tokens_per_s"] == pytest.approx(1 / 1.7e-6, rel=1e-3)
    assert p["load_hidden_fraction"] == 0
    # with prefetch one more slot streams (2 stay): 800 B = 0.8 us, hidden under 1 us of compute
    q = paging.plan_paging(seg, 4, storage_gbps=1.0, compute_s_per_token=1e-6, prefetch=True)
    assert q["streamed_bytes_per_token"] == 800 and q["bound"] == "compute"
    assert q["decode_tokens_per_s"] == pytest.approx(1e6, rel=1e-3) and q["load_hidden_fraction"] == 1.0
    # storage-bound: prefetch hides only the compute's worth of the 8 us load
    r = paging.plan_paging(seg, 4, storage_gbps=0.1, compute_s_per_token=1e-6, prefetch=True)
    assert r["bound"] == "storage" and r["load_hidden_fraction"] == pytest.approx(1 / 8)
    assert r["decode_tokens_per_s"] == pytest.approx(1 / 8e-6, rel=1e-3)


def test_paging_from_dram_shares_the_bus_and_cannot_overlap():
    seg = [100] * 10
    p = paging.plan_paging(seg, 4, storage_gbps=1.0, compute_s_per_token=1e-6, prefetch=True, shared_bus=True)
    # 800 B read and written again on the bus the compute uses: 1.6 us on top of 1 us
    assert p["stream_s_per_token"] == pytest.approx(1.6e-6)
    assert p["decode_tokens_per_s"] == pytest.approx(1 / 2.6e-6, rel=1e-3) and p["load_hidden_fraction"] == 0


def test_prefill_streams_once_per_chunk_pass():
    p = paging.plan_paging([100] * 10, 4, storage_gbps=1.0, prefill_s_per_token=1e-9, prompt_tokens=1024,
                           prefill_chunk=512, prefetch=False)
    assert p["prefill_passes"] == 2
    assert p["prefill_tokens_per_s"] == pytest.approx(1024 / (1024e-9 + 2 * 0.7e-6), rel=1e-3)


def test_cost_model_checks_the_npu_window_and_capacity():
    gib = 2**30
    seg = [gib] * 8
    p = paging.plan_paging(seg, 4, npu_window_bytes=4 * gib, capacity_bytes=8 * gib, other_resident_bytes=gib)
    assert p["resident_weight_bytes"] == 4 * gib and p["npu_window_ok"] is True and p["fits"] is True
    p = paging.plan_paging(seg, 5, npu_window_bytes=4 * gib, capacity_bytes=8 * gib)
    assert p["npu_window_ok"] is False and p["fits"] is False and "IOMMU window" in p["reasons"][0]
    with pytest.raises(InputError):
        paging.plan_paging(seg, 0)


def test_planner_pages_a_model_that_does_not_fit():
    from edgeinfer.planning.planner import plan

    whole = plan("Qwen/Qwen3-8B", "rk3588-8g", suggest=False)
    assert not whole.fits  # 8.2 GB of w8a8 weights on an 8 GB board
    paged = plan("Qwen/Qwen3-8B", "rk3588-8g", paging=6, storage="nvme", suggest=False)
    pg = paged.details.paging
    # a decoder on the board's own runtime: the NPU window of segments + the host's embedding table
    assert paged.runtime == "rknn"
    assert paged.breakdown["weights"] == pg.npu_resident_bytes + pg.host_weight_bytes
    assert paged.fits and pg.npu_resident_bytes < whole.breakdown["weights"] / 2
    assert pg.resident_weight_bytes + pg.streamed_bytes_per_token >= whole.breakdown["weights"]
    assert pg.npu_window_ok is True and pg.storage_gbps == pytest.approx(3.94)
    # decode is bounded by storage: never faster than streaming the non-resident bytes allows
    assert paged.estimates.decode_tokens_per_s <= 3.94e9 / pg.streamed_bytes_per_token + 1e-4  # 4 decimals
    too_wide = plan("Qwen/Qwen3-8B", "rk3588-8g", paging=20, suggest=False)
    assert not too_wide.fits and any("IOMMU window" in r for r in too_wide.reasons)


def test_planner_suggests_the_widest_window_that_fits():
    from edgeinfer.planning.planner import plan

    sug = plan("Qwen/Qwen3-8B", "rk3588-8g").suggestions.paging
    assert sug is not None
    assert plan("Qwen/Qwen3-8B", "rk3588-8g", paging=sug["window"], suggest=False).fits
    assert not plan("Qwen/Qwen3-8B", "rk3588-8g", paging=sug["window"] + 1, suggest=False).fits


def test_cli_plan_paging_json_and_exit_codes(cli):
    ok = cli("plan", "Qwen/Qwen3-8B", "--board", "rk3588-8g", "--paging", "6", "--storage", "nvme", "--json")
    assert ok.returncode == 0, ok.stderr
    d = json.loads(ok.stdout)
    assert d["fits"] and d["memory"]["details"]["paging"]["window"] == 6
    assert d["estimates"]["paging"]["bound"] in ("storage", "compute")
    bad = cli("plan", "Qwen/Qwen3-8B", "--board", "rk3588-8g", "--paging", "4", "--storage", "floppy")
    assert bad.returncode == 2 and "unknown storage 'floppy'" in bad.stderr


def test_a_segmented_bundle_loads_paged(deep, tmp_path, x):
    from edgeinfer.contract.backend import TensorSpec
    from edgeinfer.model import bundle
    from edgeinfer.run.bundle import open_session

    be = plugins.get_backend("onnxruntime")
    arts = seg_mod.deploy_segments(be, deep, tmp_path / "b", "fp32", None, segments=3)
    assert [a.name for a in arts] == ["segment_00.onnx", "segment_01.onnx", "segment_02.onnx"]
    spec = [TensorSpec("x", ("batch", DIM), "float32")]
    bundle.write(tmp_path / "b", bundle.Manifest(
        backend="onnxruntime", board="host", scheme="fp32", artifacts=[a.name for a in arts], inputs=spec,
        outputs=[TensorSpec("y", ("batch", DIM), "float32")], source={"path": str(deep)},
        paging={"window": 2, "prefetch": True, "segments": 3}))
    with open_session(bundle.Bundle.open(tmp_path / "b")) as sess:
        assert isinstance(sess, paged_mod.PagedSession) and sess.window == 2
        assert np.array_equal(sess.run({"x": x})["y"], ort_run(deep, {"x": x})[0])


def test_each_resident_segment_budgets_its_own_activation_buffers():
    """Every loaded segment is a runtime instance with its own activation buffers (docs/paging.md: at
    batch 32, MiniLM's RSS grows by ~80-130 MB per extra resident segment); the plan counts them per
    resident segment, the weights by the window."""
    from edgeinfer.planning.planner import plan

    whole = plan("all-minilm-l6-v2", "host", quant="fp32", ctx=128, batch=32, suggest=False)
    act = whole.breakdown["activations"]
    # MiniLM, batch 32 × 128 tokens, fp32 rows (by hand): inputs 4096 × 384 × 4 B, attention = 12 heads' 128 × 128
    # scores (+ softmax copy) for 32 sequences + q, k, v and their 2 × 12-head copies; onnxruntime holds an encoder's
    # peak twice (the arena and the memory pattern: runtimes.yaml encoder_activation_copies)
    tok = 32 * 128
    attention = 32 * 12 * 128 * 128 * 4 * 2 + tok * (12 + 2 * 12) * 32 * 4
    assert act == 2 * (tok * 384 * 4 + max(attention, tok * (2 * 384 + 2 * 1536) * 4) + tok * 384 * 4)
    for w in (1, 3, 6):
        p = plan("all-minilm-l6-v2", "host", quant="fp32", ctx=128, batch=32, paging=w, suggest=False)
        assert p.breakdown["activations"] == w * act
        assert p.details.paging.resident_instances == w
        assert p.total_bytes == (p.breakdown["weights"] + w * act + p.breakdown["kv_cache"]
                                 + p.breakdown["runtime"] + p.breakdown["reserved"])


def test_paged_plan_json_keeps_the_keys_each_rule_gives():
    """The typed estimates / paging cost give --json exactly the keys the cost models give, in their order."""
    from edgeinfer.planning.planner import plan

    dec = plan("Qwen/Qwen3-8B", "rk3588-8g", paging=12, storage="nvme", suggest=False)
    enc = plan("bge-m3", "rk3588-8g", paging=4, storage="emmc", suggest=False)
    e_dec, e_enc = dec.to_dict()["estimates"], enc.to_dict()["estimates"]
    assert list(e_dec)[-4:] == ["bw_fraction", "paging", "decode_tokens_per_s_unpaged",
                                "prefill_tokens_per_s_unpaged"]
    assert list(e_enc)[-3:] == ["bw_fraction", "paging", "prefill_tokens_per_s_unpaged"]  # an encoder: no decode
    paged_rate = dec.details.paging.decode_tokens_per_s
    assert e_dec["decode_tokens_per_s"] == paged_rate != e_dec["decode_tokens_per_s_unpaged"]
    assert list(dec.to_dict()["memory"]["details"]["paging"])[:2] == ["rule", "window"]
    assert "rule" not in enc.to_dict()["memory"]["details"]["paging"] and enc.details.paging.rule is None
    assert enc.to_dict()["memory"]["details"]["paging"]["segment_bytes"] == list(enc.details.paging.segment_bytes)
