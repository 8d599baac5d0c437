"""``pytest -m fuzz``: generated events of every kind the contracts accept and reject.

Two layers. In process, properties of the contracts: every valid event, however a foreign
producer serialised it, decodes to the same event as its payload and round-trips through our
encoding, and the published JSON Schema accepts it; every invalid one is refused with the reason
it must get (its dead letter carries it byte for byte), and the schema refuses it too where a
schema can tell (one field wrong; cross-field rules only the code knows). Every valid start and
finish applies once in the store's scripts, on one server and on a Redis Cluster. Through a real ``leap worker
all``: the generated messages are produced raw by a foreign producer (confluent-kafka), and then
every invalid one is on the dead-letter topic with its reason, its original bytes and its
coordinates, every valid submission has a ranking, every valid start and finish was applied,
and the worker neither crashed nor restarted.

``LEAP_FUZZ_EXAMPLES`` (default 1,000; 10,000 for a long run) is the number of examples per
property and of messages through the worker. It is read here: only this suite uses it.
"""

from __future__ import annotations

import base64
import dataclasses
import itertools
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from features.keys import KeyLayout
from features.layout import packable_id
from features.store import FeatureStore, redis_client
from leap.core.hardware import load_catalogue
from leap.core.settings import Settings
from leap.services.workers import WorkerProcess
from streams.client import SchedulerClient
from streams.deadletter import dead_letter
from streams.events import ID_LEN, DeadLetter, EventError, JobStart, Submission
from streams.topics import DEAD_LETTER, JOB_FINISHES, JOB_STARTS, SUBMISSIONS, end_offsets
from tests.fuzz_events import TOPICS, Case, invalid_case, valid_case

