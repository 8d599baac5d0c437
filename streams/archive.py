"""The history archive's format: tables, column types, day folders, and the part-file writer.

Layout (shared by the archiver, :mod:`streams.archiver`, and the simulator's
:func:`leap.fleet.history.write_history`, so training reads live and simulated history alike)::

    ROOT/submissions/day=YYYY-MM-DD/part-<epoch_ms>-<n>.parquet   columns = Submission fields
    ROOT/starts/day=YYYY-MM-DD/...                                 columns = JobStart fields
    ROOT/finishes/day=YYYY-MM-DD/...                               columns = JobFinish fields
    ROOT/rankings/day=YYYY-MM-DD/...                               columns = Ranking fields; candidates
                                                                   and features_used as JSON text

Each event is filed under the UTC day of its ``event_time`` (:func:`day_of`, :func:`split_by_day`,
:func:`day_folder`). Parquet files are immutable, so every flush adds new part files; a part file
appears whole or not at all (written under a hidden name, synced, then linked into place).
Offsets are committed only after the batch's files are in place: delivery is at-least-once, and
a crash between the write and the commit stores some events twice. Readers must drop repeated
``event_id`` s (:func:`drop_duplicate_events`).
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from prometheus_client import Counter

from leap.core.settings import DEFAULT_ARCHIVE_FLUSH_EVENTS, DEFAULT_ARCHIVE_FLUSH_SECONDS, Settings
from streams.events import Event, JobFinish, JobStart, Ranking, Submission
from streams.topics import JOB_FINISHES, JOB_STARTS, RANKINGS, SUBMISSIONS

log = logging.getLogger("leap.archive")

DAY = 86400
#: Topic -> (table folder, event class).
TABLES: dict[str, tuple[str, type[Event]]] = {
    SUBMISSIONS.name: ("submissions", Submission),
    JOB_STARTS.name: ("starts", JobStart),
    JOB_FINISHES.name: ("finishes", JobFinish),
    RANKINGS.name: ("rankings", Ranking),
}

ARCHIVED = Counter("leap_archive_events_total", "Events written to the archive", ["table"])
SKIPPED = Counter("leap_archive_skipped_total", "Invalid events not archived", ["topic", "reason"])
FILES = Counter("leap_archive_files_total", "Part files written to the archive", ["table"])


@dataclass(frozen=True)
class ArchiveConfig:
    """Where the archiver writes and how often it flushes.

    Parameters
    ----------
    root
        Archive folder.
    flush_events, flush_seconds
        A flush happens per topic when this many events are buffered or this long after the
        previous one, whichever comes first (and on shutdown). Bigger means fewer, larger files.
    """

    root: Path
    flush_events: int = DEFAULT_ARCHIVE_FLUSH_EVENTS
    flush_seconds: float = DEFAULT_ARCHIVE_FLUSH_SECONDS

    @classmethod
    def from_settings(cls, settings: Settings) -> ArchiveConfig:
        """``settings.archive_root`` and the settings' flush limits."""
        return cls(
            root=settings.archive_root,
            flush_events=settings.archive_flush_events,
            flush_seconds=settings.archive_flush_seconds,
        )



# ------------------------------------------------------------------------------ tables

_ARROW = {"str": pa.string(), "int": pa.int64(), "float": pa.float64(), "strlist": pa.list_(pa.string())}


def arrow_schema(cls: type[Event]) -> pa.Schema:
    """Column types of an event's table; nested values (``object``, ``records``) as JSON text."""
    return pa.schema([(f.name, _ARROW.get(f.kind, pa.string())) for f in cls.FIELDS])


def table_name(cls: type[Event]) -> str:
    """The archive folder of an event class (``Submission`` -> ``submissions``)."""
    for name, kind in TABLES.values():
        if kind is cls:
            return name
    raise ValueError(f"{cls.__name__} is not archived")


