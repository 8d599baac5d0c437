"""Small builders of valid events for tests (one place, so contract changes touch one file)."""

from __future__ import annotations

import csv
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client import REGISTRY
from redis.backoff import NoBackoff
from redis.retry import Retry

from streams.events import SCHEMA_VERSION, JobFinish, JobStart, Submission

T0 = 1_790_000_000.0
CANDIDATES = ("H100-SXM", "A100-80GB", "MI300X", "TPU-v5p", "L4")

#: The served model's parameters where a report's or a command's logic, not the model's size or
#: accuracy, is under test: small trees, and no learned roofline (its thousand Adam steps per fit
#: are a fixed cost that outweighs small trees several times on a few thousand rows).
PLUMBING_PARAMS: dict[str, Any] = {"n_estimators": 30, "num_leaves": 15, "learned_roofline": False}


def submission_dict(job: str, i: int, **over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "event_id": f"sub-{job}-{i}",
        "event_time": T0 + i,
        "job_key": job,
        "attempt_id": f"{job}-att-{i}",
        "model_type": "llama-7b",
        "family": "dense_lm",
        "params": 7e9,
        "global_batch_size": 512,
        "seq_len": 2048,
        "precision": "bf16",
        "num_accelerators": 8,
        "data_parallel": 8,
        "tensor_parallel": 1,
        "pipeline_parallel": 1,
        "framework": "pytorch",
        "candidates": list(CANDIDATES),
        "requested_hardware": "A100-80GB",
    }
    d.update(over)
    return d


def submission(job: str, i: int, **over: Any) -> Submission:
    return Submission.from_dict(submission_dict(job, i, **over))


def finish_dict(job: str, event_id: str, t: float, hardware: str, throughput: float | None,
                model_type: str = "llama-7b", family: str = "dense_lm", outcome: str = "completed",
                num_accelerators: int = 8) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "event_id": event_id,
        "event_time": t,
        "job_key": job,
        "attempt_id": f"{job}-{event_id}",
        "model_type": model_type,
        "family": family,
        "hardware": hardware,
        "num_accelerators": num_accelerators,
        "throughput": throughput,
        "accelerator_hours": 1.5,
        "outcome": outcome,
        "start_time": t - 3600,
    }


def finish(job: str, event_id: str, t: float, hardware: str, throughput: float | None, **kw: Any) -> JobFinish:
    return JobFinish.from_dict(finish_dict(job, event_id, t, hardware, throughput, **kw))


def start(job: str, event_id: str, t: float, hardware: str) -> JobStart:
    return JobStart.from_dict({
        "schema_version": SCHEMA_VERSION, "event_id": event_id, "event_time": t, "job_key": job,
        "attempt_id": f"{job}-{event_id}", "model_type": "llama-7b", "family": "dense_lm",
        "hardware": hardware, "num_accelerators": 8,
    })


# ---------------------------------------------------------------- consumed batches, as agents see them


@dataclass(frozen=True)
class ConsumedMessage:
    """A consumed Kafka message: the fields of ``faust.types.Message`` the batch logic reads."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True)
class ConsumedEvent:
    """One item of a ``take_events`` batch (Faust's ``EventT`` carries its message the same way)."""

    message: ConsumedMessage


def consumed(topic: str, items: Sequence[tuple[bytes | None, bytes | None]], partition: int = 0,
             first_offset: int = 0) -> list[ConsumedEvent]:
    """A batch of (key, value) messages from consecutive offsets of one partition."""
    return [ConsumedEvent(ConsumedMessage(topic, partition, first_offset + i, key, value))
            for i, (key, value) in enumerate(items)]


@dataclass
class Outbox:
    """Collects what the batch logic sends to one topic, as (key, value, time sent)."""

    sent: list[tuple[bytes, bytes, float]] = field(default_factory=list)

    async def __call__(self, key: bytes, value: bytes) -> None:
        self.sent.append((key, value, time.time()))

    def keys(self) -> list[bytes]:
        return [key for key, _, _ in self.sent]

    def values(self) -> list[bytes]:
        return [value for _, value, _ in self.sent]


def metric(name: str, **labels: str) -> float:
    """Current value of one sample of the process's Prometheus registry (0 if never set)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


# ---------------------------------------------------------------- a Redis that comes up late


def free_port() -> int:
    """A loopback port nothing listens on (the OS's pick; free until someone binds it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def client_without_retries(port: int) -> redis.Redis:
    """A client that surfaces each connection failure at once (redis-py otherwise retries with
    back-off inside the call, which would hide an outage from the code under test)."""
    return redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1, socket_timeout=5,
                       retry=Retry(NoBackoff(), 0))


@contextmanager
def late_redis_server(port: int, after_s: float, workdir: Path) -> Iterator[dict[str, float]]:
    """Start a throw-away ``redis-server`` on ``port`` ``after_s`` seconds from now.

    Yields a dict that gets ``"started"`` (the time the process was launched) and ``"up"`` (the
    time it answered a first PING). A thread starts it, not the event loop: the code under test
    blocks the loop while it calls Redis. The server keeps nothing on disk and is stopped by its
    own process handle.
    """
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not on PATH")
    state: dict[str, float] = {}
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        state["started"] = time.time()
        procs.append(subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ))
        probe = client_without_retries(port)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                probe.ping()
                state["up"] = time.time()
                return
            except redis.ConnectionError:
                time.sleep(0.01)

    timer = threading.Timer(after_s, start)
    timer.start()
    try:
        yield state
    finally:
        timer.cancel()
        timer.join()
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)


def slice_table(src: Path, dst: Path, workloads: set[str]) -> Path:
    """Write the rows of measurement table ``src`` whose workload is in ``workloads`` to ``dst``."""
    with src.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["workload"] in workloads]
    with dst.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return dst
