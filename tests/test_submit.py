"""``leap submit`` for people: what a hand-written line may leave out, and refusals that say the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from leap.cli import app
from leap.core.settings import Settings
from leap.services.workers import WorkerProcess
from leap.submit import FILLED, read_submissions
from streams.events import SCHEMA_VERSION, Ranking

HAND_WRITTEN: dict[str, Any] = {"job_key": "hand-job", "attempt_id": "hand-job-1", "model_type": "llama-7b",
                                "global_batch_size": 512, "num_accelerators": 8, "candidates": ["H100-SXM", "L4"]}


def _line(**over: Any) -> str:
    return orjson.dumps({**HAND_WRITTEN, **over}).decode()


def test_a_hand_written_line_gets_version_id_and_time_and_nothing_else() -> None:
    read = read_submissions([_line(), "", _line(attempt_id="hand-job-2", event_time=None)], now=lambda: 1.8e9)
    assert read.refusals == []
    first, second = read.submissions
    assert (first.schema_version, first.event_time) == (SCHEMA_VERSION, 1.8e9)
    assert first.event_id != second.event_id and first.event_id.startswith("cli-")
    assert [n for n, _ in read.filled] == [1, 3] and all(set(f) == set(FILLED) for _, f in read.filled)
    assert first.family is None and first.params is None  # the job's description is never guessed


def test_what_the_line_gives_is_kept() -> None:
    read = read_submissions([_line(event_id="mine", event_time=1.79e9, schema_version=1)])
    assert (read.submissions[0].event_id, read.submissions[0].event_time) == ("mine", 1.79e9)
    assert read.filled == []


@pytest.mark.parametrize(("line", "field", "fix"), [
    (_line(global_batch_size=10**12), "submission.global_batch_size", "an integer >= 1 and <= 100000000"),
    (_line(params=1e30), "submission.params", "a number >= 1 and <= 1e+15; null or leave it out"),
    (_line(event_time=1.7e12), "submission.event_time", "or leave it out: leap submit fills it"),
    (_line(candidates=["_starts"]), "submission.candidates", "not starting with '_'"),
    (_line(precision="int4"), "submission.precision", "one of fp32, tf32, bf16, fp16, fp8"),
    (orjson.dumps({k: v for k, v in HAND_WRITTEN.items() if k != "model_type"}).decode(), "submission.model_type",
     "set model_type to a non-empty string"),
    (_line(schema_version=9), "submission.schema_version", "set schema_version to 1 or leave it out"),
    (_line(data_parallel=3, tensor_parallel=1, pipeline_parallel=1), "data_parallel x tensor_parallel",
     "or leave the degrees out"),
    ('{"job_key": ', "not valid JSON", "one JSON object on one line"),
])
def test_every_refusal_names_the_line_the_field_and_the_fix(line: str, field: str, fix: str) -> None:
    read = read_submissions([_line(), line])
    assert len(read.submissions) == 1  # the good line still reads
    (refusal,) = read.refusals
    assert refusal.startswith("line 2: ") and field in refusal
    assert "Fix: " in refusal and fix in refusal.split("Fix: ", 1)[1]


def test_the_command_refuses_the_file_and_publishes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "subs.jsonl"
    path.write_text(_line() + "\n" + _line(params=1e30) + "\n")
    result = CliRunner().invoke(app, ["submit", str(path), "--no-wait"])
    assert result.exit_code == 2
    assert "line 2: submission.params" in result.output and "nothing was published" in result.output


def test_a_missing_file_names_the_fix(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["submit", str(tmp_path / "nope.jsonl")])
    assert result.exit_code == 2 and "Fix: give a file of JSON lines" in result.output


@pytest.mark.integration
@pytest.mark.e2e
def test_a_hand_written_submission_is_ranked(worker: WorkerProcess, settings: Settings, run_id: str,
                                             tmp_path: Path) -> None:
    path = tmp_path / "subs.jsonl"
    path.write_text(_line(job_key=f"hand-{run_id}", attempt_id=f"hand-{run_id}-1") + "\n")
    result = CliRunner().invoke(app, ["submit", str(path), "--timeout", "60"])
    assert result.exit_code == 0, result.output
    assert "line 1: filled in schema_version=1, event_id=cli-" in result.output
    ranking = Ranking.decode(next(line for line in result.output.splitlines() if line.startswith("{")).encode())
    assert ranking.attempt_id == f"hand-{run_id}-1" and ranking.submission_event_id.startswith("cli-")
    assert {c["hardware"] for c in ranking.candidates} == {"H100-SXM", "L4"}
