"""The one place that names LEAP's topics, their partition counts and configs.

Workers never rely on broker auto-creation: ``leap topics create`` (and every worker at start-up)
creates what is missing and leaves existing topics alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from core.settings import Settings

DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class Topic:
    """A topic's name, its partitions (None: the deployment's ``Settings.topic_partitions``), config, role."""

    name: str
    partitions: int | None
    config: dict[str, str] = field(default_factory=dict)
    doc: str = ""

    def partitions_in(self, settings: Settings) -> int:
        """The partition count this deployment creates the topic with."""
        return self.partitions if self.partitions is not None else settings.topic_partitions


# The four event streams scale with workers: their partition count is the deployment's, and it
# bounds how many workers of a role share the load (a partition goes to one worker of a group).
SUBMISSIONS = Topic("leap.submissions", None, {"retention.ms": str(14 * DAY_MS)}, "scheduler -> predictor")
JOB_STARTS = Topic("leap.job-starts", None, {"retention.ms": str(90 * DAY_MS)}, "cluster -> feature agents")
JOB_FINISHES = Topic("leap.job-finishes", None, {"retention.ms": str(90 * DAY_MS)}, "cluster -> feature agents")
RANKINGS = Topic("leap.rankings", None, {"retention.ms": str(14 * DAY_MS)}, "predictor -> scheduler, dashboards")
MODELS = Topic(
    "leap.models",
    1,
    {"cleanup.policy": "compact", "min.compaction.lag.ms": "0", "segment.ms": str(3600 * 1000)},
    "model registry -> predictors (compacted: the latest announcement per key survives)",
)
DEAD_LETTER = Topic("leap.dead-letter", 3, {"retention.ms": str(30 * DAY_MS)}, "anything rejected")

ALL_TOPICS: tuple[Topic, ...] = (SUBMISSIONS, JOB_STARTS, JOB_FINISHES, RANKINGS, MODELS, DEAD_LETTER)
#: Key under which the current model is announced on the compacted models topic.
CURRENT_MODEL_KEY = b"current"


def consumer_group(role: str) -> str:
    """The consumer group of a worker role (each role is its own group)."""
    return f"leap-{role}"


def skip_to_end(settings: Settings, group: str, topics: tuple[str, ...], timeout: float = 10.0) -> int:
    """Commit the end of every partition of ``topics`` for ``group``, skipping its backlog.

    The group's workers must be stopped: they resume with whatever arrives next. Returns how
    many offsets the group moved past (from 0 on partitions where it had committed nothing).
    """
    consumer = Consumer(settings.confluent_config(**{"group.id": group, "enable.auto.commit": False}))
    try:
        ends = end_offsets(consumer, topics, timeout)
        parts = [TopicPartition(t, p) for t, p in ends]
        committed = {(tp.topic, tp.partition): tp.offset for tp in consumer.committed(parts, timeout=timeout)}
        skipped = sum(end - max(committed[key], 0) for key, end in ends.items())
        consumer.commit(offsets=[TopicPartition(t, p, end) for (t, p), end in ends.items()], asynchronous=False)
        return skipped
    finally:
        consumer.close()


def end_offsets(consumer: Consumer, topics: tuple[str, ...], timeout: float = 10.0) -> dict[tuple[str, int], int]:
    """High watermark of every partition of ``topics`` now, keyed by (topic, partition)."""
    return {
        (t, p): consumer.get_watermark_offsets(TopicPartition(t, p), timeout=timeout)[1]
        for t in topics
        for p in consumer.list_topics(t, timeout=timeout).topics[t].partitions
    }


def create_topics(settings: Settings, topics: tuple[Topic, ...] = ALL_TOPICS, timeout: float = 30.0) -> dict[str, str]:
    """Create missing topics. Returns ``{name: "created" | "exists"}``; raises on other errors."""
    admin = AdminClient(settings.confluent_config())
    existing = set(admin.list_topics(timeout=timeout).topics)
    result = {t.name: "exists" for t in topics if t.name in existing}
    replicated = {"min.insync.replicas": str(settings.topic_min_insync)} if settings.topic_min_insync else {}
    wanted = [
        NewTopic(t.name, num_partitions=t.partitions_in(settings), replication_factor=settings.topic_replication,
                 config={**t.config, **replicated})
        for t in topics
        if t.name not in existing
    ]
    if wanted:
        for name, future in admin.create_topics(wanted, operation_timeout=timeout).items():
            try:
                future.result()
                result[name] = "created"
            except KafkaException as exc:
                if exc.args and exc.args[0].name() == "TOPIC_ALREADY_EXISTS":
                    result[name] = "exists"
                else:
                    raise
    return result
