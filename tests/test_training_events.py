"""Training rows from the chunked replay (:mod:`leap.training.events`) equal those of a plain replay.

The plain replay makes every event an object up front and walks them in (time, kind, index)
order, as :func:`leap.training.dataset.build_examples` did before it replayed a chunk at a time; the
rows, targets and times must be the same numbers, whatever the chunk and row-batch sizes.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from features.offline import OfflineFeatureState
from features.rows import build_batch_rows
from leap.core.hardware import load_catalogue
from leap.fleet.history import simulate, write_history
from leap.training import dataset
from leap.training.dataset import DAY, Examples, History, build_examples, read_history
from leap.training.days import parse_day
from leap.training.events import events, ids_unique, measured_finish, replay
from streams.events import JobFinish, JobStart, Submission

CAT = load_catalogue()


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> History:
    out: Path = tmp_path_factory.mktemp("events-history")
    write_history(simulate(seed=2, days=4, attempts_per_day=300, start=parse_day("2025-02-01")), out)
    return read_history(out, with_oracle=False)


def plain_examples(history: History, rows_from: float | None, until: float | None) -> dict[str, Any]:
    """Every event an object, one replay in (time, kind, index) order, every row built at the end."""
    finishes: list[JobFinish] = events(history.finishes, JobFinish)
    starts: list[JobStart] = events(history.starts, JobStart)
    subs: list[Submission] = events(history.submissions, Submission)
    measured = {f.attempt_id: f for f in finishes if f.throughput is not None}
    times = ([e.event_time for e in finishes], [e.event_time for e in starts], [e.event_time for e in subs])
    merged = sorted([(t, k, i) for k, table in enumerate(times) for i, t in enumerate(table)])
    state = OfflineFeatureState(CAT.canonical)
    examples, y, finish_time = [], [], []
    for t, kind, i in merged:
        if until is not None and t >= until:
            break
        if kind == 0:
            state.apply_finish(finishes[i])
        elif kind == 1:
            state.apply_start(starts[i])
        elif (done := measured.get(subs[i].attempt_id)) is not None and (rows_from is None or t >= rows_from):
            snap = state.snapshot(subs[i], candidates=(done.hardware,))
            examples.append((subs[i], snap, (done.hardware,)))
            assert done.throughput is not None
            y.append(done.throughput / done.num_accelerators)
            finish_time.append(done.event_time)
    rows = build_batch_rows([e[0] for e in examples], [e[1] for e in examples], CAT, [e[2] for e in examples])
    return {"rows": rows, "y": np.array(y), "finish_time": np.array(finish_time)}


def assert_same(ex: Examples, plain: dict[str, Any]) -> None:
    assert len(ex) == len(plain["y"]) > 0
    assert np.array_equal(ex.y, plain["y"]) and np.array_equal(ex.finish_time, plain["finish_time"])
    assert ex.rows.keys() == plain["rows"].keys()
    for col, values in plain["rows"].items():
        if values.dtype == object:
            assert (ex.rows[col] == values).all(), col
        else:
            assert np.array_equal(ex.rows[col], values, equal_nan=True), col


@pytest.mark.parametrize("window", ["all", "last two days"])
def test_chunked_rows_equal_a_plain_replay(history: History, window: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rows_from, until = (None, None) if window == "all" else (history.last_day - DAY, history.last_day + DAY / 2)
    plain = plain_examples(history, rows_from, until)
    # chunks and row batches far smaller than the history, so that both cross many boundaries
    monkeypatch.setattr("leap.training.events.CHUNK", 97)
    monkeypatch.setattr(dataset, "ROW_BATCH", 41)
    assert_same(build_examples(history, CAT, rows_from=rows_from, until=until), plain)


def test_replay_leaves_out_unkept_submissions_and_later_events(history: History) -> None:
    subs = history.submissions
    keep = np.arange(subs.num_rows) % 3 == 0
    until = history.last_day
    seen = list(replay(history.finishes, history.starts, subs, until, keep, chunk=50))
    times = [e.event_time for _, _, e in seen]
    assert times == sorted(times) and max(times) < until
    kept_rows = {row for kind, row, _ in seen if kind == 2}
    expected = set(np.flatnonzero(keep & (subs.column("event_time").to_numpy() < until)).tolist())
    assert kept_rows == expected
    # each event is the table's row it says it is
    tables = (history.finishes, history.starts, subs)
    for kind, row, event in seen[::37]:
        assert event.event_id == tables[kind].column("event_id")[row].as_py()


def test_measured_finish_takes_the_last_measured_finish_of_an_attempt() -> None:
    finishes = pa.table({"attempt_id": ["a", "b", "a", "c", "b"], "throughput": [1.0, 2.0, 3.0, None, None]})
    found = measured_finish(finishes, pa.array(["a", "b", "c", "d"]))
    # a: the later of two measured finishes; b: its unmeasured finish does not count; c, d: none
    assert found.tolist() == [2, 1, -1, -1]


def test_ids_unique_sees_repeats_within_and_across_tables() -> None:
    starts = pa.table({"event_id": ["s1", "s2"]})
    assert ids_unique(starts, pa.table({"event_id": ["f1", "f2"]}))
    assert not ids_unique(starts, pa.table({"event_id": ["f1", "s2"]}))  # a finish reusing a start's id
    assert not ids_unique(pa.table({"event_id": ["s1", "s1"]}))


def test_rows_equal_a_plain_replay_when_a_finish_reuses_a_start_id(history: History) -> None:
    """With ids known unique the replay keeps no per-job ids; a reused id must switch that back on,
    so that the offline state drops the finish as the job scripts would."""
    starts, finishes = history.starts, history.finishes
    job = finishes.column("job_key")[0].as_py()
    start_of_job = next(i for i, k in enumerate(starts.column("job_key").to_pylist()) if k == job)
    ids = finishes.column("event_id").to_pylist()
    ids[0] = starts.column("event_id")[start_of_job].as_py()
    reused = replace(history, finishes=finishes.set_column(
        finishes.schema.get_field_index("event_id"), "event_id", pa.array(ids, pa.string())))
    assert not ids_unique(reused.starts, reused.finishes)
    plain = plain_examples(reused, None, None)
    assert_same(build_examples(reused, CAT), plain)
