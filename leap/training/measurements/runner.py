"""The fold runner: every model on every fold of a protocol, on identical rows, and their scores.

Per fold, the held-out configurations' jobs are the test jobs and every other job trains:

- training examples = :func:`leap.training.dataset.build_examples` on the training jobs' history
  (point-in-time rows, exactly as ``leap train`` builds them);
- test examples = :func:`leap.training.held_out.build_held_out_examples`: every attempt of every test
  job, with the features as of its submission, where the job sees only its own earlier attempts
  and the cross-job aggregates of the training jobs; plus every candidate's rows of each
  submission (for top-1 and regret);
- each model (a factory of the estimator contract, :mod:`leap.training.measurements.estimators`) is
  fitted on the training examples and predicts the test rows.

Scores (:mod:`leap.core.accuracy`): acc@10, acc@20 and MAPE over all test attempts and by evidence
level (``same``: the job ran on this hardware before; ``other``: only elsewhere, the transfer
task and the primary figure; ``none``: a cold first attempt); top-1 and regret over the
submissions with at least two candidates priced in the catalogue, by throughput per dollar.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from features.rows import Rows, concat_rows
from leap.core.accuracy import regret, summary, top1
from leap.core.hardware import Catalogue
from leap.training.dataset import Examples, History
from leap.training.held_out import build_cross_fitted_examples, build_held_out_examples, select_jobs
from leap.training.measurements.estimators import Estimator, ModelFactory
from leap.training.measurements.history import TableHistory
from leap.training.measurements.pairs import folds
from leap.training.measurements.table import Table
from leap.training.new_types import attach_new_type_rows
from predictor.lgbm import EVIDENCE, evidence_level
from predictor.models import ThroughputModel

#: The evidence level whose rows give the primary figures (the job ran elsewhere before).
PRIMARY = "other"


@dataclass
class Fold:
    """One fold's training and held-out examples (the held-out ones with every candidate's rows)."""

    train: Examples
    test: Examples


def with_new_type_rows(examples: Examples, history: History, catalogue: Catalogue) -> Examples:
    """``examples`` (of ``history``'s jobs) with their :attr:`Examples.new_type_rows`.

    For a history without time (a measurement table): the jobs of each model type are built as
    held-out ones (:func:`build_held_out_examples`) against the history of every other type, so
    their rows carry no median, paired ratio or other aggregate their own type fed, as a type's
    first jobs see at serving. The served model calibrates what it serves to new model types on
    them (:class:`predictor.lgbm.LightGBMThroughput`); a fleet's history has its own builder
    (:mod:`leap.training.new_types`). A history of one type is returned as it is.
    """
    subs = history.submissions
    job_type = dict(zip(subs.column("job_key").to_pylist(), subs.column("model_type").to_pylist(), strict=True))
    by_type: dict[str, list[str]] = {}
    for job, model_type in job_type.items():
        by_type.setdefault(str(model_type), []).append(str(job))
    if len(by_type) < 2 or not len(examples):
        return examples
    parts = [build_held_out_examples(select_jobs(history, jobs, keep=False), select_jobs(history, jobs), catalogue,
                                     full=False) for jobs in by_type.values()]
    return attach_new_type_rows(examples, Examples.concat([p for p in parts if len(p)]))


def make_fold(th: TableHistory, test_rows: np.ndarray, catalogue: Catalogue) -> Fold:
    """The fold whose test jobs are those of the table rows ``test_rows`` (a boolean mask)."""
    keys = set(th.job_key[test_rows].tolist())
    train = select_jobs(th.history, keys, keep=False)
    held_out = select_jobs(th.history, keys)
    # A table has no time: training rows see the other training jobs' aggregates, as test rows do;
    # their new-type view sees the other model types' only.
    examples = with_new_type_rows(build_cross_fitted_examples(train, catalogue), train, catalogue)
    return Fold(examples, build_held_out_examples(train, held_out, catalogue))


@dataclass
class _ModelRun:
    """One model's predictions over the folds and what they cost."""

    acc: list[np.ndarray] = field(default_factory=list)
    full: list[list[np.ndarray]] = field(default_factory=list)
    fit_s: float = 0.0
    predict_s: float = 0.0
    predicted_rows: int = 0
    #: per fold, what a model that reports its fit (``fit_report_``) chose and did
    reports: list[Any] = field(default_factory=list)
    #: per fold and test attempt, whether the measured throughput lies inside the model's band
    #: (1.0 / 0.0; NaN where there is no prediction); empty for a model without ``predict_band``
    inside: list[np.ndarray] = field(default_factory=list)


def fit_estimator(model: Estimator | ThroughputModel, rows: Rows, y: np.ndarray, groups: np.ndarray,
                  new_type_rows: Rows | None = None) -> Estimator | ThroughputModel:
    """``model.fit(rows, y, groups)``; ``model.fit(rows, y)`` for a model whose ``fit`` takes no groups;
    ``new_type_rows`` (:attr:`leap.training.dataset.Examples.new_type_rows`) too, by name, to a model
    whose ``fit`` takes them.

    The :mod:`predictor.models` baselines take no groups; accepting them as they are lets any
    :class:`~predictor.models.ThroughputModel` plug in without an adapter.
    """
    try:
        params = list(inspect.signature(model.fit).parameters.values())
    except (TypeError, ValueError):  # no introspectable signature: assume the full contract
        params = []
    takes_groups = not params or len(params) >= 3 or any(p.kind is p.VAR_POSITIONAL for p in params)
    if new_type_rows is not None and any(p.name == "new_type_rows" for p in params):
        return model.fit(rows, y, groups, new_type_rows=new_type_rows)  # type: ignore[call-arg]
    if takes_groups:
        return model.fit(rows, y, groups)  # type: ignore[call-arg]
    return model.fit(rows, y)  # type: ignore[call-arg]


def _fold_result(factory: ModelFactory, fold: Fold, full_rows: Rows, sizes: list[int]) -> dict[str, Any]:
    """Fit one fresh model on the fold's training rows; its predictions of the test and candidate
    rows (``acc``, ``full``, ``inside``: see :class:`_ModelRun`), times and fit report."""
    t0 = time.perf_counter()
    model = fit_estimator(factory(), fold.train.rows, fold.train.y, fold.train.job_key,
                          fold.train.new_type_rows) if len(fold.train) else None
    out: dict[str, Any] = {"fit_s": time.perf_counter() - t0, "predict_s": 0.0, "predicted_rows": 0,
                           "report": getattr(model, "fit_report_", None) or None, "inside": None}
    n_test, n_full = len(fold.test), int(sum(sizes))
    if model is None:  # nothing to train on (e.g. a table with one workload, held out)
        return {**out, "acc": np.full(n_test, np.nan), "full": [np.full(k, np.nan) for k in sizes]}
    t1 = time.perf_counter()
    acc = np.asarray(model.predict(fold.test.rows), dtype=np.float64)
    full = np.asarray(model.predict(full_rows), dtype=np.float64) if n_full else np.empty(0)
    out.update(predict_s=time.perf_counter() - t1, predicted_rows=n_test + n_full, acc=acc,
               full=np.split(full, np.cumsum(sizes)[:-1]) if sizes else [])
    if hasattr(model, "predict_band"):
        lower, upper = model.predict_band(acc, fold.test.rows)
        inside = (fold.test.y >= lower) & (fold.test.y <= upper)
        out["inside"] = np.where(np.isfinite(acc) & np.isfinite(lower) & np.isfinite(upper), inside, np.nan)
    return out


def fold_key(name: str, factory: ModelFactory, fold: Fold, protocol: str, seed: int) -> str:
    """A digest of what a model's predictions on a fold depend on, the code aside: the model's
    name and parameters, the protocol, the seed and the fold's jobs and measurements."""
    model = factory()
    params = model.get_params() if hasattr(model, "get_params") else {}
    digest = hashlib.sha256(orjson.dumps([name, params, protocol, seed], default=str, option=orjson.OPT_SORT_KEYS))
    for ex in (fold.train, fold.test):
        digest.update("\n".join(map(str, ex.job_key.tolist())).encode())
        digest.update(np.ascontiguousarray(ex.y, dtype=np.float64).tobytes())
    return digest.hexdigest()[:24]


def _checkpointed(factory: ModelFactory, fold: Fold, full_rows: Rows, sizes: list[int], save: Path | None
                  ) -> dict[str, Any]:
    """:func:`_fold_result`, read from ``save`` when a run stopped after it, else written there as
    it ends (NaN is saved as null and read back as NaN)."""
    if save is not None and save.exists():
        saved = orjson.loads(save.read_bytes())
        floats = functools.partial(np.asarray, dtype=np.float64)
        inside = None if saved["inside"] is None else floats(saved["inside"])
        return {**saved, "acc": floats(saved["acc"]), "full": [floats(f) for f in saved["full"]], "inside": inside}
    result = _fold_result(factory, fold, full_rows, sizes)
    if save is not None:
        save.parent.mkdir(parents=True, exist_ok=True)
        save_whole(save, result)
    return result


def save_whole(path: Path, result: Mapping[str, Any]) -> None:
    """``result`` as JSON at ``path``, through a temporary file: a run killed while writing leaves
    the file whole or absent, never half written."""
    partial = path.with_suffix(".partial")
    partial.write_bytes(orjson.dumps(result, option=orjson.OPT_SERIALIZE_NUMPY, default=str))
    partial.replace(path)


def _add(run: _ModelRun, result: Mapping[str, Any]) -> None:
    run.fit_s += result["fit_s"]
    run.predict_s += result["predict_s"]
    run.predicted_rows += result["predicted_rows"]
    if result["report"]:
        run.reports.append(result["report"])
    run.acc.append(result["acc"])
    run.full.append(result["full"])
    if result["inside"] is not None:
        run.inside.append(result["inside"])


def run_protocol(
    th: TableHistory,
    t: Table,
    protocol: str,
    models: Mapping[str, ModelFactory],
    catalogue: Catalogue,
    seed: int = 0,
    checkpoint: Path | None = None,
) -> dict[str, Any]:
    """Every model on every fold of ``protocol``; every test attempt is predicted exactly once.

    Parameters
    ----------
    th, t
        The converted table and the table.
    protocol
        ``config_fold`` or ``leave_one_workload_out`` (:func:`leap.training.measurements.pairs.folds`).
    models
        ``name -> factory`` of estimators; a fresh one is fitted per fold.
    catalogue
        Specs for the rows and prices for top-1 and regret.
    seed
        Seed of the configuration folds.
    checkpoint
        Folder keeping each model's predictions of each fold as the fold ends (:func:`fold_key`
        names them), so that a run stopped halfway resumes at the next fold: a fine-tuned
        language model on a table of thousands of rows is hours a fold. A saved fold is reused only
        by a run of the same code and hardware catalogue: the key covers neither.

    Returns
    -------
    dict
        ``{"folds", "rows": {level: count}, "models": {name: scores}}``; see :func:`score_model`.
    """
    runs = {name: _ModelRun() for name in models}
    tests: list[Examples] = []
    t0 = time.perf_counter()
    for test_rows in folds(t, protocol, seed):
        fold = make_fold(th, test_rows, catalogue)
        tests.append(fold.test)
        keys = sorted(fold.test.full)
        sizes = [len(fold.test.full[k][1]["hardware"]) for k in keys]
        full_rows = concat_rows([fold.test.full[k][1] for k in keys])
        for name, factory in models.items():
            save = None if checkpoint is None else checkpoint / f"{fold_key(name, factory, fold, protocol, seed)}.json"
            _add(runs[name], _checkpointed(factory, fold, full_rows, sizes, save))
    truth = _Truth.of(tests, catalogue)
    return {
        "folds": len(tests),
        "rows": {level: int((truth.level == k).sum()) for k, level in enumerate(EVIDENCE)},
        "seconds": round(time.perf_counter() - t0, 2),
        "models": {name: score_model(run, truth) for name, run in runs.items()},
    }


@dataclass
class _Truth:
    """What the predictions are scored against, over all folds in fold order."""

    y: np.ndarray
    level: np.ndarray
    #: per ranked submission: (index of its priced candidates, their true throughput, their prices)
    ranked: list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]]

    @classmethod
    def of(cls, tests: list[Examples], catalogue: Catalogue) -> _Truth:
        return cls(
            y=np.concatenate([ex.y for ex in tests]) if tests else np.empty(0),
            level=np.concatenate([evidence_level(ex.rows) for ex in tests]) if tests else np.empty(0, dtype=int),
            ranked=[_ranked_truth(ex, catalogue) for ex in tests],
        )


