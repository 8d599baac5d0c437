"""``ThroughputModel.predict_explained``: the same numbers as ``predict``, and which estimate each row serves."""

from __future__ import annotations

import numpy as np
import pytest

from features.rows import Rows
from leap.training.dataset import Examples
from predictor import lgbm
from predictor.lgbm import LightGBMThroughput
from predictor.models import (
    BASELINES,
    ESTIMATE_OF_COLUMN,
    ESTIMATES,
    LookupTable,
    PairedTransfer,
    first_finite,
    first_finite_source,
)

NAN = float("nan")


def test_first_finite_source_names_the_column_that_answered() -> None:
    a, b, c = np.array([1.0, NAN, NAN, NAN]), np.array([2.0, 3.0, NAN, NAN]), np.array([NAN, 4.0, 5.0, NAN])
    values, source = first_finite_source(a, b, c)
    np.testing.assert_array_equal(values, first_finite(a, b, c))
    np.testing.assert_array_equal(source, [0, 1, 2, -1])


def baseline_rows() -> Rows:
    """A paired transfer, a plain transfer only, a model-type median only, a family median only,
    nothing; the last row ran here (the row builder puts its measurement in the transfer columns)."""
    return {
        "transfer_paired_log": np.array([1.0, NAN, NAN, NAN, NAN, 0.5]),
        "transfer_log": np.array([2.0, 2.5, NAN, NAN, NAN, 0.5]),
        "lookup_model_log": np.array([3.0, 3.0, 3.5, NAN, NAN, 3.0]),
        "lookup_family_log": np.array([4.0, 4.0, 4.0, 4.5, NAN, 4.0]),
        "prior_same_n": np.array([0.0, 0.0, 0.0, 0.0, 0.0, 2.0]),
    }


@pytest.mark.parametrize("kind", sorted(BASELINES))
def test_a_baseline_labels_each_row_with_the_column_that_answered(kind: str) -> None:
    model, rows = BASELINES[kind](), baseline_rows()
    pred, estimate = model.predict_explained(rows)
    np.testing.assert_array_equal(pred, model.predict(rows))
    assert set(estimate) <= set(ESTIMATES)
    expected = {"transfer_paired": ["paired_ratio", "prior_carried", "lookup", "lookup", "none", "measured_here"],
                "transfer": ["prior_carried", "prior_carried", "lookup", "lookup", "none", "measured_here"],
                "lookup": ["lookup", "lookup", "lookup", "lookup", "none", "lookup"]}[kind]
    assert list(estimate) == expected


def test_labels_of_the_paired_transfer_point_at_the_value_served() -> None:
    rows = baseline_rows()
    pred, estimate = PairedTransfer().predict_explained(rows)
    assert pred[0] == np.exp(rows["transfer_paired_log"][0]) and pred[1] == np.exp(rows["transfer_log"][1])
    assert (estimate[0], estimate[1]) == ("paired_ratio", "prior_carried")
    assert LookupTable().predict_explained(rows)[1][0] == "lookup"


# ---------------------------------------------------------------------------- the served model




def served_from(model: LightGBMThroughput, rows: Rows, pred: np.ndarray, estimate: np.ndarray) -> None:
    """Every row not labelled ``model`` serves exactly a column with its label (in the rows or the base
    model's derived columns); ``none`` exactly where there is no prediction."""
    based = model._with_base(rows)
    assert set(estimate) <= set(ESTIMATES)
    np.testing.assert_array_equal(estimate == "none", np.isnan(pred))
    for i in np.flatnonzero((estimate != "model") & (estimate != "none")):
        columns = [c for c, label in ESTIMATE_OF_COLUMN.items() if label == estimate[i] and c in based]
        assert any(np.isclose(np.log(pred[i]), based[c][i], rtol=0, atol=1e-12) for c in columns), \
            (i, estimate[i], columns)


def test_the_served_model_gives_the_same_numbers_and_says_which_estimate(
        served_with_selectors: tuple[LightGBMThroughput, Examples]) -> None:
    model, holdout = served_with_selectors
    assert model.selectors_  # the selectors run in this pass
    pred, estimate = model.predict_explained(holdout.rows)
    np.testing.assert_array_equal(pred, model.predict(holdout.rows))
    served_from(model, holdout.rows, pred, estimate)
    assert "model" in set(estimate) and len(set(estimate)) >= 3  # the selectors pick other estimates too


def test_without_trust_in_the_correction_the_anchor_is_served_and_named(
        served_with_selectors: tuple[LightGBMThroughput, Examples]) -> None:
    model, holdout = served_with_selectors
    kept = model.selectors_, model.trust_by_evidence_, model.trust_new_type_
    try:
        model.selectors_, model.trust_by_evidence_, model.trust_new_type_ = {}, dict.fromkeys(lgbm.EVIDENCE, 0.0), {}
        pred, estimate = model.predict_explained(holdout.rows)
    finally:
        model.selectors_, model.trust_by_evidence_, model.trust_new_type_ = kept
    assert "model" not in set(estimate)
    served_from(model, holdout.rows, pred, estimate)
    ran_here = holdout.rows["prior_same_n"] > 0
    assert ran_here.any() and set(estimate[ran_here]) == {"measured_here"}  # first in the anchor chain
