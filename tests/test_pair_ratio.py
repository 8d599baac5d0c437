"""The pair ratio model (:mod:`predictor.pair_ratio`) and the served model's use of it for model
types never seen."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from leap.core.hardware import load_catalogue
from leap.training import measurements as m
from leap.training.measurements.runner import Fold
from predictor.calibration import EVIDENCE, evidence_level
from predictor.lgbm import LightGBMThroughput
from predictor.models import ESTIMATES, RATIO_MODEL
from predictor.pair_ratio import PairRatioModel
from tests.factories import slice_table

GAVEL = Path(__file__).resolve().parent.parent / "data" / "measurements" / "gavel.csv"


@pytest.fixture(scope="module")
def new_workload(tmp_path_factory: pytest.TempPathFactory) -> Fold:
    """Three Gavel workloads; the fold holds one of them out whole (a model type never seen)."""
    small = slice_table(GAVEL, tmp_path_factory.mktemp("r") / "small.csv", {"LM", "ResNet-18", "Transformer"})
    t, th = m.load_history(small)
    held = next(iter(m.folds(t, "leave_one_workload_out", 0)))
    return m.make_fold(th, held, load_catalogue())


def test_the_ratio_needs_a_prior_elsewhere(new_workload: Fold) -> None:
    train, test = new_workload.train, new_workload.test
    pred = PairRatioModel().fit(train.rows, train.y, train.job_key).predict(test.rows)
    cold = test.rows["prior_other_n"] == 0
    assert np.isnan(pred[cold]).all() and np.isfinite(pred[~cold]).all()


def test_the_ratio_round_trips_through_its_state(new_workload: Fold) -> None:
    train, test = new_workload.train, new_workload.test
    model = PairRatioModel(seed=3).fit(train.rows, train.y, train.job_key)
    assert model.booster_ is not None
    again = PairRatioModel.from_state(model.state(), model.booster_.model_to_string())
    np.testing.assert_array_equal(again.predict(test.rows), model.predict(test.rows))
    assert again.band_ == model.band_ and again.get_params() == model.get_params()


@pytest.fixture(scope="module")
def served(new_workload: Fold) -> LightGBMThroughput:
    train = new_workload.train
    return LightGBMThroughput(num_threads=1).fit(train.rows, train.y, train.job_key)


def test_the_choice_is_made_per_evidence_level_out_of_fold(served: LightGBMThroughput) -> None:
    assert set(served.ratio_new_type_) == set(EVIDENCE)
    # fitted on all rows exactly when some level chose it
    assert (served.ratio_ is not None) == any(served.ratio_new_type_.values())
    off = LightGBMThroughput(num_threads=1, pair_ratio=False)
    assert off.get_params()["pair_ratio"] is False


def test_a_new_model_type_is_served_the_ratio_where_it_was_chosen_and_says_so(
        new_workload: Fold, served: LightGBMThroughput) -> None:
    train, test = new_workload.train, new_workload.test
    model = LightGBMThroughput.from_artifact(served.state(), served.model_texts())
    # as if held-out types had shown the ratio clearly better than both the paired transfer and the model
    model.ratio_new_type_ = dict.fromkeys(EVIDENCE, False) | {"other": True}
    model.gate_new_type_ = dict.fromkeys(EVIDENCE, False)
    model.ratio_ = PairRatioModel(seed=0).fit(train.rows, train.y)
    pred, estimate = model.predict_explained(test.rows)
    ratio = model.ratio_.predict(test.rows)
    by_ratio = (evidence_level(test.rows) == EVIDENCE.index("other")) & np.isfinite(ratio)
    assert by_ratio.any() and RATIO_MODEL in ESTIMATES
    np.testing.assert_allclose(pred[by_ratio], ratio[by_ratio], rtol=1e-9)
    assert set(estimate[by_ratio].tolist()) == {RATIO_MODEL}
    assert RATIO_MODEL not in estimate[~by_ratio].tolist()
    # known model types never take it
    known = model.predict_explained(train.rows)[1]
    assert RATIO_MODEL not in known.tolist()
    # and it is saved with the model
    again = LightGBMThroughput.from_artifact(model.state(), model.model_texts())
    np.testing.assert_array_equal(again.predict(test.rows), model.predict(test.rows))
