"""Backtest: N nightly retrains over the end of a history.

For each of the last ``days`` days: train on attempts that finished before that day (within the
training window), then score the day's finished attempts with features as of their submission.
Rows are built once (point-in-time by construction); only the models change from night to night.

Models scored side by side: ``lightgbm`` (the served model), the baselines ``transfer_paired``
(the job's prior times the ratio earlier jobs showed between the two types near its
configuration), ``transfer`` (times the ratio of lookup medians) and ``lookup``, and, where the
history has the simulator's oracle table, the two references no model can beat, ``oracle`` and
``ceiling`` (:mod:`leap.training.oracle`).

Top-1 and regret use a sample of attempts with every candidate's rows."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from features.rows import Rows
from leap.core.accuracy import regret, summary, top1
from leap.core.hardware import Catalogue, load_catalogue
from leap.training import new_types
from leap.training.dataset import DAY, Examples, History, read_history
from leap.training.days import checked_first_test_day, day_text, first_test_day, submitted_on, training_rows
from leap.training.oracle import OracleTables
from leap.training.pool import run_shared, shared
from leap.training.row_cache import built_examples
from leap.training.train import baseline_models, fit_served
from predictor.lgbm import EVIDENCE, evidence_level
from predictor.models import ThroughputModel
from streams.events import Submission

METRICS = ("acc@10", "acc@20", "mape", "top1", "regret", "band_coverage")
#: Scored side by side, in the order tables list them.
METHODS = ("lightgbm", "transfer_paired", "transfer", "lookup", "oracle", "ceiling")


#: What :func:`pick_metrics` scores: a model, the truth itself (``None``), or a function of the
#: attempt and its candidates' rows (the ceiling, which needs the attempt's oracle entries).
Picker = ThroughputModel | None | Callable[[Submission, Rows], np.ndarray]


def pick_metrics(models: dict[str, Picker], ex: Examples, oracle: OracleTables,
                  catalogue: Catalogue) -> dict[str, dict[str, float]]:
    """Top-1 and regret on the sampled attempts that have every candidate's row and oracle."""
    names = catalogue.names()
    col = {n: i for i, n in enumerate(names)}
    prices = np.array([catalogue.price(n) or np.nan for n in names])
    # Per-accelerator throughput against per-accelerator price: the accelerator count is the
    # same for every candidate of one attempt, so it cancels out of the choice.
    samples: list[tuple[Submission, Rows, list[int], np.ndarray]] = []
    for sub, rows in ex.full.values():
        found = oracle.pairs.look("throughput", [sub.attempt_id] * len(rows["hardware"]), rows["hardware"])
        if np.all(found > 0) and all(h in col for h in rows["hardware"]):
            true = found / sub.num_accelerators
            samples.append((sub, rows, [col[h] for h in rows["hardware"]], true))
    out: dict[str, dict[str, float]] = {}
    if not samples:
        return out
    k = len(samples)
    true_m = np.full((k, len(names)), 1e-300)  # non-candidates: never the best, never chosen
    price_m = np.tile(np.where(np.isfinite(prices), prices, 1.0), (k, 1))
    for i, (_, _, cols, true) in enumerate(samples):
        true_m[i, cols] = true
    for name, model in models.items():
        if model is None:
            preds = [true for _, _, _, true in samples]
        elif isinstance(model, ThroughputModel):
            preds = _predict_each(model, [rows for _, rows, _, _ in samples])
        else:
            preds = [model(sub, rows) for sub, rows, _, _ in samples]
        pred_m = np.full((k, len(names)), np.nan)
        for i, ((_, _, cols, _), pred) in enumerate(zip(samples, preds, strict=True)):
            # A candidate the model cannot predict scores 0 (never chosen over one it can), so
            # a row without any prediction falls to a candidate, never to a non-candidate.
            pred_m[i, cols] = np.nan_to_num(pred, nan=0.0)
        out[name] = {"top1": top1(pred_m, true_m, price_m), "regret": regret(pred_m, true_m, price_m)}
    return out


def _predict_each(model: ThroughputModel, each: list[Rows]) -> list[np.ndarray]:
    """``model.predict`` of each of the row sets, in one call over all of them: a model predicts
    row by row, so one call serves the 1,500 sampled attempts of a night instead of one call each."""
    joined = {c: np.concatenate([rows[c] for rows in each]) for c in each[0]}
    return np.split(model.predict(joined), np.cumsum([len(rows["hardware"]) for rows in each])[:-1])


