"""Day arithmetic of the nightly retrains, shared by ``leap train``, the backtest and the drivers report.

A night trains on the attempts that *finished* before its day (a label is only known once the
attempt finished) and were submitted within the training window; a test day scores the attempts
submitted on it. Days are UTC and start at midnight, in Unix seconds.
"""

from __future__ import annotations

import datetime as dt

import numpy as np

from leap.training.dataset import DAY, Examples, History


def parse_day(text: str) -> float:
    """``YYYY-MM-DD`` (UTC) to Unix seconds at midnight."""
    try:
        day = dt.datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=dt.UTC)
    except ValueError:
        raise ValueError(f"{text!r} is not a date in YYYY-MM-DD form") from None
    return day.timestamp()


def day_text(t: float) -> str:
    """Unix seconds to their UTC date, ``YYYY-MM-DD``."""
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime("%Y-%m-%d")


def first_test_day(history: History, days: int) -> float:
    """Midnight of the first of the last ``days`` days of the history."""
    return history.last_day - (days - 1) * DAY


def checked_first_test_day(history: History, days: int) -> float:
    """:func:`first_test_day`, after checking that at least 2 days of training precede it.

    Raises
    ------
    ValueError
        If the history is too short for ``days`` test days after 2 training days.
    """
    first_test = first_test_day(history, days)
    if first_test - history.first_day < 2 * DAY:
        raise ValueError(f"the history has {int((history.last_day - history.first_day) / DAY) + 1} days: "
                         f"too short for {days} test days after at least 2 days of training")
    return first_test


def submitted_on(ex: Examples, day: float) -> Examples:
    """The examples submitted on the day that starts at ``day``."""
    return ex.select((ex.submit_time >= day) & (ex.submit_time < day + DAY))


def training_mask(ex: Examples, day: float, window_days: float) -> np.ndarray:
    """Which examples a model trained at ``day`` may learn from.

    Those that finished before ``day`` and were submitted at most ``window_days`` days before it.
    """
    return (ex.finish_time < day) & (ex.submit_time >= day - window_days * DAY)


def training_rows(ex: Examples, day: float, window_days: float) -> Examples:
    """The examples selected by :func:`training_mask`."""
    return ex.select(training_mask(ex, day, window_days))
