"""MiniLM on the CPU path: dtypes, weight-only INT8, shape buckets, compile counting, profile."""

from __future__ import annotations

import numpy as np
import pytest

from edgeinfer.errors import FeedError
from edgeinfer.testing import minilm


def pooled(session, feeds):
    return minilm.mean_pool(session.run(feeds)["last_hidden_state"], feeds["attention_mask"])


@pytest.fixture(scope="module")
def fp32_pooled(ascend, minilm_artifacts, heldout_feeds):
    with ascend.load(minilm_artifacts("fp32"), warmup=False) as s:
        return pooled(s, heldout_feeds)


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["fp16", "bf16", "w8a16"])
def test_reduced_precision_cosine(ascend, minilm_artifacts, heldout_feeds, fp32_pooled, scheme):
    with ascend.load(minilm_artifacts(scheme), warmup=False) as s:
        got = pooled(s, heldout_feeds)
        notes = s.profile_notes()
    cos = minilm.cosine(got, fp32_pooled)
    assert cos.min() >= 0.99, f"{scheme}: min cosine {cos.min():.5f}"
    assert not np.allclose(got, fp32_pooled, atol=1e-7), "the scheme must actually change the computation"
    if scheme == "w8a16":
        assert "torchao" in notes["quant"]
    else:
        assert notes["dtype"] == scheme


def test_load_time_dtype_option(ascend, minilm_artifacts, heldout_feeds, fp32_pooled):
    with ascend.load(minilm_artifacts("fp32"), dtype="bf16", warmup=False) as s:
        assert s.profile_notes()["dtype"] == "bf16"
        assert minilm.cosine(pooled(s, heldout_feeds), fp32_pooled).min() >= 0.99


def test_buckets_equal_unpadded_on_valid_tokens(ascend, minilm_artifacts):
    with ascend.load(minilm_artifacts("fp32"), seq_buckets="64,128", batch_buckets="1,4", warmup=False) as s:
        for n, seq in ((1, 13), (3, 40), (6, 100)):  # 6 rows: chunks of 4 + 2 (padded to 4)
            feeds = minilm.tokenize(minilm.sentences()[:n], seq=seq)
            feeds["attention_mask"][0, seq // 2 :] = 0  # a row with its own padding too
            got = s.run(feeds)["last_hidden_state"]
            want = s.run_unpadded(feeds)["last_hidden_state"]
            assert got.shape == want.shape == (n, seq, 384)
            valid = feeds["attention_mask"].astype(bool)
            np.testing.assert_allclose(got[valid], want[valid], rtol=1e-4, atol=1e-4)
        keys = set(s.profile_notes()["warmup_ms"]) | {"b1xs64", "b4xs64", "b4xs128"}
        assert {"b1xs64", "b4xs64", "b4xs128"} <= keys


def test_sequence_longer_than_buckets_is_a_feed_error(ascend, minilm_artifacts):
    with ascend.load(minilm_artifacts("fp32"), seq_buckets="64", batch_buckets="1", warmup=False) as s:
        feeds = minilm.tokenize(minilm.sentences()[:1], seq=80)
        with pytest.raises(FeedError, match="longer than the largest shape bucket 64"):
            s.run(feeds)


def test_warmup_runs_every_bucket_and_reports_first_run_cost(ascend, minilm_artifacts):
    with ascend.load(minilm_artifacts("fp32"), seq_buckets=[64, 128], batch_buckets=[1, 2]) as s:
        assert s.profile_notes()["warmup_ms"] == {}  # auto: eager on CPU has no per-shape compile
    with ascend.load(minilm_artifacts("fp32"), seq_buckets=[64, 128], batch_buckets=[1, 2], warmup=True) as s:
        warm = s.profile_notes()["warmup_ms"]
    assert sorted(warm) == ["b1xs128", "b1xs64", "b2xs128", "b2xs64"]
    assert all(v["first_run_ms"] > 0 and v["second_run_ms"] > 0 for v in warm.values())


def test_one_compile_per_bucket(ascend, minilm_artifacts):
    """torch.compile (dynamo graph capture, 'eager' compiler to keep the test fast): the counting
    backend is invoked once per bucket at warm-up and never again for shapes inside the buckets."""
    opts = dict(seq_buckets="64,128", batch_buckets="1,2", compile=True, compile_backend="eager")
    with ascend.load(minilm_artifacts("fp32"), **opts) as s, ascend.load(
        minilm_artifacts("fp32"), seq_buckets="64,128", batch_buckets="1,2", warmup=False
    ) as eager:
        after_warmup = dict(s.profile_notes()["compiles_per_bucket"])
        assert after_warmup == {"b1xs64": 1, "b1xs128": 1, "b2xs64": 1, "b2xs128": 1}
        for n, seq in ((1, 10), (2, 64), (1, 100), (2, 77), (1, 64)):
            feeds = minilm.tokenize(minilm.sentences()[:n], seq=seq)
            np.testing.assert_allclose(
                s.run(feeds)["last_hidden_state"], eager.run(feeds)["last_hidden_state"], rtol=1e-5, atol=1e-5
            )
        assert s.profile_notes()["compiles_per_bucket"] == after_warmup


@pytest.mark.slow
def test_inductor_one_bucket(ascend, minilm_artifacts):
    """The default CPU compiler (inductor) on one bucket: compiled once, same results as eager."""
    opts = dict(seq_buckets="64", batch_buckets="1")
    with ascend.load(minilm_artifacts("fp32"), compile=True, **opts) as s, ascend.load(
        minilm_artifacts("fp32"), warmup=False, **opts
    ) as eager:
        notes = s.profile_notes()
        assert notes["compile_backend"] == "inductor" and notes["compiles_per_bucket"] == {"b1xs64": 1}
        feeds = minilm.tokenize(minilm.sentences()[:1], seq=30)
        np.testing.assert_allclose(
            s.run(feeds)["last_hidden_state"], eager.run(feeds)["last_hidden_state"], rtol=1e-4, atol=1e-4
        )
        assert s.profile_notes()["compiles_per_bucket"] == {"b1xs64": 1}


def test_profile_has_torch_profiler_ops(ascend, minilm_artifacts):
    with ascend.load(minilm_artifacts("fp32"), seq_buckets="64", batch_buckets="2", warmup=False) as s:
        feeds = minilm.tokenize(minilm.sentences()[:2], seq=32)
        prof = s.profile(feeds, repeat=2)
    names = [o.name for o in prof.ops]
    assert "aten::addmm" in names or "aten::linear" in names or "aten::mm" in names
    times = [o.time_ms for o in prof.ops]
    assert times == sorted(times, reverse=True) and all(o.exec_type == "cpu" for o in prof.ops)
    assert prof.notes["device"] == "cpu" and prof.notes["seq_buckets"] == [64]


def test_stamp_and_inputs(ascend, minilm_artifacts):
    import json

    from edgeinfer.contract import stamp

    art = minilm_artifacts("fp32")
    data = stamp.read(art)
    assert data["backend"] == "ascend" and data["scheme"] == "fp32" and data["kind"] == "hf"
    assert [i["name"] for i in data["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    assert data["versions"]["toolkit"].startswith("torch ")
    assert data["source"]["sha256"] == stamp.sha256_file(minilm.model_dir() / "model.safetensors")
    json.dumps(data)
