"""Several workers per role share the topics by partitions; workers join and leave while events flow.

Two feature workers and two predictor workers start in their consumer groups; while a producer
publishes finishes, starts and submissions, a third of each joins and a first of each leaves.
Afterwards: every submission has exactly one ranking (for a ``read_committed`` reader), the
rankings of one job came in submission order, and the features in Redis equal a clean single pass
over the same events (``rebuild-features``), so no finish was counted twice or lost. The same
checks follow a broker killed and restarted mid-stream on the three-broker cluster.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from typer.testing import CliRunner

from features.keys import KeyLayout
from leap.core.settings import Settings
from leap.replay.cli import app
from leap.services.workers import WorkerProcess
from streams.client import SchedulerClient
from streams.events import Ranking
from streams.topics import (
    DEPLOYMENT_HEADER,
    JOB_FINISHES,
    JOB_STARTS,
    RANKINGS,
    SUBMISSIONS,
    consumer_group,
    skip_to_end,
)
from tests.conftest import wait_until_ranking
from tests.factories import T0, finish_dict, start, submission

pytestmark = [pytest.mark.scale, pytest.mark.integration]

JOBS = 24
ROUNDS = 10  # per job: one finish, one start and one submission per round
HARDWARE = ("H100-SXM", "A100-80GB", "MI300X", "L4")


@pytest.fixture
def scale_settings(settings: Settings, run_id: str) -> Settings:
    """The shared broker and Redis, under a key prefix of this test alone."""
    scaled = replace(settings, key_prefix=f"scale-{run_id}")
    skip_to_end(scaled, consumer_group(scaled, "features"), (JOB_STARTS.name, JOB_FINISHES.name, SUBMISSIONS.name))
    skip_to_end(scaled, consumer_group(scaled, "predictor"), (SUBMISSIONS.name,))
    return scaled


class Workers:
    """Named worker processes of one test, all under the same settings."""

    def __init__(self, settings: Settings, folder: Path) -> None:
        self.settings, self.folder = settings, folder
        self.running: dict[str, WorkerProcess] = {}

    def add(self, name: str, role: str) -> WorkerProcess:
        self.running[name] = WorkerProcess(self.settings, role, self.folder / f"{name}.log")
        return self.running[name]

    def __getitem__(self, name: str) -> WorkerProcess:
        return self.running[name]

    def stop_all(self) -> None:
        for proc in self.running.values():
            if proc.alive():
                proc.stop()


@pytest.fixture
def pool(scale_settings: Settings, tmp_path: Path) -> Iterator[Workers]:
    workers = Workers(scale_settings, tmp_path)
    try:
        yield workers
    finally:
        workers.stop_all()


def _events(run: str, rng: random.Random) -> list[tuple[str, str, bytes]]:
    """(topic, key, value) of every round of every job, in publishing order."""
    out = []
    for k in range(ROUNDS):
        for j in range(JOBS):
            job = f"{run}-job{j}"
            hw = HARDWARE[(j + k) % len(HARDWARE)]
            fin = finish_dict(job, f"{run}-f{j}-{k}", T0 + 60 * k + j, hw, round(rng.uniform(50, 500), 3),
                              model_type=f"{run}-m{j % 3}", family=f"{run}-fam")
            st = start(job, f"{run}-s{j}-{k}", T0 + 60 * k + j - 30, hw).to_dict()
            sub = submission(job, k, model_type=f"{run}-m{j % 3}", family=f"{run}-fam").to_dict()
            out += [(JOB_FINISHES.name, job, orjson.dumps(fin)), (JOB_STARTS.name, job, orjson.dumps(st)),
                    (SUBMISSIONS.name, job, orjson.dumps(sub))]
    return out


def _publish_slowly(settings: Settings, events: list[tuple[str, str, bytes]], seconds: float) -> None:
    with SchedulerClient(settings, follow_rankings=False) as client:
        pause = seconds / len(events)
        for topic, key, value in events:
            client.publish_raw(topic, key, value)
            time.sleep(pause)
        client.flush()


def _wait_applied(rds: redis.Redis, prefix: str, jobs: list[str], per_job: int, timeout: float = 120) -> None:
    layout = KeyLayout(prefix)
    deadline = time.monotonic() + timeout
    counts: list[int] = []
    while time.monotonic() < deadline:
        pipe = rds.pipeline(transaction=False)
        for job in jobs:
            pipe.hmget(layout.job(job), "_starts", "_completed")
        counts = [sum(int(v or 0) for v in row) for row in pipe.execute()]
        if all(c >= per_job for c in counts):
            return
        time.sleep(0.5)
    raise AssertionError(f"features not applied within {timeout}s: {counts}")


def test_workers_join_and_leave_while_events_flow(scale_settings: Settings, pool: Workers, rds: redis.Redis,
                                                  run_id: str) -> None:
    for name, role in (("f1", "features"), ("f2", "features"), ("p1", "predictor"), ("p2", "predictor")):
        pool.add(name, role)
    wait_until_ranking(scale_settings, pool["p1"])
    _await_members(scale_settings, 2)

    def churn() -> None:
        # joined and left ~6 s later (two worker starts and rebalances): well within the 17 s of events
        time.sleep(3)
        pool.add("f3", "features")
        pool.add("p3", "predictor")
        _await_members(scale_settings, 3)  # joined and holding partitions, while events flow
        assert pool["f1"].stop() == 0 and pool["p1"].stop() == 0  # leave gracefully, mid-stream

    got = _stream_and_check(scale_settings, rds, run_id, 7, 17.0, churn)
    for j in range(JOBS):
        arrivals = [got[f"{run_id}-job{j}-att-{k}"][1] for k in range(ROUNDS)]
        assert arrivals == sorted(arrivals), f"rankings of job {j} out of order"
    for name in ("f2", "f3", "p2", "p3"):
        assert pool[name].alive(), pool[name].log_tail()
    for role in ("features", "predictor"):
        shares = _assignments(scale_settings, consumer_group(scale_settings, role))
        assert len(shares) == 2 and all(shares), f"{role}: partitions per member {shares}"


def _stream_and_check(settings: Settings, rds: redis.Redis, run_id: str, seed: int, seconds: float,
                      meanwhile: Callable[[], None]) -> dict[str, tuple[Ranking, float]]:
    """Publish the run's events over ``seconds`` while ``meanwhile`` runs; then every submission has
    exactly one ranking for a ``read_committed`` reader and the features equal a clean rebuild
    (nothing lost, nothing counted twice)."""
    events = _events(run_id, random.Random(seed))
    started = time.time() - 2
    with SchedulerClient(settings) as client:
        producer = threading.Thread(target=_publish_slowly, args=(settings, events, seconds))
        producer.start()
        meanwhile()
        producer.join()
        attempts = [f"{run_id}-job{j}-att-{k}" for j in range(JOBS) for k in range(ROUNDS)]
        got = client.wait_for(attempts, timeout=120)
    missing = sorted(set(attempts) - set(got))
    assert not missing, (f"{len(missing)} submissions without a ranking, e.g. {missing[:3]}\n"
                         + "\n".join(_where(settings, started, missing[:5])))
    copies = _rankings_read_committed(settings, started, attempts)
    doubled = sorted(a for a in attempts if copies[a] != 1)
    assert not doubled, (f"{len(doubled)} submissions ranked more than once, e.g. {doubled[:3]}\n"
                         + "\n".join(_where(settings, started, doubled[:5])))
    _wait_applied(rds, settings.key_prefix, [f"{run_id}-job{j}" for j in range(JOBS)], per_job=2 * ROUNDS)
    out = _rebuild(settings, started, run_id)
    assert out["events"] == 2 * JOBS * ROUNDS and out["duplicates"] == 0
    assert out["mismatches"] == 0, out["details"]
    return got


def _read_since(settings: Settings, topic: str, started: float, isolation: str) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every message of ``topic`` since ``started`` (the end: nothing
    more for 2 s), read with ``isolation``; of rankings, only this deployment's (other workers on the
    shared broker, under other key prefixes, rank every submission too)."""
    reader = Consumer(settings.confluent_config(**{"group.id": f"since-{uuid.uuid4().hex[:8]}",
                                                   "enable.auto.commit": False, "isolation.level": isolation}))
    ours = settings.key_prefix.encode()
    out: list[tuple[int, int, bytes]] = []
    try:
        parts = list(reader.list_topics(topic, timeout=10).topics[topic].partitions)
        reader.assign(reader.offsets_for_times([TopicPartition(topic, p, int(started * 1000)) for p in parts], 10))
        while msgs := reader.consume(500, timeout=2.0):
            for m in msgs:
                theirs = topic == RANKINGS.name and dict(m.headers() or []).get(DEPLOYMENT_HEADER) != ours
                if m.error() is None and not theirs:
                    out.append((m.partition() or 0, m.offset() or 0, m.value() or b""))
    finally:
        reader.close()
    return out


