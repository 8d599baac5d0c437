"""The feature agents: job starts and finishes in, Redis features updated, bad events dead-lettered.

Events arrive in batches (``take_events``) so that each batch is one pipelined Redis round trip.
A Redis outage is not a bad event: the batch waits with back-off (:func:`with_redis_retry`).
The Faust agents only loop over batches; :func:`handle_feature_batch` does the work of one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar

import faust
import redis

from features.store import FeatureStore
from streams import metrics
from streams.app import Send, SourceEvent, SourceMessage, decode_batch, send_dead_letters, topic_sender
from streams.deadletter import dead_letter
from streams.events import Event, JobFinish, JobStart
from streams.topics import DEAD_LETTER, JOB_FINISHES, JOB_STARTS

log = logging.getLogger("leap.features")

#: Batch limits: large enough to amortise a Redis round trip, short enough to keep latency low.
FEATURE_BATCH = (500, 0.05)
#: Back-off while Redis is unreachable: events wait (never dead-lettered for an outage).
RETRY_DELAYS_S = (0.1, 0.5, 1.0, 2.0, 5.0)
#: Dead-letter reason of an event a Redis script rejected.
PROCESSING_ERROR = "processing_error"

P = ParamSpec("P")
T = TypeVar("T")
E = TypeVar("E", bound=Event)


async def with_redis_retry(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run a Redis call, waiting out connection failures instead of dropping the batch.

    Parameters
    ----------
    fn, args, kwargs
        A blocking call on Redis and its arguments.

    Returns
    -------
    What ``fn`` returns. After the last of :data:`RETRY_DELAYS_S` the connection error is raised;
    any other error (e.g. a script's ``ResponseError``) is raised at once.
    """
    for delay in (*RETRY_DELAYS_S, None):
        try:
            return fn(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if delay is None:
                raise
            log.warning("redis unavailable (%s); retrying in %.1fs", exc, delay)
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")


async def apply_with_isolation(
    apply: Callable[[Sequence[E]], list[int]],
    events: Sequence[E],
    sources: Sequence[SourceMessage],
    send_dead_letter: Send,
) -> list[int]:
    """Apply a batch; if a script rejects it, apply one by one and dead-letter the culprits.

    Parameters
    ----------
    apply
        A store write (``FeatureStore.apply_finishes`` or ``apply_starts``): 1 per applied
        event, 0 per duplicate.
    events, sources
        Valid events and the message each came from (for the culprit's dead letter).
    send_dead_letter
        Sends one dead letter.

    Returns
    -------
    1 or 0 per event, in order; 0 also for a rejected event.
    """
    try:
        return list(await with_redis_retry(apply, events))
    except redis.ResponseError:
        # One by one finds the culprit. The pipeline ran every other script before raising, so
        # those events come back as duplicates (0) on the second pass.
        pass
    results: list[int] = []
    for ev, msg in zip(events, sources, strict=True):
        try:
            results.extend(await with_redis_retry(apply, [ev]))
        except redis.ResponseError as exc:
            letter = dead_letter(msg.topic, msg.partition, msg.offset, msg.key, msg.value, PROCESSING_ERROR,
                                 f"redis script failed: {exc}")
            await send_dead_letters(send_dead_letter, [letter])
            results.append(0)
    return results


async def handle_feature_batch(
    batch: Sequence[SourceEvent],
    cls: type[E],
    apply: Callable[[Sequence[E]], list[int]],
    topic: str,
    send_dead_letter: Send,
) -> list[int]:
    """Process one batch of a feature topic: decode, dead-letter, apply, count.

    Parameters
    ----------
    batch
        Consumed messages (Faust events).
    cls
        Event class of the topic (:class:`JobStart` or :class:`JobFinish`).
    apply
        The store write for ``cls``.
    topic
        Topic name, the metrics label.
    send_dead_letter
        Sends one dead letter.

    Returns
    -------
    1 or 0 per valid event, in order (see :func:`apply_with_isolation`).
    """
    metrics.EVENTS_IN.labels(topic).inc(len(batch))
    metrics.BATCH_SIZE.labels(topic).observe(len(batch))
    decoded = decode_batch(cls, batch)
    await send_dead_letters(send_dead_letter, decoded.letters)
    if not decoded.events:
        return []
    applied = await apply_with_isolation(apply, decoded.events, decoded.sources, send_dead_letter)
    duplicates = len(applied) - sum(applied)
    if duplicates:
        metrics.DUPLICATES.labels(topic).inc(duplicates)
    now = time.time()
    for ev in decoded.events:
        metrics.FEATURE_FRESHNESS.observe(max(0.0, now - getattr(ev, "event_time", now)))
    return applied


def attach_feature_agents(app: faust.App, topics: dict[str, faust.TopicT], store: FeatureStore) -> None:
    """Agents that keep per-job and per-model-type features in Redis up to date."""
    send_dead_letter = topic_sender(topics[DEAD_LETTER.name])

    async def run(stream: Any, cls: type[E], apply: Callable[[Sequence[E]], list[int]], topic: str) -> None:
        async for batch in stream.take_events(*FEATURE_BATCH):
            await handle_feature_batch(batch, cls, apply, topic, send_dead_letter)

    @app.agent(topics[JOB_STARTS.name], name="leap.features.job-starts")
    async def job_starts(stream: Any) -> None:
        await run(stream, JobStart, store.apply_starts, JOB_STARTS.name)

    @app.agent(topics[JOB_FINISHES.name], name="leap.features.job-finishes")
    async def job_finishes(stream: Any) -> None:
        await run(stream, JobFinish, store.apply_finishes, JOB_FINISHES.name)
