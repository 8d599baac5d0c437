"""Parsing ``--from`` / ``--to``: ISO times, Unix seconds, ``now``, ``-2h`` and ``offset:N``."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

_RELATIVE = re.compile(r"^-(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
#: Unix seconds beyond this (year ~5138) are almost certainly milliseconds typed by mistake.
_MAX_UNIX_S = 1e11


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
        ``None``/empty (open), ``now``, ``-90m`` / ``-2h`` / ``-1d`` (relative to ``now``), Unix
        seconds (``1764680000`` or with decimals), an ISO-8601 time (``2026-12-01T08:00``; UTC
        when no zone is given) or ``offset:N``.
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
    now = time.time() if now is None else now
    low = raw.lower()
    if low == "now":
        return Bound("time", int(now * 1000), raw)
    if low.startswith("offset:"):
        number = raw.split(":", 1)[1].strip()
        if not number.isdigit():
            raise ValueError(f"{raw!r}: offset:N needs a non-negative integer N")
        return Bound("offset", int(number), raw)
    match = _RELATIVE.match(low)
    if match:
        seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
        return Bound("time", int((now - seconds) * 1000), raw)
    try:
        seconds = float(raw)
    except ValueError:
        pass
    else:
        if not seconds >= 0:
            raise ValueError(f"{raw!r}: Unix seconds must be >= 0")
        if seconds > _MAX_UNIX_S:
            raise ValueError(f"{raw!r}: expected Unix seconds (this looks like milliseconds)")
        return Bound("time", int(seconds * 1000), raw)
    try:
        stamp = datetime.fromisoformat(raw)
    except ValueError:
        raise ValueError(
            f"{raw!r}: expected an ISO time (2026-12-01T08:00Z), Unix seconds, 'now', "
            "a relative time like -2h / -30m / -1d, or offset:N"
        ) from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return Bound("time", int(stamp.timestamp() * 1000), raw)


def check_order(start: Bound, end: Bound) -> None:
    """Reject a range whose start is after its end when both are of the same kind."""
    if start.kind == end.kind and start.kind != "open" and start.value > end.value:
        raise ValueError(f"--from ({start.describe()}) is after --to ({end.describe()})")
