"""The predictor loop (:mod:`predictor.loop`) on the real broker and redis-server.

Each test runs the loop in a thread on topics and a consumer group of its own (created here,
deleted after), so nothing it publishes or ranks reaches anyone else's workers or clients.
"""

from __future__ import annotations

import asyncio
import base64
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from aiokafka.partitioner import DefaultPartitioner
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from features.keys import KeyLayout
from features.store import FeatureStore
from leap.core.hardware import load_catalogue
from leap.core.settings import Settings
from predictor.commits import Batch, Commits
from predictor.loop import ConfluentPredictor, Routes
from predictor.models import LookupTable
from predictor.service import ActiveModel, ModelHolder, RankingService
from streams.events import DeadLetter, Ranking, Submission
from streams.topics import session_timeout
from tests.factories import client_without_retries, free_port, late_redis_server, metric, submission
from tests.faults_support import wait_until

CAT = load_catalogue()
PARTITIONS = 3


# ---------------------------------------------------------------------- without a broker


def test_commits_follow_consumption_order_and_stop_at_a_failed_batch() -> None:
    commits = Commits()
    first, second, third = Batch({("t", 0): 5}, outstanding=1), Batch({("t", 0): 9, ("t", 1): 3}), Batch({("t", 1): 7})
    commits.pending.extend([first, second, third])
    commits.advance()
    assert commits.take({("t", 0), ("t", 1)}) == []  # the second is delivered, but the first is not
    third.outstanding = 1
    first.delivered(None, None)  # type: ignore[arg-type]
    commits.advance()
    assert [(tp.topic, tp.partition, tp.offset) for tp in commits.take({("t", 0)})] == [("t", 0, 9)]  # 1 revoked
    third.delivered(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), None)  # type: ignore[arg-type]
    commits.advance()
    assert commits.failed is not None and commits.take({("t", 0), ("t", 1)}) == []
    assert list(commits.pending) == [third]  # never committed, nor anything after it


def test_transaction_settings() -> None:
    default = Settings.from_env({})
    assert default.exactly_once and default.transaction_interval >= 0 and default.worker_id is None
    custom = Settings.from_env({"LEAP_EXACTLY_ONCE": "0", "LEAP_TRANSACTION_INTERVAL": "0.2", "LEAP_WORKER_ID": "w7"})
    assert (custom.exactly_once, custom.transaction_interval, custom.worker_id) == (False, 0.2, "w7")
    child = Settings.from_env(custom.to_env())  # what a child worker sees
    assert (child.exactly_once, child.transaction_interval, child.worker_id) == (False, 0.2, "w7")
    with pytest.raises(ValueError, match="LEAP_TRANSACTION_INTERVAL"):
        Settings.from_env({"LEAP_TRANSACTION_INTERVAL": "-1"})
    with pytest.raises(ValueError, match="LEAP_EXACTLY_ONCE"):
        Settings.from_env({"LEAP_EXACTLY_ONCE": "maybe"})


# ---------------------------------------------------------------------- on the broker

pytest_integration = pytest.mark.integration


@pytest.fixture
def routes(settings: Settings, topics: dict[str, str]) -> Iterator[Routes]:
    run = uuid.uuid4().hex[:10]
    r = Routes(f"leap.test-{run}.submissions", f"leap.test-{run}.rankings", f"leap.test-{run}.dead-letter",
               f"leap-test-{run}")
    admin = AdminClient(settings.confluent_config())
    names = [r.submissions, r.rankings, r.dead_letter]
    for future in admin.create_topics([NewTopic(n, PARTITIONS, 1) for n in names]).values():
        future.result(30)
    try:
        yield r
    finally:
        for future in admin.delete_topics(names).values():
            future.result(30)


def service_on(store: FeatureStore, version: str = "lookup-loop-test") -> RankingService:
    return RankingService(store, CAT, ModelHolder(ActiveModel(LookupTable(), version)))


@contextmanager
def running(settings: Settings, service: RankingService, routes: Routes,
            **consumer: Any) -> Iterator[ConfluentPredictor]:
    """The loop in a thread until the block ends; then stopped as SIGTERM stops it."""
    loop = ConfluentPredictor(settings, service, routes=routes, consumer_overrides=consumer)
    errors: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(loop.run())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, name="loop-under-test", daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.stopping = True
        thread.join(60)
    assert not thread.is_alive() and not errors, errors


