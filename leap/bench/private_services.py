"""A private broker and redis-server for one benchmark (``bench e2e --private``).

On a machine where others run workers and benchmarks against the shared local services, a
benchmark there measures their load too: their Lua batch scripts hold the shared redis-server
(``SLOWLOG`` shows them), and their predictors join the same consumer group (splitting the
partitions, or, on the other Kafka engine, refused by the group). Here the benchmark gets its own
single-node KRaft broker (the shared jars, its own folder and free ports) and redis-server, with
LEAP's topics; both are stopped when it ends. The machine's CPUs stay shared.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from leap.core.settings import Settings
from leap.services.kafka import KafkaNode, start_local_kafka, stop_local_kafka, wait_for_kafka
from leap.services.processes import stop_process
from leap.services.redis_server import redis_conf, spawn_redis, wait_for_redis
from streams.topics import create_topics

#: Seconds a private broker may take to answer (the shared machine is often busy).
START_TIMEOUT_S = 180.0


def free_port() -> int:
    """A loopback port nothing listens on (the OS's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def private_services(settings: Settings, say: Callable[[str], None] | None = None) -> Iterator[Settings]:
    """Start a broker and a redis-server of this benchmark's own; yields settings that name them.

    Parameters
    ----------
    settings
        The deployment's settings: the broker's jars are the ones cached under its home.
    say
        Progress callback (a ``str -> None``), or None.
    """
    step = say or (lambda _msg: None)
    folder = Path(tempfile.mkdtemp(prefix="leap-bench-services-"))
    node = KafkaNode(port=free_port(), controller_port=free_port(), home=folder / "kafka")
    redis_port = free_port()
    private = replace(settings, kafka_bootstrap=f"127.0.0.1:{node.port}", kafka_from_env=True,
                      redis_url=f"redis://127.0.0.1:{redis_port}/0", redis_from_env=True, redis_cluster=False)
    redis_pid: int | None = None
    try:
        step(f"starting a private broker on {node.port} and redis-server on {redis_port}")
        started = time.monotonic()
        _, kafka_pid = start_local_kafka(settings, step, node)
        redis_pid = spawn_redis(folder / "redis", redis_conf(folder / "redis", redis_port), folder / "redis.pid")
        wait_for_kafka(private, START_TIMEOUT_S, kafka_pid, node.home)
        wait_for_redis(private, START_TIMEOUT_S, redis_pid, folder / "redis")
        create_topics(private)
        step(f"private services up after {time.monotonic() - started:.1f} s")
        yield private
    finally:
        stop_local_kafka(settings, node)
        if redis_pid is not None:
            stop_process(redis_pid)
        shutil.rmtree(folder, ignore_errors=True)
