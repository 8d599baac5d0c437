"""Sanity bounds and reserved names in the contracts, and the published schemas that state them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from features.keys import KeyLayout
from features.layout import COUNTER_FIELDS, COUNTER_PREFIX
from leap.core.keyspace import RESERVED_PREFIX
from streams.contract import OUT_OF_RANGE, RESERVED_NAME, TIME_OUT_OF_RANGE
from streams.events import EARLIEST_TIME, LATEST_TIME, EventError, JobFinish, JobStart, Submission
from tests.factories import finish_dict, submission_dict

SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"


def _schema(name: str) -> dict[str, Any]:
    return json.loads((SCHEMAS / f"{name}.schema.json").read_text())


def _start_dict(**over: Any) -> dict[str, Any]:
    d = {k: v for k, v in finish_dict("j", "s", 1.79e9, "L4", None).items() if k in {f.name for f in JobStart.FIELDS}}
    return {**d, **over}


# (event class, schema name, payload, reason, field): what the issue found accepted and ranked.
REFUSED = [
    (Submission, "submission", submission_dict("j", 1, event_time=1.0), TIME_OUT_OF_RANGE, "submission.event_time"),
    (Submission, "submission", submission_dict("j", 1, event_time=4e12), TIME_OUT_OF_RANGE, "submission.event_time"),
    (Submission, "submission", submission_dict("j", 1, params=1e30), OUT_OF_RANGE, "submission.params"),
    (Submission, "submission", submission_dict("j", 1, global_batch_size=10**12), OUT_OF_RANGE,
     "submission.global_batch_size"),
    (Submission, "submission", submission_dict("j", 1, seq_len=2**40), OUT_OF_RANGE, "submission.seq_len"),
    (Submission, "submission", submission_dict("j", 1, candidates=["H100-SXM", "_starts"]), RESERVED_NAME,
     "submission.candidates"),
    (Submission, "submission", submission_dict("j", 1, requested_hardware="_x"), RESERVED_NAME,
     "submission.requested_hardware"),
    (JobFinish, "job_finish", finish_dict("j", "e", 1.79e9, "_starts", 10.0), RESERVED_NAME, "job_finish.hardware"),
    (JobFinish, "job_finish", finish_dict("j", "e", 1.79e9, "L4", 1e12), OUT_OF_RANGE, "job_finish.throughput"),
    (JobFinish, "job_finish", {**finish_dict("j", "e", 1.79e9, "L4", 10.0), "accelerator_hours": 1e11},
     OUT_OF_RANGE, "job_finish.accelerator_hours"),
    (JobFinish, "job_finish", {**finish_dict("j", "e", 1.79e9, "L4", 10.0), "start_time": 1.79e12},
     TIME_OUT_OF_RANGE, "job_finish.start_time"),
    (JobStart, "job_start", _start_dict(hardware="_completed"), RESERVED_NAME, "job_start.hardware"),
    (JobStart, "job_start", _start_dict(num_accelerators=2**21), OUT_OF_RANGE, "job_start.num_accelerators"),
    (JobStart, "job_start", _start_dict(job_key="}x"), RESERVED_NAME, "job_start.job_key"),
    (Submission, "submission", submission_dict("}team-a", 1), RESERVED_NAME, "submission.job_key"),
]


@pytest.mark.parametrize(("cls", "schema", "payload", "reason", "field"), REFUSED,
                         ids=[f"{r[4]}-{r[3]}" for r in REFUSED])
def test_out_of_bounds_and_reserved_values_are_refused_by_code_and_schema(
        cls: type[Submission | JobFinish | JobStart], schema: str, payload: dict[str, Any], reason: str,
        field: str) -> None:
    with pytest.raises(EventError) as err:
        cls.from_dict(payload)
    assert (err.value.reason, err.value.field) == (reason, field)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(payload, _schema(schema))


@pytest.mark.parametrize("t", [EARLIEST_TIME, 1.79e9, LATEST_TIME])
def test_times_inside_the_bounds_are_accepted_by_code_and_schema(t: float) -> None:
    payload = submission_dict("j", 1, event_time=t)
    assert Submission.from_dict(payload).event_time == t
    jsonschema.validate(payload, _schema("submission"))


def test_names_that_merely_contain_the_marker_are_fine() -> None:
    sub = Submission.from_dict(submission_dict("j", 1, candidates=["H100_SXM", "my_gpu"]))
    assert sub.candidates == ("H100_SXM", "my_gpu")
    jsonschema.validate(submission_dict("j", 1, candidates=["H100_SXM"]), _schema("submission"))


@pytest.mark.parametrize("job", ["a}b", "{x", "{}", "x{y}z", "j"])
def test_every_accepted_job_key_gives_its_keys_one_non_empty_hash_tag(job: str) -> None:
    """Redis Cluster hashes the text between the first '{' and the next '}', or the whole key when
    that is empty: a job key starting with '}' would spread the job's keys over slots."""
    Submission.from_dict(submission_dict(job, 1))
    lay = KeyLayout("leap")
    keys = [lay.job(job), lay.job_window(job), lay.job_seen(job), lay.job_outbox(job)]
    tags = {key[key.index("{") + 1: key.index("}", key.index("{") + 1)] for key in keys}
    assert len(tags) == 1 and "" not in tags


def test_the_store_marks_its_fields_with_the_one_reserved_marker() -> None:
    """The contracts and the store read one definition, so no counter can be named by an event."""
    assert COUNTER_PREFIX == RESERVED_PREFIX
    for field in COUNTER_FIELDS:
        with pytest.raises(EventError) as err:
            JobFinish.from_dict(finish_dict("j", "e", 1.79e9, field, 10.0))
        assert err.value.reason == RESERVED_NAME
