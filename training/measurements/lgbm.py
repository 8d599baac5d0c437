"""The pairwise LightGBM: fit on (prior, target) pairs, predict a held-out pair's throughput."""

from __future__ import annotations

from typing import Any

import lightgbm as lgb
import numpy as np

from core.accuracy import best_weight
from training.measurements.baselines import predict_transfer
from training.measurements.feature_space import FeatureSpace
from training.measurements.pairs import Pairs
from training.measurements.table import FloatArray, IntArray, Table

#: Small and deterministic: the tables have hundreds to a few thousand pairs. Categorical
#: settings are lowered from LightGBM's defaults (min_data_per_group=100, cat_smooth=10), which
#: would otherwise refuse to split on hardware types with a few dozen pairs each.
LGB_PARAMS: dict[str, Any] = {
    "objective": "regression",
    "learning_rate": 0.05,
    "num_leaves": 15,
    "min_data_in_leaf": 5,
    "min_data_per_group": 5,
    "cat_smooth": 1.0,
    "cat_l2": 1.0,
    "max_cat_to_onehot": 8,
    "lambda_l2": 1.0,
    "feature_fraction": 0.9,
    "bagging_fraction": 0.9,
    "bagging_freq": 1,
    "deterministic": True,
    "force_row_wise": True,
    "num_threads": 1,
    "verbose": -1,
}
LGB_ROUNDS = 400

#: ``ratio`` fits log(target / prior), ``log`` fits log(target). See docs/measurements.md for
#: the comparison that picked the default.
TARGETS = ("ratio", "log")
DEFAULT_TARGET = "ratio"

#: Features left out by default. With a ratio target the prior's absolute level mostly encodes
#: the workload's unit (images/s vs tokens/s) and lets trees memorise workloads; leaving it out
#: was better on config_fold for both public tables (ablation in docs/measurements.md).
DEFAULT_EXCLUDE: tuple[str, ...] = ("log_prior",)


def predict_lightgbm(
    t: Table,
    pairs: Pairs,
    train: IntArray,
    test: IntArray,
    space: FeatureSpace,
    target: str = DEFAULT_TARGET,
    seed: int = 0,
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE,
) -> FloatArray:
    """Fit on the training pairs and predict the test pairs' throughput.

    Parameters
    ----------
    target
        ``ratio``: fit log(target / prior) and return prior x exp(prediction); ``log``: fit
        log(target) directly.
    exclude
        Feature names to leave out (ablations).
    """
    if len(train) == 0:
        return np.full(len(test), np.nan)
    keep = [k for k, n in enumerate(space.names) if n not in exclude]
    names = [space.names[k] for k in keep]
    x_train = space.matrix(t, pairs, train)[:, keep]
    x_test = space.matrix(t, pairs, test)[:, keep]
    y = np.log(t.throughput[pairs.row[train]])
    if target == "ratio":
        y = y - np.log(pairs.prior[train])
    elif target != "log":
        raise ValueError(f"unknown target {target!r}; one of {TARGETS}")
    categorical = [n for n in space.categorical if n in names]
    offset = np.log(pairs.prior) if target == "ratio" else np.zeros(len(pairs))
    pred = fit_predict(x_train, y, x_test, names, categorical, seed) + offset[test]
    train_wl = {t.workload[i] for i in pairs.row[train].tolist()}
    new = np.array([t.workload[i] not in train_wl for i in pairs.row[test].tolist()], dtype=bool)
    if new.any():
        trust = new_workload_trust(t, pairs, train, x_train, y, offset[train], names, categorical, seed)
        base = np.log(predict_transfer(t, pairs, train, test[new]))
        pred[new] = base + trust * (pred[new] - base)
    return np.asarray(np.exp(pred), dtype=np.float64)


def fit_predict(x_train: FloatArray, y: FloatArray, x_test: FloatArray, names: list[str],
                categorical: list[str], seed: int) -> FloatArray:
    """Train LightGBM (:data:`LGB_PARAMS`, :data:`LGB_ROUNDS` rounds) and predict ``x_test``."""
    ds = lgb.Dataset(x_train, label=y, feature_name=names, categorical_feature=categorical, free_raw_data=True)
    booster = lgb.train({**LGB_PARAMS, "seed": seed}, ds, num_boost_round=LGB_ROUNDS)
    return np.asarray(booster.predict(x_test), dtype=np.float64)


def new_workload_trust(t: Table, pairs: Pairs, train: IntArray, x_train: FloatArray, y: FloatArray,
                       offset: FloatArray, names: list[str], categorical: list[str], seed: int) -> float:
    """How much of the trees' departure from the transfer estimate to keep for a new workload.

    For a workload without training pairs, the trees can only generalise from other workloads,
    and the transfer baseline's median speed-up of the hardware pair is a strong rival. Inner
    leave-one-workload-out over the training pairs decides: each training workload in turn is
    predicted by trees fitted on the others, and the weight ``w`` in ``transfer x (trees /
    transfer) ** w`` (``w`` in 0, 0.1, ..., 1) with the best acc@10 over all of them is kept.
    Only folds with new workloads pay for the inner fits.
    """
    wl = np.array([t.workload[i] for i in pairs.row[train].tolist()], dtype=object)
    trees, base, actual = [], [], []
    for w in sorted(set(wl.tolist())):
        inner = wl == w
        if inner.all():
            return 1.0
        trees.append(fit_predict(x_train[~inner], y[~inner], x_train[inner], names, categorical, seed)
                     + offset[inner])
        base.append(np.log(predict_transfer(t, pairs, train[~inner], train[inner])))
        actual.append(np.log(t.throughput[pairs.row[train[inner]]]))
    tr, ba, ac = np.concatenate(trees), np.concatenate(base), np.concatenate(actual)
    return best_weight(ba, tr - ba, np.exp(ac))
