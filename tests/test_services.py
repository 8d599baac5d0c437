"""Integration tests of the local services: the real broker and server that ``up`` starts."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from typer.testing import CliRunner

from leap.core.settings import LOCAL_KAFKA_PORT, LOCAL_REDIS_PORT, Settings
from leap.services import cli, docker, kafka, redis_server, stack

integration = pytest.mark.integration


@pytest.fixture(scope="session")
def settings() -> Settings:
    return Settings.from_env()


@pytest.fixture(scope="session")
def running_services(settings: Settings) -> dict[str, Any]:
    """Start (or find) Kafka and Redis once per session."""
    return stack.up(settings)


@pytest.fixture()
def throwaway_topic(settings: Settings, running_services: dict[str, Any]) -> Iterator[str]:
    """A one-partition topic that exists only for one test."""
    admin = AdminClient(settings.confluent_config())
    name = f"leap.test.services-{uuid.uuid4().hex[:12]}"
    admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=-1)])[name].result(30)
    yield name
    admin.delete_topics([name], operation_timeout=30)[name].result(30)


@integration
def test_skip_to_end_moves_a_group_past_its_backlog(settings: Settings, throwaway_topic: str) -> None:
    from streams.topics import skip_to_end

    producer = Producer(settings.confluent_config(acks="all"))
    for i in range(5):
        producer.produce(throwaway_topic, value=b"old %d" % i)
    assert producer.flush(30) == 0
    group = f"leap-test-{uuid.uuid4().hex[:8]}"
    assert skip_to_end(settings, group, (throwaway_topic,)) == 5
    assert skip_to_end(settings, group, (throwaway_topic,)) == 0  # nothing new since
    producer.produce(throwaway_topic, value=b"new")
    assert producer.flush(30) == 0
    consumer = Consumer(settings.confluent_config(**{"group.id": group, "auto.offset.reset": "earliest"}))
    try:
        consumer.subscribe([throwaway_topic])
        deadline, received = time.monotonic() + 60, None
        while received is None and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                received = msg.value()
        assert received == b"new"  # the five old messages were skipped
    finally:
        consumer.close()


def test_group_calls_wait_out_a_coordinator_that_is_not_ready() -> None:
    """A fresh broker answers the first group requests with NOT_COORDINATOR while it creates
    ``__consumer_offsets``; those are asked again, anything else is raised at once."""
    from confluent_kafka import KafkaException

    from streams.topics import _retrying

    answers = iter([KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS, None])

    def committed() -> str:
        code = next(answers)
        if code is not None:
            raise KafkaException(KafkaError(code))
        return "offsets"

    assert _retrying(committed, timeout=5) == "offsets"

    def refused() -> str:
        raise KafkaException(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED))

    with pytest.raises(KafkaException):
        _retrying(refused, timeout=5)


@integration
def test_up_reports_both_services(running_services: dict[str, Any]) -> None:
    assert set(running_services) == {"kafka", "redis"}
    for name in ("kafka", "redis"):
        assert running_services[name]["backend"] in {"local", "docker", "external"}
        assert running_services[name]["action"] in {"started", "running", "used"}
        assert running_services[name]["version"]


@integration
def test_status_reports_ok(settings: Settings, running_services: dict[str, Any]) -> None:
    result = stack.status(settings)
    assert result["kafka"] == {
        "ok": True,
        "version": kafka.KAFKA_VERSION if not settings.kafka_from_env else kafka.kafka_version(settings),
        "bootstrap": settings.kafka_bootstrap,
    }
    assert result["redis"]["ok"] is True
    assert result["redis"]["version"].split(".")[0].isdigit()
    assert set(result["redis"]) == {"ok", "version", "url"}


@integration
def test_a_broker_named_by_the_environment_on_this_machine_has_its_version(settings: Settings,
                                                                          running_services: dict[str, Any]) -> None:
    """As the secured stack's is named (``secure.env``): its release is read from the jars it runs."""
    if running_services["kafka"]["backend"] != "local":
        pytest.skip("the broker is not a local process")
    named = dataclasses.replace(settings, kafka_from_env=True)
    assert stack.status(named)["kafka"]["version"] == kafka.KAFKA_VERSION
    from leap.services.kafka_version import local_broker_version

    assert local_broker_version("127.0.0.1:1") is None  # nothing listens there


