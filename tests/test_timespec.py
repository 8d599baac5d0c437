"""One time syntax for every ``--from`` / ``--to`` of the CLI (:func:`leap.core.timespec.parse_time`)."""

from __future__ import annotations

import pytest

from leap.core.timespec import parse_time
from leap.dashboard.cli import parse_since
from leap.replay.timespec import parse_bound

NOW = 1_800_000_000.0
#: Each accepted form, and the Unix seconds it names at :data:`NOW`.
FORMS = [
    ("now", NOW),
    ("-2m", NOW - 120), ("2m", NOW - 120), ("-30m", NOW - 1800), ("-90s", NOW - 90), ("-1.5h", NOW - 5400),
    ("-1d", NOW - 86400), ("-1w", NOW - 7 * 86400), ("1790000000.5", 1_790_000_000.5),
    ("2026-12-01T08:00", 1_796_112_000.0), ("2026-12-01T08:00Z", 1_796_112_000.0),
    ("2026-12-01T09:00+01:00", 1_796_112_000.0),
]


@pytest.mark.parametrize("text, seconds", FORMS)
def test_every_command_reads_a_time_the_same_way(text: str, seconds: float) -> None:
    assert parse_time(text, NOW) == pytest.approx(seconds)
    assert parse_since(text, NOW) == pytest.approx(seconds)  # leap dashboard --from
    bound = parse_bound(text, NOW)  # leap replay --from / --to
    assert bound.kind == "time" and bound.value == int(seconds * 1000)


@pytest.mark.parametrize("text, message", [
    ("last tuesday", "expected an ISO time"), ("-2x", "expected an ISO time"), ("1764680000000", "milliseconds"),
    ("-5", "must be >= 0"),
])
def test_every_command_refuses_the_same_times(text: str, message: str) -> None:
    for parse in (parse_time, parse_since, parse_bound):
        with pytest.raises(ValueError, match=message):
            parse(text, NOW)


def test_the_dashboard_refuses_a_start_in_the_future_and_replay_keeps_offsets() -> None:
    with pytest.raises(ValueError, match="future"):
        parse_since("2999-01-01", NOW)
    assert parse_bound("offset:42", NOW).kind == "offset"
    with pytest.raises(ValueError, match="or offset:N"):
        parse_bound("yesterday", NOW)
