"""Backtest rows of a scheduler that leaves an optional field out (``leap backtest --drop-field``,
``leap drivers --drop-fields``).

The contract lets a submission leave out ``params``, ``framework`` and the parallel layout; the
simulated histories never do. These rows are those of :func:`leap.training.backtest.backtest` with one
field (:data:`features.completion.OPTIONAL_FIELDS`) left out of every submission from the first test
day on (the scored ones, and those the later nights train on), so that the model, the stand-ins of
:mod:`features.completion` and the baselines are scored on the same attempts as the complete run.
The history before keeps the field: its submissions are what the stand-ins are derived from.
With ``everywhere`` it is left out of the whole history, and only the fallbacks stand in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from features.completion import LAYOUT_FIELDS, OPTIONAL_FIELDS
from leap.core.hardware import Catalogue
from leap.training import new_types
from leap.training.dataset import DAY, Examples, History, build_examples_with_progress, read_history
from leap.training.days import checked_first_test_day


def examples_without(history_dir: Path, days: int, field: str, catalogue: Catalogue, progress: Any = None,
                     everywhere: bool = False, window_days: int = 30) -> tuple[History, Examples]:
    """A history and its backtest rows with ``field`` left out (see the module docstring).

    Parameters
    ----------
    history_dir
        History folder.
    days
        Test days at the end of the history (as :func:`leap.training.backtest.backtest` takes them).
    field
        One of :data:`features.completion.OPTIONAL_FIELDS` (``layout``: all three degrees).
    catalogue
        Specs for the rows.
    progress
        Anything with ``print``, or None.
    everywhere
        Leave the field out of every submission, not only from the first test day on.
    window_days
        Training window of the nightly fits: where one takes few enough rows, the rows carry their
        new-type view (:func:`leap.training.new_types.for_nightly_fits`), built from the same
        submissions without the field.

    Raises
    ------
    ValueError
        An unknown field, or a history too short for ``days``.
    """
    check_fields([field])
    history = read_history(history_dir)
    first_test = checked_first_test_day(history, days)
    sent = without_field(history, field, None if everywhere else first_test)
    examples = build_examples_with_progress(sent, catalogue, progress, full_from=first_test)
    test_days = [first_test + d * DAY for d in range(days)]
    return history, new_types.for_nightly_fits(examples, sent, catalogue, test_days, window_days)


def missing_fields(history_dir: Path, days: int, fields: Sequence[str], catalogue: Catalogue,
                   window_days: int = 30, params: dict[str, Any] | None = None,
                   progress: Any = None) -> list[dict[str, Any]]:
    """The drivers report's robustness table: the backtest with each of ``fields`` left out of every
    submission from the first test day on, beside the same days complete.

    Returns
    -------
    list of dict
        One row per run, the complete one first: ``{"dropped": field or None, "acc@10", "top1",
        "transfer", "transfer_paired", "band_coverage_range", "below_transfer_days"}``, the
        accuracies the means over the days; ``below_transfer_days`` counts the days the served
        model fell below the lookup-transfer baseline on those rows.

    Raises
    ------
    ValueError
        An unknown field, or a history too short for ``days``.
    """
    from leap.training.backtest import backtest

    check_fields(fields)
    rows = []
    for field in (None, *fields):
        examples = None if field is None else examples_without(history_dir, days, field, catalogue, progress,
                                                               window_days=window_days)
        result = backtest(history_dir, days=days, window_days=window_days, params=params, catalogue=catalogue,
                          progress=progress, examples=examples)
        mean = result["mean"]
        rows.append({"dropped": field, "acc@10": mean["lightgbm"]["acc@10"], "top1": mean["lightgbm"]["top1"],
                     "transfer": mean["transfer"]["acc@10"], "transfer_paired": mean["transfer_paired"]["acc@10"],
                     "band_coverage_range": result["band_coverage_range"],
                     "below_transfer_days": sum(d["lightgbm"]["acc@10"] < d["transfer"]["acc@10"]
                                                for d in result["per_day"])})
    return rows


def check_fields(fields: Sequence[str]) -> None:
    """Raise ValueError naming the ``fields`` that are not optional submission fields, or none given."""
    unknown = [f for f in fields if f not in OPTIONAL_FIELDS]
    if unknown or not fields:
        raise ValueError(f"cannot drop {', '.join(map(repr, unknown)) or 'nothing'}: choose from "
                         f"{', '.join(OPTIONAL_FIELDS)}")


def without_field(history: History, field: str, since: float | None) -> History:
    """``history`` with ``field`` (``layout``: its three degrees) null in the submissions from ``since``
    on (all of them if None), as a scheduler that leaves it out sends them."""
    subs = history.submissions
    late = pc.greater_equal(subs["event_time"], since) if since is not None else None
    for name in LAYOUT_FIELDS if field == "layout" else (field,):
        column = subs[name]
        empty = pa.nulls(len(subs), column.type)
        subs = subs.set_column(subs.schema.get_field_index(name), name,
                               empty if late is None else pc.if_else(late, empty, column))
    return dataclasses.replace(history, submissions=subs)
