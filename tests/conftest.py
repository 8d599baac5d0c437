"""Session-scoped fixtures on the real Kafka broker and redis-server that ``leap services up``
starts (or, with ``LEAP_USE_TESTCONTAINERS=1`` and a Docker engine, on testcontainers)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from features.store import redis_client
from leap.core.settings import Settings
from leap.services import stack
from leap.services.docker import docker_available
from leap.services.kafka import KAFKA_VERSION
from leap.services.workers import WorkerProcess


def _testcontainers_settings() -> Iterator[Settings] | None:
    if os.environ.get("LEAP_USE_TESTCONTAINERS") != "1" or not docker_available():
        return None

    def gen() -> Iterator[Settings]:
        from testcontainers.kafka import KafkaContainer
        from testcontainers.redis import RedisContainer

        with KafkaContainer(f"apache/kafka:{KAFKA_VERSION}").with_kraft() as kafka, \
                RedisContainer("redis:7") as red:
            url = f"redis://{red.get_container_host_ip()}:{red.get_exposed_port(6379)}/0"
            yield replace(Settings.from_env(), kafka_bootstrap=kafka.get_bootstrap_server(), redis_url=url,
                          kafka_from_env=True, redis_from_env=True)

    return gen()


@pytest.fixture(scope="session")
def settings() -> Iterator[Settings]:
    containers = _testcontainers_settings()
    if containers is not None:
        yield from containers
        return
    base = Settings.from_env()
    stack.up(base)
    yield base


@pytest.fixture(scope="session")
def running_services(settings: Settings) -> dict[str, Any]:
    return stack.status(settings)


@pytest.fixture(scope="session")
def rds(settings: Settings) -> redis.Redis:
    # typed as one server: the tests that take it use plain-server commands; with
    # LEAP_REDIS_CLUSTER=1 redis-py's cluster client routes the same calls by key
    return cast(redis.Redis, redis_client(settings))


@pytest.fixture(scope="session")
def cluster_settings(settings: Settings) -> Settings:
    """Settings of the local three-master Redis Cluster (started here if it does not run)."""
    from leap.core.settings import LOCAL_REDIS_CLUSTER_PORTS

    if settings.redis_from_env and not settings.redis_cluster:
        pytest.skip("LEAP_REDIS_URL names a single server; set LEAP_REDIS_CLUSTER=1 to test a cluster")
    if settings.redis_cluster:
        return settings
    stack.up(settings, redis_cluster=True)
    return replace(settings, redis_url=f"redis://127.0.0.1:{LOCAL_REDIS_CLUSTER_PORTS[0]}/0", redis_cluster=True)


@pytest.fixture(params=["server", "cluster"])
def store_client(request: pytest.FixtureRequest, rds: redis.Redis) -> Any:
    """The store tests' Redis: the single server, then the Redis Cluster (same tests, both)."""
    if request.param == "server":
        return rds
    return redis_client(request.getfixturevalue("cluster_settings"))


@pytest.fixture
def store(store_client: Any, run_id: str) -> Iterator[Any]:
    """A feature store under a key prefix of this test alone, on the server and on the cluster."""
    from features.keys import KeyLayout
    from features.store import FeatureStore
    from leap.core.hardware import load_catalogue

    fs = FeatureStore(store_client, KeyLayout(f"store-{run_id}"), canonicalize=load_catalogue().canonical)
    yield fs
    fs.delete_all()


@pytest.fixture(scope="session")
def topics(settings: Settings) -> dict[str, str]:
    from streams.topics import create_topics

    return create_topics(settings)


@pytest.fixture
def run_id() -> str:
    """A fresh id to keep one test's jobs, keys and attempts apart from every other's."""
    return uuid.uuid4().hex[:10]


def wait_until_ranking(settings: Settings, proc: WorkerProcess, timeout: float = 90) -> None:
    """Block until the predictor answers a canary submission."""
    from streams.client import SchedulerClient
    from tests.factories import submission

    deadline = time.monotonic() + timeout
    with SchedulerClient(settings) as client:
        while time.monotonic() < deadline:
            if not proc.alive():
                raise RuntimeError(f"worker exited early:\n{proc.log_tail()}")
            canary = submission(f"canary-{uuid.uuid4().hex[:8]}", 0)
            client.publish(canary)
            client.flush()
            if client.wait_for([canary.attempt_id], timeout=5):
                return
    raise RuntimeError(f"worker gave no ranking within {timeout}s:\n{proc.log_tail()}")


@pytest.fixture(scope="session")
def worker(
    settings: Settings, topics: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """One ``leap worker all`` for the session's end-to-end tests.

    Its group first skips whatever earlier runs (a demo, another suite) left unread: the tests
    publish their own events once it answers, and a backlog would only delay that answer. Its home
    is the session's own: the models the tests announce are compiled there, not into the
    compiled-trees cache of the checkout's demo (whose libraries they would push out).
    """
    from streams.topics import JOB_FINISHES, JOB_STARTS, SUBMISSIONS, consumer_group, skip_to_end

    skip_to_end(settings, consumer_group(settings, "all"), (JOB_STARTS.name, JOB_FINISHES.name, SUBMISSIONS.name))
    skip_to_end(settings, consumer_group(settings, "predictor"), (SUBMISSIONS.name,))  # the predictor of `all`
    home = tmp_path_factory.mktemp("worker")
    proc = WorkerProcess(replace(settings, home=home), "all", home / "worker.log")
    try:
        wait_until_ranking(settings, proc)
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def small_history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Ten simulated days of 1,500 attempts, written as the archive format."""
    from leap.fleet.history import simulate, write_history
    from leap.training.train import parse_day

    out = tmp_path_factory.mktemp("history")
    write_history(simulate(seed=4, days=10, attempts_per_day=1500, start=parse_day("2025-03-01")), out)
    return out


@pytest.fixture(scope="session")
def tiny_history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six simulated days of 400 attempts: for what a few nights of small fits show."""
    from leap.fleet.history import simulate, write_history

    out = tmp_path_factory.mktemp("tiny-history")
    write_history(simulate(seed=3, days=6, attempts_per_day=400), out)
    return out


@pytest.fixture(scope="session")
def served_with_selectors(small_history: Path) -> tuple[Any, Any]:
    """The served model fitted with a held-out tenth and its selectors on the small history
    (thresholds lowered to its size), and that history's holdout day: ``(model, holdout)``.
    Shared, so fitted once; tests must not change the model."""
    import numpy as np

    from leap.core.hardware import load_catalogue
    from leap.training.dataset import build_examples, read_history
    from leap.training.train import split
    from predictor import calibration, lgbm, selector

    ex = build_examples(read_history(small_history), load_catalogue())
    last = float(np.floor(ex.submit_time.max() / 86400) * 86400)
    sp = split(ex, last + 86400, window_days=30)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lgbm, "HOLDOUT_FROM", 1000)
        mp.setattr(selector, "MIN_ROWS", 30)
        # A gate of two standard errors stays shut on this small history's held-out tenth, which would
        # serve the fallback everywhere and hide what the selectors pick.
        mp.setattr(calibration, "GATE_MARGIN", 1.0)
        # The whole correction (no trust weights): on this small history whether it earns any trust
        # turns on a tree or two, and the tests of the explained pass need the model served somewhere.
        model = lgbm.LightGBMThroughput(n_estimators=40, num_leaves=15, num_threads=1, early_stopping_rounds=0,
                                        trust=False).fit(sp.train.rows, sp.train.y, sp.train.job_key)
    return model, sp.holdout