def backtest(
    history_dir: Path,
    days: int = 30,
    window_days: int = 30,
    params: dict[str, Any] | None = None,
    catalogue: Catalogue | None = None,
    progress: Any = None,
    examples: tuple[History, Examples] | None = None,
    jobs: int = 1,
    row_cache: Path | None = None,
) -> dict[str, Any]:
    """Retrain nightly over the last ``days`` days of a history and score each day.

    Parameters
    ----------
    history_dir
        History folder (ignored when ``examples`` is given).
    days
        Test days at the end of the history.
    window_days
        Training window of each retrain.
    params
        LightGBM parameters; None for the defaults.
    catalogue
        Specs for the rows and prices for regret; default :func:`leap.core.hardware.load_catalogue`.
    progress
        Anything with ``print`` (a rich console), for one line per day.
    examples
        ``(history, examples)`` already built, with candidate rows from the first test day on.
    jobs
        Worker processes scoring nights side by side, one thread a fit; 1: here, on OpenMP's threads.
        A night's results depend on its fit's thread count only, not on the process that ran it.
    row_cache
        Folder keeping built rows (:func:`leap.training.row_cache.built_examples`); None: built every run.

    Returns
    -------
    dict
        ``{"days", "window_days", "mean": {model: metrics}, "by_evidence", "per_day": [...], "data_hash",
        "lightgbm_beats_transfer_days", "lightgbm_by_hardware", "lightgbm_by_family", "lightgbm_sample"}``.

    Raises
    ------
    ValueError
        If the history is too short, or no day had both training and test examples.
    """
    catalogue = catalogue or load_catalogue()
    history, ex, first_test = history_examples(history_dir, days, catalogue, progress, examples, row_cache=row_cache)
    nights = [first_test + d * DAY for d in range(days)]
    ex = new_types.for_nightly_fits(ex, history, catalogue, nights, window_days)
    oracle, digest = OracleTables.read(history, catalogue), history.digest
    del history  # the rows are built: the archive's tables would stay alive through every fit
    errors = _no_errors()
    per_day = []
    for row in _scored_nights(ex, nights, window_days, params, oracle, catalogue, jobs, errors):
        per_day.append(row)
        _print_night(progress, row)
    if not per_day:
        raise ValueError("no day had both training and test examples")
    return {**_summarise(per_day, errors, window_days, digest), "params": dict(params or {})}


def _print_night(progress: Any, row: dict[str, Any]) -> None:
    if progress is not None:
        progress.print(f"{row['day']}: train {row['train_rows']} test {row['test_rows']}  acc@10 "
                       + "  ".join(f"{n} {row[n]['acc@10']:.3f}" for n in METHODS if n in row))


#: The served model's errors a backtest keeps per scored attempt (:func:`_record_errors`), for
#: its by-hardware and by-family breakdowns.
ERROR_KEYS = ("hardware", "family", "pred", "actual")
def _night(day: float, window_days: int, params: dict[str, Any] | None
           ) -> tuple[dict[str, Any] | None, dict[str, list[Any]]]:
    """:func:`_score_day` on the examples, oracle tables and catalogue :func:`~leap.training.pool.shared` holds;
    the night's row (None: nothing to train on or to score) and its errors."""
    ex, oracle, catalogue = shared()
    errors = _no_errors()
    return _score_day(ex, day, window_days, params, oracle, catalogue, errors), errors


def _no_errors() -> dict[str, list[Any]]:
    return {key: [] for key in ERROR_KEYS}


def _scored_nights(ex: Examples, nights: list[float], window_days: int, params: dict[str, Any] | None,
                   oracle: OracleTables, catalogue: Catalogue, jobs: int, errors: dict[str, list[Any]]
                   ) -> Iterator[dict[str, Any]]:
    """Each night's :func:`_score_day` row, in the nights' order, its errors added to ``errors``
    (a night with nothing to train on or to score: none); with ``jobs`` > 1 scored in that many
    worker processes (:func:`leap.training.pool.run_shared`), one thread a fit."""
    if jobs > 1:
        params = {"num_threads": 1, **(params or {})}
    args = [(day, window_days, params) for day in nights]
    for _, (row, night_errors) in run_shared(_night, args, (ex, oracle, catalogue), jobs):
        for key in ERROR_KEYS:
            errors[key].extend(night_errors[key])
        if row is not None:
            yield row


def history_examples(history_dir: Path, days: int, catalogue: Catalogue, progress: Any,
                     examples: tuple[History, Examples] | None = None, full_per_day: int = 1500,
                     row_cache: Path | None = None) -> tuple[History, Examples, float]:
    """The history, its examples and the first of the last ``days`` test days; rows are built (or
    read from ``row_cache``) unless given (a short history fails first), with every candidate's
    rows for ``full_per_day`` attempts a test day."""
    if examples is not None:
        return examples[0], examples[1], first_test_day(examples[0], days)
    history = read_history(history_dir)
    first = checked_first_test_day(history, days)
    return history, built_examples(history, catalogue, progress, row_cache, full_from=first,
                                   full_per_day=full_per_day), first


