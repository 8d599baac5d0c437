"""The feature agents' batch logic (:func:`features.agents.handle_feature_batch`), without a worker:
consumed batches in, Redis updated and dead letters out, on the real redis-server."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import orjson
import pytest
import redis

from features.agents import handle_feature_batch
from features.keys import KeyLayout
from features.store import FeatureStore
from leap.core.hardware import load_catalogue
from streams.deadletter import PROCESSING_ERROR
from streams.events import DeadLetter, JobFinish, JobStart
from streams.topics import DEAD_LETTER, JOB_FINISHES, JOB_STARTS
from tests.factories import (
    T0,
    Outbox,
    client_without_retries,
    consumed,
    finish,
    finish_dict,
    free_port,
    late_redis_server,
    metric,
    start,
    submission,
)

pytestmark = pytest.mark.integration

CAT = load_catalogue()
E = TypeVar("E", JobStart, JobFinish)


@pytest.fixture
def store(rds: redis.Redis, run_id: str) -> Iterator[FeatureStore]:
    fs = FeatureStore(rds, KeyLayout(f"test-{run_id}"), canonicalize=CAT.canonical)
    yield fs
    fs.delete_all()


def keyed(events: list[JobFinish] | list[JobStart]) -> list[tuple[bytes | None, bytes | None]]:
    """Messages as the scheduler client produces them: keyed by job."""
    return [(ev.job_key.encode(), ev.encode()) for ev in events]


def letters_of(outbox: Outbox) -> list[DeadLetter]:
    assert outbox.keys() == [DeadLetter.decode(v).source_topic.encode() for v in outbox.values()]
    return [DeadLetter.decode(v) for v in outbox.values()]


async def test_valid_events_are_applied_and_bad_messages_dead_lettered(store: FeatureStore, run_id: str) -> None:
    job = f"{run_id}-j"
    good = [finish(job, "e1", T0, "H100-SXM", 800.0), finish(job, "e2", T0 + 1, "A100-80GB", 400.0)]
    backwards = finish_dict(job, "e3", T0 + 2, "L4", 10.0)
    backwards["start_time"] = T0 + 10  # started after it finished
    items = [keyed(good)[0], (b"k", b"\xff\xfe"), (job.encode(), orjson.dumps(backwards)), keyed(good)[1]]
    letters_out = Outbox()
    before = {
        "in": metric("leap_events_in_total", topic=JOB_FINISHES.name),
        "out": metric("leap_events_out_total", topic=DEAD_LETTER.name),
        "fresh": metric("leap_feature_freshness_seconds_count"),
    }
    applied = await handle_feature_batch(consumed(JOB_FINISHES.name, items, partition=1, first_offset=7),
                                         JobFinish, store.apply_finishes, JOB_FINISHES.name, letters_out)
    assert applied == [1, 1]
    snap = store.read([submission(job, 1)])[0]
    assert (snap.prior["H100-SXM"].n, snap.prior["A100-80GB"].n, "L4" in snap.prior) == (1, 1, False)
    assert [(d.source_topic, d.partition, d.offset, d.reason) for d in letters_of(letters_out)] == [
        (JOB_FINISHES.name, 1, 8, "bad_json"), (JOB_FINISHES.name, 1, 9, "inconsistent"),
    ]
    assert metric("leap_events_in_total", topic=JOB_FINISHES.name) - before["in"] == 4
    assert metric("leap_events_out_total", topic=DEAD_LETTER.name) - before["out"] == 2
    assert metric("leap_feature_freshness_seconds_count") - before["fresh"] == 2


async def deliver_twice(event: E, cls: type[E], apply: Callable[[Sequence[E]], list[int]], topic: str) -> None:
    """The same event twice in one batch, then once more (redelivered after a restart)."""
    duplicates = metric("leap_duplicate_events_total", topic=topic)
    letters_out = Outbox()
    raw = (event.job_key.encode(), event.encode())
    assert await handle_feature_batch(consumed(topic, [raw, raw]), cls, apply, topic, letters_out) == [1, 0]
    assert await handle_feature_batch(consumed(topic, [raw], first_offset=2), cls, apply, topic, letters_out) == [0]
    assert metric("leap_duplicate_events_total", topic=topic) - duplicates == 2
    assert letters_out.sent == []


async def test_duplicate_starts_are_counted_and_applied_once(store: FeatureStore, run_id: str) -> None:
    await deliver_twice(start(f"{run_id}-j", "s1", T0, "MI300X"), JobStart, store.apply_starts, JOB_STARTS.name)
    assert store.read([submission(f"{run_id}-j", 1)])[0].starts == 1


async def test_duplicate_finishes_are_counted_and_applied_once(store: FeatureStore, run_id: str) -> None:
    event = finish(f"{run_id}-j", "f1", T0, "MI300X", 80.0)
    await deliver_twice(event, JobFinish, store.apply_finishes, JOB_FINISHES.name)
    snap = store.read([submission(f"{run_id}-j", 1)])[0]
    assert (snap.completed, snap.prior["MI300X"].n) == (1, 1)


async def test_an_event_a_script_rejects_is_dead_lettered_and_the_rest_applied(
    store: FeatureStore, rds: redis.Redis, run_id: str
) -> None:
    ok_a = finish(f"{run_id}-a", "a1", T0, "H100-SXM", 800.0)
    poison = finish(f"{run_id}-p", "p1", T0, "H100-SXM", 800.0)
    ok_b = finish(f"{run_id}-b", "b1", T0, "L4", 80.0)
    # The poison job's de-duplication key holds a string, so its script's SADD fails (WRONGTYPE).
    rds.set(store.layout.job_seen(poison.job_key), "not a set")
    letters_out = Outbox()
    batch = consumed(JOB_FINISHES.name, keyed([ok_a, poison, ok_b]), partition=4, first_offset=100)
    applied = await handle_feature_batch(batch, JobFinish, store.apply_finishes, JOB_FINISHES.name, letters_out)

    assert len(applied) == 3 and applied[1] == 0
    [letter] = letters_of(letters_out)
    assert (letter.source_topic, letter.partition, letter.offset, letter.key) == (
        JOB_FINISHES.name, 4, 101, poison.job_key)
    assert letter.reason == PROCESSING_ERROR and letter.error.startswith("redis script failed")
    assert letter.raw_base64 is not None and base64.b64decode(letter.raw_base64) == poison.encode()
    snaps = store.read([submission(ok_a.job_key, 1), submission(ok_b.job_key, 2)])
    assert (snaps[0].prior["H100-SXM"].n, snaps[1].prior["L4"].n) == (1, 1)  # applied, once each


async def test_a_redis_outage_holds_the_batch_until_redis_is_back(run_id: str, tmp_path: Path) -> None:
    port = free_port()
    store = FeatureStore(client_without_retries(port), KeyLayout(f"test-{run_id}"), canonicalize=CAT.canonical)
    with pytest.raises(redis.ConnectionError):
        store.client.ping()  # Redis is down when the batch arrives
    events = [finish(f"{run_id}-j", "e1", T0, "H100-SXM", 800.0), finish(f"{run_id}-j", "e2", T0 + 1, "T4", 8.0)]
    letters_out = Outbox()
    with late_redis_server(port, after_s=0.3, workdir=tmp_path) as server:
        applied = await asyncio.wait_for(handle_feature_batch(consumed(JOB_FINISHES.name, keyed(events)), JobFinish,
                                                              store.apply_finishes, JOB_FINISHES.name, letters_out),
                                         timeout=30)
        snap = store.read([submission(f"{run_id}-j", 1)])[0]
    assert "up" in server
    assert applied == [1, 1] and letters_out.sent == []  # waited, applied once, nothing dead-lettered
    assert (snap.prior["H100-SXM"].n, snap.prior["T4"].n) == (1, 1)