def _ranked_truth(ex: Examples, catalogue: Catalogue) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """For each full submission of a fold (in key order): its priced candidates and their truth.

    A candidate's true per-accelerator throughput is the median of the job's measurements on it
    (every candidate was measured, by construction); prices are the catalogue's, and a candidate
    without one cannot be ranked by throughput per dollar, so it is left out of the choice.
    """
    measured: dict[tuple[str, str], list[float]] = {}
    for job, hw, y in zip(ex.job_key.tolist(), ex.hardware.tolist(), ex.y.tolist(), strict=True):
        measured.setdefault((job, catalogue.canonical(hw)), []).append(y)
    out = []
    for k in sorted(ex.full):
        sub, rows = ex.full[k]
        names = [str(h) for h in rows["hardware"].tolist()]
        prices = [catalogue.price(h) for h in names]
        idx = np.array([i for i, p in enumerate(prices) if p is not None and (sub.job_key, names[i]) in measured],
                       dtype=np.int64)
        true = np.array([float(np.median(measured[(sub.job_key, names[i])])) for i in idx.tolist()])
        out.append((idx, true, np.array([prices[i] for i in idx.tolist()], dtype=np.float64)))
    return out


def score_model(run: _ModelRun, truth: _Truth) -> dict[str, Any]:
    """A model's scores: the primary (prior elsewhere) summary at the top, then the rest.

    Returns
    -------
    dict
        ``{"acc@10", "acc@20", "mape", "n", "n_missing"`` (rows of evidence :data:`PRIMARY`),
        ``"all"`` (every test attempt), ``"by_evidence": {same, other, none}``, ``"top1"``,
        ``"regret"``, ``"n_ranked"`` (submissions with two or more priced candidates),
        ``"band_coverage"`` (share of measured throughputs of :data:`PRIMARY` rows with a prediction
        inside the model's 80 % band; NaN for a model without a band),
        ``"fit_s"`` (all folds), ``"predict_us_per_row"}``.
    """
    pred = np.concatenate(run.acc) if run.acc else np.empty(0)
    by_level = {level: summary(pred[truth.level == k], truth.y[truth.level == k]) for k, level in enumerate(EVIDENCE)}
    hits, regrets = [], []
    for fold_pred, fold_truth in zip(run.full, truth.ranked, strict=True):
        for p, (idx, true, price) in zip(fold_pred, fold_truth, strict=True):
            if len(idx) < 2:
                continue
            if not np.isfinite(p[idx]).any():
                # No estimate for any priced candidate: no pick. A miss for top-1, and no regret
                # (leap.core.accuracy would fall back to the first candidate, which is not a choice).
                hits.append(0.0)
                continue
            hits.append(top1(p[idx][None, :], true[None, :], price))
            regrets.append(regret(p[idx][None, :], true[None, :], price))
    reports = {"fit_reports": run.reports} if run.reports else {}
    inside = np.concatenate(run.inside) if run.inside else np.full(len(pred), np.nan)
    banded = inside[(truth.level == EVIDENCE.index(PRIMARY)) & np.isfinite(inside)]
    return {
        **reports,
        **by_level[PRIMARY],
        "all": summary(pred, truth.y),
        "by_evidence": by_level,
        "top1": float(np.mean(hits)) if hits else float("nan"),
        "regret": float(np.mean(regrets)) if regrets else float("nan"),
        "n_ranked": len(hits),
        "n_unranked": len(hits) - len(regrets),
        "band_coverage": float(np.mean(banded)) if len(banded) else float("nan"),
        "fit_s": round(run.fit_s, 3),
        "predict_us_per_row": round(1e6 * run.predict_s / run.predicted_rows, 2) if run.predicted_rows else None,
    }
