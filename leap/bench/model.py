"""The LightGBM model the predict benchmark serves: fitted on a small simulated history.

The history is what ``leap fleet history`` writes (same functions), in a temporary folder;
examples and fitting are ``leap train``'s own (:mod:`leap.training.train`). A fit takes minutes (half
an hour on a busy 2-core machine), so a fitted model can be saved as a registry artifact and
loaded by later runs (``bench predict --save-model`` / ``--model``). Also the plain model of
DESIGN §9's loop (:class:`PlainLightGBM`), the anchor the served model is compared with.
"""

from __future__ import annotations

import datetime as dt
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import lightgbm as lgb
import numpy as np

from features.rows import CATEGORICAL, COLUMNS, Rows
from leap.core.hardware import Catalogue
from leap.fleet.history import simulate, write_history
from leap.training.train import fit_model, load_examples, split
from predictor.compiled import TreePredictor, trees_for
from predictor.lgbm import LightGBMThroughput
from predictor.models import ThroughputModel
from predictor.registry import Registry

HISTORY_START = dt.datetime(2025, 1, 1, tzinfo=dt.UTC).timestamp()
#: DESIGN §9's plain model: 200 trees x 31 leaves.
PLAIN_TREES = 200
PLAIN_LEAVES = 31


def fit_on_simulated_history(
    catalogue: Catalogue, days: int, per_day: int, seed: int = 0, trees: int | None = None
) -> tuple[LightGBMThroughput, dict[str, Any]]:
    """Simulate ``days`` x ``per_day`` attempts, build point-in-time examples and fit.

    Parameters
    ----------
    catalogue
        Hardware specs for the rows.
    days, per_day
        Size of the simulated history.
    seed
        Simulator seed.
    trees
        Override ``n_estimators`` (the main model; the base model gets twice as many). None keeps
        ``leap train``'s defaults, which is what a predictor serves.

    Returns
    -------
    The model and facts about it (rows, fit seconds, tree counts).
    """
    params = None if trees is None else {"n_estimators": trees}
    with tempfile.TemporaryDirectory(prefix="leap-bench-history-") as tmp:
        folder = Path(tmp)
        write_history(simulate(seed, days, per_day, start=HISTORY_START), folder)
        _, ex, as_of, _ = load_examples(folder, catalogue, None, window_days=days)
        train = split(ex, as_of, days).train
    t0 = time.perf_counter()
    model = fit_model(train, params)
    fit_s = time.perf_counter() - t0
    assert model.booster_ is not None
    info: dict[str, Any] = {
        "history_days": days, "history_per_day": per_day, "train_rows": len(train), "fit_s": round(fit_s, 1),
        "main_trees": model.booster_.num_trees(), "num_leaves": model.size_["num_leaves"],
        "base_trees": model.base_.num_trees() if model.base_ is not None else 0,
        "num_threads": model.num_threads,
    }
    return model, info


def load_fitted(folder: Path) -> tuple[LightGBMThroughput, dict[str, Any]]:
    """A model saved by :func:`save_fitted` (or any registry artifact folder) and its facts."""
    meta = json.loads((folder / "metadata.json").read_text())
    model = Registry(folder.parent).load(folder.name, folder)
    assert isinstance(model, LightGBMThroughput)
    return model, {**meta.get("bench_model", {}), "loaded_from": str(folder)}


def save_fitted(model: LightGBMThroughput, info: dict[str, Any], folder: Path) -> None:
    """Save a fitted bench model as a registry artifact, so that later runs can skip the fit."""
    Registry(folder.parent).save(model, {"bench_model": info}, version=folder.name)


class PlainLightGBM(ThroughputModel):
    """DESIGN §9's plain model: one LightGBM of :data:`PLAIN_TREES` x :data:`PLAIN_LEAVES` on the
    rows' numeric columns, one thread — the model of the plain loop the served one is compared with.

    Fitted on the served model's own predictions, so its trees grow as deep as real targets make them.
    Predicts with LightGBM until :meth:`compile_trees`, then with the compiled trees (same output).
    """

    kind = "plain_lightgbm"

    def __init__(self, rows: Rows, target: np.ndarray) -> None:
        super().__init__()
        self.columns = [c for c in COLUMNS if c not in CATEGORICAL]
        ok = np.isfinite(target)
        params = {"objective": "regression", "num_leaves": PLAIN_LEAVES, "num_threads": 1, "verbose": -1, "seed": 0}
        self.booster = lgb.train(params, lgb.Dataset(self._matrix(rows)[ok], label=target[ok]),
                                 num_boost_round=PLAIN_TREES)
        self.trees: TreePredictor = self.booster

    def compile_trees(self, cache_dir: Path) -> None:
        """Predict with the booster's trees compiled to C (:mod:`predictor.compiled`) from now on."""
        self.trees = trees_for(self.booster, cache_dir)

    def _matrix(self, rows: Rows) -> np.ndarray:
        return np.column_stack([rows[c] for c in self.columns])

    def _predict_log(self, rows: Rows) -> np.ndarray:
        return np.asarray(self.trees.predict(self._matrix(rows), num_threads=1))
