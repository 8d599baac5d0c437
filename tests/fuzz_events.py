"""Hypothesis strategies of the bytes producers put on LEAP's input topics: events the contracts
accept, written by foreign serialisers, and events they reject, each with the reason it must get.

Valid events are drawn from the contracts' own field specs (:mod:`streams.events`), so a new
field or bound is fuzzed without touching this file; the cross-field rules are the only thing
spelled here. Invalid events are a valid one with one thing wrong (one field or one rule), or
bytes that are not a JSON object at all. :func:`cases` mixes both on the three input topics.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import orjson
from hypothesis import strategies as st

from streams.contract import Field
from streams.events import (
    EARLIEST_TIME,
    MAX_EVENT_BYTES,
    SUPPORTED_SCHEMA_VERSIONS,
    Event,
    JobFinish,
    JobStart,
    Submission,
)
from streams.topics import JOB_FINISHES, JOB_STARTS, SUBMISSIONS

#: The input topics and the event each carries.
TOPICS: dict[str, type[Event]] = {SUBMISSIONS.name: Submission, JOB_STARTS.name: JobStart,
                                  JOB_FINISHES.name: JobFinish}

#: Any Unicode scalar value (no lone surrogates: those cannot be UTF-8; they are fuzzed as escapes).
_CHARS = st.characters(codec="utf-8")
_JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**53, 2**53),
                          st.floats(allow_nan=False, allow_infinity=False), st.text(_CHARS, max_size=20))
_JSON = st.recursive(_JSON_SCALARS, lambda kids: st.lists(kids, max_size=4)
                     | st.dictionaries(st.text(_CHARS, max_size=8), kids, max_size=4), max_leaves=12)


@dataclass(frozen=True)
class Draft:
    """A valid event's payload, or one made invalid on purpose, before it is serialised."""

    topic: str
    payload: dict[str, Any]
    reason: str | None  # the dead-letter reason it must get; None: valid
    what: str  # what was done to it, for failure messages
    schema_checked: bool = True  # a JSON Schema can tell (False: a cross-field rule)


@dataclass(frozen=True)
class Case:
    """One message as produced: where, its key and value bytes, and what must become of it."""

    topic: str
    key: bytes | None
    value: bytes | None
    reason: str | None
    what: str
    payload: dict[str, Any] | None = None  # the payload serialised (valid cases and one-thing-wrong ones)
    schema_refuses: bool = False  # an invalid payload that the JSON Schema must refuse too


# ------------------------------------------------------------------ valid payloads from the specs


def _text(spec: Field) -> st.SearchStrategy[str]:
    top = spec.max_len or 64
    short, long = st.text(_CHARS, min_size=spec.min_len or 1, max_size=min(top, 12)), \
        st.text(_CHARS, min_size=max(1, top - 2), max_size=top)
    # mostly short (cheap to generate), one in eight at the limit
    out = st.integers(0, 7).flatmap(lambda k: long if k == 0 else short)
    if spec.reserved_prefix is not None:
        prefix = spec.reserved_prefix
        out = out.map(lambda v: "x" + v[1:] if v.startswith(prefix) else v)
    return out


def _number(spec: Field) -> st.SearchStrategy[Any]:
    low = spec.minimum if spec.minimum is not None else spec.exclusive_minimum
    if spec.kind == "int":
        lo = math.ceil(low) if low is not None else -2**31
        if spec.exclusive_minimum is not None and lo == spec.exclusive_minimum:
            lo += 1
        return st.integers(lo, int(spec.maximum) if spec.maximum is not None else 2**31)
    floats = st.floats(min_value=low, max_value=spec.maximum, allow_nan=False, allow_infinity=False,
                       exclude_min=spec.exclusive_minimum is not None)
    edges = [x for x in (spec.minimum, spec.maximum) if x is not None]
    return st.one_of(floats, st.sampled_from(edges)) if edges else floats


