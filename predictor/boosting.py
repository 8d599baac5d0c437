"""LightGBM settings and helpers of the served model (:mod:`predictor.lgbm`).

How big the trees are and how categories split depend on how many rows there are to learn from;
a serving batch evaluates each distinct row once; the base model learns from targets with each
job's own speed removed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightgbm as lgb
import numpy as np

from predictor.compiled import TreePredictor

#: From this many training rows on, a random tenth is held out to calibrate; below, all rows out of fold.
HOLDOUT_FROM = 20_000
#: The served model's size where its knobs are left unset (None): below :data:`SMALL_ROWS`
#: training rows the trees are small and many, learning slowly from few rows per leaf (the settings
#: the old pairwise model used on the public tables' few hundred rows, chosen on fold seed 0
#: against two other sizes); from there on, :data:`LARGE_SIZE`. A knob that is set applies at any
#: size, so that a search over it moves the model on a small table too.
SMALL_ROWS = 1000
SMALL_SIZE: dict[str, float] = {"num_leaves": 15, "n_estimators": 400, "min_child_samples": 5, "learning_rate": 0.05}
LARGE_SIZE: dict[str, float] = {"num_leaves": 63, "n_estimators": 300, "min_child_samples": 30, "learning_rate": 0.08}
#: The base model's first fit only estimates each job's speed factor (the mean of the job's residuals,
#: :func:`job_effects`): from :data:`HOLDOUT_FROM` training rows on, where it cost as much as the
#: second fit, it grows this many times fewer trees at this many times the rate (the simulator's
#: tuning seeds scored the same). Smaller fits cost little and keep it whole: on a public table of
#: a few thousand rows the coarse fit moved the estimates of first attempts.
JOB_EFFECT_COARSENING = 3
#: LightGBM's categorical settings (its defaults from :data:`HOLDOUT_FROM` rows on). Its own
#: defaults (100 rows per category, smoothing 10) never split on a hardware type with a few dozen
#: rows, which is every type of a public measurement table.
CATEGORY_SETTINGS: dict[str, float] = {"min_data_per_group": 100, "cat_smooth": 10.0, "cat_l2": 10.0}
FEW_ROWS_CATEGORY_SETTINGS: dict[str, float] = {"min_data_per_group": 5, "cat_smooth": 1.0, "cat_l2": 1.0}


def size_for(training_rows: int, given: Mapping[str, float | None]) -> dict[str, float]:
    """The served model's size knobs: each one ``given`` (not None), else the default for
    ``training_rows`` (:data:`SMALL_SIZE` below :data:`SMALL_ROWS`, else :data:`LARGE_SIZE`)."""
    default = SMALL_SIZE if training_rows < SMALL_ROWS else LARGE_SIZE
    return {name: value if (value := given.get(name)) is not None else default[name] for name in default}


def map_values(values: np.ndarray, table: Mapping[str, Any], default: Any, dtype: Any) -> np.ndarray:
    """``table[str(v)]`` for each value, ``default`` where absent: one lookup per distinct value.

    What ``np.unique(values.astype(str), return_inverse=True)`` and a lookup per distinct value
    give, without turning every object into a fixed-width string and sorting them (which cost a
    serving batch several times as much).
    """
    items = values.tolist()
    found = {v: table.get(str(v), default) for v in set(items)}
    return np.array([found[v] for v in items], dtype=dtype)


def predict_distinct(booster: TreePredictor, x: np.ndarray, num_threads: int) -> np.ndarray:
    """``booster.predict(x)``, evaluating each distinct row once (a booster or its compiled trees)."""
    return predict_together(booster, x[:0], x, num_threads)[1]


def predict_together(booster: TreePredictor, head: np.ndarray, x: np.ndarray, num_threads: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """``booster.predict(head)`` and ``booster.predict(x)`` in one call, each distinct row of ``x`` once.

    Every candidate of a submission asks for the same configuration on the job's prior
    hardware, so a serving batch holds each such row once per candidate. One call instead of two:
    compiled trees walk all their code once per call, which a batch of a few rows mostly pays for.
    """
    rows = np.ascontiguousarray(x)
    # Compare rows as raw bytes: NaNs (missing values) then match each other, unlike as floats.
    keys = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    pred = np.asarray(booster.predict(np.concatenate([head, rows[first]]), num_threads=num_threads))
    return pred[:len(head)], pred[len(head):][inverse.ravel()]


def job_effects(residual: np.ndarray, groups: np.ndarray, shrink: float = 1.0) -> np.ndarray:
    """Each row's job effect: the mean residual of its job, shrunk towards 0 for jobs seen once."""
    keys, inverse = np.unique(groups, return_inverse=True)
    sums = np.bincount(inverse, weights=residual, minlength=len(keys))
    counts = np.bincount(inverse, minlength=len(keys))
    return np.asarray((sums / (counts + shrink))[inverse])


def train_and_score(params: dict[str, Any], data: lgb.Dataset, rounds: int) -> tuple[lgb.Booster, np.ndarray]:
    """``lgb.train`` of ``rounds`` trees, and the model's estimates of its own training rows.

    The estimates are read from the training state (the scores boosting keeps for every training
    row, bagged out or not) instead of predicting every row again, which cost the fit as much as
    growing a third of its trees. The booster returned holds no training data.
    """
    booster = lgb.train(params, data, num_boost_round=rounds, keep_training_booster=True)
    fitted: list[np.ndarray] = []

    def keep(preds: np.ndarray, _: lgb.Dataset) -> tuple[str, float, bool]:
        fitted.append(np.array(preds, dtype=np.float64))
        return "fitted", 0.0, False

    booster.eval_train(feval=keep)
    return lgb.Booster(model_str=booster.model_to_string()), fitted[0]


def train_stopping_early(params: dict[str, Any], data: lgb.Dataset, rounds: int, valid: lgb.Dataset | None,
                         patience: int) -> lgb.Booster:
    """``lgb.train`` of at most ``rounds`` trees, stopped once the loss on ``valid`` has not improved
    for ``patience`` rounds and cut to its best round, so that a saved or compiled model holds only
    the trees it predicts with. Without ``valid``, or with ``patience`` 0, all ``rounds``."""
    if valid is None or patience <= 0:
        return lgb.train(params, data, num_boost_round=rounds)
    booster = lgb.train(params, data, num_boost_round=rounds, valid_sets=[valid],
                        callbacks=[lgb.early_stopping(patience, verbose=False)])
    if 0 < booster.best_iteration < booster.current_iteration():
        booster = lgb.Booster(model_str=booster.model_to_string(num_iteration=booster.best_iteration))
    return booster
