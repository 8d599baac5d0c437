"""The evaluation protocol: every model on every fold, and the report of one table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from core.accuracy import summary
from core.hardware import Catalogue
from training.measurements.baselines import predict_lookup, predict_transfer
from training.measurements.feature_space import FeatureSpace
from training.measurements.lgbm import DEFAULT_EXCLUDE, DEFAULT_TARGET, predict_lightgbm
from training.measurements.pairs import PROTOCOLS, Pairs, build_pairs, config_ids, folds
from training.measurements.table import FloatArray, IntArray, MeasurementError, Table, load_table

MODELS = ("lightgbm", "lookup", "transfer")


def fold_predictions(
    t: Table,
    pairs: Pairs,
    test_rows: npt.NDArray[np.bool_],
    space: FeatureSpace,
    target: str = DEFAULT_TARGET,
    seed: int = 0,
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE,
) -> tuple[IntArray, dict[str, FloatArray]]:
    """Predictions of every model for the pairs whose target row is a test row.

    Training uses only rows outside ``test_rows`` and the pairs formed among them; both
    protocols hold out whole configurations, so a training pair's prior is never a test row.

    Returns
    -------
    (test_pair_indices, {model: predictions})
    """
    in_test = test_rows[pairs.row]
    # A pair is usable for training only if its target and its prior's configuration are both
    # outside the test fold; configurations never straddle folds, so the target row decides.
    train = np.flatnonzero(~in_test)
    test = np.flatnonzero(in_test)
    train_rows = np.flatnonzero(~test_rows)
    preds = {
        "lightgbm": predict_lightgbm(t, pairs, train, test, space, target, seed, exclude),
        "lookup": predict_lookup(t, pairs, train_rows, test),
        "transfer": predict_transfer(t, pairs, train, test),
    }
    return test, preds


def run_protocol(
    t: Table,
    cfg: IntArray,
    pairs: Pairs,
    protocol: str,
    space: FeatureSpace,
    seed: int = 0,
    target: str = DEFAULT_TARGET,
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE,
) -> dict[str, dict[str, Any]]:
    """Metrics of each model over all folds of ``protocol`` (every pair predicted once)."""
    pred = {m: np.full(len(pairs), np.nan) for m in MODELS}
    for test_rows in folds(t, cfg, protocol, seed):
        test, fold_pred = fold_predictions(t, pairs, test_rows, space, target, seed, exclude)
        for m in MODELS:
            pred[m][test] = fold_pred[m]
    actual = t.throughput[pairs.row]
    return {m: summary(pred[m], actual) for m in MODELS}


def evaluate(
    csv_path: Path | str,
    seed: int = 0,
    target: str = DEFAULT_TARGET,
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE,
    catalogue: Catalogue | None = None,
) -> dict[str, Any]:
    """Evaluate LightGBM and both baselines on a measurement table under both protocols.

    Parameters
    ----------
    csv_path
        Measurement CSV (see :mod:`training.measurements`).
    seed
        Seed of the configuration folds and of LightGBM.
    target
        LightGBM target transform, ``ratio`` (default) or ``log``.
    exclude
        LightGBM feature names to leave out (ablations).
    catalogue
        Hardware catalogue for the spec features; default :func:`core.hardware.load_catalogue`.

    Returns
    -------
    dict
        ``{"rows", "pairs", "protocols": {protocol: {model: {"acc@10", "acc@20", "mape", "n",
        "n_missing"}}}, "lightgbm_target", "seed", "hardware_in_catalogue"}``.

    Raises
    ------
    MeasurementError
        If the file is missing or invalid, or no configuration was measured on two hardware types.
    """
    path = Path(csv_path)
    t = load_table(path)
    cfg = config_ids(t)
    pairs = build_pairs(t, cfg)
    if len(pairs) == 0:
        raise MeasurementError(f"{path}: no configuration is measured on two hardware types; nothing to pair")
    space = FeatureSpace.build(t, catalogue)
    return {
        "file": str(path),
        "rows": len(t),
        "pairs": len(pairs),
        "seed": seed,
        "lightgbm_target": target,
        "lightgbm_excluded_features": list(exclude),
        "hardware_in_catalogue": sorted(h for h, s in space.specs.items() if not np.isnan(s).all()),
        "protocols": {p: run_protocol(t, cfg, pairs, p, space, seed, target, exclude) for p in PROTOCOLS},
    }
