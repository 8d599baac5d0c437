"""The Faust app, the feature agents and the batch plumbing shared with the predictor agent.

Each worker role is its own consumer group (``leap-features``, ``leap-predictor``, or
``leap-all`` for both in one process): run either ``all`` or the separate roles, not both.
Agents take events in batches (``take_events``) so Redis sees one round trip per batch.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Sequence
from typing import Any, TypeVar

import faust
import redis
from faust.types import EventT

from features.store import FeatureStore
from leap.settings import Settings
from streams import metrics
from streams.deadletter import dead_letter
from streams.events import Event, EventError, JobFinish, JobStart
from streams.topics import ALL_TOPICS, DEAD_LETTER, JOB_FINISHES, JOB_STARTS, consumer_group

log = logging.getLogger("leap.streams")

E = TypeVar("E", bound=Event)

#: Batch limits: large enough to amortise a Redis round trip, short enough to keep latency low.
FEATURE_BATCH = (500, 0.05)
#: Back-off while Redis is unreachable: events wait (never dead-lettered for an outage).
RETRY_DELAYS_S = (0.1, 0.5, 1.0, 2.0, 5.0)


def _credentials(settings: Settings) -> Any:
    sec = settings.kafka_security
    protocol = sec.get("security.protocol", "PLAINTEXT").upper()
    if protocol == "PLAINTEXT":
        return None
    context = ssl.create_default_context(cafile=sec.get("ssl.ca.location")) if "SSL" in protocol else None
    if "SASL" in protocol:
        return faust.SASLCredentials(
            username=sec.get("sasl.username"),
            password=sec.get("sasl.password"),
            mechanism=sec.get("sasl.mechanism", "PLAIN"),
            ssl_context=context,
        )
    return faust.SSLCredentials(context)


def build_app(settings: Settings, role: str) -> tuple[faust.App, dict[str, faust.TopicT]]:
    """A Faust app for one worker role, with a raw-bytes channel per LEAP topic."""
    app = faust.App(
        consumer_group(role),
        broker=[f"kafka://{hp}" for hp in settings.kafka_bootstrap.split(",")],
        broker_credentials=_credentials(settings),
        store="memory://",
        web_enabled=False,
        topic_disable_leader=True,
        topic_allow_declare=False,  # topics come from streams.topics, never auto-created
        # A new feature group rebuilds state from the retained history; a new predictor group
        # starts at the end (nobody waits for rankings of old submissions any more).
        consumer_auto_offset_reset="latest" if role == "predictor" else "earliest",
        producer_linger_ms=5,
        broker_commit_every=500,
        broker_commit_interval=1.0,
    )
    topics = {
        t.name: app.topic(t.name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
        for t in ALL_TOPICS
    }

    @app.timer(interval=5.0)
    async def export_consumer_lag() -> None:
        # Faust's monitor already tracks end and read offsets per partition; publish the gap.
        monitor = app.monitor
        ends, reads = monitor.tp_end_offsets or {}, monitor.tp_read_offsets or {}
        for tp, end in ends.items():
            read = reads.get(tp)
            if read is not None:
                metrics.CONSUMER_LAG.labels(tp.topic, str(tp.partition)).set(max(0, end - read - 1))

    return app, topics


def decode_batch(cls: type[E], batch: Sequence[EventT]) -> tuple[list[E], list[Any]]:
    """Split a batch into valid events and dead letters (one per invalid message)."""
    good: list[E] = []
    letters = []
    for event in batch:
        msg = event.message
        try:
            good.append(cls.decode(msg.value))
        except EventError as exc:
            letters.append(dead_letter(msg.topic, msg.partition, msg.offset, msg.key, msg.value, exc.reason, str(exc)))
    return good, letters


async def send_dead_letters(topic: faust.TopicT, letters: Sequence[Any]) -> None:
    for letter in letters:
        await topic.send(key=letter.source_topic.encode(), value=letter.encode())
        metrics.DEAD_LETTERS.labels(letter.source_topic, letter.reason).inc()
        log.warning("dead letter %s[%d]@%d: %s", letter.source_topic, letter.partition, letter.offset, letter.error)
    if letters:
        metrics.EVENTS_OUT.labels(DEAD_LETTER.name).inc(len(letters))


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