def _score_day(ex: Examples, day: float, window_days: int, params: dict[str, Any] | None,
               oracle: OracleTables, catalogue: Catalogue, errors: dict[str, list[Any]]) -> dict[str, Any] | None:
    """One night: train before ``day``, score the day's attempts; None if either side is empty.

    Appends LightGBM's errors on the day to ``errors``.
    """
    train = training_rows(ex, day, window_days)
    test = submitted_on(ex, day)
    if len(train) == 0 or len(test) == 0:
        return None
    served = fit_served(train, params)  # as served: history without a size, never above a part's peak
    models: dict[str, Picker] = {"lightgbm": served, **baseline_models()}
    row: dict[str, Any] = {"day": day_text(day), "train_rows": len(train), "test_rows": len(test)}
    preds: dict[str, np.ndarray] = {}
    for name, model in models.items():
        assert isinstance(model, ThroughputModel)
        pred = preds[name] = model.predict(test.rows)
        row[name] = summary(pred, test.y)
    row["lightgbm"]["band_coverage"] = band_coverage(served, preds["lightgbm"], test)
    _record_errors(errors, test, preds["lightgbm"])
    if not oracle.empty:
        preds["oracle"] = oracle.per_accelerator(test)
        row["oracle"] = summary(preds["oracle"], test.y)
        models["oracle"] = None
        preds["ceiling"] = oracle.ceiling(test.rows, test.attempt_id, test.num_accelerators)
        models["ceiling"] = oracle.ceiling_picker
        row["ceiling"] = summary(preds["ceiling"], test.y)
    row["by_evidence"] = by_evidence(test, preds)
    for name, picks in pick_metrics(models, test, oracle, catalogue).items():
        row[name].update(picks)
    return row


def band_coverage(model: ThroughputModel, pred: np.ndarray, test: Examples) -> float:
    """Share of measured throughputs inside the model's band (nominally 80%: 10th to 90th percentile)."""
    lower, upper = model.predict_band(pred, test.rows)
    inside = (test.y >= lower) & (test.y <= upper)
    return float(np.mean(inside)) if len(test.y) else float("nan")


def _record_errors(errors: dict[str, list[Any]], test: Examples, pred: np.ndarray) -> None:
    errors["hardware"].extend(test.rows["hardware"].tolist())
    errors["family"].extend(test.rows["family"].tolist())
    errors["pred"].extend(pred.tolist())
    errors["actual"].extend(test.y.tolist())


def by_evidence(test: Examples, preds: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """Per evidence level: its share of the day's attempts and each method's acc@10 on them."""
    level = evidence_level(test.rows)
    return {
        name: {"share": float(np.mean(level == k)),
               **{n: summary(p[level == k], test.y[level == k])["acc@10"] for n, p in preds.items()}}
        for k, name in enumerate(EVIDENCE)
    }


def _summarise(per_day: list[dict[str, Any]], errors: dict[str, list[Any]], window_days: int,
               data_hash: str) -> dict[str, Any]:
    """The backtest's result: means over the days, the per-day rows and LightGBM's breakdowns."""
    names = [n for n in METHODS if n in per_day[0]]
    mean = {n: {m: float(np.nanmean([r[n][m] for r in per_day])) for m in METRICS if m in per_day[0][n]}
            for n in names}
    evidence = {
        level: {key: float(np.nanmean([r["by_evidence"][level][key] for r in per_day]))
                for key in per_day[0]["by_evidence"][level]}
        for level in EVIDENCE
    }
    wins = {f"lightgbm_beats_{base}_days": sum(r["lightgbm"]["acc@10"] > r[base]["acc@10"] for r in per_day)
            for base in ("transfer", "transfer_paired", "lookup")}
    coverage = [r["lightgbm"]["band_coverage"] for r in per_day]
    return {"days": len(per_day), "window_days": window_days, "mean": mean, "by_evidence": evidence,
            "per_day": per_day, **wins,
            "band_coverage_range": [float(np.min(coverage)), float(np.max(coverage))], "data_hash": data_hash,
            "lightgbm_by_hardware": _breakdown(errors, "hardware"), "lightgbm_by_family": _breakdown(errors, "family"),
            "lightgbm_sample": _sample(errors, 3000)}


def _breakdown(errors: dict[str, list[Any]], key: str) -> dict[str, dict[str, float]]:
    """LightGBM's metrics per value of ``key`` (hardware or family), over all scored attempts."""
    keys = np.array(errors[key], dtype=object)
    pred, actual = np.array(errors["pred"]), np.array(errors["actual"])
    return {str(k): summary(pred[keys == k], actual[keys == k]) for k in sorted(set(keys.tolist()))}


def _sample(errors: dict[str, list[Any]], n: int) -> dict[str, list[float]]:
    """Predicted and measured per-accelerator throughput of up to ``n`` scored attempts."""
    idx = np.random.default_rng(0).permutation(len(errors["pred"]))[:n]
    return {"pred": [errors["pred"][i] for i in idx], "actual": [errors["actual"][i] for i in idx]}
