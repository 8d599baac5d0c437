"""Pricing and ordering of candidates (the service around it: ``tests/test_service.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from leap.core.hardware import load_catalogue
from predictor.ranking import COLD_START, NO_ESTIMATE, UNKNOWN_HARDWARE, price_candidate, rank_candidates

CAT = load_catalogue()


def test_orders_by_throughput_per_dollar_and_keeps_unknowns_unranked() -> None:
    names = ["H100-SXM", "Quantum-9000", "T4", "A100-80GB"]
    per_acc = np.array([100.0, 50.0, 10.0, np.nan])
    priced = rank_candidates(names, 4, per_acc, per_acc * 0.9, per_acc * 1.1, [None] * 4, CAT)
    by_name = {c["hardware"]: c for c in priced.candidates}
    assert len(priced.candidates) == 4  # nothing dropped
    assert by_name["Quantum-9000"]["rank"] is None and by_name["Quantum-9000"]["reason"] == UNKNOWN_HARDWARE
    assert by_name["A100-80GB"]["rank"] is None and by_name["A100-80GB"]["reason"] == NO_ESTIMATE
    ranked = [c for c in priced.candidates if c["rank"] is not None]
    assert [c["rank"] for c in ranked] == [1, 2]
    assert ranked[0]["throughput_per_dollar"] >= ranked[1]["throughput_per_dollar"]
    h100 = by_name["H100-SXM"]
    price = CAT.price("H100-SXM")
    assert price is not None
    assert h100["hourly_cost"] == price * 4
    assert h100["throughput_per_dollar"] == 400.0 * 3600 / (price * 4)
    assert priced.best == ranked[0]["hardware"]


def test_nothing_rankable_gives_no_best() -> None:
    priced = rank_candidates(["Nope"], 1, np.array([1.0]), np.array([1.0]), np.array([1.0]), [None], CAT)
    assert priced.best is None and priced.candidates[0]["reason"] == UNKNOWN_HARDWARE


def test_a_known_reason_stays_on_a_ranked_candidate_and_everything_scales_with_accelerators() -> None:
    names = ["L4", "H100-SXM"]
    priced = rank_candidates(names, 2, np.array([10.0, 100.0]), np.array([5.0, 50.0]), np.array([20.0, 200.0]),
                             [COLD_START, None], CAT)
    l4 = next(c for c in priced.candidates if c["hardware"] == "L4")
    price = CAT.price("L4")
    assert price is not None
    assert l4 == {
        "hardware": "L4", "predicted_throughput": 20.0, "lower": 10.0, "upper": 40.0, "hourly_cost": price * 2,
        "throughput_per_dollar": 20.0 * 3600 / (price * 2), "rank": l4["rank"], "reason": COLD_START,
    }
    assert list(l4) == ["hardware", "predicted_throughput", "lower", "upper", "hourly_cost",
                        "throughput_per_dollar", "rank", "reason"]  # the order the ranking JSON shows
    assert sorted(c["rank"] for c in priced.candidates) == [1, 2]


def test_equal_value_keeps_the_submissions_order() -> None:
    names = ["A100-80GB", "A100"]  # one type, two spellings: the same price and estimate
    priced = rank_candidates(names, 1, np.array([7.0, 7.0]), np.array([7.0, 7.0]), np.array([7.0, 7.0]),
                             [None, None], CAT)
    assert [(c["hardware"], c["rank"]) for c in priced.candidates] == [("A100-80GB", 1), ("A100", 2)]


def test_price_candidate_says_whether_it_can_take_a_rank() -> None:
    entry, rankable = price_candidate("H100-SXM", 8, float("nan"), float("nan"), float("nan"), None, CAT)
    assert not rankable and entry["reason"] == NO_ESTIMATE and entry["hourly_cost"] is not None
    entry, rankable = price_candidate("Quantum-9000", 8, 5.0, 4.0, 6.0, COLD_START, CAT)
    assert not rankable and entry["reason"] == UNKNOWN_HARDWARE and entry["predicted_throughput"] == 40.0
    entry, rankable = price_candidate("H100-SXM", 8, 5.0, 4.0, 6.0, None, CAT)
    assert rankable and entry["rank"] is None  # ranks come from the ordering, not from pricing


def test_predictions_above_the_parts_peak_are_cut_to_it() -> None:
    """llama31-8b at 8192 tokens on a T4: ~0.17 samples/s per accelerator at its peak, whatever a model says."""
    from features.rows import build_rows
    from features.snapshot import FeatureSnapshot
    from predictor.ranking import bound_by_peak
    from tests.factories import submission

    sub = submission("j", 1, model_type="llama31-8b", params=8e9, seq_len=8192, precision="fp16")
    rows = build_rows(sub, FeatureSnapshot(), ["T4", "H100-SXM"], CAT)
    t4 = CAT.resolve("T4")
    assert t4 is not None
    peak = t4.peak_tflops * 1e12 / (6 * 8e9 * 8192)
    pred = np.array([1.0, 0.5])
    cut_pred, lower, upper, cut = bound_by_peak(pred, pred * 0.5, pred * 2, rows)
    assert cut.tolist() == [True, False]
    assert cut_pred[0] == pytest.approx(peak, rel=1e-12) and upper[0] == cut_pred[0]
    assert lower[0] == cut_pred[0] and cut_pred[1] == 0.5 and (lower[1], upper[1]) == (0.25, 1.0)
    moe = build_rows(submission("j", 1, family="moe", params=8e9, seq_len=8192), FeatureSnapshot(), ["T4"], CAT)
    assert not bound_by_peak(np.array([1.0]), np.array([1.0]), np.array([1.0]), moe)[3].any()  # FLOPs unknown


def test_rows_without_a_parameter_count_are_served_what_history_holds() -> None:
    """No size given or derivable: the model type's median on each part stands in for the model's flat guess."""
    from features.rows import build_rows
    from features.snapshot import FeatureSnapshot, LookupStat
    from predictor.ranking import history_where_params_unknown
    from tests.factories import submission

    snap = FeatureSnapshot(lookup_model={"T4": LookupStat(5, 2.0), "H100-SXM": LookupStat(5, 20.0)})
    sized = build_rows(submission("j", 1), snap, ["T4", "H100-SXM", "L4"], CAT)
    unsized = build_rows(submission("j", 1, params=None), snap, ["T4", "H100-SXM", "L4"], CAT)
    flat = np.array([10.0, 11.0, 10.5])
    assert not history_where_params_unknown(flat, flat / 2, flat * 2, sized)[3].any()
    pred, lower, upper, used = history_where_params_unknown(flat, flat / 2, flat * 2, unsized)
    assert used.tolist() == [True, True, False]  # L4: no history, the model's estimate stays
    np.testing.assert_allclose(pred, [2.0, 20.0, 10.5])
    np.testing.assert_allclose(lower, [1.0, 10.0, 5.25])
    np.testing.assert_allclose(upper, [4.0, 40.0, 21.0])