@integration
def test_status_json_command_prints_the_documented_shape(running_services: dict[str, Any]) -> None:
    outcome = CliRunner().invoke(cli.app, ["status", "--json"])
    assert outcome.exit_code == 0, outcome.output
    printed = json.loads(outcome.stdout)
    assert set(printed) == {"kafka", "redis"}
    assert set(printed["kafka"]) == {"ok", "version", "bootstrap"}
    assert set(printed["redis"]) == {"ok", "version", "url"}
    assert printed["kafka"]["ok"] is True and printed["redis"]["ok"] is True


def test_status_url_never_shows_a_password() -> None:
    # No server listens on port 1: this also checks that a dead service is "not ok", not a crash.
    fake = Settings(redis_url="redis://leap:s3cret@127.0.0.1:1/0", kafka_bootstrap="127.0.0.1:1")
    started = time.monotonic()
    result = stack.status(fake)
    assert time.monotonic() - started < 20
    assert result["redis"]["ok"] is False and result["kafka"]["ok"] is False
    assert "s3cret" not in json.dumps(result)
    assert result["redis"]["url"] == "redis://leap:***@127.0.0.1:1/0"


@integration
def test_unreachable_names_each_service_that_does_not_answer(settings: Settings,
                                                             running_services: dict[str, Any]) -> None:
    assert stack.unreachable(settings) == []
    dead = Settings(redis_url="redis://leap:s3cret@127.0.0.1:1/0", kafka_bootstrap="127.0.0.1:1")
    problems = stack.unreachable(dead, timeout=1.0)
    assert len(problems) == 2
    assert problems[0].startswith("Kafka at 127.0.0.1:1 does not answer (")
    assert problems[1].startswith("Redis at redis://leap:***@127.0.0.1:1/0 does not answer (")
    assert "s3cret" not in " ".join(problems)
    assert stack.unreachable(dead, kafka=False, redis=False) == []
    with pytest.raises(stack.ServiceError, match="Fix: start the local ones with `leap services up`"):
        stack.require_services(replace(settings, redis_url=dead.redis_url), kafka=False)
    assert stack.require_services(settings) is settings


