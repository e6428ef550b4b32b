"""The golden check's ranking and label metrics (edgeinfer.deploy.ranking) against values worked out by hand
(written next to each case) and, for Kendall tau, against scipy.stats.kendalltau."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgeinfer.deploy import ranking
from edgeinfer.errors import InputError

REF = [4.0, 3.0, 2.0, 1.0, 0.0]  # items 0..4, ranked 0 > 1 > 2 > 3 > 4


def test_kendall_tau_by_hand():
    assert ranking.kendall_tau(REF, REF) == 1.0
    assert ranking.kendall_tau(REF, REF[::-1]) == -1.0
    # one adjacent swap (items 3 and 4): 9 concordant, 1 discordant of 10 pairs → 0.8
    assert ranking.kendall_tau(REF, [4, 3, 2, 0, 1]) == pytest.approx(0.8)
    # items 0 and 2 swapped: pairs (0,1), (1,2), (0,2) discordant → (7 - 3) / 10
    assert ranking.kendall_tau(REF, [2, 3, 4, 1, 0]) == pytest.approx(0.4)


def test_kendall_tau_matches_scipy_with_ties():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(3)
    for _ in range(20):
        a = rng.integers(0, 4, size=9).astype(float)  # ties on both sides: tau-b
        b = rng.integers(0, 4, size=9).astype(float)
        want = stats.kendalltau(a, b).statistic
        if not math.isnan(want):
            assert ranking.kendall_tau(a, b) == pytest.approx(want)


def test_top_k_overlap_by_hand():
    assert ranking.top_k_overlap(REF, REF, 3) == 1.0
    assert ranking.top_k_overlap(REF, [4, 3, 1, 2, 0], 3) == pytest.approx(2 / 3)  # item 3 replaces item 2
    assert ranking.top_k_overlap(REF, [2, 4, 3, 1, 0], 3) == 1.0  # same three, another order
    assert ranking.top_k_overlap(REF, [0, 1, 2, 3, 4], 2) == 0.0
    assert ranking.top_k_overlap([1.0, 0.0], [0.0, 1.0], 3) == 1.0  # k beyond the list: the whole list
    assert ranking.top_k_overlap([1.0, 0.0], [0.0, 1.0], 1) == 0.0


def test_ndcg_by_hand():
    # gains by the reference's rank with k=3: item0 3, item1 2, item2 1; discounts 1, 1/log2(3), 1/2
    ideal = 3 + 2 / math.log2(3) + 1 / 2
    assert ranking.ndcg_at_k(REF, REF, 3) == pytest.approx(1.0)
    # 2nd and 3rd swapped: 3 + 1/log2(3) + 2/2
    assert ranking.ndcg_at_k(REF, [4, 2, 3, 1, 0], 3) == pytest.approx((3 + 1 / math.log2(3) + 1) / ideal)
    # 1st and 2nd swapped: 2 + 3/log2(3) + 1/2
    assert ranking.ndcg_at_k(REF, [3, 4, 2, 1, 0], 3) == pytest.approx((2 + 3 / math.log2(3) + 0.5) / ideal)
    # item 3 (gain 0) in 3rd place instead of item 2: 3 + 2/log2(3) + 0
    assert ranking.ndcg_at_k(REF, [4, 3, 1, 2, 0], 3) == pytest.approx((3 + 2 / math.log2(3)) / ideal)
    # below the top k the order does not count
    assert ranking.ndcg_at_k(REF, [4, 3, 2, 0, 1], 3) == pytest.approx(1.0)


def test_default_ndcg_threshold_fails_any_reordering_inside_the_top_3():
    limit = ranking.RERANK_THRESHOLDS["ndcg"]
    for swapped in ([4, 2, 3, 1, 0], [3, 4, 2, 1, 0], [2, 3, 4, 1, 0]):
        assert ranking.ndcg_at_k(REF, swapped, 3) < limit


def test_check_rerank_names_the_failing_query():
    ref = [np.array([[4.0], [3.0], [2.0], [1.0]]), np.array([[1.0], [2.0], [3.0], [4.0]])]
    cand = [ref[0] + 0.01, np.array([[1.0], [2.0], [4.0], [3.0]])]  # second query: its top two swapped
    report = ranking.check_rerank(["kept query", "swapped query"], ref, cand, ranking.RERANK_THRESHOLDS)
    assert report["passed"] is False
    assert len(report["failures"]) == 1 and "'swapped query'" in report["failures"][0]
    assert report["per_query"][0]["kendall_tau"] == 1.0
    # 4 items, one adjacent swap: (5 - 1) / 6
    assert report["per_query"][1]["kendall_tau"] == pytest.approx(4 / 6)
    assert report["kendall_tau"]["min"] == pytest.approx(4 / 6)


def test_check_classify_by_hand():
    ref = [np.array([[2.0, 0.0], [0.0, 1.0]])]
    cand = [np.array([[2.0, 0.0], [1.0, 0.0]])]  # second row flips to label 0
    report = ranking.check_classify(ref, cand, "softmax", ranking.CLASSIFY_THRESHOLDS)
    assert report["label_agreement"] == 0.5 and report["disagreeing_rows"] == [1]
    # softmax([0, 1])[1] = e/(1+e); softmax([1, 0])[1] = 1/(1+e): difference (e-1)/(e+1)
    assert report["max_prob_error"] == pytest.approx((math.e - 1) / (math.e + 1))
    assert report["passed"] is False and len(report["failures"]) == 2


def test_thresholds_override_and_refuse_unknown_metric():
    assert ranking.thresholds("rerank", {"ndcg": 0.9})["ndcg"] == 0.9
    assert ranking.thresholds("rerank", None) == ranking.RERANK_THRESHOLDS
    with pytest.raises(InputError, match="label_agreement"):
        ranking.thresholds("classify", {"ndcg": 0.9})
