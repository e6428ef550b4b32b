"""Static-shape buckets: which (batch × seq) shapes a static target gets, a real bucketed deploy of MiniLM for
core-ultra-155h (OpenVINO, run on the CPU here: the NPU is absent), each bucket against onnxruntime fp32, and
runs (``edgeinfer run``, the serve worker) picking the smallest bucket."""

from __future__ import annotations

import functools
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.deploy import buckets as build_buckets
from edgeinfer.errors import FeedError, InputError
from edgeinfer.model.bundle import Bundle
from edgeinfer.run import buckets
from edgeinfer.run.bundle import open_session, tokenize_texts
from edgeinfer.testing import minilm, models
from edgeinfer.testing.cli import run_cli

NINE = [(b, s) for b in (1, 4, 8) for s in (32, 64, 128)]
SHORT = ["Trains run late.", "Solar panels work.", "Bread is baked."]  # each well under 16 tokens


# --- choosing buckets: pure functions, expected values worked out by hand --------------------------------------


def test_choose_keeps_smallest_first_within_the_memory_budget():
    # cost = b*s units; order: 1x32 (32), 1x64 (64), 4x32 (128), 8x32 (256), 4x64 (256), 8x64, 4x128, 8x128
    kept, dropped = build_buckets.choose((1, 128), NINE, lambda b, s: b * s, budget=500)
    assert kept == [(1, 32), (1, 64), (1, 128), (4, 32), (8, 32)]  # 32+64+128+256 = 480 <= 500
    assert sorted(dropped) == ["4x128", "4x64", "8x128", "8x64"]
    assert dropped["4x64"].startswith("memory")


def test_choose_caps_the_count_and_always_keeps_the_deployed_shape():
    kept, dropped = build_buckets.choose((1, 128), NINE, lambda b, s: 1, budget=10**12, max_count=3)
    assert kept == [(1, 32), (1, 64), (1, 128)]
    assert len(dropped) == 6 and all("more than 3" in why for why in dropped.values())
    assert build_buckets.choose((1, 128), NINE, lambda b, s: 10**9, budget=0)[0] == [(1, 128)]


@pytest.mark.parametrize("ctx, want", [(2048, [1, 4, 8]), (8192, [1, 4]), (32768, [1])])
def test_decode_batches_keep_what_the_kv_cache_of_that_many_sequences_fits(ctx, want):
    """Qwen3-0.6B fp16 on rk3588-8g (about 7.0 GB usable, 1.2 GB of weights): its KV cache is 28 layers × 2 ×
    8 kv heads × 128 × 2 bytes = 112 KiB a token, so 8 × 8192 tokens (7.5 GB) cannot fit, 4 × 8192 (3.8 GB)
    can, and one sequence of 32768 (3.8 GB) leaves no room for four."""
    from edgeinfer.planning.boards import get_board

    kept, why = build_buckets.decode_batches(Path("qwen3-0.6b"), get_board("rk3588-8g"), "fp16", ctx, "rknn")
    assert kept == want and "rk3588-8g" in why


def test_sequence_ladder():
    assert build_buckets.seq_ladder(128, masked=True) == [32, 64, 128]
    assert build_buckets.seq_ladder(128, masked=False) == [128]  # padding positions need an attention mask
    assert build_buckets.seq_ladder(24, masked=True) == [16, 24]
    assert build_buckets.seq_ladder(8, masked=True) == [8]


def test_parse_buckets_option():
    assert build_buckets.parse(None) == "auto"
    assert build_buckets.parse("none") == "none"
    assert build_buckets.parse("4x64, 1x128") == [(1, 128), (4, 64)]
    for bad in ("4x", "0x32", "4*64", "1x32,1x32"):
        with pytest.raises(InputError):
            build_buckets.parse(bad)


def test_pick_smallest_bucket_that_holds_the_batch():
    assert buckets.pick(NINE, 1, 10) == (1, 32)
    assert buckets.pick(NINE, 3, 40) == (4, 64)
    assert buckets.pick(NINE, 5, 128) == (8, 128)
    assert buckets.pick(NINE, 2, 32) == (4, 32)
    assert buckets.pick(NINE, 9, 20) is None
    assert buckets.pick(NINE, 1, 129) is None


