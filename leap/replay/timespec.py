"""Parsing ``--from`` / ``--to`` of a replay: a time (:func:`leap.core.timespec.parse_time`, the CLI's
one syntax) or ``offset:N``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from leap.core.timespec import FORMS, parse_time


@dataclass(frozen=True)
class Bound:
    """One end of a replay range.

    Attributes
    ----------
    kind
        ``"time"`` (``value`` = Kafka timestamp in ms), ``"offset"`` (``value`` = offset on every
        selected partition), or ``"open"`` (log start for ``--from``, end at start-up for ``--to``).
    value
        Milliseconds or offset; 0 for ``open``.
    text
        What the user typed, for reports.
    """

    kind: Literal["time", "offset", "open"]
    value: int = 0
    text: str = ""

    def describe(self) -> str:
        if self.kind == "time":
            stamp = datetime.fromtimestamp(self.value / 1000, tz=UTC).isoformat(timespec="seconds")
            return f"{stamp} ({self.text})" if self.text and self.text != stamp else stamp
        if self.kind == "offset":
            return f"offset {self.value}"
        return "open"


OPEN = Bound("open")


def parse_bound(text: str | None, now: float | None = None) -> Bound:
    """Parse one range bound.

    Parameters
    ----------
    text
        ``None``/empty (open), a time (:func:`leap.core.timespec.parse_time`: ``now``, ``-90m``,
        Unix seconds, ISO-8601) or ``offset:N``.
    now
        Current time in Unix seconds (defaults to the clock); fixed by tests.

    Returns
    -------
    Bound

    Raises
    ------
    ValueError
        With a message that says which forms are accepted.
    """
    if text is None or not text.strip():
        return OPEN
    raw = text.strip()
    if raw.lower().startswith("offset:"):
        number = raw.split(":", 1)[1].strip()
        if not number.isdigit():
            raise ValueError(f"{raw!r}: offset:N needs a non-negative integer N")
        return Bound("offset", int(number), raw)
    try:
        return Bound("time", int(parse_time(raw, now) * 1000), raw)
    except ValueError as exc:
        if FORMS in str(exc):
            raise ValueError(f"{raw!r}: expected {FORMS}, or offset:N") from None
        raise


def check_order(start: Bound, end: Bound) -> None:
    """Reject a range whose start is after its end when both are of the same kind."""
    if start.kind == end.kind and start.kind != "open" and start.value > end.value:
        raise ValueError(f"--from ({start.describe()}) is after --to ({end.describe()})")
