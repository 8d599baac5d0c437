"""Helpers of the served model: serving ones give what the numpy formulations they replace gave;
the early-stopped fit keeps only the trees it predicts with; a size knob given is used."""

from __future__ import annotations

import lightgbm as lgb
import numpy as np

from predictor.boosting import LARGE_SIZE, SMALL_ROWS, SMALL_SIZE, map_values, size_for, train_stopping_early


def test_map_values_equals_unique_and_lookup() -> None:
    values = np.array(["H100", "A100", "none", "H100", float("nan"), None, "unseen", "A100"], dtype=object)
    table = {"H100": 0, "A100": 1, "none": 2, "nan": 3}
    distinct, inverse = np.unique(values.astype(str), return_inverse=True)
    expected = np.array([table.get(v, np.nan) for v in distinct], dtype=np.float64)[inverse]
    got = map_values(values, table, np.nan, np.float64)
    assert got.dtype == np.float64 and got.tobytes() == expected.tobytes()
    assert map_values(values[:0], table, -1, np.int64).shape == (0,)
    assert map_values(values, {"H100": True}, False, bool).tolist() == [True, False, False, True] + [False] * 4


def test_early_stopping_keeps_only_the_best_rounds_trees() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 4))
    y = x[:, 0] + rng.normal(scale=2.0, size=600)  # mostly noise: held-out loss stops improving early
    params = {"objective": "regression", "num_leaves": 31, "learning_rate": 0.3, "min_child_samples": 5,
              "verbose": -1, "num_threads": 1, "seed": 0, "deterministic": True}
    data = lgb.Dataset(x[:400], label=y[:400])
    valid = lgb.Dataset(x[400:], label=y[400:], reference=data)
    full = lgb.train(params, lgb.Dataset(x[:400], label=y[:400]), num_boost_round=200)
    stopped = train_stopping_early(params, data, 200, valid, patience=10)
    kept = stopped.num_trees()
    assert 1 <= kept < 200
    losses = [float(np.mean((full.predict(x[400:], num_iteration=k) - y[400:]) ** 2)) for k in range(1, kept + 11)]
    assert int(np.argmin(losses)) + 1 == kept  # the best round of those it tried, and no tree after it
    np.testing.assert_allclose(stopped.predict(x), full.predict(x, num_iteration=kept), rtol=1e-12)
    assert train_stopping_early(params, lgb.Dataset(x[:400], label=y[:400]), 50, None, 10).num_trees() == 50
    assert train_stopping_early(params, lgb.Dataset(x[:400], label=y[:400]), 50, valid, 0).num_trees() == 50


def test_a_size_knob_given_applies_at_any_size_and_one_unset_follows_the_training_rows() -> None:
    unset = dict.fromkeys(SMALL_SIZE)
    assert size_for(SMALL_ROWS - 1, unset) == SMALL_SIZE and size_for(SMALL_ROWS, unset) == LARGE_SIZE
    given = {**unset, "num_leaves": 7, "learning_rate": 0.02}
    assert size_for(200, given) == {**SMALL_SIZE, "num_leaves": 7, "learning_rate": 0.02}
    assert size_for(50_000, given) == {**LARGE_SIZE, "num_leaves": 7, "learning_rate": 0.02}