def _rankings_read_committed(settings: Settings, started: float, attempts: list[str]) -> Counter[str]:
    """How many rankings of each of ``attempts`` a ``read_committed`` reader sees (exactly once: 1)."""
    wanted = set(attempts)
    return Counter(r.attempt_id for _, _, value in _read_since(settings, RANKINGS.name, started, "read_committed")
                   if (r := Ranking.decode(value)).attempt_id in wanted)


def _where(settings: Settings, started: float, attempts: list[str]) -> list[str]:
    """Where each of ``attempts`` went: its submission's offset, every copy of its ranking read
    uncommitted (those of aborted transactions too), and the predictor group's committed offset of
    the submission's partition (past the submission: the group went on without its ranking)."""
    places: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for topic in (SUBMISSIONS.name, RANKINGS.name):
        for partition, offset, value in _read_since(settings, topic, started, "read_uncommitted"):
            for attempt in (a for a in attempts if a.encode() in value):
                places.setdefault((topic, attempt), []).append((partition, offset))
    group = Consumer(settings.confluent_config(**{"group.id": consumer_group(settings, "predictor")}))
    try:
        subs = {a: places.get((SUBMISSIONS.name, a), []) for a in attempts}
        asked = sorted({p for found in subs.values() for p, _ in found})
        committed = {tp.partition: tp.offset for tp in
                     group.committed([TopicPartition(SUBMISSIONS.name, p) for p in asked], timeout=10)}
    finally:
        group.close()
    return [f"{a}: submission at {subs[a]}, rankings read uncommitted at {places.get((RANKINGS.name, a), [])}, "
            f"group committed {[committed.get(p) for p, _ in subs[a]]}" for a in attempts]


