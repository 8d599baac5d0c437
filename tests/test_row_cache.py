"""leap.training.row_cache: a run resumed from the previous night's checkpoint builds the rows a
cold build builds, and anything that would make it differ builds cold."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from leap.core.hardware import Catalogue, load_catalogue
from leap.training import row_cache
from leap.training.dataset import DAY, Examples, History, read_history
from leap.training.row_cache import META, OPEN_DAYS, ROWS, STATE, checkpoint_time, examples_as_of, window_history

WINDOW = 4 * DAY  # the next night's window starts before the checkpoint's open attempts


@pytest.fixture(scope="module")
def history(tiny_history: Path) -> History:
    return read_history(tiny_history, with_oracle=False)


@pytest.fixture(scope="module")
def catalogue() -> Catalogue:
    return load_catalogue()


def assert_same(a: Examples, b: Examples) -> None:
    assert len(a) == len(b) > 0
    for name in ("y", "submit_time", "finish_time", "num_accelerators"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    for name in ("attempt_id", "job_key", "hardware"):
        assert getattr(a, name).tolist() == getattr(b, name).tolist(), name
    assert a.rows.keys() == b.rows.keys()
    for column, values in a.rows.items():
        if values.dtype == object:
            assert values.tolist() == b.rows[column].tolist(), column
        else:
            np.testing.assert_array_equal(values, b.rows[column], err_msg=column)  # NaNs equal


def rows_as_of(history: History, catalogue: Catalogue, until: float, folder: Path | None
              ) -> tuple[Examples, dict[str, Any]]:
    """A training run's rows as of ``until`` (its window's submissions only, as leap train reads them)."""
    return examples_as_of(window_history(history, until - WINDOW), catalogue, until - WINDOW, until, folder)


def nights(history: History) -> tuple[float, float]:
    last = history.last_day + DAY
    return last - DAY, last


def test_the_next_night_resumes_and_builds_what_a_cold_build_builds(
        history: History, catalogue: Catalogue, tmp_path: Path) -> None:
    first, second = nights(history)
    _, cache = rows_as_of(history, catalogue, first, tmp_path)
    assert cache["used"] is False and "no checkpoint" in cache["reason"]
    assert cache["checkpoint"] <= first
    resumed, cache = rows_as_of(history, catalogue, second, tmp_path)
    assert cache["used"] is True and cache["resumed_from"] is not None
    cold, _ = rows_as_of(history, catalogue, second, None)
    assert_same(resumed, cold)
    # and the night after that resumes from the checkpoint the resumed run left
    again, cache = rows_as_of(history, catalogue, second, tmp_path)
    assert cache["used"] is True
    assert_same(again, cold)


def without_finish(history: History, attempt_id: str) -> History:
    f = history.finishes
    return dataclasses.replace(history, finishes=f.filter(pc.not_equal(f.column("attempt_id"), attempt_id)))


def test_a_changed_past_builds_cold(history: History, catalogue: Catalogue, tmp_path: Path) -> None:
    first, second = nights(history)
    _, cache = rows_as_of(history, catalogue, first, tmp_path)
    early = history.finishes.filter(pc.less(history.finishes.column("event_time"), first - WINDOW))
    changed = without_finish(history, early.column("attempt_id")[0].as_py())
    rows, cache = rows_as_of(changed, catalogue, second, tmp_path)
    assert cache["used"] is False and "changed" in cache["reason"]
    assert_same(rows, rows_as_of(changed, catalogue, second, None)[0])


def test_a_submission_gone_from_the_window_builds_cold(history: History, catalogue: Catalogue,
                                                       tmp_path: Path) -> None:
    first, second = nights(history)
    rows_as_of(history, catalogue, first, tmp_path)
    subs = history.submissions
    t = subs.column("event_time")
    inside = subs.filter(pc.and_(pc.greater_equal(t, second - WINDOW), pc.less(t, first - DAY)))
    gone = inside.column("event_id")[0]
    changed = dataclasses.replace(history, submissions=subs.filter(pc.not_equal(subs.column("event_id"), gone)))
    rows, cache = rows_as_of(changed, catalogue, second, tmp_path)
    assert cache["used"] is False and "changed" in cache["reason"]
    assert_same(rows, rows_as_of(changed, catalogue, second, None)[0])


def test_an_old_attempt_measured_after_the_checkpoint_builds_cold(
        history: History, catalogue: Catalogue, tmp_path: Path) -> None:
    """A finish that arrives after the checkpoint for an attempt submitted long before it: the
    checkpoint has no row for it, a cold build does."""
    first, second = nights(history)
    subs, f = history.submissions, history.finishes
    measured = f.filter(pc.is_valid(f.column("throughput")))
    old = subs.filter(pc.and_(pc.greater_equal(subs.column("event_time"), second - WINDOW),
                              pc.less(subs.column("event_time"), first - OPEN_DAYS * DAY)))
    attempt = next(a for a in old.column("attempt_id").to_pylist()
                   if a in set(measured.column("attempt_id").to_pylist()))
    late = f.filter(pc.equal(f.column("attempt_id"), attempt))
    moved = late.set_column(late.schema.get_field_index("event_time"), "event_time",
                            pa.array([first + DAY / 2] * late.num_rows, type=late.schema.field("event_time").type))
    before = without_finish(history, attempt)
    after = dataclasses.replace(before, finishes=pa.concat_tables([before.finishes, moved]))
    assert checkpoint_time(before, first) > first - OPEN_DAYS * DAY
    rows_as_of(before, catalogue, first, tmp_path)
    rows, cache = rows_as_of(after, catalogue, second, tmp_path)
    assert cache["used"] is False and "measured since" in cache["reason"]
    assert attempt in rows.attempt_id.tolist()
    assert_same(rows, rows_as_of(after, catalogue, second, None)[0])


def test_a_checkpoint_of_other_row_code_is_not_used(history: History, catalogue: Catalogue, tmp_path: Path) -> None:
    first, second = nights(history)
    rows_as_of(history, catalogue, first, tmp_path)
    meta = json.loads((tmp_path / META).read_text())
    (tmp_path / META).write_text(json.dumps({**meta, "code": "another"}))
    _, cache = rows_as_of(history, catalogue, second, tmp_path)
    assert cache["used"] is False and "code" in cache["reason"]


def test_a_folder_others_can_write_to_is_refused(history: History, catalogue: Catalogue, tmp_path: Path) -> None:
    """The checkpoint is a pickle, which runs code when loaded: only a private folder holds one."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(PermissionError, match="not private"):
        rows_as_of(history, catalogue, nights(history)[0], shared)
    assert not list(shared.iterdir())


