"""``copy``: republish a slice of topics to another topic, byte for byte.

Keys, headers, values and timestamps are kept. The partition is kept too when the target has
it, so a job's events stay in one partition and in their original order; otherwise the
producer's key partitioner places them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient

from leap.core.settings import Settings
from leap.replay.decode import header_pairs, key_text, try_decode
from leap.replay.reader import Reader, ReplayError
from streams.events import EventError
from streams.topics import ALL_TOPICS, Topic, create_topics

LIVE_TOPICS = frozenset(t.name for t in ALL_TOPICS)
_PRODUCER: dict[str, str | int | float | bool] = {
    "enable.idempotence": True, "linger.ms": 20, "compression.type": "lz4",
}


@dataclass
class CopyResult:
    read: int = 0
    copied: int = 0
    skipped_bad: int = 0
    created_topic: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"read": self.read, "copied": self.copied, "skipped_bad": self.skipped_bad,
                "created_topic": self.created_topic}


def ensure_topic(settings: Settings, name: str, partitions: int) -> tuple[int, bool]:
    """Partition count of ``name``, creating the topic with ``partitions`` if it is missing."""
    admin = AdminClient(settings.confluent_config())
    try:
        meta = admin.list_topics(name, timeout=10)
    except KafkaException as exc:
        raise ReplayError(f"cannot reach Kafka: {exc}") from None
    info = meta.topics.get(name)
    if info is not None and info.error is None and info.partitions:
        return len(info.partitions), False
    try:
        # The deployment's replication, and a wait for every partition's leader: the copy
        # produces to explicit partitions right away.
        created = create_topics(settings, (Topic(name, partitions),))[name] == "created"
    except KafkaException as exc:
        raise ReplayError(f"cannot create topic {name!r}: {exc}") from None
    return partitions, created


def copy_slice(reader: Reader, settings: Settings, target: str, jobs: Sequence[str], skip_bad: bool,
               dry_run: bool) -> CopyResult:
    """Copy what ``reader`` yields to ``target`` (``dry_run``: read and count only)."""
    result = CopyResult()
    producer: Producer | None = None
    target_partitions = 0
    errors: list[str] = []
    if not dry_run:
        wanted = max((p.partition for p in reader.plan), default=0) + 1
        target_partitions, result.created_topic = ensure_topic(settings, target, wanted)
        producer = Producer(settings.confluent_config(**_PRODUCER))

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            errors.append(err.str())

    for msg in reader:
        result.read += 1
        key = key_text(msg) or ""
        if jobs and not any(fnmatchcase(key, p) for p in jobs):
            continue
        ev = try_decode(msg)
        if isinstance(ev, EventError):
            reader.tally.add_bad(msg, ev.reason, ev.message)
            if skip_bad:
                result.skipped_bad += 1
                continue
        result.copied += 1
        if producer is None:
            continue
        kwargs: dict[str, Any] = {"key": msg.key(), "value": msg.value(), "on_delivery": delivered}
        headers = header_pairs(msg)
        if headers:
            kwargs["headers"] = headers
        ts_type, ts = msg.timestamp()
        if ts_type != TIMESTAMP_NOT_AVAILABLE and ts > 0:
            kwargs["timestamp"] = ts
        if (msg.partition() or 0) < target_partitions:
            kwargs["partition"] = msg.partition()
        while True:
            try:
                producer.produce(target, **kwargs)
                break
            except BufferError:  # local queue full: let deliveries drain, then retry
                producer.poll(0.05)
        producer.poll(0)
    if producer is not None:
        left = producer.flush(60)
        if left or errors:
            raise ReplayError(f"copy to {target!r}: {left} message(s) undelivered, {len(errors)} failed"
                              + (f" (first: {errors[0]})" if errors else ""))
    return result
