"""The Kafka side of the dashboard: a background thread that follows three topics.

No consumer group offsets are used or committed: every partition is assigned explicitly, at its
end when the dashboard starts (or at a given time via ``offsets_for_times``), the same way the
scheduler client follows rankings. Any number of dashboards can run without affecting the
workers' groups or each other.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from leap.core.settings import Settings
from leap.dashboard.aggregator import Aggregator
from streams.topics import JOB_FINISHES, RANKINGS, READ_COMMITTED, SUBMISSIONS

log = logging.getLogger(__name__)

#: Topic name -> the aggregator's kind.
KINDS: dict[str, str] = {RANKINGS.name: "ranking", JOB_FINISHES.name: "finish", SUBMISSIONS.name: "submission"}
_CONSUMER: dict[str, str | int | float | bool] = {
    "group.id": "leap-dashboard-unused",  # required by librdkafka; never joined or committed
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "fetch.wait.max.ms": 100,
    **READ_COMMITTED,
    # while the broker is down, try (and log the failure) every few seconds, not every 100 ms
    "reconnect.backoff.ms": 1000,
    "reconnect.backoff.max.ms": 10000,
}
RETRY_S = 5.0


def start_positions(consumer: Consumer, topics: list[str], since: float | None, timeout: float = 10.0
                    ) -> list[TopicPartition]:
    """One ``TopicPartition`` per partition of ``topics``, at its end now or at time ``since``.

    Ends are resolved to concrete offsets here rather than left as ``OFFSET_END``, which would be
    resolved only at the first fetch: whatever is published after this call is then never missed.
    """
    meta = consumer.list_topics(timeout=timeout)
    out: list[TopicPartition] = []
    for topic in topics:
        tmeta = meta.topics.get(topic)
        if tmeta is None or tmeta.error is not None or not tmeta.partitions:
            raise KafkaException(f"topic {topic} is not available (run `leap topics create`)")
        parts = sorted(tmeta.partitions)
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1] for p in parts}
        if since is None:
            out.extend(TopicPartition(topic, p, ends[p]) for p in parts)
            continue
        wanted = [TopicPartition(topic, p, int(since * 1000)) for p in parts]
        for tp in consumer.offsets_for_times(wanted, timeout=timeout):
            # -1: no message at or after ``since`` in this partition, so start at its end
            out.append(TopicPartition(topic, tp.partition, tp.offset if tp.offset >= 0 else ends[tp.partition]))
    return out


class Follower(threading.Thread):
    """Consumes rankings, finishes and submissions into an :class:`Aggregator` until stopped.

    Parameters
    ----------
    settings
        Kafka connection settings.
    aggregator
        Receives every message value; its lock is held for each fetched batch.
    since
        Unix seconds to start from; ``None`` = the end of each partition now.
    topics
        Topic name -> ``ranking`` / ``finish`` / ``submission``; default LEAP's own topics
        (another mapping follows, e.g., topics a replay wrote).
    metadata_timeout
        Seconds to wait for topic metadata and offsets before reporting an error and retrying.
    """

    def __init__(self, settings: Settings, aggregator: Aggregator, since: float | None = None,
                 topics: Mapping[str, str] | None = None, metadata_timeout: float = 10.0) -> None:
        super().__init__(name="leap-dashboard-follower", daemon=True)
        self.settings = settings
        self.aggregator = aggregator
        self.since = since
        self.topics = dict(KINDS if topics is None else topics)
        self.metadata_timeout = metadata_timeout
        self.ready = threading.Event()  # set once every partition is assigned
        self._stop_event = threading.Event()
        self.state = "connecting"
        self.error: str | None = None
        self.kafka_errors = 0

    def status(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "error": self.error,
            "kafka_errors": self.kafka_errors,
            "bootstrap": self.settings.kafka_bootstrap,
            "topics": list(self.topics),
            "since": self.since,
        }

    def stop(self, timeout: float = 10.0) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout)

    def run(self) -> None:
        while not self._stop_event.is_set():
            consumer = Consumer(self.settings.confluent_config(**_CONSUMER))
            try:
                consumer.assign(start_positions(consumer, list(self.topics), self.since, self.metadata_timeout))
                self.state, self.error = "following", None
                self.ready.set()
                self._loop(consumer)
            except KafkaException as exc:
                self.state, self.error = "error", str(exc)
                log.warning("dashboard: Kafka not available (%s); retrying in %.0fs", exc, RETRY_S)
                self._stop_event.wait(RETRY_S)
            finally:
                consumer.close()
        self.state = "stopped"

    def _loop(self, consumer: Consumer) -> None:
        agg = self.aggregator
        add, kinds = agg.add, self.topics
        while not self._stop_event.is_set():
            msgs = consumer.consume(num_messages=1000, timeout=0.2)
            now = time.time()
            with agg.lock:
                for msg in msgs:
                    if msg.error():
                        self.kafka_errors += 1
                        continue
                    add(kinds[msg.topic() or ""], msg.value(), now)
                agg.tick(now)
