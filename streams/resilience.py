"""Waiting out an outage of a dependency (Redis, the broker) without losing or committing anything.

A batch whose dependency is down is neither applied, nor dead-lettered, nor skipped: it waits, with
capped exponential back-off, for as long as the outage lasts, and its offsets stay uncommitted
(:func:`streams.app.take_batches` acks a batch only once its handler returned). On-call sees the
wait as ``leap_dependency_up{dependency=...} 0`` and as one log line when the dependency goes down
and one when it is back, not one per retry.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis

from streams import metrics

log = logging.getLogger("leap.streams")

T = TypeVar("T")

class Abandoned(BaseException):
    """The worker is stopping while a batch waits out an outage: the batch is given up, unacked.

    A ``BaseException``, like cancellation, so that no ``except Exception`` of a handler takes
    it for a bad event and dead-letters what is only waiting.
    """


#: Tell whether the worker is stopping (:func:`stop_waiting_when`; Faust's app is above this module).
_STOPPING: list[Callable[[], bool]] = []


def stop_waiting_when(stopping: Callable[[], bool]) -> None:
    """Make :func:`call_until_up` give up (:class:`Abandoned`) once ``stopping()`` is true.

    Faust stops by waiting for every event in flight to be acked; a batch waiting for Redis
    would hold a SIGTERM for as long as the outage lasts.
    """
    _STOPPING.append(stopping)


#: First wait after a failed call; each further failure doubles it, up to :data:`BACKOFF_CAP_S`.
BACKOFF_FIRST_S = 0.05
#: Longest wait between two attempts: a recovered dependency is noticed within this long.
BACKOFF_CAP_S = 2.0


def backoff(attempt: int) -> float:
    """Seconds to wait before attempt ``attempt + 1`` (``attempt`` = failures so far, from 0)."""
    return min(BACKOFF_CAP_S, BACKOFF_FIRST_S * 2.0 ** min(attempt, 30))


@dataclass
class Dependency:
    """A service the agents call, its health as last seen, and which errors mean "it is down".

    Parameters
    ----------
    name
        Label of ``leap_dependency_up`` and of the log lines (``redis``, ``kafka``).
    is_outage
        True for an error that says the dependency is unavailable (connection refused, timeout,
        loading, out of memory...), as opposed to one that says the request itself is bad.
    """

    name: str
    is_outage: Callable[[BaseException], bool]
    down_since: float | None = field(default=None, init=False)
    failures: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        metrics.DEPENDENCY_UP.labels(self.name).set(1)

    def mark_down(self, exc: BaseException) -> None:
        self.failures += 1
        if self.down_since is None:
            self.down_since = time.monotonic()
            metrics.DEPENDENCY_UP.labels(self.name).set(0)
            log.error("%s is unavailable (%s: %s): batches wait and nothing is committed until it is back",
                      self.name, type(exc).__name__, exc)

    def mark_up(self) -> None:
        if self.down_since is not None:
            log.warning("%s is back after %.1f s (%d failed attempts); batches resume",
                        self.name, time.monotonic() - self.down_since, self.failures)
            metrics.DEPENDENCY_UP.labels(self.name).set(1)
        self.down_since = None
        self.failures = 0


async def call_until_up(dependency: Dependency, fn: Callable[[], Awaitable[T]]) -> T:
    """Await ``fn()`` until it succeeds, waiting while ``dependency`` is down; never gives up.

    Parameters
    ----------
    dependency
        The service ``fn`` calls; only its outage errors are retried.
    fn
        Makes the awaitable of one attempt (a blocking call goes through ``asyncio.to_thread``,
        so the event loop keeps heart-beating to the broker while Redis is slow: a loop blocked
        for longer than the group's session timeout would cost the worker its partitions).

    Returns
    -------
    What ``fn()`` gives. Any other error is raised at once; cancellation, and :class:`Abandoned`
    when the worker stops during the outage, are raised too, and the batch then stays unacked.
    """
    attempt = 0
    while True:
        try:
            result = await fn()
        except Exception as exc:
            if not dependency.is_outage(exc):
                raise
            dependency.mark_down(exc)
            if any(stopping() for stopping in _STOPPING):
                raise Abandoned(f"stopping while {dependency.name} is unavailable") from exc
            await asyncio.sleep(backoff(attempt))
            attempt += 1
            continue
        dependency.mark_up()
        return result


def kafka_outage(exc: BaseException) -> bool:
    """True for a produce error that says the broker is unreachable or busy, not that the record is bad."""
    from aiokafka.errors import KafkaError, MessageSizeTooLargeError, RecordTooLargeError

    if isinstance(exc, MessageSizeTooLargeError | RecordTooLargeError):
        return False
    return isinstance(exc, KafkaError | asyncio.TimeoutError | ConnectionError | OSError)


#: The broker, as seen by the agents' sends (rankings, dead letters).
KAFKA = Dependency("kafka", kafka_outage)


#: Error replies that say the server cannot serve anyone right now (not that the request is bad):
#: loading its data, out of memory, failing to persist, a replica, a busy script, a cluster change.
REDIS_UNAVAILABLE_REPLIES = ("LOADING", "OOM", "MISCONF", "READONLY", "BUSY", "MASTERDOWN", "NOREPLICAS",
                             "CLUSTERDOWN", "TRYAGAIN")


def redis_outage(exc: BaseException) -> bool:
    """True for a Redis error that says the server is unreachable or unable to serve, not that
    the command (an event) is bad."""
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        return True
    return isinstance(exc, redis.ResponseError) and str(exc).startswith(REDIS_UNAVAILABLE_REPLIES)


#: The online store as seen by this process's agents and predictor (``leap_dependency_up{dependency="redis"}``).
REDIS = Dependency("redis", redis_outage)


async def with_redis_retry(fn: Callable[..., T], *args: Any) -> T:
    """Run a blocking Redis call in a thread, waiting out an outage for as long as it lasts.

    Parameters
    ----------
    fn, args
        A blocking call on Redis and its arguments.

    Returns
    -------
    What ``fn`` returns. Only errors that say the request itself is bad (e.g. a script's
    ``ResponseError``) are raised; cancellation is raised too (the batch then stays unacked).
    """
    return await call_until_up(REDIS, lambda: asyncio.to_thread(fn, *args))
