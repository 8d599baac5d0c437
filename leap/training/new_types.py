"""A fleet history's rows as a model type's first jobs see the fleet: the served model's new-type view.

Below :data:`predictor.boosting.HOLDOUT_FROM` training rows the served model calibrates what it
serves to a model type never seen (gate, trust, band) on folds that hold whole model types out
(:class:`predictor.lgbm.LightGBMThroughput`). A held-out fold's rows must then read what the fleet
would hold had it never run those types: no lookup median, paired ratio or configuration aggregate
that their own jobs fed. Stripping the model-level medians from ordinary rows
(:func:`predictor.calibration.as_new_type`) is not enough: the family and all-jobs paired ratios
still hold the type's own pairs, and their configuration kernel weighs the type's own
configurations most, so the held-out rows look easier than a new type is.

:func:`with_unseen_type_rows` builds those rows by replay: the model types are split into the served
model's own type folds (:func:`predictor.calibration.job_folds`, :data:`predictor.lgbm.FOLDS`, the
model's default seed), and the history is replayed once per fold with that fold's types unseen
(:class:`features.offline.OfflineFeatureState`): a few replays of a history small enough to take
this path. A measurement table, which has no time, has its own builder
(:func:`leap.training.measurements.runner.with_new_type_rows`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from leap.core.hardware import Catalogue
from leap.training.dataset import Examples, History, build_examples
from leap.training.days import training_mask
from predictor.boosting import HOLDOUT_FROM
from predictor.calibration import job_folds
from predictor.lgbm import FOLDS


def with_unseen_type_rows(examples: Examples, history: History, catalogue: Catalogue, seed: int = 0,
                          rows_from: float | None = None, until: float | None = None) -> Examples:
    """``examples`` with their :attr:`~leap.training.dataset.Examples.new_type_rows` (as they are if
    of one model type). Worth its replays where a fit will take fewer than
    :data:`predictor.boosting.HOLDOUT_FROM` of them (:func:`needed`).

    Parameters
    ----------
    examples
        Rows of ``history`` (:func:`leap.training.dataset.build_examples`), e.g. a training window.
    history
        What they were built from.
    catalogue
        Specs for the rows.
    seed
        The served model's seed: its type folds are the replays' folds.
    rows_from, until
        As the examples were built (:func:`~leap.training.dataset.build_examples`).

    Raises
    ------
    ValueError
        An example the replays gave no row (not of this history, or built with other bounds).
    """
    types = np.asarray(examples.rows["model_type"]).astype(str)
    n_types = len(np.unique(types))
    if n_types < 2:
        return examples
    folds = job_folds(types, min(FOLDS, n_types), seed)
    parts = [build_examples(history, catalogue, rows_from=rows_from, until=until,
                            unseen_types=frozenset(types[folds == f].tolist())) for f in np.unique(folds)]
    return attach_new_type_rows(examples, Examples.concat([p for p in parts if len(p)]))


def for_nightly_fits(examples: Examples, history: History, catalogue: Catalogue, days: Sequence[float],
                     window_days: float) -> Examples:
    """``examples`` with their new-type rows if a nightly fit on one of ``days`` (over a window of
    ``window_days``, :func:`leap.training.days.training_mask`) takes fewer than
    :data:`predictor.boosting.HOLDOUT_FROM` of them, as ``leap train`` fits a small fleet; else as
    they are (and as they are if they already have them)."""
    if examples.new_type_rows is not None or not any(
            needed(int(training_mask(examples, day, window_days).sum())) for day in days):
        return examples
    return with_unseen_type_rows(examples, history, catalogue)


def needed(training_rows: int) -> bool:
    """Whether a fit on this many rows calibrates on held-out model types (and reads new-type rows)."""
    return training_rows < HOLDOUT_FROM


def attach_new_type_rows(examples: Examples, view: Examples) -> Examples:
    """``examples`` with ``view``'s rows of the same attempts as their new-type rows.

    Raises
    ------
    ValueError
        An example ``view`` has no row for.
    """
    position = {a: i for i, a in enumerate(view.attempt_id.tolist())}
    missing = [a for a in examples.attempt_id.tolist() if a not in position]
    if missing:
        raise ValueError(f"{len(missing)} examples have no new-type row (first: {missing[0]}): not of this history")
    order = np.array([position[a] for a in examples.attempt_id.tolist()], dtype=np.int64)
    return dataclasses.replace(examples, new_type_rows={c: v[order] for c, v in view.rows.items()})
