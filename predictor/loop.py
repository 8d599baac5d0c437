"""The predictor's confluent-kafka engine (``LEAP_PREDICTOR_ENGINE=confluent``).

The same work as the Faust agent (:mod:`predictor.agent`) — the same batch handler
(:func:`predictor.agent.handle_submissions`: dead letters for bad input, one ranking per valid
submission, a Redis outage waited out, the same metrics), the same topics and consumer group —
driven by a plain librdkafka consumer and producer instead of Faust's streams and aiokafka.
It exists because the Faust path costs more per message than the ranking itself at high rates
(docs/benchmarks.md, "Issue 13: the predictor's Kafka engine"); both are kept, one per worker.

How a batch moves:

- **taking**: wait for the first submission (``poll``), then take what has already arrived
  (``consume(timeout=0)``): no batching window, so a lone submission is ranked at once and a
  burst makes the next batch larger;
- **sending**: rankings and dead letters are handed to the producer (``linger.ms`` 0, idempotent,
  no message timeout: a broker outage holds them in the producer's queue until it is back);
- **committing**: a batch's offsets become committable only once the broker acknowledged every
  message produced for it, and in consumption order (a batch never commits over an earlier one
  still waiting); they are committed once a second, on a rebalance and on the way out. A failed
  delivery or handler leaves its batch uncommitted and the worker exits
  (:data:`streams.app.EXIT_UNPROCESSED`), as the Faust worker does;
- **a long batch** (a Redis outage): the consumer keeps polling with its partitions paused, so
  the group does not evict the worker for exceeding ``max.poll.interval.ms``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from core.settings import Settings
from predictor.agent import PREDICT_BATCH, handle_submissions
from predictor.service import RankingService
from streams import metrics
from streams.app import EXIT_UNPROCESSED, Send
from streams.resilience import KAFKA, Abandoned, stop_waiting_when
from streams.topics import DEAD_LETTER, RANKINGS, SUBMISSIONS, consumer_group

log = logging.getLogger("leap.predictor")

#: Longest wait for a first submission before the loop looks at its timers and the stop flag.
IDLE_POLL_S = 0.1
#: Offsets of acknowledged batches are committed this often (Faust's ``broker_commit_interval``).
COMMIT_EVERY_S = 1.0
#: A batch running longer than this (an outage being waited out) polls the paused consumer.
KEEPALIVE_S = 1.0
#: Lag gauge and price reload periods (the Faust worker's timers).
LAG_EVERY_S = 5.0
HOUSEKEEPING_EVERY_S = 30.0

Offsets = dict[tuple[str, int], int]


@dataclass(frozen=True)
class Routes:
    """Where the loop reads and writes: the LEAP topics and the predictor's group (tests use their own)."""

    submissions: str = SUBMISSIONS.name
    rankings: str = RANKINGS.name
    dead_letter: str = DEAD_LETTER.name
    group: str = consumer_group("predictor")


def producer_config(settings: Settings) -> dict[str, Any]:
    """Rankings and dead letters: sent at once (``linger.ms`` 0: at high rates librdkafka still
    batches what queues while a request is in flight), idempotent, never given up on, and keyed
    onto the partition the Faust engine (aiokafka, Java's murmur2) would pick, so a job's rankings
    stay on one partition whichever engine ranked them (librdkafka's default hashes with CRC32)."""
    return settings.confluent_config(**{
        "linger.ms": 0, "enable.idempotence": True, "message.timeout.ms": 0, "partitioner": "murmur2_random",
    })


def consumer_config(settings: Settings, group: str) -> dict[str, Any]:
    """The predictor's group member: explicit commits only, a new group starts at the end (as
    the Faust worker), the worker's session timeout."""
    return settings.confluent_config(**{
        "group.id": group,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "latest",
        "session.timeout.ms": int(settings.kafka_session_timeout * 1000),
        "heartbeat.interval.ms": int(settings.kafka_session_timeout * 1000 / 5),
        "fetch.wait.max.ms": 100,
    })


class ConsumedMessage:
    """A consumed confluent-kafka message in the shape the batch handler reads
    (:class:`streams.app.SourceEvent` and :class:`streams.app.SourceMessage` at once)."""

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


