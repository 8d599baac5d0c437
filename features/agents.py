"""The feature agents: job starts and finishes in, Redis features updated, bad events dead-lettered.

Events arrive in batches (``take_events``) so that each batch is one pipelined Redis round trip.
A Redis outage is not a bad event: the batch waits with back-off (:func:`with_redis_retry`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import faust
import redis
from faust.types import EventT

from features.store import FeatureStore
from streams import metrics
from streams.app import decode_batch, send_dead_letters
from streams.deadletter import dead_letter
from streams.events import Event, JobFinish, JobStart
from streams.topics import DEAD_LETTER, JOB_FINISHES, JOB_STARTS

log = logging.getLogger("leap.features")

#: Batch limits: large enough to amortise a Redis round trip, short enough to keep latency low.
FEATURE_BATCH = (500, 0.05)
#: Back-off while Redis is unreachable: events wait (never dead-lettered for an outage).
RETRY_DELAYS_S = (0.1, 0.5, 1.0, 2.0, 5.0)


async def with_redis_retry(fn: Any, *args: Any) -> Any:
    """Run a Redis call, waiting out connection failures instead of dropping the batch."""
    for delay in (*RETRY_DELAYS_S, None):
        try:
            return fn(*args)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if delay is None:
                raise
            log.warning("redis unavailable (%s); retrying in %.1fs", exc, delay)
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")


async def apply_with_isolation(
    apply: Any, events: Sequence[Any], batch: Sequence[EventT], dlq: faust.TopicT
) -> list[int]:
    """Apply a batch; if a script rejects it, apply one by one and dead-letter the culprits."""
    try:
        return list(await with_redis_retry(apply, events))
    except redis.ResponseError:
        results: list[int] = []
        by_id = {e.message.value: e.message for e in batch}
        for ev in events:
            try:
                results.extend(await with_redis_retry(apply, [ev]))
            except redis.ResponseError as exc:
                msg = by_id.get(ev.encode())
                letter = dead_letter(
                    msg.topic if msg else "unknown", msg.partition if msg else 0, msg.offset if msg else 0,
                    ev.job_key.encode(), ev.encode(), "processing_error", f"redis script failed: {exc}",
                )
                await send_dead_letters(dlq, [letter])
                results.append(0)
        return results


def attach_feature_agents(app: faust.App, topics: dict[str, faust.TopicT], store: FeatureStore) -> None:
    """Agents that keep per-job and per-model-type features in Redis up to date."""
    dlq = topics[DEAD_LETTER.name]

    async def run(stream: Any, cls: type[Event], apply: Any, topic: str) -> None:
        async for batch in stream.take_events(*FEATURE_BATCH):
            metrics.EVENTS_IN.labels(topic).inc(len(batch))
            metrics.BATCH_SIZE.labels(topic).observe(len(batch))
            good, letters = decode_batch(cls, batch)
            await send_dead_letters(dlq, letters)
            if not good:
                continue
            applied = await apply_with_isolation(apply, good, batch, dlq)
            duplicates = len(applied) - sum(applied)
            if duplicates:
                metrics.DUPLICATES.labels(topic).inc(duplicates)
            now = time.time()
            for ev in good:
                metrics.FEATURE_FRESHNESS.observe(max(0.0, now - getattr(ev, "event_time", now)))

    @app.agent(topics[JOB_STARTS.name], name="leap.features.job-starts")
    async def job_starts(stream: Any) -> None:
        await run(stream, JobStart, store.apply_starts, JOB_STARTS.name)

    @app.agent(topics[JOB_FINISHES.name], name="leap.features.job-finishes")
    async def job_finishes(stream: Any) -> None:
        await run(stream, JobFinish, store.apply_finishes, JOB_FINISHES.name)
