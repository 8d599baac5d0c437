"""Dead letters carry the consumed message itself, and are valid under their own contract for
every value a message can have (none, empty, foreign bytes, too large to carry); the agents'
isolation paths dead-letter a failing event instead of dropping its batch; outages are told
apart from bad requests."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from pathlib import Path

import jsonschema
import orjson
import pytest
import redis

from predictor.handler import handle_submissions
from streams.app import DECODE_ERROR, decode_batch
from streams.deadletter import dead_letter, fit_dead_letter
from streams.events import DeadLetter, Ranking, Submission
from streams.resilience import BACKOFF_CAP_S, backoff, kafka_outage, redis_outage
from streams.topics import SUBMISSIONS
from tests.factories import Outbox, consumed, submission, submission_dict

SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "schemas" / "dead_letter.schema.json").read_text())


def _valid_everywhere(letter: DeadLetter) -> DeadLetter:
    """The letter as a reader sees it: through the contract and the published JSON Schema."""
    raw = letter.encode()
    jsonschema.validate(orjson.loads(raw), SCHEMA)
    return DeadLetter.decode(raw)


@pytest.mark.parametrize(("key", "value"), [(b"", b""), (None, None), (b"k", b"\x00\xff not utf-8"), (b"\xfe", b"{")])
def test_a_dead_letter_of_any_message_is_valid_and_keeps_its_bytes(key: bytes | None, value: bytes | None) -> None:
    [msg] = consumed(SUBMISSIONS.name, [(key, value)], partition=5, first_offset=123)
    decoded = decode_batch(Submission, [msg])
    [letter] = decoded.letters
    back = _valid_everywhere(letter)
    assert (back.source_topic, back.partition, back.offset) == (SUBMISSIONS.name, 5, 123)
    assert back.event_id == f"dl:{SUBMISSIONS.name}:5:123"  # the same message always gives the same id
    if value is None:
        assert back.raw_base64 is None
    else:
        assert back.raw_base64 is not None and base64.b64decode(back.raw_base64) == value
    assert back.key == (None if key is None else key.decode("utf-8", "replace"))


def test_a_foreign_serialisation_is_dead_lettered_byte_for_byte() -> None:
    # Another producer's JSON: key order, spacing and escapes that our encoder would not produce.
    body = dict(reversed(list(submission_dict("j", 1).items())))
    body["num_accelerators"] = 0  # out of range
    raw = json.dumps(body, indent=1, ensure_ascii=True).encode()
    [letter] = decode_batch(Submission, consumed(SUBMISSIONS.name, [(b"j", raw)], partition=2, first_offset=9)).letters
    assert base64.b64decode(_valid_everywhere(letter).raw_base64 or "") == raw
    assert (letter.reason, letter.partition, letter.offset) == ("out_of_range", 2, 9)


def test_an_unexpected_decoding_error_is_dead_lettered_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_rule(self: Submission) -> None:
        raise KeyError("a bug")

    good = submission("j", 1).encode()
    monkeypatch.setattr(Submission, "_check_rules", broken_rule)
    decoded = decode_batch(Submission, consumed(SUBMISSIONS.name, [(b"j", good)]))
    assert decoded.events == [] and [x.reason for x in decoded.letters] == [DECODE_ERROR]


def test_a_letter_too_large_for_the_topic_drops_only_its_bytes() -> None:
    letter = dead_letter("t", 1, 2, b"k", b"x" * DeadLetter.MAX_BYTES, "oversize", "too big")
    fitted = _valid_everywhere(fit_dead_letter(letter))
    assert fitted.raw_base64 is None and "t[1]@2" in fitted.error
    assert len(fitted.encode()) <= DeadLetter.MAX_BYTES
    small = dead_letter("t", 1, 2, b"k", b"{}", "bad_json", "x")
    assert fit_dead_letter(small) is small


class _FailsFor:
    """A ranking service that raises for one job (as a corrupt feature hash would)."""

    def __init__(self, bad_job: str) -> None:
        self.bad_job = bad_job

    def rank(self, subs: list[Submission], received: list[float]) -> list[Ranking]:
        if any(s.job_key == self.bad_job for s in subs):
            raise ValueError(f"corrupt features of {self.bad_job}")
        return [Ranking(schema_version=1, event_id=f"rank:{s.event_id}", event_time=r + 0.001, job_key=s.job_key,
                        attempt_id=s.attempt_id, submission_event_id=s.event_id, submission_time=s.event_time,
                        model_version="test", candidates=(), best_hardware=None, features_used={}, fallback=None,
                        latency_ms=1.0, since_submit_ms=2.0) for s, r in zip(subs, received, strict=True)]


async def test_one_failing_submission_is_dead_lettered_and_the_rest_ranked() -> None:
    subs = [submission(f"job{i}", i) for i in range(3)]
    batch = consumed(SUBMISSIONS.name, [(s.job_key.encode(), s.encode()) for s in subs], partition=1, first_offset=50)
    rankings_out, letters_out = Outbox(), Outbox()
    ranked = await handle_submissions(batch, _FailsFor("job1"), rankings_out, letters_out)  # type: ignore[arg-type]
    assert [r.job_key for r in ranked] == ["job0", "job2"] and len(rankings_out.sent) == 2
    [letter] = [DeadLetter.decode(v) for v in letters_out.values()]
    assert (letter.reason, letter.offset, letter.key) == ("processing_error", 51, "job1")
    assert letter.raw_base64 is not None and base64.b64decode(letter.raw_base64) == subs[1].encode()


def test_outages_are_told_apart_from_bad_requests() -> None:
    from aiokafka.errors import KafkaConnectionError, RecordTooLargeError

    assert redis_outage(redis.ConnectionError("refused")) and redis_outage(redis.TimeoutError())
    assert redis_outage(redis.ResponseError("LOADING Redis is loading the dataset in memory"))
    assert redis_outage(redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'"))
    assert not redis_outage(redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind"))
    assert not redis_outage(ValueError("invalid literal for int()"))
    assert kafka_outage(KafkaConnectionError()) and not kafka_outage(RecordTooLargeError())


def test_backoff_grows_and_is_capped() -> None:
    waits = [backoff(i) for i in range(40)]
    assert waits == sorted(waits) and waits[0] < 0.1 and waits[-1] == BACKOFF_CAP_S


async def test_a_stop_during_an_outage_abandons_the_batch_without_dead_letters(monkeypatch: pytest.MonkeyPatch) -> None:
    import streams.resilience as resilience
    from features.agents import apply_with_isolation

    monkeypatch.setattr(resilience, "_STOPPING", [])
    resilience.stop_waiting_when(lambda: True)  # the worker was asked to stop

    def redis_down(events: Sequence[Submission]) -> list[int]:
        raise redis.ConnectionError("refused")

    subs = [submission("j", 1)]
    letters_out = Outbox()
    with pytest.raises(resilience.Abandoned):
        sources = [e.message for e in consumed(SUBMISSIONS.name, [(b"j", subs[0].encode())])]
        await apply_with_isolation(redis_down, subs, sources, letters_out)
    assert letters_out.sent == []  # waiting is not failing: nothing dead-lettered
