"""The selectors: which estimate a row serves, learned on held-out rows, saved and compiled with the model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from features.rows import Rows
from leap.core.accuracy import summary
from leap.training.dataset import Examples
from predictor import selector
from predictor.calibration import EVIDENCE
from predictor.compiled import CompiledTrees
from predictor.lgbm import LightGBMThroughput
from predictor.registry import Registry
from predictor.selector import CANDIDATES, CONTEXT, PREFIX, SELECTOR_GROUPS, fit_selectors, select


def synthetic(n: int, seed: int) -> tuple[Rows, np.ndarray, np.ndarray]:
    """Rows whose job ran elsewhere only: the measured throughput is the prior itself where
    ``paired_model_n`` is 0 (an input-bound job, say) and the model's prediction elsewhere."""
    rng = np.random.default_rng(seed)
    rows: Rows = {c: rng.normal(0.0, 1.0, n) for c in {*CANDIDATES["other"], *CONTEXT}}
    rows["paired_model_n"] = rng.integers(0, 2, n).astype(np.float64)
    served = rows["prior_other_log"] + rng.choice([-0.5, 0.5], n)
    truth = np.where(rows["paired_model_n"] == 0, rows["prior_other_log"], served)
    return rows, served, np.exp(truth + rng.normal(0.0, 0.01, n))


def test_a_selector_learns_which_estimate_lands_within_ten_percent() -> None:
    rows, served, y = synthetic(2000, seed=1)
    level = np.full(len(y), EVIDENCE.index("other"))
    boosters = fit_selectors(rows, served, y, level, num_threads=1, seed=0)
    assert set(boosters) == {PREFIX + "other"}
    test_rows, test_served, test_y = synthetic(1000, seed=2)
    chosen = select(dict(boosters), test_rows, test_served, level[:1000], num_threads=1)
    before = summary(np.exp(test_served), test_y)["acc@10"]
    after = summary(np.exp(chosen), test_y)["acc@10"]
    assert before == pytest.approx(0.5, abs=0.05)
    assert after > 0.95
    # only ever one of the row's own estimates
    estimates = np.column_stack([test_served, *(test_rows[c] for c in CANDIDATES["other"])])
    assert np.all(np.any(np.isclose(estimates, chosen[:, None]), axis=1))


def test_levels_with_few_held_out_rows_or_no_candidates_keep_the_prediction() -> None:
    rows, served, y = synthetic(2000, seed=3)
    level = np.repeat([EVIDENCE.index("other"), EVIDENCE.index("same"), EVIDENCE.index("none")],
                      [selector.MIN_ROWS - 1, 1000, 2000 - 999 - selector.MIN_ROWS])
    rows = {**rows, "prior_same_log": rows["prior_other_log"], "prior_same_last_log": served + 1.0}
    boosters = fit_selectors(rows, served, y, level, num_threads=1, seed=0)
    assert set(boosters) == {PREFIX + "same"}  # too few "other" rows; "none" has no candidates
    chosen = select(dict(boosters), rows, served, level, num_threads=1)
    kept = level != EVIDENCE.index("same")
    np.testing.assert_array_equal(chosen[kept], served[kept])


def test_without_selectors_nothing_changes() -> None:
    rows, served, _ = synthetic(100, seed=4)
    np.testing.assert_array_equal(select({}, rows, served, np.ones(100, dtype=int), num_threads=1), served)


# ---------------------------------------------------------------------------- in the served model


def test_the_served_model_fits_selectors_on_its_held_out_jobs(served_with_selectors: tuple[LightGBMThroughput, Examples]
                                                              ) -> None:
    model, holdout = served_with_selectors
    assert set(model.selectors_) == {PREFIX + name for name in CANDIDATES}
    chosen = model.predict(holdout.rows)
    selectors, model.selectors_ = model.selectors_, {}
    try:
        plain = model.predict(holdout.rows)
    finally:
        model.selectors_ = selectors
    assert np.isfinite(chosen).mean() > 0.9
    assert (chosen != plain).any()  # some rows serve another estimate
    none = holdout.rows["prior_same_n"] + holdout.rows["prior_other_n"] == 0
    np.testing.assert_array_equal(chosen[none], plain[none])  # rows without history keep the prediction


def test_selectors_are_saved_loaded_and_compiled_with_the_model(
    served_with_selectors: tuple[LightGBMThroughput, Examples], tmp_path: Path
) -> None:
    model, holdout = served_with_selectors
    record = Registry(tmp_path / "registry").save(model, {"metrics": {}})
    assert {p.name for p in record.path.iterdir()} >= {f"{name}.txt" for name in model.selectors_}
    loaded = Registry(tmp_path / "registry").load(record.version)
    assert isinstance(loaded, LightGBMThroughput)
    expected = model.predict(holdout.rows)
    np.testing.assert_array_equal(loaded.predict(holdout.rows), expected)
    loaded.compile_trees(tmp_path / "compiled")
    assert all(isinstance(loaded.trees_[name], CompiledTrees) for name in model.selectors_)
    np.testing.assert_allclose(loaded.predict(holdout.rows), expected, rtol=1e-9, atol=0, equal_nan=True)


def test_a_model_without_a_feature_group_the_selectors_read_fits_none(small_history: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # Selectors would serve the job's prior to an ablation that removed it (docs/model.md, drivers).
    from leap.core.hardware import load_catalogue
    from leap.training.dataset import build_examples, read_history
    from predictor import lgbm

    ex = build_examples(read_history(small_history), load_catalogue())
    monkeypatch.setattr(lgbm, "HOLDOUT_FROM", 1000)
    monkeypatch.setattr(selector, "MIN_ROWS", 30)
    groups = tuple(g for g in SELECTOR_GROUPS if g != "prior")
    model = LightGBMThroughput(n_estimators=20, num_leaves=15, num_threads=1, feature_groups=groups,
                               early_stopping_rounds=0).fit(ex.rows, ex.y, ex.job_key)
    assert model.selectors_ == {}
