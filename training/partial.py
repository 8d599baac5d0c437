"""Backtest rows of a scheduler that leaves an optional field out (``leap backtest --drop-field``).

The contract lets a submission leave out ``params``, ``framework`` and the parallel layout; the
simulated histories never do. These rows are those of :func:`training.backtest.backtest` with one
field (:data:`features.completion.OPTIONAL_FIELDS`) left out of every submission from the first test
day on (the scored ones, and those the later nights train on), so that the model, the stand-ins of
:mod:`features.completion` and the baselines are scored on the same attempts as the complete run.
The history before keeps the field: its submissions are what the stand-ins are derived from.
With ``everywhere`` it is left out of the whole history, and only the fallbacks stand in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.hardware import Catalogue
from features.completion import OPTIONAL_FIELDS
from training.dataset import Examples, History, build_examples_with_progress, read_history
from training.days import checked_first_test_day


def examples_without(history_dir: Path, days: int, field: str, catalogue: Catalogue, progress: Any = None,
                     everywhere: bool = False) -> tuple[History, Examples]:
    """A history and its backtest rows with ``field`` left out (see the module docstring).

    Parameters
    ----------
    history_dir
        History folder.
    days
        Test days at the end of the history (as :func:`training.backtest.backtest` takes them).
    field
        One of :data:`features.completion.OPTIONAL_FIELDS` (``layout``: all three degrees).
    catalogue
        Specs for the rows.
    progress
        Anything with ``print``, or None.
    everywhere
        Leave the field out of every submission, not only from the first test day on.

    Raises
    ------
    ValueError
        An unknown field, or a history too short for ``days``.
    """
    if field not in OPTIONAL_FIELDS:
        raise ValueError(f"cannot drop {field!r}: choose one of {', '.join(OPTIONAL_FIELDS)}")
    history = read_history(history_dir)
    first_test = checked_first_test_day(history, days)
    ex = build_examples_with_progress(history, catalogue, progress, full_from=first_test, drop_field=field,
                                      drop_from=None if everywhere else first_test)
    return history, ex
