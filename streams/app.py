"""The Faust app of a worker role and the batch plumbing every agent shares.

The feature agents (role ``features``, or ``all`` beside the predictor) and the archiver run on
Faust; each role is its own consumer group (``leap-features``, ``leap-all``, ``leap-archiver``):
run either ``all`` or ``features``, not both. The predictor is a librdkafka loop
(:mod:`predictor.loop`, group ``leap-predictor``) that shares the batch plumbing below.
Agents take events in batches (``take_events``) so Redis sees one round trip per batch; the
agents themselves live with what they serve (:mod:`features.agents`, :mod:`streams.archiver`).
Their per-batch logic takes plain callables (:data:`Send`) and anything shaped like a Faust event
(:class:`SourceEvent`), so it runs, and is tested, without a worker.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import faust
from mode.utils.futures import notify

from leap.core.settings import Settings
from streams import metrics
from streams.deadletter import dead_letter, fit_dead_letter
from streams.events import DeadLetter, Event, EventError
from streams.resilience import KAFKA, Abandoned, call_until_up, stop_waiting_when
from streams.topics import ALL_TOPICS, DEAD_LETTER, READ_COMMITTED, consumer_group, session_timeout

log = logging.getLogger("leap.streams")

E = TypeVar("E", bound=Event)

#: Sends one message (key, value) to a topic; :func:`topic_sender` binds one to a Faust topic.
Send = Callable[[bytes, bytes], Awaitable[object]]
#: Dead-letter reason of a message whose decoding raised something other than a contract error.
DECODE_ERROR = "decode_error"
#: Exit code of a worker whose batch handler failed: its batch is unacked, so it must not go on
#: (a later commit would step over it); the restarted worker reads the batch again.
EXIT_UNPROCESSED = 75


class SourceMessage(Protocol):
    """What the batch logic reads of a consumed Kafka message (a ``faust.types.Message`` has it)."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...

    @property
    def key(self) -> bytes | None: ...

    @property
    def value(self) -> bytes | None: ...


class SourceEvent(Protocol):
    """One item of a ``take_events`` batch (a ``faust.types.EventT`` is one)."""

    @property
    def message(self) -> SourceMessage: ...


@dataclass(frozen=True)
class Decoded(Generic[E]):
    """A decoded batch: valid events with the message each came from, and the dead letters."""

    events: list[E] = field(default_factory=list)
    sources: list[SourceMessage] = field(default_factory=list)  # sources[i] carried events[i]
    letters: list[DeadLetter] = field(default_factory=list)


def topic_sender(topic: faust.TopicT) -> Send:
    """A :data:`Send` that produces to ``topic`` (raw bytes key and value)."""

    async def send(key: bytes, value: bytes) -> None:
        # While the broker is unreachable the send waits (the batch stays unacked), it never fails.
        async def attempt() -> object:
            return await topic.send(key=key, value=value)

        await call_until_up(KAFKA, attempt)

    return send


def _credentials(settings: Settings) -> Any:
    sec = settings.kafka_security
    protocol = sec.get("security.protocol", "PLAINTEXT").upper()
    if protocol == "PLAINTEXT":
        return None
    context = ssl.create_default_context(cafile=sec.get("ssl.ca.location")) if "SSL" in protocol else None
    if "SASL" in protocol:
        return faust.SASLCredentials(
            username=sec.get("sasl.username"),
            password=sec.get("sasl.password"),
            mechanism=sec.get("sasl.mechanism", "PLAIN"),
            ssl_context=context,
        )
    return faust.SSLCredentials(context)


