"""The one place that names LEAP's topics, their partition counts and configs.

Workers never rely on broker auto-creation: ``leap topics create`` (and every worker at start-up)
creates what is missing and leaves existing topics alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from leap.core.settings import Settings

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
#: How every LEAP consumer reads: only what committed transactions wrote. The predictors rank in
#: transactions (:mod:`predictor.transactions`): a reader of uncommitted data would see the
#: rankings of an aborted transaction beside their second, committed, copy. (librdkafka's default
#: too, but aiokafka's is read_uncommitted: said here once, for every client.)
READ_COMMITTED: dict[str, str] = {"isolation.level": "read_committed"}
#: Key under which the current model is announced on the compacted models topic.
CURRENT_MODEL_KEY = b"current"


#: Header on every message a predictor produces (rankings, dead letters): the key prefix of the
#: deployment that produced it. Two deployments sharing a broker each rank every submission (see
#: :func:`consumer_group`); a scheduler of one follows only its own (``SchedulerClient(deployment=)``).
DEPLOYMENT_HEADER = "leap-deployment"


def deployment_headers(settings: Settings) -> list[tuple[str, bytes]]:
    """The headers a predictor of this deployment puts on what it produces."""
    return [(DEPLOYMENT_HEADER, settings.key_prefix.encode())]


def consumer_group(settings: Settings, role: str) -> str:
    """The consumer group of a worker role: each role is its own group, named after the
    deployment's key prefix (``leap-predictor`` by default).

    A deployment is its key prefix: two that share a broker but not a store (a benchmark's or a
    test's scratch prefix beside the default one) must not split each other's partitions, or
    one would rank submissions from the other's features. Each gets every submission instead."""
    return f"{settings.key_prefix}-{role}"


#: The broker's default ``group.min.session.timeout.ms``, seconds: assumed when it cannot be asked.
BROKER_DEFAULT_MIN_SESSION_S = 6.0
_session_floor: dict[str, float] = {}


def session_timeout(settings: Settings) -> float:
    """The group session timeout workers use: ``Settings.kafka_session_timeout``, raised to the
    broker's ``group.min.session.timeout.ms`` (a shorter one is refused and the member never joins).

    Asked once per process and bootstrap; a broker that does not say (an ACL, no answer) is taken
    to have Kafka's default minimum, 6 s.
    """
    floor = _session_floor.get(settings.kafka_bootstrap)
    if floor is None:
        floor = _session_floor[settings.kafka_bootstrap] = _broker_min_session(settings)
    return max(settings.kafka_session_timeout, floor)


def _broker_min_session(settings: Settings, timeout: float = 10.0) -> float:
    from confluent_kafka.admin import ConfigResource

    admin = AdminClient(settings.confluent_config(log_level=4))  # no notice of the queue it drops on exit
    try:
        broker = next(iter(admin.list_topics(timeout=timeout).brokers))
        resource = ConfigResource(ConfigResource.Type.BROKER, str(broker))
        configs = admin.describe_configs([resource], request_timeout=timeout)[resource].result(timeout)
        return int(configs["group.min.session.timeout.ms"].value) / 1000
    except (KafkaException, KeyError, StopIteration, ValueError, TypeError):
        return BROKER_DEFAULT_MIN_SESSION_S


def skip_to_end(settings: Settings, group: str, topics: tuple[str, ...], timeout: float = 10.0) -> int:
    """Commit the end of every partition of ``topics`` for ``group``, skipping its backlog.

    The group's workers must be stopped: they resume with whatever arrives next. Returns how
    many offsets the group moved past (from 0 on partitions where it had committed nothing).
    """
    consumer = Consumer(settings.confluent_config(**{"group.id": group, "enable.auto.commit": False}))
    try:
        ends = end_offsets(consumer, topics, timeout)
        parts = [TopicPartition(t, p) for t, p in ends]
        committed = {(tp.topic, tp.partition): tp.offset
                     for tp in _retrying(lambda: consumer.committed(parts, timeout=timeout), timeout)}
        skipped = sum(end - max(committed[key], 0) for key, end in ends.items())
        _retrying(lambda: consumer.commit(offsets=[TopicPartition(t, p, end) for (t, p), end in ends.items()],
                                          asynchronous=False), timeout)
        return skipped
    finally:
        consumer.close()


def end_offsets(consumer: Consumer, topics: tuple[str, ...], timeout: float = 10.0) -> dict[tuple[str, int], int]:
    """High watermark of every partition of ``topics`` now, keyed by (topic, partition)."""
    return {
        (t, p): _high_watermark(consumer, TopicPartition(t, p), timeout)
        for t in topics
        for p in consumer.list_topics(t, timeout=timeout).topics[t].partitions
    }


#: Errors that pass: a partition's leader is moving, or the group coordinator is not ready yet
#: (a fresh broker creates ``__consumer_offsets`` on the first group request). Asking again
#: shortly finds the new leader or the loaded coordinator.
_TRANSIENT = frozenset({KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                        KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.NOT_COORDINATOR,
                        KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.COORDINATOR_LOAD_IN_PROGRESS})

T = TypeVar("T")


def _retrying(call: Callable[[], T], timeout: float) -> T:
    """``call()``, asked again while it fails with a transient error, until ``timeout`` passed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except KafkaException as exc:
            if exc.args[0].code() not in _TRANSIENT or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _high_watermark(consumer: Consumer, tp: TopicPartition, timeout: float) -> int:
    """The partition's end; a leader that moved (a broker restarted or just joined) is retried."""
    return int(_retrying(lambda: consumer.get_watermark_offsets(tp, timeout=timeout), timeout)[1])


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
        _await_leaders(admin, [t.topic for t in wanted], timeout)
    return result


def _await_leaders(admin: AdminClient, names: list[str], timeout: float) -> None:
    """Wait until every partition of new topics has a leader: on a multi-broker cluster a client
    that asks for offsets right after creation is otherwise told NOT_LEADER_FOR_PARTITION."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        topics = admin.list_topics(timeout=timeout).topics
        if all(name in topics and topics[name].error is None and topics[name].partitions
               and all(p.leader >= 0 and p.error is None for p in topics[name].partitions.values())
               for name in names):
            return
        time.sleep(0.2)
    raise KafkaException(f"topics {names} have partitions without a leader after {timeout:.0f} s")
