"""The LightGBM model: learning, determinism, its band, and artifacts without pickle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from leap.core.accuracy import TRUST_GRID, summary
from leap.core.hardware import load_catalogue
from leap.training.dataset import Examples, build_examples, read_history
from leap.training.train import fit_model, split
from predictor.boosting import JOB_EFFECT_COARSENING, SMALL_ROWS, SMALL_SIZE, predict_distinct
from predictor.lgbm import EVIDENCE, LEARNED_ROOFLINE, LightGBMThroughput, evidence_level
from predictor.models import LookupTable, PairedTransfer, PriorTransfer
from predictor.registry import Registry, RegistryError

SMALL = {"n_estimators": 150, "num_leaves": 31}


@pytest.fixture(scope="module")
def examples(small_history: Path) -> Examples:
    return build_examples(read_history(small_history), load_catalogue())


@pytest.fixture(scope="module")
def trained(examples: Examples) -> tuple[LightGBMThroughput, Examples]:
    last = float(np.floor(examples.submit_time.max() / 86400) * 86400)
    sp = split(examples, last + 86400, window_days=30)
    return fit_model(sp.train, SMALL), sp.holdout


def test_beats_both_baselines_on_the_holdout(trained: tuple[LightGBMThroughput, Examples]) -> None:
    model, holdout = trained
    ours = summary(model.predict(holdout.rows), holdout.y)["acc@10"]
    assert ours > summary(LookupTable().predict(holdout.rows), holdout.y)["acc@10"] + 0.1
    assert ours > summary(PriorTransfer().predict(holdout.rows), holdout.y)["acc@10"] + 0.01


def test_training_is_deterministic(examples: Examples, trained: tuple[LightGBMThroughput, Examples]) -> None:
    # every stage, twice on the same rows: a three-day window and small trees keep the two fits short
    _, holdout = trained
    last = float(np.floor(examples.submit_time.max() / 86400) * 86400)
    train = split(examples, last + 86400, window_days=3).train
    params = {"n_estimators": 40, "num_leaves": 15}
    first, again = fit_model(train, params), fit_model(train, params)
    np.testing.assert_array_equal(first.predict(holdout.rows), again.predict(holdout.rows))


def test_a_size_given_holds_on_a_training_set_too_small_for_the_default_size(examples: Examples) -> None:
    # the tables' tuning searches these knobs: below SMALL_ROWS they must move the model too
    last = float(np.floor(examples.submit_time.max() / 86400) * 86400)
    train = split(examples, last + 86400, window_days=3).train
    train = train.select(np.arange(len(train)) < 800)
    assert len(train) < SMALL_ROWS
    model = fit_model(train, {"n_estimators": 12, "num_leaves": 7, "num_threads": 1})
    assert model.size_ == {**SMALL_SIZE, "n_estimators": 12, "num_leaves": 7}
    assert model.booster_ is not None and model.booster_.num_trees() <= 12


def test_band_covers_about_eighty_percent(trained: tuple[LightGBMThroughput, Examples]) -> None:
    model, holdout = trained
    pred = model.predict(holdout.rows)
    lo, hi = model.predict_band(pred, holdout.rows)
    ok = np.isfinite(pred)
    inside = (holdout.y[ok] >= lo[ok]) & (holdout.y[ok] <= hi[ok])
    assert 0.6 <= inside.mean() <= 0.95  # nominal 80% (10th to 90th percentile of residuals)


def test_artifact_round_trip_predicts_identically(tmp_path: Path, trained: tuple[LightGBMThroughput, Examples]) -> None:
    model, holdout = trained
    registry = Registry(tmp_path)
    record = registry.save(model, {"metrics": {}})
    assert sorted(p.name for p in record.path.iterdir()) == ["base.txt", "main.txt", "metadata.json"]
    loaded = registry.load(record.version)
    np.testing.assert_array_equal(loaded.predict(holdout.rows), model.predict(holdout.rows))
    lo1, hi1 = loaded.predict_band(model.predict(holdout.rows), holdout.rows)
    lo2, hi2 = model.predict_band(model.predict(holdout.rows), holdout.rows)
    np.testing.assert_array_equal(lo1, lo2)
    np.testing.assert_array_equal(hi1, hi2)


def test_registry_current_and_rollback(tmp_path: Path, trained: tuple[LightGBMThroughput, Examples]) -> None:
    registry = Registry(tmp_path)
    first = registry.save(trained[0], {}, version="v1").version
    second = registry.save(trained[0], {}, version="v2").version
    assert registry.current() is None
    registry.set_current(first, "test")
    registry.set_current(second, "test")
    assert registry.current() == "v2" and registry.previous() == "v1"
    with pytest.raises(RegistryError, match="unknown model version 'v3'"):
        registry.set_current("v3", "test")
    assert isinstance(registry.load("lookup"), LookupTable)


def test_unknown_feature_group_is_refused(examples: Examples) -> None:
    with pytest.raises(ValueError, match="unknown feature groups"):
        LightGBMThroughput(feature_groups=("config", "weather")).fit(examples.rows, examples.y)


def test_the_prior_is_carried_by_the_paired_ratio_where_other_jobs_showed_one(
        trained: tuple[LightGBMThroughput, Examples]) -> None:
    model, holdout = trained
    rows = {c: v.copy() for c, v in holdout.rows.items()}
    rows["transfer_paired_log"][:300] = np.nan  # no pair seen between these rows' two parts
    based = model._with_base(rows)
    paired, weight = rows["transfer_paired_log"], rows["transfer_paired_weight"]
    shown = np.isfinite(paired) & (weight > 0)
    only_base = ~np.isfinite(paired) & np.isfinite(based["base_transfer_log"])
    assert shown.any() and only_base.any()
    np.testing.assert_allclose(based["blended_transfer_log"][shown], paired[shown], atol=1e-12)
    np.testing.assert_array_equal(based["blended_transfer_log"][only_base], based["base_transfer_log"][only_base])
    with pytest.raises(ValueError, match="blend must be one of"):
        LightGBMThroughput(blend="chosen").fit(holdout.rows, holdout.y)


def test_base_ratio_to_the_same_hardware_is_one(trained: tuple[LightGBMThroughput, Examples]) -> None:
    # The base stage re-evaluates a row on the job's prior hardware by swapping in that type's
    # columns; a swap to the row's own hardware must change nothing, or some hardware-dependent
    # column (a spec, a roofline term) is left behind.
    model, holdout = trained
    rows = {c: v[:200].copy() for c, v in holdout.rows.items()}
    rows["prior_hw"] = rows["hardware"].copy()
    rows["prior_other_log"] = np.zeros(200)
    derived = model._with_base(rows)
    known = np.array([h in model.hardware_specs_ for h in rows["hardware"]])
    assert known.any()
    np.testing.assert_array_equal(derived["base_ratio"][known], 0.0)


def test_base_ratios_stay_within_the_span_its_training_rows_showed(
        trained: tuple[LightGBMThroughput, Examples]) -> None:
    # Linear leaves extrapolate: a configuration far from every training row must not carry a
    # prior across by a ratio the base model never gave a training row.
    model, holdout = trained
    assert model.base_ratio_span_ is not None
    lo, hi = model.base_ratio_span_
    assert lo < 0.0 < hi
    rows = {c: v.copy() for c, v in holdout.rows.items()}
    for column in ("log_batch", "log_params", "log_seq", "log_accelerators"):
        rows[column] = rows[column] * 4.0 - 20.0  # far outside anything trained on
    ratio = model._with_base(rows)["base_ratio"]
    finite = ratio[np.isfinite(ratio)]
    assert finite.size > 0 and finite.min() >= lo and finite.max() <= hi
    state, texts = model.state(), model.model_texts()
    assert state["base_ratio_span"] == [lo, hi]
    assert LightGBMThroughput.from_artifact(state, texts).base_ratio_span_ == (lo, hi)
    del state["base_ratio_span"]  # an artifact saved before the span: unbounded, as it was fitted
    assert LightGBMThroughput.from_artifact(state, texts).base_ratio_span_ is None


def test_trust_scales_the_main_models_correction(trained: tuple[LightGBMThroughput, Examples]) -> None:
    model, holdout = trained
    assert set(model.trust_by_evidence_) <= set(EVIDENCE)
    assert all(w in TRUST_GRID for w in model.trust_by_evidence_.values())
    anchor, correction = model._anchor_and_correction(model._with_base(holdout.rows))
    saved = (dict(model.trust_by_evidence_), dict(model.trust_new_type_), dict(model.gate_),
             dict(model.gate_new_type_), model.selectors_)
    try:
        model.selectors_ = {}
        model.gate_ = model.gate_new_type_ = dict.fromkeys(EVIDENCE, True)  # the model's estimate everywhere
        for w in (0.0, 1.0):  # model types the training rows lacked have trust of their own
            model.trust_by_evidence_ = model.trust_new_type_ = dict.fromkeys(EVIDENCE, w)
            np.testing.assert_allclose(np.log(model.predict(holdout.rows)), anchor + w * correction)
    finally:
        (model.trust_by_evidence_, model.trust_new_type_, model.gate_, model.gate_new_type_,
         model.selectors_) = saved


def test_the_gate_serves_the_paired_transfer_where_the_model_was_not_shown_better(
    trained: tuple[LightGBMThroughput, Examples],
) -> None:
    model, holdout = trained
    assert set(model.gate_) == set(EVIDENCE)
    fallback = PairedTransfer().predict(holdout.rows)
    served = model.predict(holdout.rows)
    level, new = evidence_level(holdout.rows), model._is_new_type(holdout.rows)
    for k, name in enumerate(EVIDENCE):
        # a model type the training rows lacked has a gate of its own (none chosen: the fallback)
        closed = np.where(new, not model.gate_new_type_.get(name, False), not model.gate_[name])
        closed &= (level == k) & np.isfinite(fallback)
        np.testing.assert_allclose(served[closed], fallback[closed])
    saved = dict(model.gate_), dict(model.gate_new_type_)
    try:
        model.gate_ = model.gate_new_type_ = dict.fromkeys(EVIDENCE, False)
        has = np.isfinite(fallback)
        np.testing.assert_allclose(model.predict(holdout.rows)[has], fallback[has])
    finally:
        model.gate_, model.gate_new_type_ = saved


def test_distinct_rows_are_predicted_once_with_the_same_result(trained: tuple[LightGBMThroughput, Examples]) -> None:
    model, holdout = trained
    assert model.base_ is not None
    x = model._base_matrix(holdout.rows)[:50]
    x[::7, 4] = np.nan  # missing values must still match their duplicates
    repeated = np.concatenate([x, x[::-1], x[:5]])
    np.testing.assert_array_equal(
        predict_distinct(model.base_, repeated, 1), model.base_.predict(repeated, num_threads=1)
    )


def test_learned_roofline_is_a_base_column_unless_ablated(
    examples: Examples, trained: tuple[LightGBMThroughput, Examples]
) -> None:
    model, holdout = trained
    assert model.roofline_ is not None and LEARNED_ROOFLINE in model.base_features_
    assert np.isfinite(model.roofline_.predict(holdout.rows)).mean() > 0.99
    last = float(np.floor(examples.submit_time.max() / 86400) * 86400)
    train = split(examples, last + 86400, window_days=30).train
    for params in ({"learned_roofline": False}, {"feature_groups": ("hardware", "prior", "lookup")}):
        # What is fitted, not how well: a few small trees suffice.
        ablated = fit_model(train, {"n_estimators": 10, "num_leaves": 7, **params})
        assert ablated.roofline_ is None and LEARNED_ROOFLINE not in ablated.base_features_
        assert np.isfinite(ablated.predict(holdout.rows)).any()


def test_main_model_stops_on_its_held_out_tenth_and_keeps_the_trees_it_grew(
        small_history: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from predictor import lgbm, selector

    ex = build_examples(read_history(small_history), load_catalogue())
    sp = split(ex, float(np.floor(ex.submit_time.max() / 86400) * 86400) + 86400, window_days=30)
    monkeypatch.setattr(lgbm, "HOLDOUT_FROM", 1000)
    monkeypatch.setattr(selector, "MIN_ROWS", 30)
    # Large steps: the held-out loss stops improving well before the last tree.
    params: dict[str, Any] = {"n_estimators": 60, "num_leaves": 15, "learning_rate": 0.5, "num_threads": 1}
    grown = LightGBMThroughput(**params, early_stopping_rounds=0).fit(sp.train.rows, sp.train.y, sp.train.job_key)
    stopped = LightGBMThroughput(**params, early_stopping_rounds=5).fit(sp.train.rows, sp.train.y, sp.train.job_key)
    assert grown.booster_ is not None and stopped.booster_ is not None
    kept = stopped.booster_.num_trees()
    assert grown.booster_.num_trees() == 60 and 1 <= kept < 60
    # Stopping changes nothing but the count: the kept trees are the first ones of the full fit.
    x = stopped._matrix(stopped._with_base(sp.train.rows))
    np.testing.assert_allclose(stopped.booster_.predict(x), grown.booster_.predict(x, num_iteration=kept), rtol=1e-12)



def test_a_first_base_fit_is_grown_only_to_estimate_the_jobs_speed(
        examples: Examples, monkeypatch: pytest.MonkeyPatch) -> None:
    from predictor import lgbm

    fitted: list[tuple[int, float]] = []
    real = lgbm.train_and_score

    def counting(params: dict[str, Any], data: Any, rounds: int) -> Any:
        fitted.append((rounds, params["learning_rate"]))
        return real(params, data, rounds)

    monkeypatch.setattr(lgbm, "train_and_score", counting)
    monkeypatch.setattr(lgbm, "HOLDOUT_FROM", 1000)  # one base model a fit, not one a fold
    train = split(examples, float(np.floor(examples.submit_time.max() / 86400) * 86400) + 86400, window_days=30).train
    small: dict[str, Any] = {"n_estimators": 12, "num_leaves": 7, "num_threads": 1, "selectors": False,
                             "learning_rate": 0.1}
    coarse = (12 // JOB_EFFECT_COARSENING, pytest.approx(0.1 * JOB_EFFECT_COARSENING))
    for job_effects, fits in ((True, [coarse, (12, 0.1)]), (False, [(12, 0.1)])):
        fitted.clear()
        model = LightGBMThroughput(**small, job_effects=job_effects).fit(train.rows, train.y, train.job_key)
        # the learned roofline reads the targets either way; only the jobs' speed needs a first fit,
        # a coarser one (fewer trees, a higher rate) from HOLDOUT_FROM rows on
        assert model.roofline_ is not None and model.base_ is not None
        assert fitted == fits
    # below HOLDOUT_FROM rows (scored out of fold) every base fit, the first included, is whole
    monkeypatch.setattr(lgbm, "HOLDOUT_FROM", len(train.y) + 1)
    fitted.clear()
    LightGBMThroughput(**small).fit(train.rows, train.y, train.job_key)
    assert len(fitted) > 2 and set(fitted) == {(12, 0.1)}