def _read_committed() -> None:
    """Make the Faust workers' consumers read only committed data (:data:`streams.topics.READ_COMMITTED`).

    Faust asks aiokafka for ``read_committed`` only under its own ``exactly_once`` guarantee, which
    would also make every agent's sends transactional; here only the reading changes (the archiver
    must not archive the rankings of an aborted predictor transaction). aiokafka reads the level
    when the consumer starts, so setting it on the consumer Faust just created is enough.
    """
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    create = AIOKafkaConsumerThread._create_worker_consumer
    if getattr(create, "reads_committed", False):
        return

    def create_reading_committed(self: Any, transport: Any) -> Any:
        consumer = create(self, transport)
        consumer._isolation_level = READ_COMMITTED["isolation.level"]
        return consumer

    create_reading_committed.reads_committed = True  # type: ignore[attr-defined]
    AIOKafkaConsumerThread._create_worker_consumer = create_reading_committed  # type: ignore[method-assign]


def build_app(settings: Settings, role: str) -> tuple[faust.App, dict[str, faust.TopicT]]:
    """A Faust app for one worker role, with a raw-bytes channel per LEAP topic."""
    _read_committed()
    (settings.home / "faust").mkdir(parents=True, exist_ok=True)  # Faust makes only the last folder
    app = faust.App(
        consumer_group(settings, role),
        broker=[f"kafka://{hp}" for hp in settings.kafka_bootstrap.split(",")],
        broker_credentials=_credentials(settings),
        store="memory://",
        # Faust keeps a small folder per app; under home, not wherever the worker was started.
        datadir=str(settings.home / "faust" / "{conf.id}-data"),  # Faust formats it with conf=
        # A killed worker's partitions move on after this long (Faust's default is 60 s, which
        # stopped rankings for a minute); heartbeats go five times per session timeout.
        broker_session_timeout=session_timeout(settings),
        broker_heartbeat_interval=session_timeout(settings) / 5,
        web_enabled=False,
        topic_disable_leader=True,
        topic_allow_declare=False,  # topics come from streams.topics, never auto-created
        # A new feature group rebuilds state from the retained history; a new predictor group
        # starts at the end (nobody waits for rankings of old submissions any more).
        consumer_auto_offset_reset="latest" if role == "predictor" else "earliest",
        # Sent at once: at low rates a linger holds every ranking for the whole linger (bench e2e's
        # hop_out shows it); at high rates aiokafka still batches while a request is out.
        producer_linger_ms=0,
        broker_commit_every=500,
        broker_commit_interval=1.0,
    )
    stop_waiting_when(lambda: bool(app.should_stop))
    topics = {
        t.name: app.topic(t.name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
        for t in ALL_TOPICS
    }

    @app.timer(interval=5.0)
    async def export_consumer_lag() -> None:
        # Faust's monitor already tracks end and read offsets per partition; publish the gap.
        monitor = app.monitor
        ends, reads = monitor.tp_end_offsets or {}, monitor.tp_read_offsets or {}
        for tp, end in ends.items():
            read = reads.get(tp)
            if read is not None:
                metrics.CONSUMER_LAG.labels(tp.topic, str(tp.partition)).set(max(0, end - read - 1))

    return app, topics


def decode_batch(cls: type[E], batch: Sequence[SourceEvent]) -> Decoded[E]:
    """Split a batch into valid events (in order) and dead letters (one per invalid message)."""
    out: Decoded[E] = Decoded()
    for event in batch:
        msg = event.message
        try:
            out.events.append(cls.decode(msg.value))
        except EventError as exc:
            out.letters.append(letter_for(msg, exc.reason, str(exc)))
            continue
        except Exception as exc:  # a bug in a contract rule must not stop the partition
            log.exception("decoding %s[%d]@%d failed", msg.topic, msg.partition, msg.offset)
            out.letters.append(letter_for(msg, DECODE_ERROR, f"{type(exc).__name__}: {exc}"))
            continue
        out.sources.append(msg)
    return out


def letter_for(msg: SourceMessage, reason: str, error: str) -> DeadLetter:
    """The dead letter of one consumed message: its own topic, partition, offset, key and bytes.

    Always built from the message as consumed, never from a decoded or re-encoded event: a
    producer that serialised differently from us must find its own bytes and coordinates here.
    """
    return dead_letter(msg.topic, msg.partition, msg.offset, msg.key, msg.value, reason, error)


async def send_dead_letters(send: Send, letters: Sequence[DeadLetter]) -> None:
    """Send dead letters (keyed by their source topic), counting and logging each."""
    for letter in letters:
        await send(letter.source_topic.encode(), fit_dead_letter(letter).encode())
        metrics.DEAD_LETTERS.labels(letter.source_topic, letter.reason).inc()
        log.warning("dead letter %s[%d]@%d: %s", letter.source_topic, letter.partition, letter.offset, letter.error)
    if letters:
        metrics.EVENTS_OUT.labels(DEAD_LETTER.name).inc(len(letters))


class _Buffer:
    """The events a stream has handed over since the last batch (Faust 0.15's own buffering: a
    stream processor fills it while the stream is consumed passively)."""

    def __init__(self, stream: Any, max_: int) -> None:
        self.stream, self.max = stream, max_
        self.events: list[Any] = []
        self.full, self.consumed = asyncio.Event(), asyncio.Event()
        self.consuming: asyncio.Future[None] | None = None  # set while a batch is handed over

    async def add(self, value: Any) -> Any:
        if self.consuming is not None:
            try:
                await self.consuming
            finally:
                self.consuming = None
        event = self.stream.current_event
        if event is None:
            raise RuntimeError("take_batches: no current event")
        self.events.append(event)
        if len(self.events) >= self.max:
            self.full.set()
            self.consumed.clear()
            await self.stream.wait(self.consumed)
        return value


async def take_batches(stream: Any, max_: int, within: float) -> AsyncIterator[list[Any]]:
    """Faust's ``Stream.take_events``, except that a batch is acked only once its handler returned.

    Faust acks a batch in a ``finally``: when the handler raises, or is cancelled while it waits
    out an outage, the batch's offsets are committed although nothing was applied (a 16 s Redis
    outage lost 513 feature events that way). Here such a batch is never acked: no offset at or
    after it is committed, and it is read again after the restart or rebalance.

    Parameters
    ----------
    stream
        The agent's Faust stream.
    max_, within
        At most ``max_`` events per batch; a partial batch is handed over after ``within`` seconds.

    Yields
    ------
    list
        Faust events, in the order consumed.
    """
    buf = _Buffer(stream, max_)
    acks = stream.enable_acks
    stream.enable_acks = False
    stream.add_processor(buf.add)
    stream._enable_passive(aiter(stream.channel))
    try:
        while not stream.should_stop:
            await stream.wait_for_stopped(buf.full, timeout=within)
            if not buf.events:
                continue
            buf.consuming = stream.loop.create_future()
            batch = list(buf.events)
            handled = False
            try:
                yield batch
                handled = True  # the consumer came back for the next batch: this one is done
            finally:
                buf.events.clear()
                if handled:
                    for event in batch:
                        await stream.ack(event)
                notify(buf.consuming)
                buf.full.clear()
                buf.consumed.set()
    finally:
        stream.enable_acks = acks
        stream._processors.remove(buf.add)


async def run_batches(stream: Any, batching: tuple[int, float], handle: Callable[[list[Any]], Awaitable[object]],
                      name: str) -> None:
    """An agent's loop: :func:`take_batches`, ``handle`` each batch, exit if a handler fails.

    Handlers wait out outages and dead-letter what they cannot apply, so an error here is a
    bug. Its batch is unacked; carrying on would commit later offsets over it, so the worker
    exits instead (like the archiver) and its restart reads the batch again.
    """
    async for batch in take_batches(stream, *batching):
        try:
            await handle(batch)
        except Abandoned as exc:
            # Faust would wait for this batch before stopping; it is not committed, so exiting
            # now loses nothing (the restarted worker reads it again).
            log.warning("%s: %s; a batch of %d stays uncommitted; exiting", name, exc, len(batch))
            logging.shutdown()
            os._exit(EXIT_UNPROCESSED)
        except Exception:
            log.critical("%s: a batch of %d failed and stays uncommitted; exiting", name, len(batch),
                         exc_info=True)
            logging.shutdown()
            os._exit(EXIT_UNPROCESSED)
