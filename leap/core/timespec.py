"""The one syntax of a point in time on the command line (``--from``, ``--to`` of every command).

Accepted, everywhere: ``now``; a look-back from now, ``-90s`` / ``-30m`` / ``-2h`` / ``-1d`` /
``-1w`` (the minus may be left out: ``15m``); Unix seconds (``1764680000``, decimals allowed); an
ISO-8601 time (``2026-12-01T08:00``, UTC unless a zone is given, ``Z`` included).
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

_LOOK_BACK = re.compile(r"^-?\s*(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
#: Unix seconds beyond this (year ~5138) are almost certainly milliseconds typed by mistake.
_MAX_UNIX_S = 1e11
#: What the error of a time that is none of the accepted forms lists.
FORMS = "an ISO time (2026-12-01T08:00, UTC unless a zone is given), Unix seconds, 'now', " \
        "or a look-back such as -90s, -30m, -2h, -1d"


def parse_time(text: str, now: float | None = None) -> float:
    """Unix seconds of ``text`` (module docstring for the forms).

    Parameters
    ----------
    text
        What the user typed.
    now
        Current time in Unix seconds (defaults to the clock); fixed by tests.

    Raises
    ------
    ValueError
        Naming the text and the accepted forms.
    """
    raw = text.strip()
    now = time.time() if now is None else now
    low = raw.lower()
    if low == "now":
        return now
    match = _LOOK_BACK.match(low)
    if match:
        return now - float(match.group(1)) * _UNIT_S[match.group(2)]
    try:
        seconds = float(raw)
    except ValueError:
        pass
    else:
        if not seconds >= 0:
            raise ValueError(f"{raw!r}: Unix seconds must be >= 0")
        if seconds > _MAX_UNIX_S:
            raise ValueError(f"{raw!r}: expected Unix seconds (this looks like milliseconds)")
        return seconds
    try:
        stamp = datetime.fromisoformat(raw)
    except ValueError:
        raise ValueError(f"{raw!r}: expected {FORMS}") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()