class Topics:
    """Publishes to the test's submissions topic and reads its rankings and dead letters."""

    def __init__(self, settings: Settings, routes: Routes) -> None:
        self.routes = routes
        self.producer = Producer(settings.confluent_config())
        self.reader = Consumer(settings.confluent_config(**{"group.id": f"{routes.group}-reader",
                                                            "enable.auto.commit": False}))
        self.reader.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t in (routes.rankings, routes.dead_letter)
                            for p in range(PARTITIONS)])
        self.rankings: list[Ranking] = []
        self.letters: list[DeadLetter] = []
        self.partitions: dict[str, int] = {}  # attempt id -> partition its ranking was written to

    def publish(self, key: bytes | None, value: bytes | None) -> None:
        self.producer.produce(self.routes.submissions, value, key)
        assert self.producer.flush(30) == 0

    def publish_each(self, subs: Sequence[Submission]) -> None:
        """``subs[i]`` to partition ``i``."""
        for partition, sub in enumerate(subs):
            self.producer.produce(self.routes.submissions, sub.encode(), sub.job_key.encode(), partition=partition)
        assert self.producer.flush(30) == 0

    def read(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for msg in self.reader.consume(100, timeout=0.2):
                if msg.error() is None and msg.value() is not None:
                    if msg.topic() == self.routes.rankings:
                        self.rankings.append(Ranking.decode(msg.value()))
                        self.partitions[self.rankings[-1].attempt_id] = msg.partition() or 0
                    else:
                        self.letters.append(DeadLetter.decode(msg.value()))

    def until(self, attempts: set[str], letters: int = 0, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if attempts <= {r.attempt_id for r in self.rankings} and len(self.letters) >= letters:
                return
            self.read(0.5)
        raise AssertionError(f"missing rankings: {sorted(attempts - {r.attempt_id for r in self.rankings})}, "
                             f"{len(self.letters)} of {letters} dead letters")

    def wait_ready(self, loop: ConfluentPredictor, timeout: float = 60) -> None:
        """Publish canaries until one is ranked: the group has joined and found its start."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            canary = submission(f"canary-{uuid.uuid4().hex[:8]}", 0)
            self.publish(canary.job_key.encode(), canary.encode())
            self.read(1.0)
            if canary.attempt_id in {r.attempt_id for r in self.rankings}:
                return
        raise AssertionError("the loop ranked no canary")

    def ends(self) -> dict[int, int]:
        """End offsets of the submissions topic's partitions that hold anything."""
        ends = {p: self.reader.get_watermark_offsets(TopicPartition(self.routes.submissions, p), timeout=10)[1]
                for p in range(PARTITIONS)}
        return {p: end for p, end in ends.items() if end > 0}

    def committed(self, settings: Settings) -> dict[int, int]:
        """The group's committed offsets (of partitions that hold anything; negative: none yet),
        read by another client, which does not join the group."""
        c = Consumer(settings.confluent_config(**{"group.id": self.routes.group}))
        try:
            return {tp.partition: tp.offset for tp in c.committed(
                [TopicPartition(self.routes.submissions, p) for p in self.ends()], timeout=10)}
        finally:
            c.close()


@pytest_integration
@pytest.mark.parametrize("exactly_once", [True, False], ids=["transactions", "at-least-once"])
def test_ranks_every_valid_submission_dead_letters_the_rest_and_commits_them(
        settings: Settings, routes: Routes, rds: redis.Redis, run_id: str, exactly_once: bool, tmp_path: Path) -> None:
    store = FeatureStore(rds, KeyLayout(f"test-{run_id}"), canonicalize=CAT.canonical)
    io = Topics(settings, routes)
    subs = [submission(f"{run_id}-{i}", i) for i in range(30)]
    settings = replace(settings, exactly_once=exactly_once, home=tmp_path)
    commits_before = metric("leap_transaction_commit_seconds_count")
    try:
        with running(settings, service_on(store), routes) as loop:
            io.wait_ready(loop)
            for i, sub in enumerate(subs):
                io.publish(sub.job_key.encode(), sub.encode())
                if i % 10 == 0:
                    io.publish(b"junk", f"{{not json {run_id} {i}".encode())
            io.until({s.attempt_id for s in subs}, letters=3)
        assert io.committed(settings) == io.ends()  # every message: ranked or dead-lettered
    finally:
        store.delete_all()
    commits = metric("leap_transaction_commit_seconds_count") - commits_before
    assert (commits >= 1) if exactly_once else (commits == 0)  # each transaction's commit timed, only with them
    ours = [r for r in io.rankings if r.attempt_id in {s.attempt_id for s in subs}]
    assert sorted(r.submission_event_id for r in ours) == sorted(s.event_id for s in subs)  # one each
    assert {r.model_version for r in ours} == {"lookup-loop-test"}
    # keyed as the Faust engine keys them (aiokafka's partitioner, Java's murmur2)
    murmur2 = DefaultPartitioner()
    assert {r.attempt_id: io.partitions[r.attempt_id] for r in ours} == {
        r.attempt_id: murmur2(r.job_key.encode(), list(range(PARTITIONS)), list(range(PARTITIONS))) for r in ours}
    assert {(d.source_topic, d.reason) for d in io.letters} == {(routes.submissions, "bad_json")}
    assert sorted(base64.b64decode(d.raw_base64 or "") for d in io.letters) == sorted(
        f"{{not json {run_id} {i}".encode() for i in (0, 10, 20))


@pytest_integration
def test_a_redis_outage_holds_the_batch_and_its_offsets_until_redis_is_back(
        settings: Settings, routes: Routes, rds: redis.Redis, run_id: str, tmp_path: Path) -> None:
    port = free_port()
    outage = FeatureStore(client_without_retries(port), KeyLayout(f"test-{run_id}"), canonicalize=CAT.canonical)
    io = Topics(settings, routes)
    subs = [submission(f"{run_id}-{i}", i) for i in range(12)]
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    settings = replace(settings, home=tmp_path)
    # The group evicts a member that does not poll for max.poll.interval.ms (here a second above
    # the session timeout, the least librdkafka takes: 3 s on the local broker, 7 s on one that
    # keeps Kafka's 6 s minimum); the outage below lasts longer.
    max_poll_s = session_timeout(settings) + 1.0
    with late_redis_server(port, after_s=0.0, workdir=tmp_path / "first"), \
            running(settings, service_on(outage), routes, **{"max.poll.interval.ms": int(max_poll_s * 1000)}) as loop:
        io.wait_ready(loop)
        server_gone = wait_for_redis_down(outage)
        start = io.ends()
        for sub in subs:
            io.publish(sub.job_key.encode(), sub.encode())
        assert io.ends() != start
        time.sleep(max_poll_s + 2.0)  # the loop polls its paused consumer meanwhile (KEEPALIVE_S)
        held = io.committed(settings)
        assert all(held[p] <= start.get(p, 0) for p in held), (held, start)  # none of the held batch
        assert loop.assigned and loop.revocations == 0, "the group kept the loop while it waited"
        io.read(0.5)
        assert not {s.attempt_id for s in subs} & {r.attempt_id for r in io.rankings}
        with late_redis_server(port, after_s=0.0, workdir=tmp_path / "second"):
            io.until({s.attempt_id for s in subs})
            loop.stopping = True
    assert server_gone
    assert io.committed(settings) == io.ends()
    assert io.letters == []  # an outage is not a bad message


def wait_for_redis_down(store: FeatureStore) -> bool:
    """Shut the late server down (SHUTDOWN NOSAVE) and wait until connections are refused."""
    with suppress(redis.ConnectionError):
        store.client.shutdown(nosave=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            store.client.ping()
        except redis.ConnectionError:
            return True
        time.sleep(0.05)
    return False


@pytest_integration
def test_the_session_timeout_is_raised_to_the_brokers_minimum(settings: Settings) -> None:
    from confluent_kafka.admin import ConfigResource

    admin = AdminClient(settings.confluent_config())
    broker = ConfigResource(ConfigResource.Type.BROKER, str(next(iter(admin.list_topics(timeout=10).brokers))))
    floor = int(admin.describe_configs([broker])[broker].result(10)["group.min.session.timeout.ms"].value) / 1000
    assert session_timeout(replace(settings, kafka_session_timeout=0.1)) == floor  # below: the broker's minimum
    assert session_timeout(replace(settings, kafka_session_timeout=floor + 5)) == floor + 5


@pytest_integration
def test_a_fenced_producer_is_replaced_and_its_batches_ranked_once(
        settings: Settings, routes: Routes, rds: redis.Redis, run_id: str, tmp_path: Path) -> None:
    """What a transaction the broker timed out does (it fences the producer): here another
    producer takes the loop's transactional id meanwhile; the loop starts a new one and goes on,
    and a read_committed reader sees each submission ranked once."""
    from predictor.transactions import ExactlyOnce

    store = FeatureStore(rds, KeyLayout(f"test-{run_id}"), canonicalize=CAT.canonical)
    io = Topics(settings, routes)
    settings = replace(settings, home=tmp_path, worker_id=f"fence-{run_id}")
    first, second = ([submission(f"{run_id}-{k}-{i}", i) for i in range(10)] for k in "ab")
    try:
        with running(settings, service_on(store), routes) as loop:
            io.wait_ready(loop)
            for sub in first:
                io.publish(sub.job_key.encode(), sub.encode())
            io.until({s.attempt_id for s in first})
            assert isinstance(loop.output, ExactlyOnce)
            usurper = Producer(settings.confluent_config(**{"transactional.id": loop.output.transactional_id}))
            usurper.init_transactions(30)  # the loop's producer is fenced from now on
            for sub in second:
                io.publish(sub.job_key.encode(), sub.encode())
            io.until({s.attempt_id for s in second})
            io.read(2.0)
            assert len(loop.output.restarts) >= 1
        assert io.committed(settings) == io.ends()
    finally:
        store.delete_all()
    ours = [r.attempt_id for r in io.rankings if r.attempt_id.startswith(run_id)]
    assert sorted(ours) == sorted(s.attempt_id for s in first + second)  # each once


class HeldUntilRevoked(RankingService):
    """Ranks as the loop's service does, but holds a batch of ``held``'s submissions until the
    group has revoked the partitions of :attr:`loop`: a long batch a rebalance lands in."""

    loop: ConfluentPredictor | None = None
    held = ""

    def rank(self, subs: Sequence[Submission], received: Sequence[float] | None = None) -> list[Ranking]:
        deadline = time.monotonic() + 60
        while (any(s.job_key == self.held for s in subs) and self.loop is not None
               and self.loop.revocations == 0 and time.monotonic() < deadline):
            time.sleep(0.01)
        return super().rank(subs, received)


@pytest_integration
def test_partitions_a_rebalance_revoked_from_a_long_batch_are_fetched_when_handed_back(
        settings: Settings, routes: Routes, rds: redis.Redis, run_id: str, tmp_path: Path) -> None:
    """librdkafka keeps a partition paused across its revocation and re-assignment: a long batch
    (its partitions paused) that a rebalance revoked, and that ended before the partitions came
    back, must not leave them paused (the loop polled for ever and ranked nothing more)."""
    store = FeatureStore(rds, KeyLayout(f"test-{run_id}"), canonicalize=CAT.canonical)
    service = HeldUntilRevoked(store, CAT, ModelHolder(ActiveModel(LookupTable(), "lookup-loop-test")))
    service.held = f"{run_id}-held"
    io = Topics(settings, routes)
    first, later = ([submission(f"{run_id}-{k}{i}", i) for i in range(PARTITIONS)] for k in "ab")
    try:
        with running(replace(settings, home=tmp_path), service, routes) as loop:
            service.loop = loop
            io.wait_ready(loop)
            # committed offsets on every partition: one handed back reads on from there, not from
            # the end (where a new group starts), so a submission sent before it came back counts
            io.publish_each(first)
            io.until({s.attempt_id for s in first})
            held = submission(service.held, 0)
            io.publish(held.job_key.encode(), held.encode())
            wait_until(lambda: loop._paused, 30, "the held batch paused the loop's partitions", poll=0.05)
            joiner = Consumer(settings.confluent_config(**{"group.id": routes.group, "enable.auto.commit": False}))
            joiner.subscribe([routes.submissions])

            def joined() -> bool:
                joiner.poll(0.1)  # joins (a message it takes is never committed)
                return bool(joiner.assignment()) and loop.revocations > 0

            try:  # revokes the loop's partitions (the held batch ends) and shares them out again
                wait_until(joined, 60, "the joiner holds partitions", poll=0.05)
            finally:
                joiner.close()  # leaves: every partition is the loop's again
            io.publish_each(later)  # the loop paused every partition: each must be fetched again
            io.until({held.attempt_id} | {s.attempt_id for s in later}, timeout=30)
    finally:
        store.delete_all()


def test_a_call_that_outlives_its_limit_is_left_behind_and_said_stuck() -> None:
    """librdkafka does not always keep a transactional call's timeout: the loop runs each on a
    thread of its own and gives the producer up when it has not returned in time."""
    from predictor.transactions import _Stuck, _within

    release = threading.Event()
    began = time.monotonic()
    with pytest.raises(_Stuck, match="more than 0 s"):
        _within(lambda: release.wait(30), 0.2, "waiting")
    assert time.monotonic() - began < 5  # the caller was not held for the call's length
    release.set()
    with pytest.raises(ValueError, match="refused"):  # what the call raised reaches the caller
        _within(lambda: (_ for _ in ()).throw(ValueError("refused")), 5, "refusing")
    assert _within(lambda: 7, 5, "returning") == 7  # returns what the call returns, when it does
