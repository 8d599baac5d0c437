"""End to end through a real ``leap worker all``: Kafka in, Redis state and rankings out.

500 submissions and 2,000 finishes with 5% duplicates, 5% out of order and 2% malformed:
exactly 500 rankings, Redis equal to an expectation computed here from the events alone
(independently of the Lua scripts and of ``features.offline``), every malformed message in the
dead-letter topic with its reason.
"""

from __future__ import annotations

import base64
import random
import statistics
import time
from collections import defaultdict
from typing import Any

import orjson
import pytest
import redis
from confluent_kafka import Consumer, TopicPartition

from features.keys import JOB_WINDOW, LOOKUP_WINDOW, KeyLayout
from leap.core.settings import Settings
from leap.services.workers import WorkerProcess
from streams.client import SchedulerClient
from streams.events import MAX_EVENT_BYTES, DeadLetter, Ranking
from streams.topics import DEAD_LETTER, JOB_FINISHES, SUBMISSIONS
from tests.factories import T0, finish_dict, submission_dict

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

HARDWARE = ("H100-SXM", "A100-80GB", "MI300X", "TPU-v5p")
N_JOBS, N_MODELS = 100, 20


def _events(run: str, rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    finishes = []
    for i in range(2000):
        job = f"{run}-job{i % N_JOBS}"
        model = (i % N_JOBS) % N_MODELS
        outcome = rng.choices(("completed", "failed", "preempted"), (0.9, 0.05, 0.05))[0]
        tput = None if outcome == "failed" else round(rng.uniform(50, 5000), 3)
        finishes.append(
            finish_dict(job, f"{run}-f{i}", T0 + i * 7.5, rng.choice(HARDWARE), tput,
                        model_type=f"{run}-m{model}", family=f"{run}-fam{model}", outcome=outcome)
        )
    subs = [
        submission_dict(f"{run}-job{i % N_JOBS}", i, event_id=f"{run}-s{i}", attempt_id=f"{run}-a{i}",
                        model_type=f"{run}-m{(i % N_JOBS) % N_MODELS}", event_time=T0 + 20000 + i)
        for i in range(500)
    ]
    return finishes, subs


def _malformed(run: str, tag: str, good: dict[str, Any], number: str, count: int) -> list[tuple[str, bytes, str]]:
    """(key, value, expected reason): every kind of bad input, cycled to ``count`` messages."""
    body = orjson.dumps(good)[:-1]
    cases: list[tuple[bytes, str]] = [
        (b"{not json", "bad_json"),
        (orjson.dumps({**good, number: "fast"}), "bad_field"),
        (orjson.dumps({**good, number: -3.0}), "out_of_range"),
        (body + b',"%s":NaN}' % number.encode(), "bad_json"),
        (body + b',"%s":1e400}' % number.encode(), "bad_json"),  # JSON cannot carry infinity either
        (orjson.dumps({**good, "schema_version": 99}), "unknown_schema_version"),
        (orjson.dumps({k: v for k, v in good.items() if k != "job_key"}), "missing_field"),
        (orjson.dumps({**good, "pad": "x" * (MAX_EVENT_BYTES + 10)}), "oversize"),
    ]
    return [(f"{run}-{tag}{i}", *cases[i % len(cases)]) for i in range(count)]


def _median_window(entries: list[tuple[float, str, float]], limit: int) -> tuple[list[tuple[float, str, float]], float]:
    window = sorted(entries)[-limit:]
    return window, statistics.median(v for _, _, v in window)


def _expected_state(finishes: list[dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    distinct = {f["event_id"]: f for f in finishes}.values()
    per_job: dict[str, dict[str, list[tuple[float, str, float]]]] = defaultdict(lambda: defaultdict(list))
    counters: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    per_agg: dict[str, dict[str, list[tuple[float, str, float]]]] = defaultdict(lambda: defaultdict(list))
    for f in distinct:
        counters[f["job_key"]][f["outcome"]] += 1
        if f["throughput"] is None:
            continue
        entry = (f["event_time"], f["event_id"], f["throughput"] / f["num_accelerators"])
        per_job[f["job_key"]][f["hardware"]].append(entry)
        per_agg["m:" + f["model_type"]][f["hardware"]].append(entry)
        per_agg["f:" + f["family"]][f["hardware"]].append(entry)
    jobs: dict[str, dict[str, Any]] = {}
    for job, counts in counters.items():
        state: dict[str, Any] = {f"_{k}": v for k, v in counts.items()}
        for hw, entries in per_job[job].items():
            window, med = _median_window(entries, JOB_WINDOW)
            state[hw] = (len(entries), window[-1][0], window[-1][2], med)
        jobs[job] = state
    aggs: dict[str, dict[str, Any]] = {}
    for agg, by_hw in per_agg.items():
        aggs[agg] = {}
        for hw, entries in by_hw.items():
            assert len(entries) <= LOOKUP_WINDOW  # so the expected count is exact
            aggs[agg][hw] = (len(entries), _median_window(entries, LOOKUP_WINDOW)[1])
    return jobs, aggs


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _read_job(rds: redis.Redis, key: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field, value in rds.hgetall(key).items():
        name, text = _text(field), _text(value)
        if name.startswith("_"):
            if name in ("_completed", "_failed", "_preempted"):
                out[name] = int(text)
            continue
        n, t, last, robust = text.split(",")
        out[name] = (int(n), float(t), float(last), float(robust))
    return out


def _dead_letters_since(
    settings: Settings, since_ms: int, keys: set[str], timeout: float = 60
) -> dict[str, DeadLetter]:
    consumer = Consumer(settings.confluent_config(**{"group.id": "leap-test-unused", "enable.auto.commit": False}))
    parts = consumer.list_topics(DEAD_LETTER.name, timeout=10).topics[DEAD_LETTER.name].partitions
    offsets = consumer.offsets_for_times([TopicPartition(DEAD_LETTER.name, p, since_ms) for p in parts], timeout=10)
    consumer.assign(offsets)
    found: dict[str, DeadLetter] = {}
    deadline = time.monotonic() + timeout
    while keys - found.keys() and time.monotonic() < deadline:
        for msg in consumer.consume(500, timeout=0.5):
            if msg.error():
                continue
            letter = DeadLetter.decode(msg.value())
            if letter.key in keys:
                found[letter.key] = letter
    consumer.close()
    return found


def _publish_order(
    finishes: list[dict[str, Any]], bad_finishes: list[tuple[str, bytes, str]], rng: random.Random
) -> list[dict[str, Any]]:
    """The finishes as published: 5% late, 5% duplicated, the malformed ones mixed in (``_raw``)."""
    order = list(finishes)
    # 5% out of order: move events far later than their event time says
    late = rng.sample(range(len(order)), 100)
    tail = [order[i] for i in sorted(late)]
    order = [f for i, f in enumerate(order) if i not in set(late)] + tail
    # 5% duplicates, re-sent at random later positions
    for dup in rng.sample(finishes, 100):
        order.insert(rng.randrange(len(order) // 2, len(order)), dup)
    for bad in bad_finishes:
        order.insert(rng.randrange(len(order) + 1), {"_raw": bad})
    return order


def _publish_finishes(client: SchedulerClient, order: list[dict[str, Any]]) -> None:
    for f in order:
        if "_raw" in f:
            client.publish_raw(JOB_FINISHES.name, f["_raw"][0], f["_raw"][1])
        else:
            client.publish_raw(JOB_FINISHES.name, f["job_key"], orjson.dumps(f))
    client.flush()


def _assert_redis_state(
    rds: redis.Redis, layout: KeyLayout, finishes: list[dict[str, Any]], worker: WorkerProcess
) -> None:
    """Wait (up to 120 s) for the job hashes and the lookups to match the expectation.

    The lookups are written in a second round trip, after the job scripts accepted their events
    (features/store.py), so for a moment a job's hash can be ahead of its lookups: wait for both.
    """
    expected_jobs, expected_aggs = _expected_state(finishes)

    def lookups() -> dict[str, dict[str, tuple[int, float]]]:
        out = {}
        for agg in expected_aggs:
            kind, name = agg.split(":", 1)
            key = layout.lookup_model(name) if kind == "m" else layout.lookup_family(name)
            stored = {_text(k): _text(v).split(",") for k, v in rds.hgetall(key).items()}
            out[agg] = {hw: (int(n), float(m)) for hw, (n, m) in stored.items()}
        return out

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        actual = {job: _read_job(rds, layout.job(job)) for job in expected_jobs}
        aggs = lookups()
        if actual == expected_jobs and aggs == expected_aggs:
            break
        time.sleep(0.5)
    assert actual == expected_jobs, worker.log_tail()
    assert aggs == expected_aggs


def _rank_submissions(
    client: SchedulerClient, subs: list[dict[str, Any]], bad_subs: list[tuple[str, bytes, str]]
) -> list[Ranking]:
    """Publish the submissions (a malformed one every 50) and collect every ranking of them."""
    for i, s in enumerate(subs):
        client.publish_raw(SUBMISSIONS.name, s["job_key"], orjson.dumps(s))
        if i % 50 == 0:
            key, value, _ = bad_subs[i // 50]
            client.publish_raw(SUBMISSIONS.name, key, value)
    client.flush()
    wanted = {s["attempt_id"] for s in subs}
    seen: list[Ranking] = []
    deadline = time.monotonic() + 120
    while len({r.attempt_id for r in seen}) < len(wanted) and time.monotonic() < deadline:
        seen.extend(r for r, _ in client.rankings(timeout=1.0) if r.attempt_id in wanted)
    # a little longer: a duplicate ranking would show up now
    seen.extend(r for r, _ in client.rankings(timeout=2.0) if r.attempt_id in wanted)
    return seen


def _assert_rankings(seen: list[Ranking], subs: list[dict[str, Any]]) -> None:
    """Exactly one ranking per submission, each of its own candidates and submission."""
    assert len(seen) == 500 and {r.attempt_id for r in seen} == {s["attempt_id"] for s in subs}
    by_attempt = {r.attempt_id: r for r in seen}
    for s in subs:
        ranking = by_attempt[s["attempt_id"]]
        assert [c["hardware"] for c in ranking.candidates if c["rank"] is not None]
        assert ranking.best_hardware in s["candidates"]
        assert ranking.submission_event_id == s["event_id"]


def _assert_dead_letters(settings: Settings, since_ms: int, bad: list[tuple[str, bytes, str]]) -> None:
    """Every malformed message dead-lettered, with its reason and its bytes."""
    expected_letters = {key: reason for key, _, reason in bad}
    letters = _dead_letters_since(settings, since_ms, set(expected_letters))
    assert set(letters) == set(expected_letters)
    raw_by_key = {key: value for key, value, _ in bad}
    for key, letter in letters.items():
        assert letter.reason == expected_letters[key], letter.error
        assert letter.error
        assert letter.source_topic in (JOB_FINISHES.name, SUBMISSIONS.name)
        assert base64.b64decode(letter.raw_base64 or "") == raw_by_key[key]


def test_end_to_end(settings: Settings, worker: WorkerProcess, rds: redis.Redis, run_id: str) -> None:
    rng = random.Random(7)
    finishes, subs = _events(run_id, rng)
    # _malformed draws nothing from rng, so the publish order is the same as if built first
    bad_finishes = _malformed(run_id, "badfin", finishes[0], "throughput", 40)
    bad_subs = _malformed(run_id, "badsub", subs[0], "params", 10)
    order = _publish_order(finishes, bad_finishes, rng)
    since_ms = int(time.time() * 1000) - 1000

    with SchedulerClient(settings) as client:
        _publish_finishes(client, order)
        _assert_redis_state(rds, KeyLayout(settings.key_prefix), finishes, worker)
        seen = _rank_submissions(client, subs, bad_subs)

    _assert_rankings(seen, subs)
    _assert_dead_letters(settings, since_ms, bad_finishes + bad_subs)


def test_a_client_follows_only_the_deployment_it_names(settings: Settings, worker: WorkerProcess,
                                                        run_id: str) -> None:
    """Rankings carry their deployment's key prefix in a header: a scheduler naming its deployment
    gets that deployment's rankings and none of another's that shares the broker."""
    subs = [submission_dict(f"{run_id}-dep-job{i}", i, event_id=f"{run_id}-dep-s{i}",
                            attempt_id=f"{run_id}-dep-a{i}", event_time=T0 + i) for i in range(20)]
    wanted = {s["attempt_id"] for s in subs}
    with SchedulerClient(settings, deployment=settings.key_prefix) as ours, \
            SchedulerClient(settings, deployment=f"{settings.key_prefix}-elsewhere") as theirs:
        for s in subs:
            ours.publish_raw(SUBMISSIONS.name, s["job_key"], orjson.dumps(s))
        ours.flush()
        got = ours.wait_for(wanted, timeout=60)
        assert got.keys() == wanted
        assert all(r.model_version for r, _ in got.values())
        assert not [r for r, _ in theirs.rankings(timeout=2.0) if r.attempt_id in wanted]
