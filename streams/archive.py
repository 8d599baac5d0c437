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
stores some events twice. Readers must drop repeated ``event_id`` s (:func:`drop_duplicate_events`).
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

from core.settings import Settings
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
#: How often buffers are checked for age (and for a stopping consumer).
FLUSH_TICK_S = 0.5
#: Exit code when a batch cannot be archived (it must not be committed; it is read again on restart).
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
            table = _writable(cls, evs)
            if table.num_rows:
                paths.append(self._write_part(self.root / table_name / f"day={day}", table))
                ARCHIVED.labels(table_name).inc(table.num_rows)
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

    The batch's offsets stay uncommitted meanwhile. If shutdown interrupts the retries, the
    process exits at once: a normal stop would commit what the consumer holds, and the batch is
    read again on restart instead.
    """
    for delay in itertools.chain(RETRY_DELAYS_S, itertools.repeat(RETRY_DELAYS_S[-1])):
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


class TopicBuffer:
    """One topic's events since the last flush; their offsets are acked only once written.

    Faust's ``take_events`` acks a batch as soon as the agent moves on, and its timer cannot be
    cut short, so a worker stopping or losing partitions would wait a whole flush interval for
    it. Here the agent only appends (with acks off) and a flush, by size, age, or because the
    consumer stopped its flow for a shutdown or rebalance, writes and then acks.
    """

    def __init__(self, writer: ArchiveWriter, topic: str, cls: type[Event], config: ArchiveConfig) -> None:
        self.writer, self.topic, self.cls, self.config = writer, topic, cls, config
        self.pending: list[Any] = []  # faust events
        self.since = 0.0
        self.stream: Any = None
        self._lock = asyncio.Lock()

    def add(self, event: Any) -> None:
        if not self.pending:
            self.since = time.monotonic()
        self.pending.append(event)

    def due(self, now: float, stopping: bool) -> bool:
        return bool(self.pending) and (
            stopping or len(self.pending) >= self.config.flush_events or now - self.since >= self.config.flush_seconds
        )

    async def flush(self) -> None:
        async with self._lock:  # size- and timer-triggered flushes never interleave
            events, self.pending = self.pending, []
            if not events:
                return
            try:
                good = decode_valid(self.cls, self.topic, (e.message.value for e in events))
                if good:
                    await write_with_retry(self.writer, self.cls, good)
            except Exception:
                # Events that are never acked hold back every later commit and make a stop wait
                # forever; exiting is the honest alternative (the batch is read again on restart).
                log.critical("archiving %d %s event(s) failed; exiting", len(events), self.cls.NAME, exc_info=True)
                logging.shutdown()
                os._exit(EXIT_UNWRITTEN)
            for event in events:
                await self.stream.ack(event)


def attach_archiver_agents(app: faust.App, topics: dict[str, faust.TopicT], config: ArchiveConfig) -> ArchiveWriter:
    """One agent per archived topic, and a task that flushes buffers that are old enough."""
    from streams import metrics

    writer = ArchiveWriter(config.root)
    buffers = [TopicBuffer(writer, topic, cls, config) for topic, (_, cls) in TABLES.items()]

    def make(buf: TopicBuffer) -> None:
        async def archive(stream: Any) -> None:
            stream.enable_acks = False  # TopicBuffer.flush acks after the write
            buf.stream = stream
            async for event in stream.events():
                metrics.EVENTS_IN.labels(buf.topic).inc()
                buf.add(event)
                if len(buf.pending) >= config.flush_events:
                    await buf.flush()

        name = _table_of(buf.cls)
        archive.__qualname__ = archive.__name__ = f"archive_{name}"  # names the agent in logs
        app.agent(topics[buf.topic], name=f"leap.archive.{name}")(archive)

    for buf in buffers:
        make(buf)

    @app.task
    async def flush_due() -> None:
        # Not app.timer: timers end as soon as the app starts stopping, but the consumer then
        # waits for every buffered event to be acked, and only a flush acks them.
        while True:
            await asyncio.sleep(min(FLUSH_TICK_S, config.flush_seconds))
            stopping = not app.consumer.flow_active  # type: ignore[attr-defined]  # shutdown or rebalance
            for buf in buffers:
                if buf.due(time.monotonic(), stopping):
                    await buf.flush()

    return writer
