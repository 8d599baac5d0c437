"""The served model's calibration (:mod:`predictor.calibration`): blend, trust, gate, band, folds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from features.rows import build_rows
from features.snapshot import FeatureSnapshot, LookupStat, PairStat, PriorStat
from leap.core.hardware import load_catalogue
from predictor.calibration import (
    EVIDENCE,
    GATE_MARGIN,
    MIN_ROWS,
    as_new_type,
    band_by_evidence,
    blend,
    evidence_level,
    gate_by_evidence,
    gated,
    job_folds,
    restore,
    trust_by_evidence,
)


def test_blend_moves_from_the_base_ratio_to_the_paired_one_with_its_weight() -> None:
    base, paired, weight = np.array([0.0, 0.0, 0.0]), np.array([1.0, 1.0, 1.0]), np.array([0.0, 1.0, 3.0])
    np.testing.assert_allclose(blend(base, paired, weight, 1.0), [0.0, 0.5, 0.75])
    np.testing.assert_allclose(blend(base, paired, weight, math.inf), [0.0, 0.0, 0.0])
    np.testing.assert_allclose(blend(base, paired, weight, 0.0), [0.0, 1.0, 1.0])  # any weight wins at k = 0


def test_blend_takes_whichever_estimate_exists() -> None:
    out = blend(np.array([np.nan, 2.0, np.nan]), np.array([1.0, np.nan, np.nan]), np.ones(3), 1.0)
    np.testing.assert_array_equal(out[:2], [1.0, 2.0])
    assert np.isnan(out[2])


def _level_rows(n: int, level: int) -> np.ndarray:
    return np.full(n, level)


def test_trust_is_whole_for_an_exact_correction_and_none_for_noise() -> None:
    rng = np.random.default_rng(5)
    n = 600
    y_log = rng.normal(3, 1, n)
    anchor = y_log + rng.normal(0, 0.3, n)
    exact = y_log - anchor
    noise = rng.normal(0, 0.3, n)
    level = np.r_[_level_rows(n // 2, 0), _level_rows(n - n // 2, 1)]
    correction = np.where(level == 0, exact, noise)
    trust = trust_by_evidence(anchor, correction, np.exp(y_log), level)
    # A tie keeps the smallest weight with the most hits: 0.9 of an exact correction already hits.
    assert trust["same"] >= 0.9
    assert trust["other"] == 0.0
    assert "none" not in trust  # no rows: restore() gives the default
    assert restore(trust).tolist() == [trust["same"], 0.0, 1.0]


def test_gate_keeps_the_model_only_where_it_is_clearly_better() -> None:
    rng = np.random.default_rng(6)
    n = 300
    y_log = rng.normal(3, 1, 3 * n)
    level = np.repeat([0, 1, 2], n)
    good = y_log + rng.normal(0, 0.02, 3 * n)  # nearly always within 10%
    poor = y_log + rng.normal(0, 0.5, 3 * n)
    served = np.where(level == 0, good, np.where(level == 1, poor, good))
    fallback = np.where(level == 0, poor, np.where(level == 1, good, good))
    gate = gate_by_evidence(served, fallback, np.exp(y_log), level)
    assert gate == {"same": True, "other": False, "none": False}  # level 2: a tie keeps the fallback


@pytest.mark.parametrize(("extra_wins", "kept"), [(0, False), (5, True)])
def test_gate_needs_a_win_of_more_than_gate_margin_standard_errors(extra_wins: int, kept: bool) -> None:
    # 100 rows where exactly one of the two lands within 10 %: one standard error is sqrt(100) = 10
    # rows, so the model ahead by exactly GATE_MARGIN of them keeps the fallback; ahead by more, not.
    model_wins = 50 + round(5 * GATE_MARGIN) + extra_wins
    model_hits = np.arange(100) < model_wins
    served = np.where(model_hits, 0.0, 0.5)
    fallback = np.where(model_hits, 0.5, 0.0)
    gate = gate_by_evidence(served, fallback, np.ones(100), np.zeros(100, dtype=int))
    assert gate["same"] is kept


def test_gate_serves_the_fallback_on_too_few_rows() -> None:
    n = MIN_ROWS - 1
    y_log = np.zeros(n)
    gate = gate_by_evidence(y_log, y_log + 1.0, np.exp(y_log), np.zeros(n, dtype=int))
    assert gate["same"] is False


def test_gated_falls_back_only_where_the_fallback_has_an_estimate() -> None:
    out = gated(np.array([1.0, 1.0, 1.0]), np.array([2.0, np.nan, 2.0]), np.array([False, False, True]))
    np.testing.assert_array_equal(out, [2.0, 1.0, 1.0])


def test_band_is_the_residual_quantiles_per_level_and_overall_where_few() -> None:
    rng = np.random.default_rng(9)
    n = 1000
    residual = np.r_[rng.normal(0, 0.1, n), rng.normal(0, 0.5, n), rng.normal(0, 1.0, 5)]
    level = np.r_[np.zeros(n, dtype=int), np.ones(n, dtype=int), np.full(5, 2)]
    overall, by_level = band_by_evidence(residual, level)
    assert set(by_level) == set(EVIDENCE)
    assert by_level["same"][1] - by_level["same"][0] < by_level["other"][1] - by_level["other"][0]
    assert by_level["none"] == overall
    inside = (residual[:n] >= by_level["same"][0]) & (residual[:n] <= by_level["same"][1])
    assert inside.mean() == pytest.approx(0.8, abs=0.01)


def test_job_folds_keep_a_jobs_rows_together_and_are_seeded() -> None:
    groups = np.repeat([f"job-{i}" for i in range(50)], 4)
    folds = job_folds(groups, 5, seed=3)
    assert all(len(set(folds[groups == g].tolist())) == 1 for g in np.unique(groups))
    assert set(folds.tolist()) == set(range(5))
    np.testing.assert_array_equal(folds, job_folds(groups, 5, seed=3))
    assert not np.array_equal(folds, job_folds(groups, 5, seed=4))


def test_evidence_level_from_the_prior_counts() -> None:
    rows = {"prior_same_n": np.array([2, 0, 0]), "prior_other_n": np.array([1, 3, 0])}
    assert evidence_level(rows).tolist() == [0, 1, 2]


def test_held_out_rows_are_seen_as_a_new_type_sees_them() -> None:
    """A job that ran on A100 (robust 50/s): its type's medians and paired ratios elsewhere are what
    other jobs of the type taught, which a type nobody ran before cannot have; the family's do stay."""
    from tests.factories import T0, submission

    snap = FeatureSnapshot(
        prior={"A100-80GB": PriorStat(3, T0, 52.0, 50.0)},
        lookup_model={"A100-80GB": LookupStat(9, 45.0), "H100-SXM": LookupStat(4, 110.0)},
        pairs={"model": {"H100-SXM": {"A100-80GB": PairStat(5, 3.0, math.log(2.2))}},
               "family": {"H100-SXM": {"A100-80GB": PairStat(40, 9.0, math.log(1.8))}},
               "all": {"H100-SXM": {"A100-80GB": PairStat(90, 20.0, math.log(1.6))}}},
    )
    sub = submission("job", 1, candidates=["A100-80GB", "H100-SXM"])
    rows = build_rows(sub, snap, sub.candidates, load_catalogue())
    assert rows["transfer_paired_log"][1] == pytest.approx(math.log(50.0 * 2.2))  # the type's own ratio
    new = as_new_type(rows)
    here, there = 0, 1
    assert new["lookup_model_log"][here] == pytest.approx(math.log(50.0))  # its own median
    assert math.isnan(new["lookup_model_log"][there]) and new["lookup_model_n"][there] == 0
    assert math.isnan(new["paired_model_log"][there]) and new["paired_model_weight"][there] == 0
    assert new["transfer_paired_log"][there] == pytest.approx(math.log(50.0 * 1.8))  # the family's ratio
    assert new["transfer_paired_weight"][there] == 9.0
    # the type's lookup ratio carried the prior: the spec ratio does now
    assert new["transfer_log"][there] == pytest.approx(rows["prior_other_log"][there] + rows["spec_ratio_peak"][there])
    assert rows["transfer_log"][there] != pytest.approx(new["transfer_log"][there])
