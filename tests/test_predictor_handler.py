"""The predictor's batch logic (:func:`predictor.handler.handle_submissions`), without a worker:
consumed batches in, rankings and dead letters out, on the real redis-server."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import redis

from features.keys import KeyLayout
from features.store import FeatureStore
from leap.core.hardware import load_catalogue
from predictor.handler import handle_submissions
from predictor.models import LookupTable
from predictor.ranking import COLD_START
from predictor.service import ActiveModel, ModelHolder, RankingService
from streams.events import DeadLetter, Ranking
from streams.topics import DEAD_LETTER, RANKINGS, SUBMISSIONS
from tests.factories import (
    Outbox,
    client_without_retries,
    consumed,
    free_port,
    late_redis_server,
    metric,
    submission,
    submission_dict,
)

pytestmark = pytest.mark.integration

CAT = load_catalogue()


@pytest.fixture
def store(rds: redis.Redis, run_id: str) -> Iterator[FeatureStore]:
    fs = FeatureStore(rds, KeyLayout(f"test-{run_id}"), canonicalize=CAT.canonical)
    yield fs
    fs.delete_all()


def service_on(store: FeatureStore) -> RankingService:
    return RankingService(store, CAT, ModelHolder(ActiveModel(LookupTable(), "lookup-test")))


def counters() -> dict[str, float]:
    """The metrics the predictor moves."""
    return {
        "in": metric("leap_events_in_total", topic=SUBMISSIONS.name),
        "batches": metric("leap_batch_size_count", topic=SUBMISSIONS.name),
        "rankings": metric("leap_events_out_total", topic=RANKINGS.name),
        "letters": metric("leap_events_out_total", topic=DEAD_LETTER.name),
        "bad_json": metric("leap_dead_letters_total", topic=SUBMISSIONS.name, reason="bad_json"),
        "missing_field": metric("leap_dead_letters_total", topic=SUBMISSIONS.name, reason="missing_field"),
        "inconsistent": metric("leap_dead_letters_total", topic=SUBMISSIONS.name, reason="inconsistent"),
        "latencies": metric("leap_prediction_latency_seconds_count"),
        "cold_starts": metric("leap_ranking_fallbacks_total", reason=COLD_START),
    }


def changed(before: dict[str, float]) -> dict[str, float]:
    return {k: v - before[k] for k, v in counters().items() if v != before[k]}


async def test_one_ranking_per_valid_submission_and_one_dead_letter_per_bad_message(
    store: FeatureStore, run_id: str
) -> None:
    subs = [submission(f"{run_id}-{k}", i) for i, k in enumerate("abc")]
    missing = submission_dict(f"{run_id}-m", 9)
    del missing["global_batch_size"]  # params and the like may be unknown; the batch may not
    inconsistent = submission_dict(f"{run_id}-x", 10, num_accelerators=16)  # 8 x 1 x 1 parallel
    items: list[tuple[bytes | None, bytes | None]] = [
        (subs[0].job_key.encode(), subs[0].encode()),
        (b"junk", b"{not json"),
        (subs[1].job_key.encode(), subs[1].encode()),
        (b"m", orjson.dumps(missing)),
        (None, None),
        (b"x", orjson.dumps(inconsistent)),
        (subs[2].job_key.encode(), subs[2].encode()),
    ]
    rankings_out, letters_out = Outbox(), Outbox()
    before = counters()
    rankings = await handle_submissions(consumed(SUBMISSIONS.name, items, partition=2, first_offset=40),
                                        service_on(store), rankings_out, letters_out)

    assert [Ranking.decode(v) for v in rankings_out.values()] == rankings
    assert [r.submission_event_id for r in rankings] == [s.event_id for s in subs]
    assert rankings_out.keys() == [s.job_key.encode() for s in subs]

    letters = [DeadLetter.decode(v) for v in letters_out.values()]
    assert letters_out.keys() == [SUBMISSIONS.name.encode()] * 4
    assert [(d.source_topic, d.partition, d.offset, d.reason, d.key) for d in letters] == [
        (SUBMISSIONS.name, 2, 41, "bad_json", "junk"),
        (SUBMISSIONS.name, 2, 43, "missing_field", "m"),
        (SUBMISSIONS.name, 2, 44, "bad_json", None),
        (SUBMISSIONS.name, 2, 45, "inconsistent", "x"),
    ]
    raw = [base64.b64decode(d.raw_base64) if d.raw_base64 is not None else None for d in letters]
    assert raw == [b"{not json", orjson.dumps(missing), None, orjson.dumps(inconsistent)]
    # An empty store: the lookup table knows nothing, so every ranking is a roofline cold start.
    assert changed(before) == {"in": 7, "batches": 1, "rankings": 3, "letters": 4, "bad_json": 2,
                               "missing_field": 1, "inconsistent": 1, "latencies": 3, "cold_starts": 3}


async def test_a_batch_without_a_valid_submission_never_reaches_redis(run_id: str) -> None:
    # Nothing listens on this store's port: a Redis call would wait out every retry, then raise.
    store = FeatureStore(client_without_retries(free_port()), KeyLayout(f"test-{run_id}"))
    rankings_out, letters_out = Outbox(), Outbox()
    batch = consumed(SUBMISSIONS.name, [(b"k", b"[]"), (b"k", b"null")])
    started = time.monotonic()
    assert await handle_submissions(batch, service_on(store), rankings_out, letters_out) == []
    assert time.monotonic() - started < 0.1  # shorter than the first retry delay
    assert rankings_out.sent == [] and len(letters_out.sent) == 2


async def test_a_redis_outage_holds_the_batch_until_redis_is_back(run_id: str, tmp_path: Path) -> None:
    port = free_port()
    store = FeatureStore(client_without_retries(port), KeyLayout(f"test-{run_id}"), canonicalize=CAT.canonical)
    with pytest.raises(redis.ConnectionError):
        store.client.ping()  # Redis is down when the batch arrives
    subs = [submission(f"{run_id}-{i}", i) for i in range(3)]
    batch = consumed(SUBMISSIONS.name, [(s.job_key.encode(), s.encode()) for s in subs])
    rankings_out, letters_out = Outbox(), Outbox()
    with late_redis_server(port, after_s=0.3, workdir=tmp_path) as server:
        rankings = await asyncio.wait_for(handle_submissions(batch, service_on(store), rankings_out, letters_out),
                                          timeout=30)
    assert "up" in server
    # Ranked once: one ranking per submission, all built and sent after Redis came up.
    assert [Ranking.decode(v).submission_event_id for v in rankings_out.values()] == [s.event_id for s in subs]
    assert all(sent_at >= server["started"] for _, _, sent_at in rankings_out.sent)
    assert all(r.event_time >= server["started"] for r in rankings)
    assert letters_out.sent == []  # an outage is not a bad message