@cache  # strategies are built once per spec: building them is most of a draw's cost
def value_of(spec: Field) -> st.SearchStrategy[Any]:
    """Any value ``spec`` accepts (not null)."""
    if spec.name == "schema_version":
        return st.sampled_from(sorted(SUPPORTED_SCHEMA_VERSIONS))
    if spec.choices is not None:
        return st.sampled_from(spec.choices)
    if spec.kind == "str":
        return _text(spec)
    if spec.kind in ("int", "float"):
        return _number(spec)
    if spec.kind == "strlist":
        return st.lists(_text(spec), min_size=spec.min_items or 0, max_size=min(spec.max_items or 8, 8), unique=True)
    if spec.kind == "object":
        return st.dictionaries(st.text(_CHARS, max_size=8), _JSON, max_size=3)
    raise AssertionError(f"{spec.name}: no strategy for kind {spec.kind}")


def _divisors(n: int, limit: int = 64) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


_FATES = st.sampled_from(("value", "value", "absent", "null"))


@cache
def valid_payload(topic: str) -> st.SearchStrategy[dict[str, Any]]:
    """:func:`_valid_payload` of the topic's event, built once."""
    return _valid_payload(TOPICS[topic])


@st.composite
def _valid_payload(draw: st.DrawFn, cls: type[Event]) -> dict[str, Any]:
    """A payload ``cls`` accepts: every field drawn from its spec, optional ones sometimes absent
    or null, then the cross-field rules made true."""
    out: dict[str, Any] = {}
    for spec in cls.FIELDS:
        fate = draw(_FATES) if not spec.required or spec.nullable else "value"
        if fate == "absent" and not spec.required:
            continue
        out[spec.name] = None if fate == "null" and spec.nullable else draw(value_of(spec))
    if cls is Submission:
        n = out["num_accelerators"]
        mode = draw(st.sampled_from(("unknown", "some", "all")))
        if mode == "all":
            tp = draw(st.sampled_from(_divisors(n)))
            pp = draw(st.sampled_from(_divisors(n // tp)))
            out.update(data_parallel=n // (tp * pp), tensor_parallel=tp, pipeline_parallel=pp)
        elif mode == "some":
            out.update(data_parallel=n, tensor_parallel=None)
        else:
            for name in ("data_parallel", "tensor_parallel", "pipeline_parallel"):
                out.pop(name, None)
    if cls is JobFinish:
        if out["outcome"] == "completed" and out.get("throughput") is None:
            out["throughput"] = draw(value_of(next(s for s in cls.FIELDS if s.name == "throughput")))
        out["start_time"] = draw(st.floats(EARLIEST_TIME, out["event_time"]))
    return out


# ------------------------------------------------------------------ one thing wrong


def _wrong_type(spec: Field) -> st.SearchStrategy[Any]:
    if spec.kind == "str":
        return st.one_of(st.integers(*_INT64), st.booleans(), st.lists(st.text(max_size=3), max_size=2),
                         st.dictionaries(st.text(max_size=3), st.integers(*_INT64), max_size=2))
    if spec.kind in ("int", "float"):
        return st.one_of(st.text(_CHARS, max_size=8), st.booleans(), st.lists(st.integers(*_INT64), max_size=2),
                         st.dictionaries(st.text(max_size=3), st.integers(*_INT64), max_size=2))
    if spec.kind == "strlist":
        return st.one_of(st.text(_CHARS, max_size=8), st.integers(*_INT64),
                         st.lists(st.integers(*_INT64), min_size=1, max_size=3),
                         st.lists(st.none(), min_size=1, max_size=2))
    return st.one_of(st.text(max_size=4), st.integers(*_INT64), st.lists(st.integers(*_INT64), max_size=2))


_INT64 = (-2**63, 2**63 - 1)  # what JSON producers write as integers (and orjson can)


def _out_of_range(spec: Field) -> list[st.SearchStrategy[Any]]:
    out: list[st.SearchStrategy[Any]] = []
    low = spec.minimum if spec.minimum is not None else spec.exclusive_minimum
    if spec.kind == "int":
        if low is not None:
            top = math.ceil(low) - 1 if spec.minimum is not None else math.floor(low)
            out.append(st.integers(_INT64[0], top))
        if spec.maximum is not None:
            out.append(st.integers(math.floor(spec.maximum) + 1, _INT64[1]))
        return out
    if low is not None:
        out.append(st.floats(max_value=low, exclude_max=spec.minimum is not None, min_value=-1e300))
    if spec.maximum is not None:
        out.append(st.floats(min_value=spec.maximum, exclude_min=True, max_value=1e300))
    return out


@cache
def _mutations(spec: Field) -> list[tuple[str, st.SearchStrategy[Any], str]]:
    """``(what, the wrong value, the reason it must get)`` for one field; ``what == "drop"``
    removes the field instead."""
    out: list[tuple[str, st.SearchStrategy[Any], str]] = [("wrong type", _wrong_type(spec), "bad_field")]
    if spec.required:
        out.append(("drop", st.none(), "missing_field"))
    if not spec.nullable:
        out.append(("null", st.none(), "bad_field"))
    if spec.kind in ("int", "float"):
        out += [("out of range", s, spec.range_reason) for s in _out_of_range(spec)]
    if spec.kind == "int":
        out.append(("not an integer", st.floats(-1e6, 1e6).filter(lambda x: not x.is_integer()), "bad_field"))
    if spec.kind == "str":
        out.append(("empty", st.just(""), "bad_field"))
        if spec.max_len is not None:
            out.append(("too long", st.text(_CHARS, min_size=spec.max_len + 1, max_size=spec.max_len + 8), "bad_field"))
        if spec.choices is not None:
            choices = spec.choices
            out.append(("not a choice", st.text(_CHARS, min_size=1, max_size=8).filter(lambda v: v not in choices),
                        "bad_field"))
    if spec.reserved_prefix is not None:
        prefix = spec.reserved_prefix
        name = st.text(_CHARS, max_size=10).map(lambda v: prefix + v)
        if spec.kind == "strlist":
            out.append(("reserved name", st.lists(name, min_size=1, max_size=3, unique=True), "reserved_name"))
        else:
            out.append(("reserved name", name, "reserved_name"))
    if spec.kind == "strlist":
        out.append(("no items", st.just([]), "bad_field"))
        out.append(("an empty item", st.just(["ok", ""]), "bad_field"))
        if spec.max_len is not None:
            out.append(("an item too long", st.just(["x" * (spec.max_len + 1)]), "bad_field"))
        if spec.max_items is not None:
            many = [f"hw{i}" for i in range(spec.max_items + 1)]
            out.append(("too many items", st.just(many), "bad_field"))
    return out


@cache
def _mutation_of(topic: str) -> st.SearchStrategy[tuple[Field, tuple[str, st.SearchStrategy[Any], str]]]:
    """A field of ``cls`` and one of its mutations: first the kind of mistake (each as likely,
    so that rare ones such as a reserved name come up as often as a wrong type), then a field
    it applies to."""
    kinds: dict[str, list[tuple[Field, tuple[str, st.SearchStrategy[Any], str]]]] = {}
    for spec in TOPICS[topic].FIELDS:
        for mutation in _mutations(spec):
            kinds.setdefault(mutation[0], []).append((spec, mutation))
    return st.sampled_from(sorted(kinds)).flatmap(lambda kind: st.sampled_from(kinds[kind]))


def _expected(spec: Field, value: Any, reason: str) -> str:
    """The reason a wrong ``schema_version`` gets: any present value the code does not read is an
    unknown version (checked before the fields), whatever its type."""
    if spec.name == "schema_version" and value is not None:
        try:
            supported = value in SUPPORTED_SCHEMA_VERSIONS
        except TypeError:  # unhashable: a list or an object
            supported = False
        if not supported:
            return "unknown_schema_version"
    return reason


_RULES: dict[type[Event], list[tuple[str, Callable[[dict[str, Any]], dict[str, Any]], str]]] = {
    Submission: [
        ("duplicate candidate", lambda p: {**p, "candidates": [*p["candidates"], p["candidates"][0]]}
         if len(p["candidates"]) < 64 else {**p, "candidates": [*p["candidates"][:-1], p["candidates"][0]]},
         "bad_field"),
        ("parallel degrees that do not multiply to the accelerators",
         lambda p: {**p, "data_parallel": p["num_accelerators"] + 1, "tensor_parallel": 1, "pipeline_parallel": 1}
         if p["num_accelerators"] < 2**20 else {**p, "data_parallel": 1, "tensor_parallel": 1, "pipeline_parallel": 1},
         "inconsistent"),
    ],
    JobStart: [],
    JobFinish: [
        ("completed without a throughput", lambda p: {**p, "outcome": "completed", "throughput": None},
         "missing_field"),
        ("started after it finished", lambda p: {**p, "start_time": p["event_time"] + 1.0}
         if p["event_time"] < 4e9 else {**p, "event_time": p["event_time"] - 10.0, "start_time": p["event_time"]},
         "inconsistent"),
    ],
}


@st.composite
def invalid_draft(draw: st.DrawFn, topic: str) -> Draft:
    """A valid payload with exactly one field, or one cross-field rule, made wrong."""
    cls = TOPICS[topic]
    payload = draw(valid_payload(topic))
    rules = _RULES[cls]
    if rules and draw(st.integers(0, 9)) == 0:
        what, break_rule, reason = draw(st.sampled_from(rules))
        return Draft(topic, break_rule(payload), reason, what, schema_checked=False)
    spec, (what, wrong, reason) = draw(_mutation_of(topic))
    if what == "drop":
        payload.pop(spec.name, None)
        return Draft(topic, payload, reason, f"{spec.name}: dropped")
    value = draw(wrong)
    payload[spec.name] = value
    return Draft(topic, payload, _expected(spec, value, reason), f"{spec.name}: {what} ({value!r:.60})")


# ------------------------------------------------------------------ serialisers


def _dump(value: Any, fmt: Callable[[float], str], ascii_only: bool, sep: tuple[str, str]) -> str:
    """JSON as another serialiser might write it: float notation, escapes and separators vary."""
    if isinstance(value, dict):
        items = (f"{_dump(k, fmt, ascii_only, sep)}{sep[1]}{_dump(v, fmt, ascii_only, sep)}" for k, v in value.items())
        return "{" + sep[0].join(items) + "}"
    if isinstance(value, list):
        return "[" + sep[0].join(_dump(v, fmt, ascii_only, sep) for v in value) + "]"
    if isinstance(value, float):
        return fmt(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=ascii_only)
    return json.dumps(value)


def _escape_all(text: str) -> str:
    """Every character of a JSON text's strings as a \\u escape (valid JSON, if unusual)."""
    out, in_string, i = [], False, 0
    while i < len(text):
        ch = text[i]
        if ch == '"':
            in_string = not in_string
            out.append(ch)
        elif in_string and ch == "\\":  # keep an existing escape as it is
            length = 6 if text[i + 1] == "u" else 2
            out.append(text[i:i + length])
            i += length
            continue
        elif in_string:
            out.append(json.dumps(ch, ensure_ascii=True)[1:-1] if ord(ch) > 0x7F else f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
        i += 1
    return "".join(out)


FLOAT_FORMATS: dict[str, Callable[[float], str]] = {
    "repr": repr, "%.17g": lambda x: f"{x:.17g}", "%.17E": lambda x: f"{x:.17E}", "%.17e": lambda x: f"{x:.17e}",
}


_EXTRAS = st.dictionaries(st.text(_CHARS, min_size=1, max_size=8), _JSON, max_size=3)
_STYLES = st.sampled_from(("orjson", "json", "indent", "custom", "escape all", "escaped slash"))


@st.composite
def foreign_bytes(draw: st.DrawFn, payload: dict[str, Any], field_names: frozenset[str]) -> tuple[bytes, str]:
    """``payload`` as a foreign producer might serialise it; the same event for the contracts.

    Numbers change type where JSON cannot tell (an integral float written as an integer, an
    integer as ``512.0``), unknown fields are added, keys reordered, and the text's float notation,
    escapes, separators and surrounding whitespace vary.
    """
    doc: dict[str, Any] = {}
    for name, value in payload.items():
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**53 and draw(st.booleans()):
            value = int(value)
        elif isinstance(value, int) and not isinstance(value, bool) and draw(st.booleans()):
            value = float(value)
        doc[name] = value
    extras = {k: v for k, v in draw(_EXTRAS).items() if k not in field_names}
    items = draw(st.permutations([*doc.items(), *extras.items()]))
    doc = dict(items)
    style = draw(_STYLES)
    if style == "orjson":
        text = orjson.dumps(doc).decode()
    elif style == "json":
        text = json.dumps(doc)
    elif style == "indent":
        width = draw(st.sampled_from(["1", "2", "4", "\t"]))  # json takes a width or the text itself
        text = json.dumps(doc, indent=int(width) if width.isdigit() else width, ensure_ascii=False)
    elif style == "custom":
        fmt = draw(st.sampled_from(sorted(FLOAT_FORMATS)))
        sep = draw(st.sampled_from(((",", ":"), (", ", ": "), (" ,\n", " :\t"))))
        text, style = _dump(doc, FLOAT_FORMATS[fmt], draw(st.booleans()), sep), f"floats {fmt}"
    elif style == "escape all":
        text = _escape_all(json.dumps(doc, ensure_ascii=False))
    else:
        text = json.dumps(doc, ensure_ascii=False).replace("/", "\\/")  # '/' occurs only inside strings
    pad = draw(st.sampled_from(("", " ", "\n", "\r\n", "\t ")))
    return (pad + text + draw(st.sampled_from(("", "\n", " ")))).encode(), f"{style}, {len(extras)} extra field(s)"


# ------------------------------------------------------------------ not an event at all

_NOT_OBJECTS = (b"", b"   ", b"[]", b"1", b'"a string"', b"null", b"true", b"\xef\xbb\xbf{}", b"{", b"}",
                b'{"a": }', b"\xff\xfe\x00", b"[" * 2000 + b"]" * 2000)


_HOWS = st.sampled_from(("fixed", "truncated", "bad utf-8", "lone surrogate", "non-finite", "trailing", "array",
                         "oversize", "tombstone"))
_TOPIC = st.sampled_from(sorted(TOPICS))
_KEYS = st.one_of(st.none(), st.binary(max_size=12), st.text(_CHARS, max_size=12).map(str.encode))


@st.composite
def broken_bytes(draw: st.DrawFn, topic: str) -> tuple[bytes | None, str, str]:
    """Bytes that are no JSON object, or a valid event's bytes broken: ``(value, reason, what)``."""
    good = orjson.dumps(draw(valid_payload(topic)))
    how = draw(_HOWS)
    if how == "fixed":
        return draw(st.sampled_from(_NOT_OBJECTS)), "bad_json", "not a JSON object"
    if how == "truncated":
        return good[:draw(st.integers(0, len(good) - 1))], "bad_json", how
    if how == "bad utf-8":
        at = good.index(b'"job_key":"') + len(b'"job_key":"')
        return good[:at] + draw(st.sampled_from((b"\xff", b"\xc3", b"\xed\xa0\x80"))) + good[at:], "bad_json", how
    if how == "lone surrogate":
        return good.replace(b'"job_key":"', b'"job_key":"\\ud800', 1), "bad_json", how
    if how == "non-finite":
        token = draw(st.sampled_from((b"NaN", b"Infinity", b"-Infinity", b"1e400")))
        return good.replace(b'"event_time":', b'"event_time":' + token + b',"was":', 1), "bad_json", how
    if how == "trailing":
        return good + draw(st.sampled_from((b" x", b"{}", b"\x00", b",")) ), "bad_json", how
    if how == "array":
        return b"[" + good + b"]", "bad_json", how
    if how == "oversize":
        padded = orjson.dumps({**orjson.loads(good), "padding": "x" * MAX_EVENT_BYTES})
        return padded, "oversize", how
    return None, "bad_json", how


# ------------------------------------------------------------------ cases


@cache
def _names(topic: str) -> frozenset[str]:
    return frozenset(s.name for s in TOPICS[topic].FIELDS)


@st.composite
def valid_case(draw: st.DrawFn, topic: str | None = None) -> Case:
    topic = topic or draw(_TOPIC)
    payload = draw(valid_payload(topic))
    value, what = draw(foreign_bytes(payload, _names(topic)))
    if len(value) > MAX_EVENT_BYTES:  # a verbose serialiser can push a big event over the limit
        return Case(topic, payload["job_key"].encode(), value, "oversize", f"{what}: {len(value)} bytes")
    return Case(topic, payload["job_key"].encode(), value, None, what, payload)


@st.composite
def invalid_case(draw: st.DrawFn, topic: str | None = None) -> Case:
    topic = topic or draw(_TOPIC)
    key = draw(_KEYS)
    if draw(st.integers(0, 3)) == 0:
        value, reason, what = draw(broken_bytes(topic))
        return Case(topic, key, value, reason, what)
    draft = draw(invalid_draft(topic))
    return Case(topic, key, orjson.dumps(draft.payload), draft.reason, draft.what, draft.payload,
                draft.schema_checked)


def cases() -> st.SearchStrategy[Case]:
    """Valid and invalid messages on the three input topics, about half each."""
    return st.one_of(valid_case(), invalid_case())