def batch_offsets(msgs: Sequence[ConsumedMessage]) -> Offsets:
    """The next offset to read of each partition in ``msgs``: what a commit of the batch names."""
    out: Offsets = {}
    for m in msgs:
        key = (m.topic, m.partition)
        out[key] = max(out.get(key, 0), m.offset + 1)
    return out


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


class ConfluentPredictor:
    """The predictor worker's consume, rank, produce, commit loop.

    Parameters
    ----------
    settings
        Broker connection and session timeout.
    service
        Ranks the submissions (the same service the Faust agent uses).
    housekeeping
        Called between batches every :data:`HOUSEKEEPING_EVERY_S` (price reload).
    routes
        Topics and consumer group (the LEAP ones by default).
    consumer_overrides
        librdkafka settings of the consumer over :func:`consumer_config`'s (tests, tuning).
    """

    def __init__(self, settings: Settings, service: RankingService,
                 housekeeping: Callable[[], object] | None = None, routes: Routes | None = None,
                 consumer_overrides: dict[str, Any] | None = None) -> None:
        self.service = service
        self.housekeeping = housekeeping
        self.routes = routes or Routes()
        self.consumer = Consumer({**consumer_config(settings, self.routes.group), **(consumer_overrides or {})})
        self.revocations = 0  # partitions revoked or lost so far (rebalances seen by this member)
        self.producer = Producer(producer_config(settings))
        self.commits = Commits()
        self.assigned: set[tuple[str, int]] = set()
        self.stopping = False
        self._batch: Batch | None = None
        self._stash: list[Message] = []  # taken while a long batch kept the consumer polled
        self._paused = False
        self._due = {"commit": 0.0, "lag": 0.0, "housekeeping": time.monotonic() + HOUSEKEEPING_EVERY_S}
        self.send_ranking = self._sender(self.routes.rankings)
        self.send_dead_letter = self._sender(self.routes.dead_letter)

    # ------------------------------------------------------------------ sending

    def _sender(self, topic: str) -> Send:
        async def send(key: bytes, value: bytes) -> None:
            self._produce(topic, key, value)
        return send

    def _produce(self, topic: str, key: bytes, value: bytes) -> None:
        batch = self._batch
        assert batch is not None, "a send outside a batch"
        while True:
            try:
                self.producer.produce(topic, value, key, on_delivery=batch.delivered)
                batch.outstanding += 1
                if KAFKA.down_since is not None:
                    KAFKA.mark_up()
                return
            except BufferError as exc:  # the producer's queue is full: the broker is away or slow
                KAFKA.mark_down(exc)
                self.producer.poll(0.1)

    # ------------------------------------------------------------------ group membership

    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.assigned |= {(tp.topic, tp.partition) for tp in partitions}
        log.info("assigned %d partition(s) of %s", len(partitions), self.routes.submissions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        gone = {(tp.topic, tp.partition) for tp in partitions}
        self.producer.flush(30)  # what was sent for finished batches: acknowledged before it is committed
        self._commit(asynchronous=False)
        self._forget(gone)

    def _on_lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._forget({(tp.topic, tp.partition) for tp in partitions})  # no commit: they may be another's

    def _forget(self, gone: set[tuple[str, int]]) -> None:
        self.revocations += 1
        self.assigned -= gone
        self.commits.forget(gone)
        self._stash = [m for m in self._stash if (m.topic(), m.partition()) not in gone]
        log.info("revoked %d partition(s)", len(gone))

    def _commit(self, asynchronous: bool = True) -> None:
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

    # ------------------------------------------------------------------ the loop

    def _take(self) -> list[Message]:
        """What has arrived, waiting up to :data:`IDLE_POLL_S` for a first message."""
        msgs, self._stash = self._stash, []
        if not msgs:
            first = self.consumer.poll(IDLE_POLL_S)
            if first is None:
                return []
            msgs = [first]
        msgs.extend(self.consumer.consume(max(0, PREDICT_BATCH[0] - len(msgs)), timeout=0))
        out = []
        for m in msgs:
            err = m.error()
            if err is None:
                out.append(m)
            elif err.code() != KafkaError._PARTITION_EOF:
                log.warning("consumer error: %s", err)
        return out

    async def _await_handled(self, work: Coroutine[Any, Any, object]) -> None:
        """Await a batch's handler; past :data:`KEEPALIVE_S`, keep the paused consumer polled."""
        task = asyncio.ensure_future(work)
        while True:
            await asyncio.wait((task,), timeout=KEEPALIVE_S)
            if task.done():
                break
            self.consumer.pause(self.consumer.assignment())
            self._paused = True
            msg = self.consumer.poll(0)
            if msg is not None:
                self._stash.append(msg)
        if self._paused:
            self.consumer.resume(self.consumer.assignment())
            self._paused = False
        task.result()

    async def _handle(self, msgs: list[Message]) -> None:
        batch = [ConsumedMessage(m) for m in msgs]
        self._batch = current = Batch(batch_offsets(batch))
        try:
            await self._await_handled(handle_submissions(batch, self.service, self.send_ranking,
                                                         self.send_dead_letter))
        except BaseException:
            current.failed = "its handler did not finish"  # never committed, nor anything after it
            raise
        finally:
            self.commits.pending.append(current)
            self._batch = None
        self.producer.poll(0)

    def _timers(self) -> None:
        now = time.monotonic()
        if now >= self._due["commit"]:
            self._commit()
            if self.commits.failed is not None:
                raise DeliveryFailed(self.commits.failed)
            self._due["commit"] = now + COMMIT_EVERY_S
        if now >= self._due["lag"]:
            self._export_lag()
            self._due["lag"] = now + LAG_EVERY_S
        if now >= self._due["housekeeping"] and self.housekeeping is not None:
            self.housekeeping()
            self._due["housekeeping"] = now + HOUSEKEEPING_EVERY_S

    def _export_lag(self) -> None:
        parts = [TopicPartition(t, p) for t, p in self.assigned]
        for tp in self.consumer.position(parts) if parts else []:
            if tp.offset < 0:
                continue  # nothing read yet
            _, high = self.consumer.get_watermark_offsets(tp, cached=True)
            if high >= 0:
                metrics.CONSUMER_LAG.labels(tp.topic, str(tp.partition)).set(max(0, high - tp.offset))

    async def run(self) -> None:
        """Consume, rank and commit until :attr:`stopping`; then flush, commit and leave the group."""
        self.consumer.subscribe([self.routes.submissions], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_lost)
        _RUNNING.add(self)
        try:
            while not self.stopping:
                msgs = self._take()
                if msgs:
                    await self._handle(msgs)
                self._timers()
            self.producer.flush(30)
            self._commit(asynchronous=False)
        finally:
            _RUNNING.discard(self)
            self.consumer.close()  # commits what was acknowledged (on_revoke), never a failed batch


#: Loops running in this process: an outage wait gives up (:class:`Abandoned`) once one is stopping.
_RUNNING: set[ConfluentPredictor] = set()
stop_waiting_when(lambda: any(loop.stopping for loop in _RUNNING))


class DeliveryFailed(RuntimeError):
    """The broker refused a ranking or dead letter for good: its batch must not be committed."""


def serve(settings: Settings, service: RankingService, housekeeping: Callable[[], object] | None = None) -> None:
    """Run the confluent-kafka predictor until SIGTERM/SIGINT (``leap worker predictor``).

    A batch whose handler or delivery failed stays uncommitted and the process exits with
    :data:`streams.app.EXIT_UNPROCESSED` (the Faust worker's contract, :func:`streams.app.run_batches`).
    """
    loop = ConfluentPredictor(settings, service, housekeeping)

    def stop(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping after the current batch", signum)
        loop.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        asyncio.run(loop.run())
    except Abandoned as exc:
        log.warning("predictor: %s; the batch stays uncommitted; exiting", exc)
        _exit()
    except Exception:
        log.critical("predictor: a batch failed and stays uncommitted; exiting", exc_info=True)
        _exit()


def _exit() -> None:
    logging.shutdown()
    os._exit(EXIT_UNPROCESSED)