def _await_members(settings: Settings, members: int, timeout: float = 90) -> None:
    """Until both roles' groups have ``members`` members, each holding partitions."""
    deadline = time.monotonic() + timeout
    shares: dict[str, list[int]] = {}
    while time.monotonic() < deadline:
        shares = {role: _assignments(settings, consumer_group(settings, role)) for role in ("features", "predictor")}
        if all(len(s) == members and all(s) for s in shares.values()):
            return
        time.sleep(0.5)
    raise AssertionError(f"groups did not reach {members} members with partitions: {shares}")


def _rebuild(settings: Settings, started: float, run_id: str) -> dict[str, Any]:
    """``rebuild-features`` of the run's jobs from the topics, compared with the live features."""
    result = CliRunner().invoke(app, ["rebuild-features", "--from", str(round(started, 3)),
                                      "--job", f"{run_id}-*", "--json"], env=settings.to_env())
    assert result.exit_code == 0, result.output
    out: dict[str, Any] = orjson.loads(result.stdout)
    return out


def _assignments(settings: Settings, group: str) -> list[int]:
    """Partitions each live member of ``group`` holds (the leavers are gone, the joiners share)."""
    admin = AdminClient(settings.confluent_config())
    described = admin.describe_consumer_groups([group])[group].result(timeout=30)
    return [len(m.assignment.topic_partitions) for m in described.members]


@pytest.fixture(scope="session")
def three_brokers(settings: Settings) -> Settings:
    """The local three-broker cluster (started here if it does not run), its topics replicated 3 times."""
    from leap.services import stack
    from streams.topics import create_topics

    if settings.kafka_from_env:
        pytest.skip("LEAP_KAFKA_BOOTSTRAP names a cluster of its own")
    cluster = replace(Settings.from_env({**os.environ, "LEAP_KAFKA_BROKERS": "3"}), key_prefix=settings.key_prefix)
    stack.up(cluster)
    create_topics(cluster)
    return cluster


def test_a_broker_killed_mid_stream_loses_and_doubles_nothing(three_brokers: Settings, tmp_path: Path, rds: redis.Redis,
                                                              run_id: str) -> None:
    from leap.services.kafka import local_kafka_pid
    from leap.services.kafka_cluster import cluster_nodes, start_node

    cluster = replace(three_brokers, key_prefix=f"brokers-{run_id}")
    victim = cluster_nodes(cluster)[1]
    workers = Workers(cluster, tmp_path)
    try:
        workers.add("all", "all")
        wait_until_ranking(cluster, workers["all"], timeout=120)

        def broker_dies_and_returns() -> None:
            time.sleep(5)
            pid = local_kafka_pid(cluster, victim)
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            time.sleep(6)
            start_node(cluster, victim, lambda _msg: None)  # back, while events still flow

        try:
            _stream_and_check(cluster, rds, run_id, 11, 16.0, broker_dies_and_returns)
        except AssertionError as exc:  # what the worker said is the story of a ranking it never sent
            raise AssertionError(f"{exc}\nworker log:\n{workers['all'].log_tail(120)}") from None
        assert workers["all"].alive(), workers["all"].log_tail()
    finally:
        workers.stop_all()
        if local_kafka_pid(cluster, victim) is None:
            start_node(cluster, victim, lambda _msg: None)
