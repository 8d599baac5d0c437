"""The Faust app of a worker role and the batch plumbing every agent shares.

Each worker role is its own consumer group (``leap-features``, ``leap-predictor``, or
``leap-all`` for both in one process): run either ``all`` or the separate roles, not both.
Agents take events in batches (``take_events``) so Redis sees one round trip per batch; the
agents themselves live with what they serve (:mod:`features.agents`, :mod:`predictor.agent`).
Their per-batch logic takes plain callables (:data:`Send`) and anything shaped like a Faust event
(:class:`SourceEvent`), so it runs, and is tested, without a worker.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import faust

from core.settings import Settings
from streams import metrics
from streams.deadletter import dead_letter
from streams.events import DeadLetter, Event, EventError
from streams.topics import ALL_TOPICS, DEAD_LETTER, consumer_group

log = logging.getLogger("leap.streams")

E = TypeVar("E", bound=Event)

#: Sends one message (key, value) to a topic; :func:`topic_sender` binds one to a Faust topic.
Send = Callable[[bytes, bytes], Awaitable[object]]


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
        await topic.send(key=key, value=value)

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


def build_app(settings: Settings, role: str) -> tuple[faust.App, dict[str, faust.TopicT]]:
    """A Faust app for one worker role, with a raw-bytes channel per LEAP topic."""
    app = faust.App(
        consumer_group(role),
        broker=[f"kafka://{hp}" for hp in settings.kafka_bootstrap.split(",")],
        broker_credentials=_credentials(settings),
        store="memory://",
        web_enabled=False,
        topic_disable_leader=True,
        topic_allow_declare=False,  # topics come from streams.topics, never auto-created
        # A new feature group rebuilds state from the retained history; a new predictor group
        # starts at the end (nobody waits for rankings of old submissions any more).
        consumer_auto_offset_reset="latest" if role == "predictor" else "earliest",
        producer_linger_ms=5,
        broker_commit_every=500,
        broker_commit_interval=1.0,
    )
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
            out.letters.append(
                dead_letter(msg.topic, msg.partition, msg.offset, msg.key, msg.value, exc.reason, str(exc))
            )
            continue
        out.sources.append(msg)
    return out


async def send_dead_letters(send: Send, letters: Sequence[DeadLetter]) -> None:
    """Send dead letters (keyed by their source topic), counting and logging each."""
    for letter in letters:
        await send(letter.source_topic.encode(), letter.encode())
        metrics.DEAD_LETTERS.labels(letter.source_topic, letter.reason).inc()
        log.warning("dead letter %s[%d]@%d: %s", letter.source_topic, letter.partition, letter.offset, letter.error)
    if letters:
        metrics.EVENTS_OUT.labels(DEAD_LETTER.name).inc(len(letters))
