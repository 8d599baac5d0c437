"""The LightGBM model the predict benchmark serves: fitted on a small simulated history.

The history is what ``leap fleet history`` writes (same functions), in a temporary folder;
examples and fitting are ``leap train``'s own (:mod:`training.train`).
"""

from __future__ import annotations

import datetime as dt
import tempfile
import time
from pathlib import Path
from typing import Any

from core.hardware import Catalogue
from fleet.history import simulate, write_history
from predictor.lgbm import LightGBMThroughput
from training.train import fit_model, load_examples, split

HISTORY_START = dt.datetime(2025, 1, 1, tzinfo=dt.UTC).timestamp()


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
        _, ex, as_of = load_examples(folder, catalogue, None, window_days=days)
        train = split(ex, as_of, days).train
    t0 = time.perf_counter()
    model = fit_model(train, params)
    fit_s = time.perf_counter() - t0
    assert model.booster_ is not None
    info: dict[str, Any] = {
        "history_days": days, "history_per_day": per_day, "train_rows": len(train), "fit_s": round(fit_s, 1),
        "main_trees": model.booster_.num_trees(), "num_leaves": model.num_leaves,
        "base_trees": model.base_.num_trees() if model.base_ is not None else 0,
        "num_threads": model.num_threads,
    }
    return model, info