#: pytest-timeout's 300 s per test is for the default count; a long run gets time in proportion.
pytestmark = [pytest.mark.fuzz, pytest.mark.timeout(max(300, int(os.environ.get("LEAP_FUZZ_EXAMPLES", "1000")) // 10))]

EXAMPLES = int(os.environ.get("LEAP_FUZZ_EXAMPLES", "1000"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"
#: Every dead-letter reason the contracts give an input event.
EVERY_REASON = {"bad_json", "oversize", "unknown_schema_version", "missing_field", "bad_field", "out_of_range",
                "time_out_of_range", "reserved_name", "inconsistent"}
#: One validator per topic, built once (``jsonschema.validate`` checks the schema itself on every call).
SCHEMA = {topic: jsonschema.Draft202012Validator(json.loads((SCHEMAS / f"{cls.NAME}.schema.json").read_text()))
          for topic, cls in TOPICS.items()}


# ------------------------------------------------------------------ in process


@FUZZ
@given(case=valid_case())
def test_every_valid_event_is_accepted_in_any_serialisation(case: Case) -> None:
    cls = TOPICS[case.topic]
    if case.reason is not None:  # a verbose serialiser pushed it over the size limit
        with pytest.raises(EventError) as err:
            cls.decode(case.value)
        assert err.value.reason == case.reason
        return
    assert case.payload is not None
    event = cls.decode(case.value)
    assert event == cls.from_dict(case.payload), case.what
    assert cls.decode(event.encode()) == event  # our own encoding round-trips
    SCHEMA[case.topic].validate(case.payload)


@FUZZ
@given(case=invalid_case())
def test_every_invalid_message_is_refused_with_its_reason(case: Case) -> None:
    with pytest.raises(EventError) as err:
        TOPICS[case.topic].decode(case.value)
    assert err.value.reason == case.reason, f"{case.what}: {err.value}"
    # The dead letter it becomes is itself valid and carries the message byte for byte.
    letter = dead_letter(case.topic, 3, 12345, case.key, case.value, err.value.reason, str(err.value))
    back = DeadLetter.decode(letter.encode())
    raw = None if back.raw_base64 is None else base64.b64decode(back.raw_base64)
    assert raw == case.value and back.reason == case.reason
    if case.schema_refuses:  # one field made wrong: the published schema refuses it too
        assert case.payload is not None
        with pytest.raises(jsonschema.ValidationError):
            SCHEMA[case.topic].validate(case.payload)


@pytest.fixture
def fuzz_store(store_client: Any, run_id: str) -> Iterator[FeatureStore]:
    fs = FeatureStore(store_client, KeyLayout(f"fuzz-{run_id}"), canonicalize=load_catalogue().canonical)
    yield fs
    fs.delete_all()


_FEATURE_CASES = st.one_of(valid_case(JOB_STARTS.name), valid_case(JOB_FINISHES.name))
_SEQUENCE = itertools.count()


@pytest.mark.integration
@settings(FUZZ, max_examples=max(1, EXAMPLES // 4),
          suppress_health_check=[*FUZZ.suppress_health_check, HealthCheck.function_scoped_fixture])
@given(case=_FEATURE_CASES)
def test_every_valid_start_and_finish_applies_once_on_a_server_and_on_a_cluster(fuzz_store: FeatureStore,
                                                                                case: Case) -> None:
    """The store's scripts take whatever the contracts accept (names, ids, numbers at their
    bounds), on one server and on a Redis Cluster: applied once, then a duplicate."""
    if case.reason is not None:
        return  # oversize: never reaches the store
    ev: Any = TOPICS[case.topic].decode(case.value)
    # unique per example (Hypothesis may draw the same ids twice); the generated text stays first,
    # where a key's hash tag begins
    n = f"~{next(_SEQUENCE)}"
    ev = dataclasses.replace(ev, job_key=ev.job_key[:ID_LEN - len(n)] + n, event_id=ev.event_id[:128 - len(n)] + n)
    apply = fuzz_store.apply_starts if isinstance(ev, JobStart) else fuzz_store.apply_finishes
    assert apply([ev]) == [1], case.what
    assert apply([ev]) == [0], case.what


# ------------------------------------------------------------------ through a worker


def collect(strategy: st.SearchStrategy[Case], n: int) -> list[Case]:
    """``n`` examples of ``strategy``, generated (not shrunk) by Hypothesis."""
    out: list[Case] = []

    @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def gather(case: Case) -> None:
        out.append(case)

    gather()
    return out[:n]


def rekey(run: str) -> Callable[[Case, int], Case]:
    """Give a valid case ids of this run (unique attempts and events; a few shared jobs, so that
    finishes meet priors and submissions read them), keeping the generated text after the tag."""

    def apply(case: Case, n: int) -> Case:
        if case.reason is not None or case.payload is None:
            return case
        payload = dict(case.payload)
        shared = n % 3 == 0
        payload["job_key"] = f"fz{run}-pool{n % 4}" if shared else f"fz{run}-{n}-{payload['job_key']}"[:ID_LEN]
        payload["event_id"] = f"fz{run}-{n}-{payload['event_id']}"[:128]
        if "attempt_id" in payload:
            payload["attempt_id"] = f"fz{run}-{n}"
        value = orjson.dumps(payload)
        return Case(case.topic, payload["job_key"].encode(), value, None, f"{case.what} (rekeyed)", payload)

    return apply


def _produce(settings_: Settings, cases: list[Case]) -> dict[int, tuple[int, int]]:
    """Produce every case as raw bytes; ``{case index: (partition, offset)}`` as the broker stored them."""
    producer = Producer(settings_.confluent_config(**{"linger.ms": 5, "acks": "all"}))
    where: dict[int, tuple[int, int]] = {}
    errors: list[str] = []

    def delivered(i: int) -> Callable[[KafkaError | None, Any], None]:
        def report(err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                where[i] = (msg.partition(), msg.offset())
        return report

    for i, case in enumerate(cases):
        while True:
            try:
                producer.produce(case.topic, key=case.key, value=case.value, on_delivery=delivered(i))
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(60) == 0 and not errors, errors[:3]
    return where


def _dead_letters(consumer: Consumer, wanted: set[tuple[str, int, int]], timeout: float) -> dict[Any, DeadLetter]:
    got: dict[tuple[str, int, int], DeadLetter] = {}
    deadline = time.monotonic() + timeout
    while wanted - got.keys() and time.monotonic() < deadline:
        for msg in consumer.consume(500, timeout=0.5):
            if msg.error() is None:
                letter = DeadLetter.decode(msg.value())
                got.setdefault((letter.source_topic, letter.partition, letter.offset), letter)
    return got


def _applied(rds: Any, layout: KeyLayout, cases: list[Case], timeout: float) -> list[Case]:
    """The valid starts and finishes whose event id is not (yet) in their job's seen-set."""
    deadline = time.monotonic() + timeout
    pending = [c for c in cases if c.reason is None and c.topic != SUBMISSIONS.name]
    while pending and time.monotonic() < deadline:
        pipe = rds.pipeline(transaction=False)
        for c in pending:
            assert c.payload is not None
            pipe.sismember(layout.job_seen(c.payload["job_key"]), packable_id(c.payload["event_id"]))
        pending = [c for c, seen in zip(pending, pipe.execute(), strict=True) if not seen]
        if pending:
            time.sleep(0.5)
    return pending


def _with_every_reason(cases: list[Case]) -> list[Case]:
    """``cases`` topped up with invalid cases of any refusal kind they lack (in a full-size run).

    Hypothesis does not draw the branches evenly (a run once held no oversize message), so the
    check that every refusal kind went through the worker would otherwise depend on the draw.
    """
    if EXAMPLES < 600:
        return cases
    for _ in range(20):
        absent = EVERY_REASON - {c.reason for c in cases}
        if not absent:
            break
        cases = cases + [c for c in collect(invalid_case(), 100) if c.reason in absent]
    return cases


@pytest.mark.integration
def test_fuzzed_messages_through_a_worker(worker: WorkerProcess, settings: Settings, topics: dict[str, str],
                                          run_id: str) -> None:
    started = time.monotonic()
    cases = collect(st.one_of(valid_case(), invalid_case()), EXAMPLES)
    cases = [rekey(run_id)(case, n) for n, case in enumerate(_with_every_reason(cases))]
    generated_s = time.monotonic() - started
    log_from = worker.log_path.stat().st_size
    letters_consumer = Consumer(settings.confluent_config(**{"group.id": f"fuzz-{run_id}",
                                                             "enable.auto.commit": False}))
    ends = end_offsets(letters_consumer, (DEAD_LETTER.name,))
    letters_consumer.assign([TopicPartition(t, p, high) for (t, p), high in ends.items()])
    client = SchedulerClient(settings)  # rankings followed from their end now
    try:
        t0 = time.monotonic()
        where = _produce(settings, cases)
        bad = {(c.topic, *where[i]): (i, c) for i, c in enumerate(cases) if c.reason is not None}
        subs = [c for c in cases if c.reason is None and c.topic == SUBMISSIONS.name]
        budget = 60 + len(cases) / 100
        letters = _dead_letters(letters_consumer, set(bad), budget)
        rankings = client.wait_for([Submission.from_dict(c.payload or {}).attempt_id for c in subs],
                                   timeout=max(5.0, budget - (time.monotonic() - t0)))
        # the worker's own Redis (a server or a cluster, as the settings say)
        unapplied = _applied(redis_client(settings), KeyLayout(settings.key_prefix), cases, timeout=30)
        processed_s = time.monotonic() - t0
    finally:
        client.close()
        letters_consumer.close()
    log = worker.log_path.read_bytes()[log_from:].decode("utf-8", "replace")

    missing = [bad[k][1].what for k in bad if k not in letters]
    wrong_reason = [(c.what, c.reason, letters[k].reason) for k, (i, c) in bad.items()
                    if k in letters and letters[k].reason != c.reason]

    def raw(letter: DeadLetter) -> bytes | None:
        return None if letter.raw_base64 is None else base64.b64decode(letter.raw_base64)

    wrong_bytes = [c.what for k, (i, c) in bad.items() if k in letters and raw(letters[k]) != c.value]
    reasons = _count(c.reason for _, c in bad.values())
    summary = {
        "messages": len(cases), "valid": len(cases) - len(bad), "invalid": len(bad),
        "valid_submissions": len(subs), "rankings": len(rankings),
        "valid_feature_events": sum(c.reason is None and c.topic != SUBMISSIONS.name for c in cases),
        "valid_lost": (len(subs) - len(rankings)) + len(unapplied),
        "invalid_dead_lettered_with_bytes_and_coordinates": len(bad) - len(missing) - len(wrong_bytes),
        "missing_dead_letters": len(missing), "wrong_reason": len(wrong_reason), "wrong_bytes": len(wrong_bytes),
        "reasons": reasons,
        "worker_alive": worker.alive(), "crash_lines": _crash_lines(log),
        "seconds": {"generate": round(generated_s, 1), "produce_to_checked": round(processed_s, 1)},
    }
    print("fuzz through a worker:", json.dumps(summary))
    assert not missing, f"{len(missing)} invalid message(s) without a dead letter, e.g. {missing[:5]}"
    assert not wrong_reason, wrong_reason[:5]
    assert not wrong_bytes, wrong_bytes[:5]
    assert len(rankings) == len(subs), f"{len(subs) - len(rankings)} valid submission(s) without a ranking"
    assert not unapplied, f"{len(unapplied)} valid start(s)/finish(es) not applied, e.g. {unapplied[:3]}"
    assert worker.alive() and not summary["crash_lines"], summary["crash_lines"]
    if len(bad) >= 300:  # enough draws that every kind of refusal must have come up
        assert set(reasons) >= EVERY_REASON, EVERY_REASON - set(reasons)


def _count(reasons: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in reasons:
        out[r] = out.get(r, 0) + 1
    return out


def _crash_lines(log: str) -> list[str]:
    """Log lines that tell of an agent crash, a traceback or a worker exit."""
    words = ("crashed", "traceback", "exiting", "stays uncommitted")
    return [line[:200] for line in log.splitlines() if any(w in line.lower() for w in words)][:10]
