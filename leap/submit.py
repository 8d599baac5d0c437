"""``leap submit`` for people: hand-written submissions, completed where a machine would fill in,
refused with the field and the fix where they are wrong.

A scheduler sends every field; a person writing a line by hand should not have to invent an
event id, the current Unix time or the contract version. :func:`read_submissions` fills exactly
those three when a line leaves them out (or sets them to null) and nothing else: every field
that describes the job is the person's to give, and a wrong one is refused with what the
contract expects of it (:func:`fix_for`), taken from the same field specs that validate it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from streams.contract import Field
from streams.events import MAX_EVENT_BYTES, SCHEMA_VERSION, EventError, Submission

#: What a hand-written line may leave out: the fields a machine knows better than a person.
FILLED = ("schema_version", "event_id", "event_time")

#: Fixes of refusals that concern more than one field (their reason -> what to do).
_RULE_FIXES = {
    "inconsistent": "make data_parallel x tensor_parallel x pipeline_parallel equal num_accelerators, or leave "
                    "the degrees out",
    "unknown_schema_version": f"set schema_version to {SCHEMA_VERSION} or leave it out (leap submit fills it)",
    "oversize": f"a submission must encode to at most {MAX_EVENT_BYTES} bytes; list fewer candidates",
    "bad_json": "write each submission as one JSON object on one line, e.g. "
                '{"job_key": "my-job", "attempt_id": "my-job-1", "model_type": "llama-7b", '
                '"global_batch_size": 512, "num_accelerators": 8, "candidates": ["H100-SXM", "A100-80GB"]}',
}


@dataclass
class ReadResult:
    """The submissions of a file, what was filled in per line, and the refusals."""

    submissions: list[Submission] = field(default_factory=list)
    filled: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # (line number, filled values)
    refusals: list[str] = field(default_factory=list)


def complete(payload: dict[str, Any], now: Callable[[], float] = time.time) -> dict[str, Any]:
    """The values of :data:`FILLED` that ``payload`` leaves out (or null): the contract version,
    a fresh event id and the current time. ``payload`` is not changed."""
    fill: dict[str, Any] = {}
    if payload.get("schema_version") is None:
        fill["schema_version"] = SCHEMA_VERSION
    if payload.get("event_id") is None:
        fill["event_id"] = f"cli-{uuid.uuid4().hex}"
    if payload.get("event_time") is None:
        fill["event_time"] = now()
    return fill


def _expects(spec: Field) -> str:
    """What a field's spec accepts, in words."""
    if spec.choices is not None:
        what = "one of " + ", ".join(spec.choices)
    elif spec.kind in ("int", "float"):
        what = "an integer" if spec.kind == "int" else "a number"
        low = ([f">= {spec.minimum:.15g}"] if spec.minimum is not None else []) + \
              ([f"> {spec.exclusive_minimum:.15g}"] if spec.exclusive_minimum is not None else [])
        high = [f"<= {spec.maximum:.15g}"] if spec.maximum is not None else []
        if low or high:
            what += " " + " and ".join(low + high)
    elif spec.kind == "strlist":
        what = f"a list of {spec.min_items or 0} to {spec.max_items or 'any number of'} distinct names"
    else:
        what = "a non-empty string" if spec.kind == "str" else f"a JSON {spec.kind}"
    if spec.max_len is not None:
        what += f" of at most {spec.max_len} characters"
    if spec.reserved_prefix is not None:
        what += f", not starting with {spec.reserved_prefix!r}"
    if spec.nullable or not spec.required:
        what += "; null or leave it out when unknown"
    return what


def fix_for(error: EventError, specs: Iterable[Field] = Submission.FIELDS) -> str:
    """How to fix what ``error`` refused: the field's expectations and meaning, or the rule's fix."""
    by_name = {s.name: s for s in specs}
    name = error.field.split(".", 1)[1] if error.field and "." in error.field else None
    spec = by_name.get(name) if name else None
    if error.reason in _RULE_FIXES:
        return _RULE_FIXES[error.reason]
    if spec is not None:
        fix = f"set {name} to {_expects(spec)} ({spec.doc.rstrip('.')})"
        return fix + "; or leave it out: leap submit fills it" if name in FILLED else fix
    return "see schemas/submission.schema.json for every field"


def read_submissions(lines: Iterable[str], now: Callable[[], float] = time.time) -> ReadResult:
    """Hand-written submissions, one JSON object per line (blank lines skipped), completed by
    :func:`complete`; every refusal says the line, the field, what is wrong and the fix."""
    out = ReadResult()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            payload = orjson.loads(line)
            if not isinstance(payload, dict):
                raise EventError("bad_json", f"submission: expected a JSON object, got {type(payload).__name__}")
            fill = complete(payload, now)
            sub = Submission.from_dict({**payload, **fill})
            if len(sub.encode()) > MAX_EVENT_BYTES:
                raise EventError("oversize", f"submission: encodes to more than {MAX_EVENT_BYTES} bytes")
        except orjson.JSONDecodeError as exc:
            out.refusals.append(f"line {number}: not valid JSON ({exc}). Fix: {_RULE_FIXES['bad_json']}")
            continue
        except EventError as exc:
            out.refusals.append(f"line {number}: {exc.message}. Fix: {fix_for(exc)}")
            continue
        out.submissions.append(sub)
        if fill:
            out.filled.append((number, fill))
    return out
