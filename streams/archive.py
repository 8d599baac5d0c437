"""The history archive: submissions, starts, finishes and rankings from the topics, as Parquet.

Layout (the same as :func:`fleet.history.write_history`, so training reads live and simulated
history alike)::

    ROOT/submissions/day=YYYY-MM-DD/part-<epoch_ms>-<n>.parquet   columns = Submission fields
    ROOT/starts/day=YYYY-MM-DD/...                                 columns = JobStart fields
    ROOT/finishes/day=YYYY-MM-DD/...                               columns = JobFinish fields
    ROOT/rankings/day=YYYY-MM-DD/...                               columns = Ranking fields; candidates
                                                                   and features_used as JSON text

Each event is filed under the UTC day of its ``event_time``. Parquet files are immutable, so
every flush adds new part files; a part file appears whole or not at all (written under a
hidden name, synced, then linked into place). Offsets are committed only after the batch's
files are in place: delivery is at-least-once, and a crash between the write and the commit
stores some events twice. Readers drop repeated ``event_id`` s (:func:`drop_duplicate_events`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from prometheus_client import Counter

from leap.settings import Settings
from streams.events import Event, EventError, JobFinish, JobStart, Ranking, Submission
from streams.topics import JOB_FINISHES, JOB_STARTS, RANKINGS, SUBMISSIONS

if TYPE_CHECKING:
    import faust

log = logging.getLogger("leap.archive")

DAY = 86400
#: Topic -> (table folder, event class).
TABLES: dict[str, tuple[str, type[Event]]] = {
    SUBMISSIONS.name: ("submissions", Submission),
    JOB_STARTS.name: ("starts", JobStart),
    JOB_FINISHES.name: ("finishes", JobFinish),
    RANKINGS.name: ("rankings", Ranking),
}
#: Back-off while the archive folder cannot be written: the batch waits, it is never skipped.
RETRY_DELAYS_S = (1.0, 2.0, 5.0, 10.0, 30.0)
#: Exit code when shutdown interrupts a failing write (the batch must not be committed).
EXIT_UNWRITTEN = 75

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
    flush_events: int = 10_000
    flush_seconds: float = 300.0

    @classmethod
    def from_env(cls, settings: Settings, env: Mapping[str, str] | None = None) -> ArchiveConfig:
        """``LEAP_ARCHIVE_DIR`` (default ``settings.home / "archive"``) and the flush limits."""
        env = os.environ if env is None else env
        default = cls(settings.home / "archive")
        return cls(
            root=Path(env["LEAP_ARCHIVE_DIR"]) if env.get("LEAP_ARCHIVE_DIR") else default.root,
            flush_events=int(env.get("LEAP_ARCHIVE_FLUSH_EVENTS") or default.flush_events),
            flush_seconds=float(env.get("LEAP_ARCHIVE_FLUSH_SECONDS") or default.flush_seconds),
        )


# ------------------------------------------------------------------------------ tables

_ARROW = {"str": pa.string(), "int": pa.int64(), "float": pa.float64(), "strlist": pa.list_(pa.string())}


def arrow_schema(cls: type[Event]) -> pa.Schema:
    """Column types of an event's table: those of ``fleet.history``; nested values as JSON text."""
    return pa.schema([(f.name, _ARROW.get(f.kind, pa.string())) for f in cls.FIELDS])


def _cell(kind: str, value: Any) -> Any:
    if kind in ("object", "records") and value is not None:
        return orjson.dumps(value).decode()  # tuples of dicts encode as JSON arrays
    if kind == "strlist" and value is not None:
        return list(value)
    return value


def to_table(cls: type[Event], events: Sequence[Event]) -> pa.Table:
    """Events of one class as an Arrow table with :func:`arrow_schema` columns."""
    schema = arrow_schema(cls)
    columns = [pa.array([_cell(f.kind, getattr(e, f.name)) for e in events], type=schema.field(f.name).type)
               for f in cls.FIELDS]
    return pa.Table.from_arrays(columns, schema=schema)


def day_of(event_time: float) -> str:
    return dt.datetime.fromtimestamp(int(event_time // DAY) * DAY, tz=dt.UTC).strftime("%Y-%m-%d")


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
        table_name = _table_of(cls)
        by_day: dict[str, list[Event]] = {}
        for ev in events:
            by_day.setdefault(day_of(ev.event_time), []).append(ev)  # type: ignore[attr-defined]
        paths = []
        for day, evs in sorted(by_day.items()):
            paths.append(self._write_part(self.root / table_name / f"day={day}", to_table(cls, evs)))
            ARCHIVED.labels(table_name).inc(len(evs))
            FILES.labels(table_name).inc()
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


def _table_of(cls: type[Event]) -> str:
    for name, kind in TABLES.values():
        if kind is cls:
            return name
    raise ValueError(f"{cls.__name__} is not archived")


# ------------------------------------------------------------------------------ the agent


def decode_valid(cls: type[Event], topic: str, raws: Iterable[bytes | None]) -> list[Event]:
    """Valid events of a batch. Invalid ones are counted and skipped: the feature and predictor
    agents already dead-letter them, and a second dead letter per message would only be noise."""
    good: list[Event] = []
    for raw in raws:
        try:
            good.append(cls.decode(raw))
        except EventError as exc:
            SKIPPED.labels(topic, exc.reason).inc()
    return good


async def write_with_retry(writer: ArchiveWriter, cls: type[Event], events: Sequence[Event]) -> None:
    """Write a batch, waiting out failures (full disk, unmounted volume) instead of dropping it.

    Faust acks a ``take_events`` batch as soon as the agent leaves it, even by an exception or
    a cancellation, and acked offsets are committed. So a batch that cannot be written is never
    given up: it is retried, and if shutdown interrupts the retries the process exits at once,
    before anything is committed; the batch is read again on restart.
    """
    for delay in (*RETRY_DELAYS_S, *itertools.repeat(RETRY_DELAYS_S[-1])):
        try:
            writer.write(cls, events)  # synchronous: no cancellation point inside a write
            return
        except OSError as exc:
            log.error("cannot write %d %s event(s) to %s (%s); retrying in %.0fs",
                      len(events), cls.NAME, writer.root, exc, delay)
        try:
            await asyncio.sleep(delay)
        except asyncio.CancelledError:
            log.critical("stopped while %d %s event(s) are unwritten; exiting without committing them",
                         len(events), cls.NAME)
            logging.shutdown()
            os._exit(EXIT_UNWRITTEN)


def attach_archiver_agents(app: faust.App, topics: dict[str, faust.TopicT], config: ArchiveConfig) -> ArchiveWriter:
    """One agent per archived topic; each flush writes that topic's buffered events."""
    from streams import metrics

    writer = ArchiveWriter(config.root)

    def make(topic: str, cls: type[Event]) -> None:
        async def archive(stream: Any) -> None:
            async for batch in stream.take_events(config.flush_events, config.flush_seconds):
                metrics.EVENTS_IN.labels(topic).inc(len(batch))
                metrics.BATCH_SIZE.labels(topic).observe(len(batch))
                good = decode_valid(cls, topic, (e.message.value for e in batch))
                if good:
                    await write_with_retry(writer, cls, good)
                # Leaving the loop body acks the batch: only now may its offsets be committed.

        app.agent(topics[topic], name=f"leap.archive.{_table_of(cls)}")(archive)

    for topic, (_, cls) in TABLES.items():
        make(topic, cls)
    return writer