def from_columns(cls: type[Event], columns: Mapping[str, Any]) -> pa.Table:
    """An event class's table from one column (array or list) per field, typed by :func:`arrow_schema`.

    Columns must already hold what the schema stores: JSON text for nested fields. Extra keys
    are ignored; a missing field raises ``KeyError``.
    """
    schema = arrow_schema(cls)
    arrays = [pa.array(columns[f.name], type=f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def _cell(kind: str, value: Any) -> Any:
    if kind in ("object", "records") and value is not None:
        return orjson.dumps(value).decode()  # tuples of dicts encode as JSON arrays
    if kind == "strlist" and value is not None:
        return list(value)
    return value


def to_table(cls: type[Event], events: Sequence[Event]) -> pa.Table:
    """Events of one class as an Arrow table with :func:`arrow_schema` columns."""
    return from_columns(cls, {f.name: [_cell(f.kind, getattr(e, f.name)) for e in events] for f in cls.FIELDS})


# ------------------------------------------------------------------------------ day folders


def _day_text(day_number: int) -> str:
    return dt.datetime.fromtimestamp(day_number * DAY, tz=dt.UTC).strftime("%Y-%m-%d")


def day_of(event_time: float) -> str:
    """The UTC day (``YYYY-MM-DD``) an event with this ``event_time`` is filed under."""
    return _day_text(int(event_time // DAY))


def day_folder(root: Path, table: str, day: str) -> Path:
    """``root/<table>/day=<day>``: the folder of one table's part files for one day."""
    return Path(root) / table / f"day={day}"


def split_by_day(table: pa.Table) -> Iterator[tuple[str, pa.Table]]:
    """A table's rows grouped by the UTC day of ``event_time``, days ascending.

    Rows keep their order within a day (the sort is stable). Used to write a whole table at
    once; the archiver files events one by one with :func:`day_of`, which agrees with it.
    """
    days = (np.asarray(table.column("event_time").to_numpy()) // DAY).astype(np.int64)
    order = np.argsort(days, kind="stable")
    table, days = table.take(pa.array(order)), days[order]
    bounds = np.flatnonzero(np.diff(days)) + 1
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(days)], strict=True):
        if hi > lo:
            yield _day_text(int(days[lo])), table.slice(int(lo), int(hi - lo))


def write_by_day(root: Path, tables: Mapping[str, pa.Table]) -> dict[str, int]:
    """Write whole tables as one ``part-0.parquet`` per table and day (:func:`split_by_day`,
    :func:`day_folder`), as a history is written at once; returns the rows written per table."""
    counts: dict[str, int] = {}
    for name, table in tables.items():
        counts[name] = table.num_rows
        for day, part in split_by_day(table):
            folder = day_folder(root, name, day)
            folder.mkdir(parents=True, exist_ok=True)
            pq.write_table(part, folder / "part-0.parquet")
    return counts


def drop_duplicate_events(table: pa.Table) -> pa.Table:
    """Keep the first row of each ``event_id`` (an at-least-once archive may hold repeats)."""
    if "event_id" not in table.column_names or table.num_rows == 0:
        return table
    ids = table.column("event_id")
    unique = pc.unique(ids)
    if len(unique) == table.num_rows:
        return table
    # unique() keeps first-seen order, so the first-occurrence indices come out ascending.
    first = pc.index_in(unique, value_set=ids)
    return table.take(first)


# ------------------------------------------------------------------------------ writing


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ArchiveWriter:
    """Appends batches of events to the day-partitioned archive as new part files.

    Parameters
    ----------
    root
        Archive folder (created on first write).
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._seq = itertools.count()

    def write(self, cls: type[Event], events: Iterable[Event]) -> list[Path]:
        """Write events of one type, one new part file per UTC day; returns the files written."""
        name = table_name(cls)
        by_day: dict[str, list[Event]] = {}
        for ev in events:
            by_day.setdefault(day_of(ev.event_time), []).append(ev)  # type: ignore[attr-defined]
        paths = []
        for day, evs in sorted(by_day.items()):
            table = _writable(cls, evs)
            if table.num_rows:
                paths.append(self._write_part(day_folder(self.root, name, day), table))
                ARCHIVED.labels(name).inc(table.num_rows)
                FILES.labels(name).inc()
        return paths

    def _write_part(self, folder: Path, table: pa.Table) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        stamp = int(time.time() * 1000)
        # Hidden name: dataset readers skip files starting with "." while they are incomplete.
        tmp = folder / f".part-{stamp}-{os.getpid()}-{next(self._seq)}.tmp"
        try:
            pq.write_table(table, tmp)
            with tmp.open("rb") as fh:
                os.fsync(fh.fileno())
            for n in itertools.count():
                final = folder / f"part-{stamp}-{n}.parquet"
                try:
                    # A hard link never replaces an existing file: two writers flushing into the
                    # same day in the same millisecond each get their own name.
                    os.link(tmp, final)
                    break
                except FileExistsError:
                    continue
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(folder)
        return final


_UNWRITABLE = (OverflowError, TypeError, ValueError, pa.ArrowException)


def _writable(cls: type[Event], events: Sequence[Event]) -> pa.Table:
    """The table of a batch, without the rare event the contract accepts but Parquet cannot hold
    (an integer beyond int64): such an event is skipped and counted, not allowed to block the topic."""
    try:
        return to_table(cls, events)
    except _UNWRITABLE:
        keep = []
        for ev in events:
            try:
                to_table(cls, [ev])
                keep.append(ev)
            except _UNWRITABLE as exc:
                topic = next(t for t, (_, c) in TABLES.items() if c is cls)
                SKIPPED.labels(topic, "unwritable").inc()
                log.error("not archived, %s %s: %s", cls.NAME, ev.event_id, exc)  # type: ignore[attr-defined]
        return to_table(cls, keep)
