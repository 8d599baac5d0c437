"""Event contracts: validation, error messages, encoding, and the published JSON Schemas."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import orjson
import pytest

from streams.contract import Field
from streams.events import (
    EVENT_TYPES,
    MAX_EVENT_BYTES,
    Event,
    EventError,
    JobFinish,
    Ranking,
    Submission,
    json_schema,
)
from tests.factories import finish_dict, submission_dict

SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"


def test_round_trip() -> None:
    sub = Submission.from_dict(submission_dict("j", 1))
    assert Submission.decode(sub.encode()) == sub
    fin = JobFinish.from_dict(finish_dict("j", "e", 1.7e9, "H100-SXM", 10.0))
    assert JobFinish.decode(fin.encode()) == fin


@pytest.mark.parametrize(
    ("change", "reason", "words"),
    [
        ({"params": "big"}, "bad_field", "submission.params: expected a number, got 'big'"),
        ({"params": -1.0}, "out_of_range", "submission.params: must be >= 1"),
        ({"global_batch_size": 1.5}, "bad_field", "expected an integer"),
        ({"precision": "int4"}, "bad_field", "'int4' is not one of"),
        ({"candidates": []}, "bad_field", "needs at least 1"),
        ({"candidates": ["H100-SXM", "H100-SXM"]}, "bad_field", "duplicate"),
        ({"schema_version": 3}, "unknown_schema_version", "3 is not supported"),
        ({"data_parallel": 4}, "inconsistent", "num_accelerators = 8"),
        ({"job_key": ""}, "bad_field", "non-empty string"),
        ({"event_time": True}, "bad_field", "expected a number"),
    ],
)
def test_submission_errors_say_what_is_wrong(change: dict[str, object], reason: str, words: str) -> None:
    with pytest.raises(EventError) as err:
        Submission.from_dict(submission_dict("j", 1, **change))
    assert err.value.reason == reason
    assert words in str(err.value)


def test_missing_field() -> None:
    payload = submission_dict("j", 1)
    del payload["model_type"]
    with pytest.raises(EventError, match=r"submission\.model_type: required field is missing"):
        Submission.from_dict(payload)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{oops", "bad_json"),
        (b'{"throughput": NaN}', "bad_json"),
        (b"[1, 2]", "bad_json"),
        (b"x" * (MAX_EVENT_BYTES + 1), "oversize"),
        (None, "bad_json"),
    ],
)
def test_decode_rejects_bad_bytes(raw: bytes | None, reason: str) -> None:
    with pytest.raises(EventError) as err:
        JobFinish.decode(raw)
    assert err.value.reason == reason


@pytest.mark.parametrize("value", [0.0, -2.0, float("inf"), float("nan")])
def test_throughput_must_be_finite_and_positive(value: float) -> None:
    with pytest.raises(EventError) as err:
        JobFinish.from_dict(finish_dict("j", "e", 1.7e9, "H100-SXM", value))
    assert err.value.reason in ("out_of_range", "not_finite")


def test_completed_finish_needs_throughput_but_failed_may_not() -> None:
    with pytest.raises(EventError, match="required when outcome is 'completed'"):
        JobFinish.from_dict(finish_dict("j", "e", 1.7e9, "H100-SXM", None))
    failed = JobFinish.from_dict(finish_dict("j", "e", 1.7e9, "H100-SXM", None, outcome="failed"))
    assert failed.throughput is None


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    sub = Submission.from_dict(submission_dict("j", 1, added_later="x"))
    assert "added_later" not in sub.to_dict()


def test_nested_record_errors_name_the_item() -> None:
    good = {"schema_version": 1, "event_id": "e", "event_time": 1.7e9, "job_key": "j", "attempt_id": "a",
            "submission_event_id": "s", "submission_time": 1.7e9, "model_version": "m", "best_hardware": None,
            "features_used": {}, "latency_ms": 1.0, "candidates": [{"hardware": "H100-SXM", "rank": None}]}
    with pytest.raises(EventError) as err:
        Ranking.from_dict(good)
    assert err.value.reason == "missing_field"
    assert "ranking.candidates[0].predicted_throughput" in str(err.value)


def test_a_spec_with_an_unknown_kind_is_rejected_when_written() -> None:
    with pytest.raises(AssertionError, match="unknown field kind"):
        Field("x", "decimal", "A kind nothing can validate.")
    with pytest.raises(AssertionError, match="records"):
        Field("x", "records", "Records without item specs.")


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda c: c.NAME)
def test_published_schema_matches_code(cls: type[Event]) -> None:
    path = SCHEMAS / f"{cls.NAME}.schema.json"
    assert json.loads(path.read_text()) == json_schema(cls), "run `leap schemas` and commit the result"


def test_schema_accepts_what_code_accepts_and_rejects_what_it_rejects() -> None:
    schema = json.loads((SCHEMAS / "submission.schema.json").read_text())
    good = submission_dict("j", 1)
    jsonschema.validate(good, schema)
    for bad in ({**good, "params": "x"}, {**good, "precision": "int4"}, {**good, "schema_version": 2}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
        with pytest.raises(EventError):
            Submission.from_dict(bad)
    finish_schema = json.loads((SCHEMAS / "job_finish.schema.json").read_text())
    jsonschema.validate(orjson.loads(orjson.dumps(finish_dict("j", "e", 1.7e9, "T4", None, outcome="failed"))),
                        finish_schema)


# ---------------------------------------------------------------- rankings: version 2 adds each candidate's basis


def ranking_dict(version: int, basis: dict[str, object] | None) -> dict[str, object]:
    candidate: dict[str, object] = {"hardware": "H100-SXM", "predicted_throughput": 800.0, "lower": 600.0,
                                    "upper": 1000.0, "hourly_cost": 80.0, "throughput_per_dollar": 36000.0,
                                    "rank": 1, "reason": None}
    if basis is not None:
        candidate["basis"] = basis
    return {"schema_version": version, "event_id": "rank:s", "event_time": 1.8e9, "job_key": "j", "attempt_id": "a",
            "submission_event_id": "s", "submission_time": 1.8e9, "model_version": "m", "candidates": [candidate],
            "best_hardware": "H100-SXM", "features_used": {}, "fallback": None, "latency_ms": 1.0}


BASIS = {"evidence": "ran_elsewhere", "estimate": "model", "prior": "A100-80GB", "ratio": 1.6}


def test_a_version_2_ranking_carries_a_basis_per_candidate_and_round_trips() -> None:
    ranking = Ranking.from_dict(ranking_dict(2, BASIS))
    assert ranking.candidates[0]["basis"]["prior"] == "A100-80GB"
    assert Ranking.decode(ranking.encode()) == ranking
    with pytest.raises(EventError, match="basis: required from schema version 2"):
        Ranking.from_dict(ranking_dict(2, None))
    with pytest.raises(EventError, match=r"candidates\[0\].basis.evidence"):
        Ranking.from_dict(ranking_dict(2, {**BASIS, "evidence": "rumour"}))
    with pytest.raises(EventError, match=r"basis.ratio: must be >= 0"):
        Ranking.from_dict(ranking_dict(2, {**BASIS, "ratio": -1.0}))
    # no prior, no ratio: left out, and decoded as sent
    never_ran: dict[str, object] = {"evidence": "none", "estimate": "lookup"}
    assert Ranking.from_dict(ranking_dict(2, never_ran)).candidates[0]["basis"] == never_ran


def test_the_decoder_still_accepts_a_version_1_ranking_without_basis() -> None:
    ranking = Ranking.from_dict(ranking_dict(1, None))
    assert ranking.schema_version == 1 and ranking.candidates[0].get("basis") is None
    versions = (Ranking.VERSION, sorted(Ranking.SUPPORTED_VERSIONS), sorted(Submission.SUPPORTED_VERSIONS))
    assert versions == (2, [1, 2], [1])
    with pytest.raises(EventError, match="unknown_schema_version"):
        Submission.from_dict(submission_dict("j", 1, schema_version=2))  # only rankings moved to version 2


def test_a_reader_of_version_1_reads_every_field_it_knows_from_a_version_2_ranking() -> None:
    """The version-1 schema, as published before the basis, accepts a version-2 ranking but for its
    version number: the basis only adds a field, none changed meaning or type."""
    v1 = json.loads((Path(__file__).parent / "data" / "ranking.v1.schema.json").read_text())
    event = orjson.loads(Ranking.from_dict(ranking_dict(2, BASIS)).encode())
    errors = list(jsonschema.Draft202012Validator(v1).iter_errors(event))
    assert [list(e.path) for e in errors] == [["schema_version"]]
    jsonschema.validate({**event, "schema_version": 1}, v1)
    jsonschema.validate(event, json.loads((SCHEMAS / "ranking.schema.json").read_text()))
