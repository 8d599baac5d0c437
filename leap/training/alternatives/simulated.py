"""Every alternative on the simulator backtest: the same nights, rows and windows for each model.

The nights are :mod:`leap.training.backtest`'s: rows built once for the whole history
(:func:`leap.training.dataset.build_examples_with_progress`, with every candidate's rows for a sample
of each test day's attempts), then for each of the last ``days`` days a model trained on the
attempts that finished before it within the window (:func:`leap.training.days.training_rows`) scores
the day's attempts (:func:`leap.training.days.submitted_on`). Top-1 and regret are the backtest's own
(:func:`leap.training.backtest.pick_metrics`, against the simulator's oracle), acc@10 by evidence
level too (:func:`leap.training.backtest.by_evidence`). Each model is fitted afresh every night and
timed: ``fit_s`` is the wall time of one fit, ``predict_us_per_row`` of its predictions over the
day's attempts and the sampled candidates' rows, per row, in one call each.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from features.rows import Rows
from leap.core.accuracy import summary
from leap.core.hardware import Catalogue, load_catalogue
from leap.training.alternatives import Factory, fit

# Private steps of the backtest, imported rather than copied so that both reports score alike;
# the report asks for them to become public (or for a models hook on backtest()).
from leap.training.backtest import by_evidence, history_examples, pick_metrics
from leap.training.dataset import DAY, Examples, History
from leap.training.days import day_text, submitted_on, training_rows
from leap.training.oracle import OracleTables
from streams.events import Submission

#: Figures averaged over the nights, in report order.
METRICS = ("acc@10", "acc@20", "mape", "top1", "regret", "fit_s", "predict_us_per_row")


def _candidate_rows(test: Examples) -> tuple[list[str], Rows | None, list[int]]:
    """The sampled attempts' candidate rows as one batch: attempt ids, the rows, rows per attempt."""
    keys = sorted(test.full)
    if not keys:
        return [], None, []
    parts = [test.full[k][1] for k in keys]
    rows = {c: np.concatenate([p[c] for p in parts]) for c in parts[0]}
    return [test.full[k][0].attempt_id for k in keys], rows, [len(p["hardware"]) for p in parts]


class _Cached:
    """A picker for :func:`leap.training.backtest.pick_metrics` that answers from one batch prediction.

    Asking the model submission by submission would time per-call overhead, not the model.
    """

    def __init__(self, attempts: list[str], pred: np.ndarray, sizes: list[int]) -> None:
        parts = np.split(pred, np.cumsum(sizes)[:-1]) if sizes else []
        self.by_attempt = dict(zip(attempts, parts, strict=True))

    def __call__(self, sub: Submission, rows: Rows) -> np.ndarray:
        return self.by_attempt[sub.attempt_id]


def score_night(ex: Examples, day: float, window_days: int, models: Mapping[str, Factory], oracle: OracleTables,
                catalogue: Catalogue, seed: int = 0, progress: Any = None) -> dict[str, Any] | None:
    """Fit every model on the night before ``day`` and score the day; None if either side is empty."""
    train, test = training_rows(ex, day, window_days), submitted_on(ex, day)
    if len(train) == 0 or len(test) == 0:
        return None
    attempts, cand_rows, sizes = _candidate_rows(test)
    row: dict[str, Any] = {"day": day_text(day), "train_rows": len(train), "test_rows": len(test),
                           "candidate_rows": int(sum(sizes))}
    preds: dict[str, np.ndarray] = {}
    pickers: dict[str, Any] = {}
    for name, factory in models.items():
        model = factory(seed)
        t0 = time.perf_counter()
        fit(model, train.rows, train.y, train.job_key)
        t1 = time.perf_counter()
        pred = preds[name] = np.asarray(model.predict(test.rows), dtype=np.float64)
        cand = np.asarray(model.predict(cand_rows), dtype=np.float64) if cand_rows is not None else np.empty(0)
        t2 = time.perf_counter()
        row[name] = {**summary(pred, test.y), "fit_s": round(t1 - t0, 3),
                     "predict_us_per_row": round(1e6 * (t2 - t1) / (len(test) + len(cand)), 2)}
        pickers[name] = _Cached(attempts, cand, sizes)
        if progress is not None:
            progress.print(f"  {row['day']} {name}: acc@10 {row[name]['acc@10']:.3f}, fit {t1 - t0:.1f}s")
    row["by_evidence"] = by_evidence(test, preds)
    for name, picks in pick_metrics(pickers, test, oracle, catalogue).items():
        row[name].update(picks)
    return row


def backtest_alternatives(
    history_dir: Path,
    models: Mapping[str, Factory],
    days: int = 7,
    window_days: int = 30,
    seed: int = 0,
    catalogue: Catalogue | None = None,
    progress: Any = None,
    examples: tuple[History, Examples] | None = None,
    pick_sample: int = 1500,
) -> dict[str, Any]:
    """Nightly retrains of every model over the last ``days`` days of a simulated history.

    Parameters
    ----------
    history_dir
        History folder (``leap fleet history``); ignored when ``examples`` is given.
    models
        ``name -> factory``; each night every model is made afresh with ``seed``.
    days, window_days
        Test days at the end of the history, and the training window of each night.
    seed
        Seed given to every factory.
    catalogue
        Specs for the rows and prices for regret; default :func:`leap.core.hardware.load_catalogue`.
    progress
        Anything with ``print`` (a rich console), for a line per model and night.
    examples
        ``(history, examples)`` already built (with candidate rows from the first test day on).
    pick_sample
        Submissions per day whose every candidate is predicted, for top-1 and regret (a language
        model spends milliseconds of CPU per candidate row, so large samples cost it hours).

    Returns
    -------
    dict
        ``{"history", "data_hash", "days", "window_days", "seed", "models", "mean": {model: {metric:
        mean over nights, "pick_sample"}}, "by_evidence": {level: {"share", model: acc@10}},
        "per_day"}``.

    Raises
    ------
    ValueError
        A history too short for ``days`` test days, or no night with training and test rows.
    """
    catalogue = catalogue or load_catalogue()
    history, ex, first_test = history_examples(history_dir, days, catalogue, progress, examples, pick_sample)
    oracle = OracleTables.read(history, catalogue)
    per_day = []
    for d in range(days):
        night = score_night(ex, first_test + d * DAY, window_days, models, oracle, catalogue, seed, progress)
        if night is not None:
            per_day.append(night)
    if not per_day:
        raise ValueError("no night had both training and test examples")
    summary = _means(per_day, list(models))
    for figures in summary["mean"].values():
        figures["pick_sample"] = pick_sample  # per model, so results with other samples can be merged
    return {"history": str(history_dir), "data_hash": history.digest, "days": len(per_day),
            "window_days": window_days, "seed": seed, "models": list(models), **summary}


def _means(per_day: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """Each model's figures averaged over the nights, and acc@10 by evidence level."""
    mean = {n: {m: float(np.nanmean([r[n][m] for r in per_day])) for m in METRICS if m in per_day[0][n]}
            for n in names}
    for n in names:
        mean[n]["fit_s_max"] = float(max(r[n]["fit_s"] for r in per_day))
    levels = per_day[0]["by_evidence"]
    by_evidence = {level: {key: float(np.nanmean([r["by_evidence"][level][key] for r in per_day]))
                           for key in levels[level]} for level in levels}
    return {"mean": mean, "by_evidence": by_evidence, "per_day": per_day}
