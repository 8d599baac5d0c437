"""The metric definitions, on examples computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from leap.core.accuracy import (
    TRUST_GRID,
    acc_at,
    best_weight,
    clear_winner,
    hits,
    is_hit,
    mape,
    regret,
    relative_error,
    relative_errors,
    summary,
    top1,
    within,
)


def test_relative_errors_by_hand() -> None:
    err = relative_errors([110.0, 80.0, np.nan], [100.0, 100.0, 50.0])
    assert err[0] == pytest.approx(0.10)
    assert err[1] == pytest.approx(0.20)
    assert math.isnan(err[2])


def test_acc_at_counts_boundary_as_hit_and_nan_as_miss() -> None:
    pred = [110.0, 80.0, 100.0, np.nan]  # errors 0.10, 0.20, 0.00, missing
    actual = [100.0, 100.0, 100.0, 100.0]
    assert acc_at(pred, actual, 0.10) == pytest.approx(2 / 4)
    assert acc_at(pred, actual, 0.20) == pytest.approx(3 / 4)


def test_boundary_is_a_hit_even_when_the_division_rounds_up() -> None:
    # |1.1 - 1.0| / 1.0 == 0.10000000000000009: ten percent off all the same
    assert relative_error(1.1, 1.0) > 0.10
    assert is_hit(1.1, 1.0, 0.10) and within(relative_error(1.1, 1.0), 0.10)
    assert not is_hit(1.1 + 1e-9, 1.0, 0.10)
    assert hits([1.1, 1.1 + 1e-9], [1.0, 1.0], 0.10).tolist() == [True, False]


def test_scalar_and_array_hit_tests_agree() -> None:
    rng = np.random.default_rng(3)
    actual = rng.uniform(1.0, 1000.0, 2000)
    # many predictions sitting on the 10% and 20% boundaries, a few missing or infinite
    pred = actual * rng.choice([0.8, 0.9, 1.1, 1.2, 1.0], actual.size) + rng.choice([0.0, 1e-13, -1e-13], actual.size)
    pred[::97] = np.nan
    pred[::131] = np.inf
    err = relative_errors(pred, actual)
    for tol in (0.10, 0.20):
        scalar = [is_hit(float(p), float(a), tol) for p, a in zip(pred, actual, strict=True)]
        assert hits(pred, actual, tol).tolist() == scalar == within(err, tol).tolist()
        assert acc_at(pred, actual, tol) == pytest.approx(np.mean(scalar))
    scalar_err = np.array([relative_error(float(p), float(a)) for p, a in zip(pred, actual, strict=True)])
    assert np.array_equal(scalar_err, err, equal_nan=True)


def test_missing_or_infinite_prediction_is_a_miss() -> None:
    assert math.isnan(relative_error(math.nan, 100.0))
    assert math.isnan(relative_error(math.inf, 100.0))
    assert not is_hit(math.nan, 100.0, 0.5)
    assert hits([np.nan, np.inf, -np.inf, 100.0], 100.0, 0.5).tolist() == [False, False, False, True]


def test_hits_broadcasts_a_matrix_against_a_column() -> None:
    pred = np.array([[100.0, 111.0], [80.0, 95.0]])
    actual = np.array([[100.0], [100.0]])
    assert hits(pred, actual, 0.10).tolist() == [[True, False], [False, True]]


def test_mape_excludes_nan_and_summary_flags_it() -> None:
    pred = [110.0, 80.0, np.nan]
    actual = [100.0, 100.0, 100.0]
    assert mape(pred, actual) == pytest.approx((0.10 + 0.20) / 2)
    s = summary(pred, actual)
    assert s == {
        "acc@10": pytest.approx(1 / 3),
        "acc@20": pytest.approx(2 / 3),
        "mape": pytest.approx(0.15),
        "n": 3,
        "n_missing": 1,
    }


def test_mape_is_nan_without_any_prediction() -> None:
    assert math.isnan(mape([np.nan], [1.0]))


def test_bad_actuals_rejected() -> None:
    with pytest.raises(ValueError):
        acc_at([1.0], [0.0], 0.1)
    with pytest.raises(ValueError):
        acc_at([1.0, 2.0], [1.0], 0.1)
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError):
            relative_error(1.0, bad)
        with pytest.raises(ValueError):
            hits([1.0], [bad], 0.1)


def test_top1_and_regret_with_prices() -> None:
    # Two jobs, three hardware types priced 1, 2, 4 $/h.
    price = [1.0, 2.0, 4.0]
    true = [[10.0, 30.0, 40.0], [10.0, 15.0, 80.0]]
    # per dollar: job0 = [10, 15, 10] -> best column 1; job1 = [10, 7.5, 20] -> best column 2
    pred = [[10.0, 30.0, 40.0], [10.0, 40.0, 60.0]]
    # predicted per dollar: job0 -> column 1 (hit); job1 = [10, 20, 15] -> column 1 (miss)
    assert top1(pred, true, price) == pytest.approx(0.5)
    # job0 regret 0; job1 chose 7.5 samples/$ vs best 20: cost per unit 1/7.5 vs 1/20 -> 20/7.5 - 1
    assert regret(pred, true, price) == pytest.approx((0.0 + (20 / 7.5 - 1)) / 2)


def test_top1_nan_prediction_never_chosen_and_ties_are_hits() -> None:
    true = [[5.0, 5.0], [1.0, 2.0]]
    pred = [[1.0, 2.0], [np.nan, 1.0]]
    assert top1(pred, true) == pytest.approx(1.0)  # tie in truth; NaN skipped -> column 1
    assert regret(pred, true) == pytest.approx(0.0)


def test_regret_needs_full_truth() -> None:
    with pytest.raises(ValueError):
        regret([[1.0, 2.0]], [[1.0, np.nan]])


def test_best_weight_keeps_a_correction_only_as_far_as_it_helps() -> None:
    actual = np.full(10, 100.0)
    up = np.full(10, math.log(1.25))
    # 20% low, corrected by exactly x1.25: within 10% from w = 0.6 up; the smallest such w wins.
    assert best_weight(np.log(np.full(10, 80.0)), up, actual) == 0.6
    # Already right, and the correction goes the wrong way: keep none of it.
    assert best_weight(np.log(np.full(10, 95.0)), np.full(10, -1.0), actual) == 0.0
    # Half 20% low (hit from w = 0.6), half 10% low (overshoot beyond w = 0.8): 0.6 serves both.
    mixed = np.log(np.r_[np.full(5, 80.0), np.full(5, 90.0)])
    assert best_weight(mixed, up, actual) == 0.6
    # Half 20% low, half 25% low (hit from w = 0.9): only 0.9 and up serve both.
    assert best_weight(np.log(np.r_[np.full(5, 80.0), np.full(5, 75.0)]), up, actual) == 0.9
    assert 0.8 in TRUST_GRID


def test_clear_winner_needs_more_than_the_margin_of_standard_errors() -> None:
    # option 1 hits on 9 rows where option 0 misses, 1 row the other way: 8 more hits, sqrt(10) ~ 3.2
    hit = np.array([[False, True]] * 9 + [[True, False]] + [[True, True]] * 10)
    assert clear_winner(hit, 0, 1.0) == 1
    assert clear_winner(hit, 0, 3.0) == 0  # 8 <= 3 x 3.16: the reference stays
    assert clear_winner(hit, 1, 1.0) == 1  # the reference itself has the most hits


def test_clear_winner_counts_a_cluster_once() -> None:
    """The same 8-hit lead, carried by one workload, is one lucky draw: its standard error is the
    cluster's whole difference (8), not sqrt(10)."""
    hit = np.array([[False, True]] * 9 + [[True, False]] + [[True, True]] * 10)
    one_workload = np.array(["a"] * 10 + ["b"] * 10)
    assert clear_winner(hit, 0, 1.0, one_workload) == 0
    # spread over many workloads, each row its own cluster: the row-level rule
    assert clear_winner(hit, 0, 1.0, np.arange(20)) == clear_winner(hit, 0, 1.0) == 1