def test_chunks_use_the_largest_batch_then_the_smallest_bucket():
    assert buckets.chunks(NINE, 20, 50) == [(0, 8, (8, 64)), (8, 16, (8, 64)), (16, 20, (4, 64))]
    assert buckets.chunks([(1, 128), (4, 32)], 6, 100) == [(i, i + 1, (1, 128)) for i in range(6)]
    with pytest.raises(FeedError, match="longer than the longest bucket"):
        buckets.chunks(NINE, 1, 200)


def test_trim_drops_trailing_padding_only():
    ids = np.array([[5, 6, 0, 0, 0], [7, 0, 0, 0, 0]])
    mask = np.array([[1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    out = buckets.trim({"input_ids": ids, "attention_mask": mask})
    assert out["input_ids"].tolist() == [[5, 6], [7, 0]]
    assert out["attention_mask"].tolist() == [[1, 1], [1, 0]]


def test_regroup_calibration_to_a_bucket_shape():
    def sample(i: int) -> dict[str, np.ndarray]:
        ids = np.zeros((1, 128), np.int64)
        ids[0, :40] = i
        return {"input_ids": ids, "attention_mask": (ids != 0).astype(np.int64)}

    groups = build_buckets.regroup([sample(1), sample(2), sample(3)], 2, 32)
    assert len(groups) == 1  # 3 rows make one full batch of 2
    assert groups[0]["input_ids"].shape == (2, 32) and groups[0]["input_ids"][:, 0].tolist() == [1, 2]
    (one,) = build_buckets.regroup([sample(5)], 4, 64)  # fewer rows than the batch: repeated
    assert one["input_ids"][:, 0].tolist() == [5, 5, 5, 5] and one["attention_mask"].sum() == 4 * 40


def test_bucketed_session_pads_and_cuts_symbolic_outputs(tmp_path):
    """Bucket artifacts whose output specs stay symbolic (RKNN converted from a dynamic ONNX) are cut too."""
    from edgeinfer.contract import registry

    backend = registry.get_backend("onnxruntime")
    path = models.token_model(tmp_path / "tokens.onnx")
    session = buckets.BucketedSession({(1, 8): backend.load(path), (2, 4): backend.load(path)})
    with session:
        ids = np.array([[7, 8, 9], [4, 5, 0]])
        out = session.run({"input_ids": ids, "attention_mask": np.array([[1, 1, 1], [1, 1, 0]])})
        assert session.counts == {(2, 4): 1}
        assert out["last_hidden_state"][..., 0].tolist() == [[7, 8, 9], [4, 5, 0]]
        out = session.run({"input_ids": np.array([[3] * 6]), "attention_mask": np.array([[1] * 5 + [0]])})
        assert session.counts == {(2, 4): 1, (1, 8): 1}
        assert out["last_hidden_state"][..., 0].tolist() == [[3, 3, 3, 3, 3, 0]]



def test_a_bucket_is_loaded_on_first_use_and_load_all_loads_the_rest(tmp_path):
    """``run`` on a 9-bucket NPU bundle compiles the bucket it needs, not nine; serve loads all up front."""
    from edgeinfer.contract import registry

    backend = registry.get_backend("onnxruntime")
    path = models.token_model(tmp_path / "tokens.onnx")
    loads: list[tuple[int, int]] = []

    def loader(shape):
        return lambda: loads.append(shape) or backend.load(path)

    session = buckets.BucketedSession({shape: loader(shape) for shape in [(1, 8), (2, 4), (4, 16)]})
    with session:
        assert loads == [(1, 8)]  # the first bucket (smallest batch), for the model's specs
        ids = np.array([[7, 8, 9], [4, 5, 0]])
        session.run({"input_ids": ids, "attention_mask": (ids != 0).astype(np.int64)})
        assert loads == [(1, 8), (2, 4)]
        session.load_all()
        assert sorted(loads) == [(1, 8), (2, 4), (4, 16)] and len(loads) == 3
        assert session.load_ms > 0


# --- a real bucketed deploy ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bucketed(module_tmp) -> Path:
    """MiniLM deployed for core-ultra-155h with its automatic buckets (the conversion cache makes reruns quick)."""
    from edgeinfer.deploy.encoder import deploy

    out = module_tmp / "minilm-155h"
    result = deploy(minilm.model_dir(), "core-ultra-155h", out)
    assert result.golden["passed"] is True
    return out


@pytest.fixture(scope="module")
def loaded(bucketed):
    """The bucketed bundle loaded once (every bucket compiled); tests clear its counts first."""
    with open_session(Bundle.open(bucketed)) as session:
        yield session


@pytest.fixture
def cli(capfd):
    """``edgeinfer ARGS`` in this process (edgeinfer.testing.cli.run_cli): what the command answers."""
    return functools.partial(run_cli, capfd)


@functools.lru_cache(maxsize=1)
def _ort(onnx_path: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])


def _reference(onnx_path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return _ort(onnx_path).run(None, feeds)[0]


def _close(got: np.ndarray, want: np.ndarray, mask: np.ndarray) -> None:
    assert got.shape == want.shape
    real = mask.astype(bool)
    cos = minilm.cosine(got[real], want[real])
    assert cos.min() > 0.999
    assert np.abs(got[real] - want[real]).max() < 0.05


@pytest.mark.slow
def test_deploy_records_nine_sealed_buckets_and_why(bucketed):
    import jsonschema

    from edgeinfer.model import bundle as bundle_mod

    manifest = json.loads((bucketed / "manifest.json").read_text())
    schema = json.loads((Path(bundle_mod.__file__).parents[1] / "schemas" / "manifest.schema.json").read_text())
    jsonschema.validate(manifest, schema)
    items = manifest["buckets"]["items"]
    assert [(i["batch"], i["seq"]) for i in items] == NINE
    assert "headroom" in manifest["buckets"]["chosen_by"]
    assert {i["artifact"] for i in items if (i["batch"], i["seq"]) == (1, 128)} == {"model.xml"}
    for i in items:
        assert i["artifact"] in manifest["files"]
        assert i["golden"]["last_hidden_state"]["cosine_min"] > 0.999
    assert bundle_mod.verify(bucketed)["ok"] is True
    # the static IRs hold the same weights byte for byte: one file on disk, not one per bucket
    bins = [bucketed / i["artifact"] for i in items if i["artifact"] != "model.xml"]
    assert len(bins) == 8 and len({p.with_suffix(".bin").stat().st_ino for p in bins}) == 1


@pytest.mark.slow
def test_every_bucket_matches_the_fp32_reference(bucketed, minilm_onnx):
    from edgeinfer.contract import registry

    backend = registry.get_backend("openvino")
    texts = minilm.heldout_sentences(8)
    for item in json.loads((bucketed / "manifest.json").read_text())["buckets"]["items"]:
        b, s = item["batch"], item["seq"]
        feeds = minilm.tokenize(texts[:b], seq=s)
        with backend.load(bucketed / item["artifact"]) as session:
            assert [tuple(x.shape) for x in session.inputs] == [(b, s)] * 3
            got = session.run(feeds)["last_hidden_state"]
        _close(got, _reference(minilm_onnx, feeds), feeds["attention_mask"])


@pytest.mark.slow
def test_bundle_session_picks_the_smallest_bucket_and_unpads(loaded, minilm_onnx):
    session = loaded
    session.counts.clear()
    assert session.shapes == NINE
    short = buckets.trim(minilm.tokenize(SHORT))  # 3 rows, under 16 tokens → 4x32
    got = session.run(short)["last_hidden_state"]
    assert session.counts == {(4, 32): 1}
    _close(got, _reference(minilm_onnx, short), short["attention_mask"])
    long = minilm.tokenize(minilm.heldout_sentences(9), seq=100)  # 9 rows of 100 → 8x128 + 1x128
    got = session.run(long)["last_hidden_state"]
    assert got.shape == (9, 100, 384)
    assert session.counts == {(4, 32): 1, (8, 128): 1, (1, 128): 1}
    _close(got, _reference(minilm_onnx, long), long["attention_mask"])
    with pytest.raises(FeedError, match="longer than the longest bucket"):
        session.run(minilm.tokenize(["x"], seq=130))


@pytest.mark.slow
def test_serve_worker_runs_a_batch_on_the_smallest_bucket(bucketed, loaded):
    from edgeinfer.serve.workers import run_batch

    bundle, session = Bundle.open(bucketed), loaded
    session.counts.clear()
    feeds = tokenize_texts(bundle, SHORT)  # padded to 128 as requests arrive; the worker cuts them to their length
    parts = run_batch(bundle, session, "embed", feeds, [1, 2], max_batch=32)
    assert session.counts == {(4, 32): 1}
    want = minilm.mean_pool(_reference_hf(feeds), feeds["attention_mask"])
    got = np.concatenate([p[1]["embedding"] for p in parts])
    assert [p[0] for p in parts] == ["ok", "ok"] and got.shape == (3, 384)
    assert minilm.cosine(got, want).min() > 0.999


def _reference_hf(feeds: dict[str, np.ndarray]) -> np.ndarray:
    from edgeinfer.testing.fixtures import _cached_export

    return _reference(_cached_export("minilm-dynamic", None, None), feeds)


@pytest.mark.slow
def test_cli_run_reports_the_bucket(bucketed, cli):
    proc = cli("run", str(bucketed), "--text", SHORT[0], "--text", SHORT[1], "--json")
    assert proc.returncode == 0, proc.stderr[-1000:]
    report = json.loads(proc.stdout)
    assert report["bucket_runs"] == {"4x32": 1}
    assert np.asarray(report["embeddings"]).shape == (2, 384)


@pytest.mark.slow
def test_bucket_artifact_outside_or_damaged_is_refused(bucketed, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(bucketed, copy, copy_function=os.link)
    manifest = json.loads((copy / "manifest.json").read_text())
    (copy / "manifest.json").unlink()  # a hard link to the fixture's: write a new file instead
    manifest["buckets"]["items"][0]["artifact"] = "../elsewhere/model.xml"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="buckets.items"):
        Bundle.open(copy)
    manifest["buckets"]["items"][0]["artifact"] = "tokenizer/tokenizer.json"  # sealed, but a second item's twin
    manifest["buckets"]["items"][1]["artifact"] = "tokenizer/tokenizer.json"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="own artifact"):
        Bundle.open(copy)


@pytest.mark.parametrize("value,needle", [("4x", "BATCHxSEQ"), ("4x32,8x64", "must include 1x128")])
def test_bad_buckets_option_is_one_line_exit_2(tmp_path, value, needle, cli):
    proc = cli("deploy", str(minilm.model_dir()), "--board", "core-ultra-155h", "--buckets", value,
                     "-o", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and needle in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_serve_infer_takes_any_length_up_to_the_longest_bucket(bucketed):
    from edgeinfer.serve.prep import ApiError, ServedModel, prepare_infer

    models = {"m": ServedModel("m", Bundle.open(bucketed))}
    assert models["m"].longest_bucket == 128

    def body(seq: int) -> bytes:
        row = [101] + [2000] * (seq - 2) + [102]
        return json.dumps({"model": "m", "inputs": {"input_ids": [row], "attention_mask": [[1] * seq],
                                                    "token_type_ids": [[0] * seq]}}).encode()

    p = prepare_infer(models, body(20), "application/json", 8)
    assert p.feeds["input_ids"].shape == (1, 20) and p.rows == 1
    with pytest.raises(ApiError, match="longer than the longest bucket") as e:
        prepare_infer(models, body(130), "application/json", 8)
    assert e.value.status == 400
