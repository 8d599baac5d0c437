"""The archiver agent: consumes the archived topics and writes them to the history archive.

The archive's format (tables, day folders, part files) is :mod:`streams.archive`; this module
buffers each topic's events, writes them with :class:`streams.archive.ArchiveWriter`, retries
while the folder cannot be written, and acknowledges offsets only once the events are on disk.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from streams.archive import SKIPPED, TABLES, ArchiveConfig, ArchiveWriter, table_name
from streams.events import Event, EventError

if TYPE_CHECKING:
    import faust

# The same logger as the format module: one name to follow for everything the archiver does.
log = logging.getLogger("leap.archive")

#: Back-off while the archive folder cannot be written: the batch waits, it is never skipped.
RETRY_DELAYS_S = (1.0, 2.0, 5.0, 10.0, 30.0)
#: How often buffers are checked for age (and for a stopping consumer).
FLUSH_TICK_S = 0.5
#: Exit code when a batch cannot be archived (it must not be committed; it is read again on restart).
EXIT_UNWRITTEN = 75


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

        name = table_name(buf.cls)
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
