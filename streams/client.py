"""The scheduler-facing client (confluent-kafka): publish submissions, receive rankings.

Rankings are read without a consumer group: the client assigns every partition of
``leap.rankings`` at its current end *before* it publishes, so no ranking of its own can be
missed and no group offsets of anyone else are touched. They are read committed: each
submission's ranking once, never one of a predictor transaction that was aborted.
While the broker is away the client says so once (``kafka is unavailable``, then ``kafka is back
after N s``) instead of librdkafka's line per reconnect attempt (:mod:`streams.kafkalog`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from leap.core.settings import Settings
from streams.events import EventError, JobFinish, JobStart, Ranking, Submission
from streams.kafkalog import client_logging
from streams.resilience import KAFKA
from streams.topics import (
    DEPLOYMENT_HEADER,
    JOB_FINISHES,
    JOB_STARTS,
    RANKINGS,
    READ_COMMITTED,
    SUBMISSIONS,
    end_offsets,
)

_PRODUCER: dict[str, str | int | float | bool] = {
    # Sent at once: with a linger every submission waits for it before it leaves (bench e2e's
    # hop_in shows it); under load librdkafka still batches what queues while a request is in flight.
    "linger.ms": 0, "enable.idempotence": True, "compression.type": "lz4",
}
_CONSUMER: dict[str, str | int | float | bool] = {
    "group.id": "leap-scheduler-unused",  # required by librdkafka; never committed
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "fetch.wait.max.ms": 10,
    **READ_COMMITTED,
}


log = logging.getLogger("leap.client")


class DeliveryError(RuntimeError):
    """The broker did not acknowledge a message."""


class SchedulerClient:
    """Publish submissions (and, for simulators, starts and finishes); follow rankings.

    Parameters
    ----------
    settings
        Connection settings.
    follow_rankings
        Open a consumer on the rankings topic positioned at its end now.
    deployment
        Follow only the rankings of the deployment with this key prefix (their
        ``leap-deployment`` header); None: every ranking on the topic. Two deployments sharing a
        broker each rank every submission, from their own features.
    """

    def __init__(self, settings: Settings, follow_rankings: bool = True, deployment: str | None = None) -> None:
        self.settings = settings
        self._deployment = deployment.encode() if deployment is not None else None
        self._errors: list[str] = []
        self.bad_rankings = 0
        self.producer = Producer(settings.confluent_config(**_PRODUCER, **client_logging()))
        self.consumer: Consumer | None = None
        if follow_rankings:
            self.consumer = Consumer(settings.confluent_config(**_CONSUMER, **client_logging()))
            ends = end_offsets(self.consumer, (RANKINGS.name,))
            self.consumer.assign([TopicPartition(t, p, high) for (t, p), high in ends.items()])

    def _on_delivery(self, err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            self._errors.append(str(err))
        else:
            KAFKA.mark_up()  # acknowledged: the broker is back, if it was away

    def _produce(self, topic: str, key: str, value: bytes) -> None:
        while True:
            try:
                self.producer.produce(topic, key=key.encode(), value=value, on_delivery=self._on_delivery)
                return
            except BufferError:  # local queue full: let deliveries drain, then retry
                self.producer.poll(0.05)

    def publish(self, sub: Submission) -> None:
        self._produce(SUBMISSIONS.name, sub.job_key, sub.encode())
        self.producer.poll(0)

    def publish_raw(self, topic: str, key: str, value: bytes) -> None:
        """Publish bytes as they are (replays and tests of bad input)."""
        self._produce(topic, key, value)
        self.producer.poll(0)

    def publish_start(self, ev: JobStart) -> None:
        self._produce(JOB_STARTS.name, ev.job_key, ev.encode())
        self.producer.poll(0)

    def publish_finish(self, ev: JobFinish) -> None:
        self._produce(JOB_FINISHES.name, ev.job_key, ev.encode())
        self.producer.poll(0)

    def flush(self, timeout: float = 30.0) -> None:
        remaining = self.producer.flush(timeout)
        if remaining:
            raise DeliveryError(f"{remaining} message(s) not delivered within {timeout}s")
        if self._errors:
            errors, self._errors = self._errors, []
            raise DeliveryError(f"{len(errors)} message(s) failed: {errors[0]}")

    def rankings(self, timeout: float = 1.0) -> Iterator[tuple[Ranking, float]]:
        """Rankings arriving within ``timeout`` seconds, each with its receive time."""
        assert self.consumer is not None, "client opened with follow_rankings=False"
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            # Wait for the first message only, then take what has already arrived: consume() with
            # a timeout waits for its whole batch or its whole timeout, which held each ranking
            # here for up to that timeout (bench e2e's hop_out showed it).
            first = self.consumer.poll(min(left, 0.05))
            if first is None:
                continue
            for msg in [first, *self.consumer.consume(num_messages=499, timeout=0)]:
                if msg.error() or not self._ours(msg):
                    continue
                try:
                    ranking = Ranking.decode(msg.value())
                except EventError as exc:
                    # Not ours to fix, and never a reason to stop placing jobs: count and skip.
                    self.bad_rankings += 1
                    log.warning("skipping a malformed ranking at %s[%d]@%d: %s",
                                msg.topic(), msg.partition(), msg.offset(), exc)
                    continue
                yield ranking, time.time()

    def _ours(self, msg: Message) -> bool:
        """Whether a ranking is the followed deployment's (every one when none is named)."""
        if self._deployment is None:
            return True
        return (DEPLOYMENT_HEADER, self._deployment) in (msg.headers() or ())

    def wait_for(self, attempt_ids: Iterable[str], timeout: float = 30.0) -> dict[str, tuple[Ranking, float]]:
        """Collect the rankings of the given attempts (or as many as arrive before ``timeout``).

        A redelivered ranking does not replace the first: the time is when the first arrived.
        """
        wanted = set(attempt_ids)
        got: dict[str, tuple[Ranking, float]] = {}
        deadline = time.monotonic() + timeout
        while wanted - got.keys() and time.monotonic() < deadline:
            for ranking, at in self.rankings(timeout=min(0.5, max(0.0, deadline - time.monotonic()))):
                if ranking.attempt_id in wanted:
                    got.setdefault(ranking.attempt_id, (ranking, at))
        return got

    def close(self) -> None:
        self.producer.flush(10)
        if self.consumer is not None:
            self.consumer.close()

    def __enter__(self) -> SchedulerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