def test_an_unreadable_checkpoint_builds_cold(history: History, catalogue: Catalogue, tmp_path: Path) -> None:
    first, second = nights(history)
    rows_as_of(history, catalogue, first, tmp_path)
    (tmp_path / STATE).write_bytes(b"not a pickle")
    rows, cache = rows_as_of(history, catalogue, second, tmp_path)
    assert cache["used"] is False and "could not be read" in cache["reason"] and cache["saved"] is True
    assert_same(rows, rows_as_of(history, catalogue, second, None)[0])


def test_rows_that_cannot_be_read_back_build_cold(history: History, catalogue: Catalogue, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The kept rows are read twice (checked, then read back once the state is let go): if the
    second read fails, the run builds cold and leaves no checkpoint naming a half-written pair."""
    first, second = nights(history)
    rows_as_of(history, catalogue, first, tmp_path)
    reads = []
    kept_rows = row_cache._kept_rows

    def read_once(folder: Path, rows_from: float) -> Examples:
        reads.append(folder)
        if len(reads) > 1:
            (folder / ROWS).write_bytes(b"")
        return kept_rows(folder, rows_from)

    monkeypatch.setattr(row_cache, "_kept_rows", read_once)
    rows, cache = rows_as_of(history, catalogue, second, tmp_path)
    assert len(reads) == 2 and cache["used"] is False and "read back" in cache["reason"]
    assert not (tmp_path / META).exists() and not (tmp_path / STATE).exists()
    assert_same(rows, rows_as_of(history, catalogue, second, None)[0])


class Said:
    """A progress sink that keeps what it was told."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, line: str) -> None:
        self.lines.append(line)


def test_built_rows_are_kept_and_read_back_for_the_same_events_and_options(
        history: History, catalogue: Catalogue, tmp_path: Path) -> None:
    """A backtest or drivers report run again reads the rows the first run built; other events or
    other options build anew, and the folder keeps the newest few sets only."""
    from leap.training.row_cache import EXAMPLES_KEPT, built_examples

    folder, said = tmp_path / "rows", Said()
    first = built_examples(history, catalogue, said, folder)
    assert len(list(folder.glob("examples-*.pickle"))) == 1 and said.lines[-1].startswith("building")
    assert_same(built_examples(history, catalogue, said, folder), first)
    assert said.lines[-1].startswith("point-in-time rows from") and len(said.lines) == 2
    later = history.submissions.filter(pc.greater(history.submissions.column("event_time"), history.first_day + DAY))
    fewer = built_examples(dataclasses.replace(history, submissions=later), catalogue, said, folder)
    assert said.lines[-1].startswith("building") and len(fewer) < len(first)
    for n in range(EXAMPLES_KEPT + 1):
        built_examples(history, catalogue, said, folder, full_per_day=10 + n)
        assert said.lines[-1].startswith("building")
    assert len(list(folder.glob("examples-*.pickle"))) == EXAMPLES_KEPT
    built_examples(history, catalogue, said, None)
    assert said.lines[-1].startswith("building") and not list(folder.glob(".examples-*"))
