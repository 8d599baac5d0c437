"""What the store does with what it must not write or cannot read, on the real redis-server.

The scripts check everything before they write anything: a refused event leaves no trace (no
seen-set entry, no counter, no window, no aggregate), so its retry is refused again instead of
being taken for a duplicate, and the agent dead-letters it. Reads degrade one corrupt job to its
fallback instead of failing the batch of other jobs it is read with.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
import redis
from prometheus_client import REGISTRY

from features.agents import apply_with_isolation
from features.layout import REJECTED
from features.store import UNREADABLE_JOB, FeatureStore
from leap.core.hardware import load_catalogue
from predictor.models import LookupTable
from predictor.service import ActiveModel, ModelHolder, RankingService
from streams.deadletter import PROCESSING_ERROR
from streams.events import DeadLetter, JobFinish
from tests.factories import T0, ConsumedMessage, finish, start, submission

pytestmark = pytest.mark.integration

CAT = load_catalogue()


def _keys(store: FeatureStore, job: str) -> dict[str, Any]:
    """Everything stored about one job and the aggregates its finishes feed."""
    lay, c = store.layout, store.client
    return {
        "job": c.hgetall(lay.job(job)), "window": c.hgetall(lay.job_window(job)),
        "seen": c.smembers(lay.job_seen(job)), "outbox": c.hgetall(lay.job_outbox(job)),
        "lookup": c.hgetall(lay.lookup_model("llama-7b")), "family": c.hgetall(lay.lookup_family("dense_lm")),
        "pairs": c.hgetall(lay.pairs("all", None)),
    }


def _unreadable(kind: str) -> float:
    return REGISTRY.get_sample_value("leap_unreadable_features_total", {"kind": kind}) or 0.0


def _poison(store: FeatureStore, job: str) -> None:
    """What a finish on hardware ``_starts`` left before the contracts refused it: a job field
    where the starts counter belongs."""
    store.client.hset(store.layout.job(job), "_starts", f"1,{T0!r},5.0,5.0")


def test_a_finish_on_a_corrupt_counter_leaves_no_trace_and_is_refused_again(store: FeatureStore) -> None:
    store.apply_finishes([finish("j", "e0", T0, "A100-80GB", 80.0)])  # a prior: the finish would pair
    store.client.hset(store.layout.job("j"), "_completed", "not a number")
    before = _keys(store, "j")
    for _ in range(2):  # the retry is judged again, never taken for a duplicate
        with pytest.raises(redis.ResponseError, match=REJECTED):
            store.apply_finishes([finish("j", "e1", T0 + 1, "H100-SXM", 800.0)])
        assert _keys(store, "j") == before


def test_a_start_on_a_poisoned_counter_is_refused_without_a_trace(store: FeatureStore) -> None:
    _poison(store, "j")
    before = _keys(store, "j")
    for _ in range(2):
        with pytest.raises(redis.ResponseError, match=f"{REJECTED}.*not a count"):
            store.apply_starts([start("j", "s1", T0, "L4")])
        assert _keys(store, "j") == before


@pytest.mark.parametrize("where", ["field", "window"])
def test_a_finish_over_an_unreadable_field_or_window_is_refused(store: FeatureStore, where: str) -> None:
    store.apply_finishes([finish("j", "e0", T0, "H100-SXM", 800.0)])
    key = store.layout.job("j") if where == "field" else store.layout.job_window("j")
    store.client.hset(key, "H100-SXM", "garbage")
    before = _keys(store, "j")
    with pytest.raises(redis.ResponseError, match=f"{REJECTED}.*unreadable"):
        store.apply_finishes([finish("j", "e1", T0 + 1, "H100-SXM", 900.0)])
    assert _keys(store, "j") == before


def test_the_scripts_refuse_a_reserved_hardware_name_even_past_the_contracts(store: FeatureStore) -> None:
    """The contracts refuse ``_starts`` as hardware; the scripts refuse it too, for any other writer."""
    store.apply_starts([start("j", "s1", T0, "L4")])
    bad = dataclasses.replace(finish("j", "e1", T0 + 1, "L4", 10.0), hardware="_starts")
    before = _keys(store, "j")
    with pytest.raises(redis.ResponseError, match=f"{REJECTED}.*counter marker"):
        store.apply_finishes([bad])
    assert _keys(store, "j") == before
    assert store.read([submission("j", 1)])[0].starts == 1


def test_a_refused_finish_feeds_no_aggregate_and_its_batch_mates_are_applied(store: FeatureStore) -> None:
    """The agent's path: the batch is refused, then applied one by one; only the culprit is
    dead-lettered, the others land once, and no lookup or pair window sees the culprit."""
    store.apply_finishes([finish("bad", "b0", T0, "A100-80GB", 80.0), finish("ok", "o0", T0, "A100-80GB", 80.0)])
    store.client.hset(store.layout.job("bad"), "_completed", "x")
    batch = [finish("ok", "o1", T0 + 1, "H100-SXM", 800.0), finish("bad", "b1", T0 + 1, "H100-SXM", 700.0),
             finish("ok2", "k1", T0 + 1, "H100-SXM", 900.0)]
    sources = [ConsumedMessage("leap.job-finishes", 0, i, ev.job_key.encode(), ev.encode())
               for i, ev in enumerate(batch)]
    letters: list[DeadLetter] = []

    async def send(_key: bytes, value: bytes) -> None:
        letters.append(DeadLetter.decode(value))

    applied = asyncio.run(apply_with_isolation(store.apply_finishes, batch, sources, send))
    assert [(dl.reason, dl.offset) for dl in letters] == [(PROCESSING_ERROR, 1)]
    assert REJECTED in letters[0].error and "_completed" in letters[0].error
    assert applied == [0, 0, 0]  # the first pass applied the good ones; the second found them done
    lay = store.layout
    window = store.client.hget(lay.window_of(lay.lookup_model("llama-7b")), "H100-SXM") or b""
    assert b" o1 " in window and b" k1 " in window and b" b1 " not in window
    stored = store.client.hgetall(lay.pairs("all", None)).values()
    pair_windows = b"".join(v if isinstance(v, bytes) else v.encode() for v in stored)
    assert b" o1 " in pair_windows and b" b1 " not in pair_windows
    assert store.client.sismember(lay.job_seen("bad"), "b1") == 0
    assert store.read([submission("ok", 1)])[0].prior["H100-SXM"].n == 1


def test_one_corrupt_job_falls_back_and_its_batch_mates_are_ranked(store: FeatureStore) -> None:
    store.apply_finishes([finish(job, f"{job}-e", T0, "H100-SXM", 800.0) for job in ("a", "poisoned", "b")])
    _poison(store, "poisoned")
    store.client.hset(store.layout.lookup_model("llama-7b"), "L4", "unreadable")
    jobs, lookups = _unreadable("job"), _unreadable("lookup")
    subs = [submission(job, i) for i, job in enumerate(("a", "poisoned", "b"))]
    snaps = store.read(subs)
    assert [bool(s.prior) for s in snaps] == [True, False, True]
    assert [s.fallback for s in snaps] == [None, UNREADABLE_JOB, None]
    assert all("H100-SXM" in s.lookup_model and "L4" not in s.lookup_model for s in snaps)
    assert (_unreadable("job") - jobs, _unreadable("lookup") - lookups) == (1, 1)
    service = RankingService(store, CAT, ModelHolder(ActiveModel(LookupTable(), "lookup-test")))
    rankings = service.rank(subs)
    assert [r.attempt_id for r in rankings] == [s.attempt_id for s in subs]
    assert UNREADABLE_JOB in (rankings[1].fallback or "")
    assert all(UNREADABLE_JOB not in (r.fallback or "") for r in (rankings[0], rankings[2]))


def test_a_refused_event_can_be_applied_once_the_state_is_repaired(store: FeatureStore) -> None:
    """Nothing of the refused attempt lingers: after a repair the same event applies, once."""
    _poison(store, "j")
    ev: JobFinish = finish("j", "e1", T0, "H100-SXM", 800.0)
    with pytest.raises(redis.ResponseError):
        store.apply_starts([start("j", "s1", T0 - 10, "H100-SXM")])
    store.client.hdel(store.layout.job("j"), "_starts")
    assert store.apply_starts([start("j", "s1", T0 - 10, "H100-SXM")]) == [1]
    assert store.apply_finishes([ev]) == [1]
    assert store.apply_finishes([ev]) == [0]
    snap = store.read([submission("j", 1)])[0]
    assert (snap.starts, snap.prior["H100-SXM"].n) == (1, 1)
