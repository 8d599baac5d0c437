"""How the predictor loop's rankings and dead letters are sent and its offsets committed.

Two ways, one interface (:class:`Output`), chosen by ``Settings.exactly_once``:

- :class:`AtLeastOnce`: each message is produced at once (idempotent, never given up on); a batch's
  offsets become committable once the broker acknowledged everything produced for it, in
  consumption order, and are committed once a second. A crash re-reads what followed the last
  commit: its submissions are ranked again (same ``event_id``, content as of the second pass).
- :class:`predictor.transactions.ExactlyOnce`: rankings, dead letters and the consumed offsets in
  one Kafka transaction; a ``read_committed`` reader sees each submission ranked once.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from leap.core.settings import Settings
from streams.kafkalog import client_logging
from streams.resilience import KAFKA
from streams.topics import deployment_headers

log = logging.getLogger("leap.predictor")

Offsets = dict[tuple[str, int], int]

#: Offsets of acknowledged batches are committed this often (at-least-once).
COMMIT_EVERY_S = 1.0


class SourceOffset(Protocol):
    """What :func:`batch_offsets` reads of a consumed message."""

    topic: str
    partition: int
    offset: int


def batch_offsets(msgs: Sequence[SourceOffset]) -> Offsets:
    """The next offset to read of each partition in ``msgs``: what a commit of the batch names."""
    out: Offsets = {}
    for m in msgs:
        key = (m.topic, m.partition)
        out[key] = max(out.get(key, 0), m.offset + 1)
    return out


class ConsumedMessage:
    """A consumed confluent-kafka message in the shape the batch handler reads
    (:class:`streams.app.SourceEvent` and :class:`streams.app.SourceMessage` at once), kept by an
    :class:`Output` until its batch is committed: an aborted transaction's batches are handled
    again from these, never read again from the broker."""

    __slots__ = ("key", "offset", "partition", "topic", "value")

    def __init__(self, msg: Message) -> None:
        self.topic: str = msg.topic() or ""
        self.partition: int = msg.partition() or 0
        self.offset: int = msg.offset() or 0
        self.key: bytes | None = msg.key()
        self.value: bytes | None = msg.value()

    @property
    def message(self) -> ConsumedMessage:
        return self


class DeliveryFailed(RuntimeError):
    """The broker refused a ranking or dead letter for good: its batch must not be committed."""


class Output(Protocol):
    """Sends a batch's messages and commits its offsets (the loop's only producer).

    ``commit``, ``end_batch`` and ``revoke`` return the messages the loop must handle again, in
    the order they were consumed (an aborted transaction's batches, or a batch dropped because it
    was aborted too); empty: none.
    """

    def begin_batch(self, msgs: Sequence[ConsumedMessage]) -> None: ...

    def send(self, topic: str, key: bytes, value: bytes) -> None: ...

    def end_batch(self, handled: bool) -> list[ConsumedMessage]: ...

    def due(self, idle: bool) -> bool: ...

    def until_due(self) -> float | None: ...

    def commit(self, asynchronous: bool = True) -> list[ConsumedMessage]: ...

    def keepalive(self) -> None: ...

    def revoke(self, gone: set[tuple[str, int]]) -> list[ConsumedMessage]: ...

    def lose(self, gone: set[tuple[str, int]]) -> None: ...

    def close(self) -> None: ...


def producer_config(settings: Settings, **extra: Any) -> dict[str, Any]:
    """Rankings and dead letters: sent at once (``linger.ms`` 0: at high rates librdkafka still
    batches what queues while a request is in flight), idempotent, and keyed onto the partition
    Java's default partitioner (murmur2) picks, as every LEAP producer before this loop did
    (librdkafka's default hashes with CRC32): a job's rankings stay on one partition."""
    return settings.confluent_config(**{"linger.ms": 0, "enable.idempotence": True,
                                        "partitioner": "murmur2_random", **client_logging(), **extra})


def produce(producer: Producer, topic: str, key: bytes, value: bytes, **kw: Any) -> None:
    """Produce one message, waiting (and saying so once) while the producer's queue is full."""
    while True:
        try:
            producer.produce(topic, value, key, **kw)
            return
        except BufferError as exc:  # the queue is full: the broker is away or slow
            KAFKA.mark_down(exc)
            producer.poll(0.1)


@dataclass
class Batch:
    """One consumed batch: the offsets it completes and the deliveries it still waits for."""

    offsets: Offsets
    outstanding: int = 0
    failed: str | None = None

    def delivered(self, err: KafkaError | None, _msg: Message) -> None:
        self.outstanding -= 1
        if err is not None and self.failed is None:
            self.failed = str(err)


@dataclass
class Commits:
    """Batches in consumption order; the acknowledged prefix is committable, the rest waits."""

    pending: deque[Batch] = field(default_factory=deque)
    ready: Offsets = field(default_factory=dict)  # acknowledged, not yet committed
    failed: str | None = None

    def advance(self) -> None:
        """Move fully delivered batches, oldest first, to :attr:`ready`; stop at a failed one."""
        while self.pending and self.pending[0].outstanding <= 0:
            batch = self.pending[0]
            if batch.failed is not None:
                self.failed = batch.failed
                return
            self.pending.popleft()
            self.ready.update(batch.offsets)

    def take(self, assigned: set[tuple[str, int]]) -> list[TopicPartition]:
        """The ready offsets of partitions still assigned (a revoked one is its new owner's)."""
        out = [TopicPartition(t, p, o) for (t, p), o in self.ready.items() if (t, p) in assigned]
        self.ready.clear()
        return out

    def forget(self, partitions: set[tuple[str, int]]) -> None:
        """Drop what is known of partitions that are no longer ours."""
        for key in partitions:
            self.ready.pop(key, None)
            for batch in self.pending:
                batch.offsets.pop(key, None)


class AtLeastOnce:
    """Produce at once, commit acknowledged batches in order once a second (module docstring).

    Parameters
    ----------
    settings
        Broker connection.
    consumer
        The loop's consumer: offsets are committed through it.
    assigned
        The loop's set of assigned partitions (shared, kept current by the loop).
    """

    def __init__(self, settings: Settings, consumer: Consumer, assigned: set[tuple[str, int]]) -> None:
        # no message timeout: a broker outage holds rankings in the queue until it is back
        self.producer = Producer(producer_config(settings, **{"message.timeout.ms": 0}))
        self.headers = deployment_headers(settings)
        self.consumer = consumer
        self.assigned = assigned
        self.commits = Commits()
        self._batch: Batch | None = None
        self._next_commit = 0.0

    def begin_batch(self, msgs: Sequence[ConsumedMessage]) -> None:
        self._batch = Batch(batch_offsets(msgs))

    def send(self, topic: str, key: bytes, value: bytes) -> None:
        batch = self._batch
        assert batch is not None, "a send outside a batch"
        produce(self.producer, topic, key, value, on_delivery=batch.delivered, headers=self.headers)
        batch.outstanding += 1

    def end_batch(self, handled: bool) -> list[ConsumedMessage]:
        batch, self._batch = self._batch, None
        assert batch is not None
        if not handled:
            batch.failed = "its handler did not finish"  # never committed, nor anything after it
        self.commits.pending.append(batch)
        self.producer.poll(0)
        return []

    def due(self, idle: bool) -> bool:
        return time.monotonic() >= self._next_commit

    def until_due(self) -> float | None:
        return None  # commits wait for the loop: they need the batch's deliveries anyway

    def commit(self, asynchronous: bool = True) -> list[ConsumedMessage]:
        """Commit the acknowledged prefix; raise :class:`DeliveryFailed` after a refused delivery."""
        self._next_commit = time.monotonic() + COMMIT_EVERY_S
        self.producer.poll(0)  # serve delivery reports
        self.commits.advance()
        offsets = self.commits.take(self.assigned)
        if offsets:
            try:
                if asynchronous:
                    self.consumer.commit(offsets=offsets, asynchronous=True)
                else:
                    self.consumer.commit(offsets=offsets, asynchronous=False)
            except Exception as exc:  # a rebalance in progress: the next owner starts from the last commit
                log.warning("committing %d offset(s) failed: %s", len(offsets), exc)
        if self.commits.failed is not None:
            raise DeliveryFailed(self.commits.failed)
        return []

    def keepalive(self) -> None:
        self.producer.poll(0)

    def revoke(self, gone: set[tuple[str, int]]) -> list[ConsumedMessage]:
        self.producer.flush(30)  # what was sent for finished batches: acknowledged before it is committed
        self.commit(asynchronous=False)
        self.commits.forget(gone)
        return []

    def lose(self, gone: set[tuple[str, int]]) -> None:
        self.commits.forget(gone)  # no commit: they may be another's

    def close(self) -> None:
        self.producer.flush(30)
        self.commit(asynchronous=False)
