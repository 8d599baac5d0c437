"""``leap train``: fit LightGBM on the archive as of a date, evaluate on a holdout day, register.

Window: examples whose attempt *finished* before the holdout day (a label is only known once
the attempt finished) and was submitted within ``window_days`` of it. Holdout: attempts
submitted on the last day before ``as_of`` that finished before ``as_of``. The candidate and
the current model are scored on the same holdout; promotion requires the candidate to be no
worse on acc@10.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from leap.core.accuracy import summary
from leap.core.hardware import Catalogue, load_catalogue
from leap.training import new_types
from leap.training.dataset import DAY, Examples, History, read_history
from leap.training.days import day_text, parse_day, training_rows
from leap.training.row_cache import examples_as_of, window_history
from predictor.lgbm import LightGBMThroughput
from predictor.models import BASELINES, ThroughputModel
from predictor.ranking import AsServed
from predictor.registry import ModelRecord, Registry


@dataclass
class Split:
    train: Examples
    holdout: Examples
    train_from: float
    holdout_day: float
    as_of: float


def split(ex: Examples, as_of: float, window_days: float) -> Split:
    holdout_day = as_of - DAY
    train_from = holdout_day - window_days * DAY
    train = training_rows(ex, holdout_day, window_days)
    holdout = ex.select((ex.submit_time >= holdout_day) & (ex.submit_time < as_of) & (ex.finish_time < as_of))
    return Split(train, holdout, train_from, holdout_day, as_of)


def score(model: ThroughputModel, ex: Examples) -> dict[str, float]:
    return summary(model.predict(ex.rows), ex.y)


def fit_model(train: Examples, params: dict[str, Any] | None = None) -> LightGBMThroughput:
    return LightGBMThroughput(**(params or {})).fit(train.rows, train.y, train.job_key,
                                                    new_type_rows=train.new_type_rows)


def fit_served(train: Examples, params: dict[str, Any] | None = None) -> AsServed:
    """:func:`fit_model`, predicting as the ranking service serves it (:class:`predictor.ranking.AsServed`)."""
    return AsServed(fit_model(train, params))


def baseline_models() -> dict[str, ThroughputModel]:
    """One instance of each baseline of :data:`predictor.models.BASELINES`, by name.

    The baselines learn nothing: they read the lookup medians and priors in the rows.
    """
    return {name: cls() for name, cls in BASELINES.items()}


def _rows_from(as_of: float, window_days: float) -> float:
    """The first submission time a training run builds rows for (its window and the holdout day)."""
    return as_of - (window_days + 1) * DAY


def load_examples(history_dir: Path, catalogue: Catalogue, as_of: float | None, window_days: float,
                  row_cache: Path | None = None) -> tuple[History, Examples, float, dict[str, Any]]:
    """The archive, the rows of a run as of ``as_of`` (default: the day after its last), and what
    the row cache did (:func:`leap.training.row_cache.examples_as_of`; ``row_cache`` None: none).

    Submissions before the window get no row and change no state but the configuration aggregates
    (which only a partial submission reads: one in the window reads the window's submissions
    only): left out of the replay, they never sit in memory beside the feature state."""
    history = read_history(history_dir, with_oracle=False)
    as_of = as_of if as_of is not None else history.last_day + DAY
    rows_from = _rows_from(as_of, window_days)
    history = window_history(history, rows_from)
    ex, cache = examples_as_of(history, catalogue, rows_from, as_of, row_cache)
    return history, ex, as_of, cache


def train(
    history_dir: Path,
    registry: Registry,
    as_of: float | None = None,
    window_days: float = 30,
    params: dict[str, Any] | None = None,
    catalogue: Catalogue | None = None,
    row_cache: Path | None = None,
) -> tuple[ModelRecord, dict[str, Any]]:
    """Fit, evaluate against the baselines and the current model, and save a new version; with a
    ``row_cache`` folder, resume the rows from the previous run's checkpoint there and leave one
    (:mod:`leap.training.row_cache`)."""
    catalogue = catalogue or load_catalogue()
    t0 = time.time()
    history, ex, as_of, cache = load_examples(history_dir, catalogue, as_of, window_days, row_cache)
    t_rows = time.time() - t0
    sp = split(ex, as_of, window_days)
    if new_types.needed(len(sp.train)):  # a small fleet: its new-type calibration reads honest rows
        sp = dataclasses.replace(sp, train=new_types.with_unseen_type_rows(
            sp.train, history, catalogue, rows_from=_rows_from(as_of, window_days), until=as_of))
        t_rows = time.time() - t0
    # Only the split is needed from here on: the archive's tables and the unsplit rows would
    # otherwise stay alive through the fit (0.8 GB and 0.3 GB at 60 days x 20,000 attempts).
    data_hash = history.digest
    del history, ex
    if len(sp.train) == 0 or len(sp.holdout) == 0:
        raise ValueError(
            f"no training or holdout examples before {day_text(as_of)} "
            f"(train {len(sp.train)}, holdout {len(sp.holdout)}); is --as-of inside the history?"
        )
    t1 = time.time()
    model = fit_model(sp.train, params)
    t_fit = time.time() - t1
    metrics = {"lightgbm": score(model, sp.holdout),
               **{name: score(baseline, sp.holdout) for name, baseline in baseline_models().items()}}
    metadata = {
        "training_window": {"from": day_text(sp.train_from), "to": day_text(sp.holdout_day),
                            "rows": len(sp.train)},
        "holdout": {"day": day_text(sp.holdout_day), "rows": len(sp.holdout)},
        "as_of": day_text(as_of),
        "history": str(history_dir),
        "data_hash": data_hash,
        "features": model.features_,
        # the main model stops growing on its held-out tenth: how many trees it kept
        "trees": {"main": model.booster_.num_trees() if model.booster_ is not None else 0,
                  "base": model.base_.num_trees() if model.base_ is not None else 0},
        "metrics": metrics,
        "timings_s": {"rows": round(t_rows, 1), "fit": round(t_fit, 1)},
        "row_cache": cache,
    }
    record = registry.save(model, metadata)
    report = {"version": record.version, **metadata}
    current = registry.current()
    if current is not None:
        report["current"] = {"version": current, "holdout": score(registry.load(current), sp.holdout)}
    return record, report


def not_worse(candidate: dict[str, float], current: dict[str, float], tolerance: float = 0.0) -> bool:
    """Promotion rule: acc@10 on the same holdout at least the current model's (minus ``tolerance``)."""
    return bool(candidate["acc@10"] >= current["acc@10"] - tolerance)


def compare_on_holdout(registry: Registry, version: str, history_dir: Path,
                       catalogue: Catalogue | None = None) -> dict[str, Any]:
    """Re-score ``version`` and the current model on ``version``'s own holdout day."""
    catalogue = catalogue or load_catalogue()
    meta = registry.record(version).metadata
    as_of = parse_day(meta["as_of"])
    window = (parse_day(meta["training_window"]["to"]) - parse_day(meta["training_window"]["from"])) / DAY
    _, ex, _, _ = load_examples(history_dir, catalogue, as_of, window)
    holdout = split(ex, as_of, window).holdout
    current = registry.current()
    out: dict[str, Any] = {"candidate": {"version": version, **score(registry.load(version), holdout)}}
    out["current"] = {"version": current, **score(registry.load(current), holdout)} if current else None
    out["not_worse"] = out["current"] is None or not_worse(out["candidate"], out["current"])
    return out


def holdout_acc(report: dict[str, Any]) -> float:
    return float(np.round(report["metrics"]["lightgbm"]["acc@10"], 4))
