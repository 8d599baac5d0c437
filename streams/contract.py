"""The machinery behind the event contracts: field specs, their validation, their JSON Schema.

:mod:`streams.events` describes each event type once, as a tuple of :class:`Field` specs; this
module turns such a tuple into a validator (:func:`validate_fields`) and a JSON Schema object
(:func:`object_schema`). Both read the same specs, so what is accepted and what is published
cannot drift apart. Nothing here knows a particular event type.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


class EventError(ValueError):
    """An event that cannot be accepted. ``reason`` is a short stable code for metrics.

    ``field`` names the offending field as ``event.name`` (``submission.params``) when one field is
    to blame, so that tools can say how to fix it; None for what concerns the whole message.
    """

    def __init__(self, reason: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.field = field

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


#: The JSON types a field can have.
KINDS = ("str", "int", "float", "strlist", "object", "records", "record")

#: Dead-letter reasons of the checks here (with ``missing_field`` and ``bad_field``): a number or
#: a time outside its documented bounds, and a name that starts with a marker the store reserves.
OUT_OF_RANGE = "out_of_range"
TIME_OUT_OF_RANGE = "time_out_of_range"
RESERVED_NAME = "reserved_name"


@dataclass(frozen=True)
class Field:
    """One field of an event: its JSON type and constraints.

    ``kind`` is one of ``str``, ``int``, ``float``, ``strlist``, ``object``, ``records`` (a list of
    objects with the fields ``items``) and ``record`` (one such object).
    ``range_reason`` is the dead-letter reason of a number outside ``minimum``/``maximum`` (times
    have their own); ``reserved_prefix`` refuses strings (and list items) that start with it.
    """

    name: str
    kind: str
    doc: str
    required: bool = True
    nullable: bool = False
    minimum: float | None = None
    exclusive_minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None
    max_len: int | None = None
    min_len: int = 1  # strings are non-empty unless a field says otherwise
    min_items: int | None = None
    max_items: int | None = None
    items: tuple[Field, ...] | None = None  # for kinds "records" and "record"
    default: Any = None
    range_reason: str = OUT_OF_RANGE
    reserved_prefix: str | None = None

    def __post_init__(self) -> None:
        # Checked once, when the spec is written, so validation can dispatch without a guard.
        if self.kind not in KINDS:
            raise AssertionError(f"{self.name}: unknown field kind {self.kind!r}")
        if (self.kind in ("records", "record")) != (self.items is not None):
            raise AssertionError(f"{self.name}: items go with kinds 'records' and 'record', and only with them")


def type_name(value: Any) -> str:
    """The JSON-ish type of ``value`` for error messages (``null`` for None)."""
    return type(value).__name__ if value is not None else "null"


# ---------------------------------------------------------------- validation


def _check_reserved(where: str, spec: Field, value: str) -> None:
    if spec.reserved_prefix is not None and value.startswith(spec.reserved_prefix):
        raise EventError(RESERVED_NAME, f"{where}: {value[:80]!r} starts with {spec.reserved_prefix!r}, which the "
                                        f"feature store's key layout reserves; use a name that does not")


def _check_str(where: str, spec: Field, value: Any) -> str:
    if not isinstance(value, str) or len(value) < spec.min_len:
        wanted = "a non-empty string" if spec.min_len else "a string"
        raise EventError("bad_field", f"{where}: expected {wanted}, got {value!r}")
    if spec.max_len is not None and len(value) > spec.max_len:
        raise EventError("bad_field", f"{where}: longer than {spec.max_len} characters")
    if spec.choices is not None and value not in spec.choices:
        raise EventError("bad_field", f"{where}: {value!r} is not one of {', '.join(spec.choices)}")
    _check_reserved(where, spec, value)
    return value


def _check_number(where: str, spec: Field, value: Any) -> int | float:
    # bool is an int subclass in Python, but true/false is not a number in JSON
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EventError("bad_field", f"{where}: expected a number, got {value!r} ({type_name(value)})")
    if spec.kind == "int":
        if isinstance(value, float):
            if not value.is_integer():
                raise EventError("bad_field", f"{where}: expected an integer, got {value!r}")
            value = int(value)
    else:
        value = float(value)
        if not math.isfinite(value):
            raise EventError("not_finite", f"{where}: must be finite, got {value!r}")
    if spec.minimum is not None and value < spec.minimum:
        raise EventError(spec.range_reason, f"{where}: must be >= {spec.minimum:.15g}, got {value!r}")
    if spec.exclusive_minimum is not None and value <= spec.exclusive_minimum:
        raise EventError(spec.range_reason, f"{where}: must be > {spec.exclusive_minimum:.15g}, got {value!r}")
    if spec.maximum is not None and value > spec.maximum:
        raise EventError(spec.range_reason, f"{where}: must be <= {spec.maximum:.15g}, got {value!r}")
    return value


def _check_strlist(where: str, spec: Field, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise EventError("bad_field", f"{where}: expected a list of strings, got {type_name(value)}")
    if spec.min_items is not None and len(value) < spec.min_items:
        raise EventError("bad_field", f"{where}: needs at least {spec.min_items} item(s)")
    if spec.max_items is not None and len(value) > spec.max_items:
        raise EventError("bad_field", f"{where}: at most {spec.max_items} items allowed")
    for item in value:
        if not isinstance(item, str) or not item:
            raise EventError("bad_field", f"{where}: items must be non-empty strings, got {item!r}")
        if spec.max_len is not None and len(item) > spec.max_len:
            raise EventError("bad_field", f"{where}: items must be at most {spec.max_len} characters")
        _check_reserved(where, spec, item)
    return tuple(value)


def _check_object(where: str, spec: Field, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise EventError("bad_field", f"{where}: expected an object, got {type_name(value)}")
    return value


def _check_records(where: str, spec: Field, value: Any) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list):
        raise EventError("bad_field", f"{where}: expected a list of objects, got {type_name(value)}")
    assert spec.items is not None  # Field.__post_init__: records always have items
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise EventError("bad_field", f"{where}[{i}]: expected an object")
        out.append(validate_fields(f"{where}[{i}]", spec.items, item))
    return tuple(out)


def _check_record(where: str, spec: Field, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise EventError("bad_field", f"{where}: expected an object, got {type_name(value)}")
    assert spec.items is not None  # Field.__post_init__: a record always has items
    # an optional field the object leaves out stays out, so a record decodes to what was encoded
    return {k: v for k, v in validate_fields(where, spec.items, value).items() if k in value}


#: The checker of each field kind: ``(where, spec, value) -> normalised value``.
_CHECKS: dict[str, Callable[[str, Field, Any], Any]] = {
    "str": _check_str,
    "int": _check_number,
    "float": _check_number,
    "strlist": _check_strlist,
    "object": _check_object,
    "records": _check_records,
    "record": _check_record,
}
assert tuple(_CHECKS) == KINDS, "every field kind needs a checker (and a schema in _field_schema)"


def validate_fields(event: str, specs: tuple[Field, ...], payload: Mapping[str, Any]) -> dict[str, Any]:
    """Check ``payload`` against ``specs``; the normalised value of every spec'd field.

    Parameters
    ----------
    event
        Prefix of error messages (``submission``, ``ranking.candidates[3]``).
    specs
        The fields, in order.
    payload
        Decoded JSON object. Fields not in ``specs`` are ignored (forward compatibility within a
        schema version).

    Returns
    -------
    dict
        ``{name: value}`` for every spec, missing optional fields set to their default.

    Raises
    ------
    EventError
        On the first field that is missing or does not meet its spec.
    """
    values: dict[str, Any] = {}
    # One pass, one call per present non-null field: this runs for every event every worker reads.
    for spec in specs:
        name = spec.name
        if name not in payload:
            if spec.required:
                raise EventError("missing_field", f"{event}.{name}: required field is missing", f"{event}.{name}")
            values[name] = spec.default
            continue
        value = payload[name]
        if value is None:
            if not spec.nullable:
                raise EventError("bad_field", f"{event}.{name}: must not be null", f"{event}.{name}")
            values[name] = None
            continue
        try:
            values[name] = _CHECKS[spec.kind](f"{event}.{name}", spec, value)
        except EventError as exc:
            if exc.field is None:  # a nested record's item has already named itself
                exc.field = f"{event}.{name}"
            raise
    return values


# ---------------------------------------------------------------- JSON Schema


def _string_limits(spec: Field) -> dict[str, Any]:
    """maxLength and the reserved prefix of a string (or of a list's items) as JSON Schema."""
    out: dict[str, Any] = {}
    if spec.max_len is not None:
        out["maxLength"] = spec.max_len
    if spec.reserved_prefix is not None:
        out["not"] = {"pattern": "^" + re.escape(spec.reserved_prefix)}
    return out


def _field_schema(spec: Field) -> dict[str, Any]:
    out: dict[str, Any]
    if spec.kind == "str":
        out = {"type": "string", "minLength": spec.min_len, **_string_limits(spec)}
        if spec.choices is not None:
            out["enum"] = list(spec.choices)
    elif spec.kind in ("int", "float"):
        out = {"type": "integer" if spec.kind == "int" else "number"}
        if spec.minimum is not None:
            out["minimum"] = spec.minimum
        if spec.exclusive_minimum is not None:
            out["exclusiveMinimum"] = spec.exclusive_minimum
        if spec.maximum is not None:
            out["maximum"] = spec.maximum
    elif spec.kind == "strlist":
        out = {"type": "array", "items": {"type": "string", "minLength": 1, **_string_limits(spec)}}
        if spec.min_items is not None:
            out["minItems"] = spec.min_items
        if spec.max_items is not None:
            out["maxItems"] = spec.max_items
    elif spec.kind == "object":
        out = {"type": "object"}
    elif spec.kind == "records":
        assert spec.items is not None
        out = {"type": "array", "items": object_schema(spec.items)}
    elif spec.kind == "record":
        assert spec.items is not None
        out = object_schema(spec.items)
    else:  # pragma: no cover - Field.__post_init__ admits only KINDS
        raise AssertionError(spec.kind)
    if spec.nullable:
        out = {"anyOf": [out, {"type": "null"}]}
    out["description"] = spec.doc
    return out


def object_schema(specs: tuple[Field, ...]) -> dict[str, Any]:
    """The JSON Schema of an object with these fields (``properties`` and ``required``).

    Parameters
    ----------
    specs
        The fields, in order; the schema lists them in the same order.

    Returns
    -------
    dict
        ``{"type": "object", "properties": ..., "required": ...}``.
    """
    return {
        "type": "object",
        "properties": {s.name: _field_schema(s) for s in specs},
        "required": [s.name for s in specs if s.required],
    }