@pytest.mark.parametrize("argv", [
    ["submit", "SUBMISSIONS"], ["topics", "create"], ["replay", "inspect"],
    ["bench", "predict", "--repeat", "1"], ["bench", "e2e", "--repeat", "1"],
])
def test_commands_that_need_a_dead_service_say_so_and_exit_1(argv: list[str], tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # Nothing listens on port 1: each command stops at once with one clear error, no traceback.
    from leap.cli import app

    monkeypatch.setenv("LEAP_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    monkeypatch.setenv("LEAP_REDIS_URL", "redis://127.0.0.1:1/0")
    submissions = tmp_path / "s.jsonl"
    submissions.write_text(json.dumps({"job_key": "j", "attempt_id": "a", "model_type": "bert-base",
                                       "global_batch_size": 32, "num_accelerators": 8,
                                       "candidates": ["a100"], "requested_hardware": "a100"}) + "\n")
    argv = [str(submissions) if a == "SUBMISSIONS" else a for a in argv]
    outcome = CliRunner().invoke(app, argv)
    assert outcome.exit_code == 1, outcome.output
    assert outcome.exception is None or isinstance(outcome.exception, SystemExit)
    text = " ".join(outcome.output.split())
    assert "does not answer" in text and "leap services up" in text


def test_a_worker_started_before_its_services_waits_for_them(tmp_path: Path) -> None:
    # A real worker process, its broker and Redis on a port where nothing listens: it says that it
    # waits for the broker and keeps waiting (no client traceback after a timeout) until stopped.
    env = {**os.environ, "LEAP_KAFKA_BOOTSTRAP": "127.0.0.1:1", "LEAP_REDIS_URL": "redis://127.0.0.1:1/0",
           "LEAP_HOME": str(tmp_path)}
    worker = subprocess.Popen([sys.executable, "-m", "leap.cli", "worker", "predictor", "--metrics-port", "0"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert worker.stdout is not None
        first = worker.stdout.readline()
        assert "[worker predictor] waiting for Kafka at 127.0.0.1:1 does not answer" in first, first
        assert "Redis" not in first  # a Redis outage is the running agents' to wait out (docs/faults.md)
        time.sleep(3)
        assert worker.poll() is None  # still waiting
    finally:
        worker.terminate()
        rest = worker.communicate(timeout=20)[0]
    assert "Traceback" not in rest and "rdkafka" not in rest


def test_wait_for_services_returns_at_once_when_none_is_asked_for() -> None:
    lines: list[str] = []
    dead = Settings(redis_url="redis://127.0.0.1:1/0", kafka_bootstrap="127.0.0.1:1")
    assert stack.wait_for_services(dead, lines.append, kafka=False, redis=False) == 0.0
    assert lines == []


@integration
def test_wait_for_services_returns_when_they_answer(settings: Settings, running_services: dict[str, Any]) -> None:
    lines: list[str] = []
    assert stack.wait_for_services(settings, lines.append) == 0.0
    assert lines == []


@integration
def test_up_is_idempotent(settings: Settings, running_services: dict[str, Any]) -> None:
    started = time.monotonic()
    again = stack.up(settings)
    assert time.monotonic() - started < 10
    for name in ("kafka", "redis"):
        assert again[name]["backend"] == running_services[name]["backend"]
        if again[name]["backend"] == "local":
            assert again[name]["action"] == "running"


@integration
def test_kafka_round_trip(settings: Settings, throwaway_topic: str) -> None:
    producer = Producer(settings.confluent_config(acks="all"))
    payload = uuid.uuid4().bytes
    producer.produce(throwaway_topic, key=b"job-1", value=payload)
    assert producer.flush(30) == 0

    consumer_conf: dict[str, str | int | float | bool] = {
        "group.id": f"leap-test-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }
    consumer = Consumer(settings.confluent_config(**consumer_conf))
    try:
        consumer.subscribe([throwaway_topic])
        deadline = time.monotonic() + 60
        received = None
        while received is None and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            err = msg.error()
            if err is not None and err.code() != KafkaError._PARTITION_EOF:
                raise AssertionError(err)
            if err is None:
                received = msg
        assert received is not None, "no message consumed within 60 s"
        assert received.key() == b"job-1"
        assert received.value() == payload
    finally:
        consumer.close()


@integration
def test_broker_does_not_auto_create_topics(settings: Settings, running_services: dict[str, Any]) -> None:
    if running_services["kafka"]["backend"] == "external":
        pytest.skip("an external cluster's broker configuration is not ours")
    name = f"leap.test.never-created-{uuid.uuid4().hex[:12]}"
    producer = Producer(settings.confluent_config(**{"message.timeout.ms": 3000}))
    producer.produce(name, value=b"x")
    producer.flush(10)
    topics = AdminClient(settings.confluent_config()).list_topics(timeout=10).topics
    assert name not in topics


@integration
def test_redis_answers(settings: Settings, running_services: dict[str, Any]) -> None:
    client = redis.Redis.from_url(settings.redis_url)
    key = f"{settings.key_prefix}:test:services:{uuid.uuid4().hex}"
    try:
        assert client.ping() is True
        client.set(key, b"value", ex=60)
        assert client.get(key) == b"value"
    finally:
        client.delete(key)
        client.close()


def test_compose_file_follows_the_pinned_versions_and_ports() -> None:
    compose = docker.COMPOSE_FILE.read_text()
    default = re.search(r"apache/kafka:\$\{LEAP_KAFKA_VERSION:-([^}]+)\}", compose)
    assert default is not None and default.group(1) == kafka.KAFKA_VERSION
    assert f'"127.0.0.1:{LOCAL_KAFKA_PORT}:' in compose
    assert f'"127.0.0.1:{LOCAL_REDIS_PORT}:' in compose
    assert '"--appendonly", "yes", "--appendfsync", "everysec"' in compose  # as the local server


def test_cluster_ids_never_look_like_an_option(monkeypatch: pytest.MonkeyPatch) -> None:
    # One random id in 64 starts with "-"; the storage tool's parser would read it as an option.
    ids = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=bytes(16))])
    monkeypatch.setattr(kafka.uuid, "uuid4", lambda: next(ids))
    cluster_id = kafka.new_cluster_id()
    assert cluster_id == "AAAAAAAAAAAAAAAAAAAAAA"
    assert len(cluster_id) == 22


def test_the_local_redis_keeps_writes_across_a_kill_9(tmp_path: Path) -> None:
    """The generated configuration (AOF, fsync every second) on a throw-away server: a write
    acknowledged more than a second before ``kill -9`` is there after the restart."""
    binary = redis_server.redis_server_binary()
    if binary is None:
        pytest.skip("no redis-server binary")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for folder in ("data", "logs"):
        (tmp_path / folder).mkdir()
    conf = tmp_path / "redis.conf"
    conf.write_text(redis_server.redis_conf(tmp_path, port))

    def start() -> tuple[subprocess.Popen[bytes], redis.Redis]:
        proc = subprocess.Popen([binary, str(conf)], cwd=tmp_path / "data",
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return proc, client
            except (redis.ConnectionError, redis.BusyLoadingError):
                if time.monotonic() > deadline:
                    proc.kill()
                    raise
                time.sleep(0.05)

    proc, client = start()
    try:
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
        client.hset("leap:job:{j}", mapping={"_starts": 3})
        time.sleep(1.5)  # past one everysec fsync
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    proc, client = start()
    try:
        assert client.hget("leap:job:{j}", "_starts") == b"3"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)


def test_compose_cluster_profile_uses_the_local_cluster_ports() -> None:
    """The Docker profile and `leap services up --kafka-brokers 3 --redis-cluster` agree on every port."""
    import yaml

    from leap.core.settings import LOCAL_KAFKA_CLUSTER_PORTS, LOCAL_REDIS_CLUSTER_PORTS

    services = yaml.safe_load(docker.COMPOSE_FILE.read_text())["services"]
    voters = ",".join(f"{i}@127.0.0.1:{c}" for i, (_, c) in enumerate(LOCAL_KAFKA_CLUSTER_PORTS, start=1))
    for i, (port, controller) in enumerate(LOCAL_KAFKA_CLUSTER_PORTS, start=1):
        env = services[f"kafka-{i}"]["environment"]
        assert env["KAFKA_LISTENERS"] == f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}"
        assert (env["KAFKA_NODE_ID"], env["KAFKA_CONTROLLER_QUORUM_VOTERS"]) == (i, voters)
        assert services[f"kafka-{i}"]["profiles"] == ["cluster"]
    for i, port in enumerate(LOCAL_REDIS_CLUSTER_PORTS, start=1):
        assert services[f"redis-node-{i}"]["environment"]["PORT"] == str(port)
    workers = services["predictor-scaled"]["environment"]
    assert workers["LEAP_KAFKA_BOOTSTRAP"] == ",".join(f"127.0.0.1:{p}" for p, _ in LOCAL_KAFKA_CLUSTER_PORTS)
    assert workers["LEAP_REDIS_URL"] == f"redis://127.0.0.1:{LOCAL_REDIS_CLUSTER_PORTS[0]}/0"
