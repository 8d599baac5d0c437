"""The feature agents: job starts, finishes and submissions in, Redis features updated, bad events
dead-lettered (submissions feed only the configuration aggregates; the predictor dead-letters them).

Events arrive in batches (:func:`streams.app.take_batches`) so that each batch is one pipelined
Redis round trip. A Redis outage is not a bad event: the batch waits, for as long as it lasts,
uncommitted (:func:`with_redis_retry`); an event Redis rejects is dead-lettered, so every event
is applied or dead-lettered before its offset is committed.
The Faust agents only loop over batches; :func:`handle_feature_batch` does the work of one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import faust
import redis

from features.store import FeatureStore
from streams import metrics
from streams.app import (
    Send,
    SourceEvent,
    SourceMessage,
    decode_batch,
    letter_for,
    run_batches,
    send_dead_letters,
    topic_sender,
)
from streams.deadletter import PROCESSING_ERROR
from streams.events import Event, JobFinish, JobStart, Submission
from streams.resilience import with_redis_retry
from streams.topics import DEAD_LETTER, JOB_FINISHES, JOB_STARTS, SUBMISSIONS

log = logging.getLogger("leap.features")

#: Batch limits: large enough to amortise a Redis round trip, short enough to keep latency low.
FEATURE_BATCH = (500, 0.05)

E = TypeVar("E", bound=Event)
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
    except Exception:
        # One by one finds the culprit. The pipeline ran every other script before raising, so
        # those events come back as duplicates (0) on the second pass.
        log.warning("a batch of %d was rejected; applying its events one by one", len(events), exc_info=True)
    results: list[int] = []
    for ev, msg in zip(events, sources, strict=True):
        try:
            results.extend(await with_redis_retry(apply, [ev]))
        except Exception as exc:
            what = "redis script failed" if isinstance(exc, redis.ResponseError) else type(exc).__name__
            await send_dead_letters(send_dead_letter, [letter_for(msg, PROCESSING_ERROR, f"{what}: {exc}")])
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


async def handle_submission_batch(batch: Sequence[SourceEvent], store: FeatureStore) -> list[int]:
    """Feed one batch of submissions to the configuration aggregates (:meth:`FeatureStore.apply_submissions`).

    The predictor owns the submissions topic's dead letters (it reads every submission too), so an
    invalid one is skipped here without a second letter; Redis refusing a batch is retried one
    submission at a time and a refused one skipped (its ranking goes out all the same).
    """
    decoded = decode_batch(Submission, batch)
    if not decoded.events:
        return []
    try:
        return list(await with_redis_retry(store.apply_submissions, decoded.events))
    except Exception:
        log.warning("configuration aggregates refused a batch of %d submissions; one by one", len(decoded.events),
                    exc_info=True)
    entered: list[int] = []
    for sub in decoded.events:
        try:
            entered.extend(await with_redis_retry(store.apply_submissions, [sub]))
        except Exception:
            log.warning("configuration aggregates refused submission %s", sub.event_id[:120], exc_info=True)
            entered.append(0)
    return entered


def attach_feature_agents(app: faust.App, topics: dict[str, faust.TopicT], store: FeatureStore) -> None:
    """Agents that keep per-job and per-model-type features in Redis up to date."""
    send_dead_letter = topic_sender(topics[DEAD_LETTER.name])

    async def run(stream: Any, cls: type[E], apply: Callable[[Sequence[E]], list[int]], topic: str) -> None:
        await run_batches(stream, FEATURE_BATCH, lambda batch: handle_feature_batch(
            batch, cls, apply, topic, send_dead_letter), f"features/{topic}")

    @app.agent(topics[JOB_STARTS.name], name="leap.features.job-starts")
    async def job_starts(stream: Any) -> None:
        await run(stream, JobStart, store.apply_starts, JOB_STARTS.name)

    @app.agent(topics[JOB_FINISHES.name], name="leap.features.job-finishes")
    async def job_finishes(stream: Any) -> None:
        await run(stream, JobFinish, store.apply_finishes, JOB_FINISHES.name)

    @app.agent(topics[SUBMISSIONS.name], name="leap.features.submissions")
    async def submissions(stream: Any) -> None:
        await run_batches(stream, FEATURE_BATCH, lambda batch: handle_submission_batch(batch, store),
                          f"features/{SUBMISSIONS.name}")
