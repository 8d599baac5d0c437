"""The archive's events in event-time order, made into objects a chunk at a time.

Building training rows replays every start and finish of the history through the offline feature
state. Made into Python objects all at once, a 60-day history of 20,000 attempts a day (3.6 million
events) took 4.3 GB: every cell of a column became its own string object, every candidate list a
tuple of new strings. :func:`replay` merges the three tables by time with NumPy and makes only one
chunk of events into objects at a time, sharing the strings of the few-valued columns (model
types, hardware names, candidate lists), so at most a chunk's objects are alive; what the replay
keeps (the feature state) is all that grows with the history.

At equal times, outcomes are applied before a submission reads them (finishes, then starts, then
submissions); ties within a kind keep the table's order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streams.events import JobFinish, JobStart, Submission

FINISH, START, SUBMISSION = 0, 1, 2
#: Events made into objects at a time (bounds the objects alive during a replay).
CHUNK = 50_000
#: Columns with few distinct values, whose strings are shared between events.
SHARED_COLUMNS = frozenset({"model_type", "family", "hardware", "precision", "framework", "outcome",
                            "requested_hardware"})


class SharedStrings:
    """One object per distinct value of the few-valued columns, across every chunk of a replay."""

    def __init__(self) -> None:
        self._strings: dict[Any, Any] = {}
        self._tuples: dict[tuple[str, ...], tuple[str, ...]] = {}

    def column(self, values: list[Any]) -> list[Any]:
        seen = self._strings
        return [seen.setdefault(v, v) for v in values]

    def candidates(self, values: list[Any]) -> list[tuple[str, ...]]:
        seen = self._tuples
        out = []
        for v in values:
            t = tuple(v or ())
            out.append(seen.setdefault(t, t))
        return out


def events(table: pa.Table, cls: type, strings: SharedStrings | None = None) -> list[Any]:
    """The rows of an archive table as ``cls`` events (no re-validation: the archive holds only
    events that passed validation); with ``strings``, few-valued columns share their strings."""
    names = [f.name for f in cls.FIELDS]  # type: ignore[attr-defined]
    cols = []
    for n in names:
        values = table.column(n).to_pylist() if n in table.column_names else [None] * table.num_rows
        if n == "candidates":
            values = strings.candidates(values) if strings is not None else [tuple(c or ()) for c in values]
        elif strings is not None and n in SHARED_COLUMNS:
            values = strings.column(values)
        cols.append(values)
    return [cls(*values) for values in zip(*cols, strict=True)]


def merge_order(times: Sequence[Any], until: float | None, since: float | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """``(kinds, index)`` of every event before ``until`` (and at or after ``since``), merged by time.

    ``times[k]`` are the event times of kind ``k`` (:data:`FINISH`, :data:`START`,
    :data:`SUBMISSION`); at equal times the lower kind comes first, then the lower index.
    """
    all_times = np.concatenate([np.asarray(t, dtype=np.float64) for t in times])
    kinds = np.concatenate([np.full(len(t), k) for k, t in enumerate(times)])
    index = np.concatenate([np.arange(len(t)) for t in times])
    order = np.lexsort((kinds, all_times))
    if until is not None:
        order = order[all_times[order] < until]
    if since is not None:  # a replay resumed where an earlier one stopped: the same order from there
        order = order[all_times[order] >= since]
    return kinds[order], index[order]


def measured_finish(finishes: pa.Table, attempt_ids: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """For each attempt id, the row of its finish with a measured throughput (-1: none).

    An attempt with more than one such finish takes the last one, as a dict filled in table
    order would.
    """
    rows = np.flatnonzero(pc.is_valid(finishes.column("throughput")).to_numpy(zero_copy_only=False))
    if len(rows) == 0:
        return np.full(len(attempt_ids), -1, dtype=np.int64)
    # index_in finds the first match: search the measured rows last to first to find the last.
    backwards = rows[::-1]
    ids = finishes.column("attempt_id").take(pa.array(backwards))
    found = pc.fill_null(pc.index_in(attempt_ids, value_set=ids), -1).to_numpy(zero_copy_only=False)
    return np.where(found >= 0, backwards[np.maximum(found, 0)], -1).astype(np.int64)


def ids_unique(*tables: pa.Table) -> bool:
    """Whether no ``event_id`` repeats within or across ``tables`` (an offline state fed only such
    events need not remember the ids it applied)."""
    ids = pa.chunked_array([c for t in tables for c in t.column("event_id").chunks], type=pa.string())
    return len(pc.unique(ids)) == len(ids)


def replay(finishes: pa.Table, starts: pa.Table, subs: pa.Table, until: float | None,
           keep_sub: np.ndarray | None = None, chunk: int | None = None, since: float | None = None
           ) -> Iterator[tuple[int, int, Any]]:
    """``(kind, row, event)`` of every event before ``until`` (at or after ``since``) in replay order.

    Parameters
    ----------
    finishes, starts, subs
        The archive's three tables.
    until
        Leave out every event at or after this time (None: none).
    keep_sub
        Submissions to replay (a mask over ``subs``); the others are left out, never made into
        objects. None: all.
    chunk
        Events made into objects at a time (default :data:`CHUNK`).
    since
        Leave out every event before this time (None: none): the rest of a replay whose state
        already holds the earlier events.
    """
    chunk = chunk or CHUNK
    tables = ((finishes, JobFinish), (starts, JobStart), (subs, Submission))
    kinds, index = merge_order([t.column("event_time").to_numpy() for t, _ in tables], until, since)
    if keep_sub is not None:
        keep = (kinds != SUBMISSION) | keep_sub[np.where(kinds == SUBMISSION, index, 0)]
        kinds, index = kinds[keep], index[keep]
    # Each table's rows in replay order, so that a chunk is a slice of each (a take per chunk
    # from a table of many files costs as much as the whole table).
    ordered = [_in_order(table, index[kinds == kind]) for kind, (table, _) in enumerate(tables)]
    at = [0, 0, 0]
    strings = SharedStrings()
    for lo in range(0, len(kinds), chunk):
        k, i = kinds[lo:lo + chunk], index[lo:lo + chunk]
        made = []
        for kind, (_, cls) in enumerate(tables):
            count = int(np.count_nonzero(k == kind))
            made.append(iter(events(ordered[kind].slice(at[kind], count), cls, strings)))
            at[kind] += count
        for kind, row in zip(k.tolist(), i.tolist(), strict=True):
            yield kind, row, next(made[kind])


def _in_order(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """``table``'s ``rows`` in this order (the table itself when that is all of it, in order)."""
    if len(rows) == table.num_rows and np.array_equal(rows, np.arange(len(rows))):
        return table
    return table.take(pa.array(rows))
