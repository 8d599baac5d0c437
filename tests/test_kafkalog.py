"""librdkafka's log through Python logging: a broker that does not answer is said once, not per retry."""

from __future__ import annotations

import logging
import time

import pytest

from leap.core.settings import Settings
from streams.client import SchedulerClient
from streams.resilience import KAFKA
from tests.factories import free_port, submission


def test_an_unreachable_broker_is_said_once_and_librdkafka_stays_quiet(
        caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.DEBUG)
    client = SchedulerClient(Settings(kafka_bootstrap=f"127.0.0.1:{free_port()}"), follow_rankings=False)
    try:
        client.publish(submission("quiet-job", 0))
        deadline = time.monotonic() + 4.0  # librdkafka retries a refused connection every ~100 ms at first
        while time.monotonic() < deadline:
            client.producer.poll(0.1)
        down = [r for r in caplog.records if r.getMessage().startswith("kafka is unavailable")]
        assert len(down) == 1, [r.getMessage() for r in caplog.records]
        assert KAFKA.down_since is not None
        flood = [r for r in caplog.records if r.name == "leap.librdkafka" and "Connect to" in r.getMessage()]
        assert flood == []
        assert "Connect to" not in capfd.readouterr().err  # nothing written around logging either
    finally:
        client.producer.purge()
        KAFKA.mark_up()


def test_kafka_back_is_said_once_with_how_long_it_was_away(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    KAFKA.mark_down(ConnectionError("refused"))
    KAFKA.mark_down(ConnectionError("refused"))
    KAFKA.mark_up()
    KAFKA.mark_up()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("kafka is")]
    assert len(lines) == 2
    assert lines[0].startswith("kafka is unavailable") and lines[1].startswith("kafka is back after")


def test_a_librdkafka_line_repeated_within_a_minute_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    from streams.kafkalog import LIBRDKAFKA

    caplog.set_level(logging.INFO)
    line = ("%s [%s] %s", "GETPID", "rdkafka#producer-1", "Failed to acquire transactional PID: Not coordinator")
    for _ in range(50):
        LIBRDKAFKA.warning(*line)
    LIBRDKAFKA.warning("%s [%s] %s", "GETPID", "rdkafka#producer-1", "Coordinator load in progress")
    said = [r.getMessage() for r in caplog.records if r.name == "leap.librdkafka"]
    assert len(said) == 2 and "Not coordinator" in said[0] and "load in progress" in said[1]
