"""Event contracts: the records on every LEAP topic, their validation and their encoding.

Each event type is described once, as a tuple of :class:`Field` specs. Validation, the
dataclass the rest of the code uses, and the published JSON Schema (``schemas/*.json``) are all
derived from that one description, so they cannot drift apart.

Values are JSON (orjson); times are Unix seconds (float, UTC); throughput is samples per
second summed over all accelerators of the attempt.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, TypeVar

import orjson

SCHEMA_VERSION = 1
SUPPORTED_SCHEMA_VERSIONS = frozenset({1})
#: Largest encoded event accepted on any topic. A submission with 64 candidates is ~4 KiB.
MAX_EVENT_BYTES = 64 * 1024

PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")
OUTCOMES = ("completed", "failed", "preempted")


class EventError(ValueError):
    """An event that cannot be accepted. ``reason`` is a short stable code for metrics."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


@dataclass(frozen=True)
class Field:
    """One field of an event: its JSON type and constraints.

    ``kind`` is one of ``str``, ``int``, ``float``, ``strlist``, ``object``, ``records``.
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
    min_items: int | None = None
    max_items: int | None = None
    items: tuple[Field, ...] | None = None  # for kind == "records"
    default: Any = None


def _type_name(value: Any) -> str:
    return type(value).__name__ if value is not None else "null"


def _check(event: str, spec: Field, value: Any) -> Any:
    """Validate one value against its spec and return it normalised (int -> float etc.)."""
    where = f"{event}.{spec.name}"
    if value is None:
        if spec.nullable:
            return None
        raise EventError("bad_field", f"{where}: must not be null")
    if spec.kind == "str":
        if not isinstance(value, str) or not value:
            raise EventError("bad_field", f"{where}: expected a non-empty string, got {value!r}")
        if spec.max_len is not None and len(value) > spec.max_len:
            raise EventError("bad_field", f"{where}: longer than {spec.max_len} characters")
        if spec.choices is not None and value not in spec.choices:
            raise EventError("bad_field", f"{where}: {value!r} is not one of {', '.join(spec.choices)}")
        return value
    if spec.kind in ("int", "float"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise EventError(
                "bad_field", f"{where}: expected a number, got {value!r} ({_type_name(value)})"
            )
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
            raise EventError("out_of_range", f"{where}: must be >= {spec.minimum:g}, got {value!r}")
        if spec.exclusive_minimum is not None and value <= spec.exclusive_minimum:
            raise EventError(
                "out_of_range", f"{where}: must be > {spec.exclusive_minimum:g}, got {value!r}"
            )
        if spec.maximum is not None and value > spec.maximum:
            raise EventError("out_of_range", f"{where}: must be <= {spec.maximum:g}, got {value!r}")
        return value
    if spec.kind == "strlist":
        if not isinstance(value, list):
            raise EventError("bad_field", f"{where}: expected a list of strings, got {_type_name(value)}")
        if spec.min_items is not None and len(value) < spec.min_items:
            raise EventError("bad_field", f"{where}: needs at least {spec.min_items} item(s)")
        if spec.max_items is not None and len(value) > spec.max_items:
            raise EventError("bad_field", f"{where}: at most {spec.max_items} items allowed")
        for item in value:
            if not isinstance(item, str) or not item:
                raise EventError("bad_field", f"{where}: items must be non-empty strings, got {item!r}")
        return tuple(value)
    if spec.kind == "object":
        if not isinstance(value, dict):
            raise EventError("bad_field", f"{where}: expected an object, got {_type_name(value)}")
        return value
    if spec.kind == "records":
        if not isinstance(value, list):
            raise EventError("bad_field", f"{where}: expected a list of objects, got {_type_name(value)}")
        assert spec.items is not None
        out = []
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                raise EventError("bad_field", f"{where}[{i}]: expected an object")
            out.append(_validate_fields(f"{where}[{i}]", spec.items, item))
        return tuple(out)
    raise AssertionError(f"unknown field kind {spec.kind}")


def _validate_fields(event: str, specs: tuple[Field, ...], payload: Mapping[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for spec in specs:
        if spec.name not in payload:
            if spec.required:
                raise EventError("missing_field", f"{event}.{spec.name}: required field is missing")
            values[spec.name] = spec.default
            continue
        values[spec.name] = _check(event, spec, payload[spec.name])
    return values


# ---------------------------------------------------------------- field specs

#: Longest id (job_key, attempt_id, model_type) accepted.
ID_LEN = 256

COMMON_FIELDS: tuple[Field, ...] = (
    Field("schema_version", "int", "Contract version; this code reads 1.", minimum=1),
    Field("event_id", "str", "Unique id of this event; used to drop duplicates.", max_len=128),
    Field("event_time", "float", "When the event happened, Unix seconds (UTC).", exclusive_minimum=0),
    Field("job_key", "str", "Names the job across attempts (also the Kafka key).", max_len=ID_LEN),
)

SUBMISSION_FIELDS: tuple[Field, ...] = (
    *COMMON_FIELDS,
    Field("attempt_id", "str", "Names this attempt of the job.", max_len=ID_LEN),
    Field("model_type", "str", "Model type, e.g. 'llama-7b'.", max_len=ID_LEN),
    Field("family", "str", "Model family, e.g. 'dense_lm', 'moe', 'vision_cnn'.", max_len=64),
    Field("params", "float", "Parameter count.", exclusive_minimum=0),
    Field("global_batch_size", "int", "Global batch size in samples.", minimum=1),
    Field("seq_len", "int", "Sequence length (tokens) or input size (pixels per side).", minimum=1),
    Field("precision", "str", "Training precision.", choices=PRECISIONS),
    Field("num_accelerators", "int", "Accelerators the attempt asks for.", minimum=1, maximum=65536),
    Field("data_parallel", "int", "Data-parallel degree.", minimum=1),
    Field("tensor_parallel", "int", "Tensor-parallel degree.", minimum=1),
    Field("pipeline_parallel", "int", "Pipeline-parallel degree.", minimum=1),
    Field("framework", "str", "Training framework, e.g. 'pytorch', 'jax'.", max_len=64),
    Field(
        "candidates", "strlist", "Candidate hardware types to rank.", min_items=1, max_items=64
    ),
    Field(
        "requested_hardware",
        "str",
        "Hardware the user asked for (default routing when no ranking arrives).",
        required=False,
        nullable=True,
        max_len=64,
    ),
)

START_FIELDS: tuple[Field, ...] = (
    *COMMON_FIELDS,
    Field("attempt_id", "str", "Names this attempt of the job.", max_len=ID_LEN),
    Field("model_type", "str", "Model type.", max_len=ID_LEN),
    Field("family", "str", "Model family.", max_len=64),
    Field("hardware", "str", "Hardware type the attempt was placed on.", max_len=64),
    Field("num_accelerators", "int", "Accelerators used.", minimum=1, maximum=65536),
)

FINISH_FIELDS: tuple[Field, ...] = (
    *START_FIELDS,
    Field(
        "throughput",
        "float",
        "Measured throughput, samples/s over all accelerators; null when nothing was measured.",
        nullable=True,
        exclusive_minimum=0,
    ),
    Field("accelerator_hours", "float", "Accelerator-hours the attempt used.", minimum=0),
    Field("outcome", "str", "How the attempt ended.", choices=OUTCOMES),
    Field("start_time", "float", "When the attempt started, Unix seconds.", exclusive_minimum=0),
)

CANDIDATE_FIELDS: tuple[Field, ...] = (
    Field("hardware", "str", "Hardware type as given in the submission.", max_len=64),
    Field("predicted_throughput", "float", "Predicted samples/s.", nullable=True, minimum=0),
    Field("lower", "float", "Lower end of the uncertainty band (samples/s).", nullable=True, minimum=0),
    Field("upper", "float", "Upper end of the uncertainty band (samples/s).", nullable=True, minimum=0),
    Field("hourly_cost", "float", "USD per hour for all accelerators of the attempt.", nullable=True),
    Field("throughput_per_dollar", "float", "Predicted samples per USD.", nullable=True, minimum=0),
    Field("rank", "int", "1 = best throughput per dollar; null when unranked.", nullable=True, minimum=1),
    Field("reason", "str", "Why the candidate is unranked or used a fallback.", nullable=True),
)

RANKING_FIELDS: tuple[Field, ...] = (
    *COMMON_FIELDS,
    Field("attempt_id", "str", "The ranked attempt.", max_len=ID_LEN),
    Field("submission_event_id", "str", "event_id of the submission ranked.", max_len=128),
    Field("submission_time", "float", "event_time of the submission.", exclusive_minimum=0),
    Field("model_version", "str", "Model that produced the predictions.", max_len=128),
    Field("candidates", "records", "Every candidate, ranked or not.", items=CANDIDATE_FIELDS),
    Field("best_hardware", "str", "Rank-1 hardware, null when nothing could be ranked.", nullable=True),
    Field("features_used", "object", "Feature values the prediction used, for audit and training."),
    Field("fallback", "str", "Why a fallback was used (null when none).", nullable=True, required=False),
    Field("latency_ms", "float", "Time from receiving the submission to emitting this.", minimum=0),
)

DEAD_LETTER_FIELDS: tuple[Field, ...] = (
    Field("schema_version", "int", "Contract version.", minimum=1),
    Field("event_id", "str", "Unique id of the dead letter.", max_len=128),
    Field("event_time", "float", "When the event was rejected.", exclusive_minimum=0),
    Field("source_topic", "str", "Topic the bad event was read from."),
    Field("partition", "int", "Partition of the bad event.", minimum=0),
    Field("offset", "int", "Offset of the bad event.", minimum=0),
    Field("key", "str", "Message key as text (lossy), null when absent.", nullable=True, required=False),
    Field("raw_base64", "str", "The message value, byte for byte, base64-encoded.", required=False,
          nullable=True),
    Field("reason", "str", "Short code, e.g. bad_json, missing_field, not_finite."),
    Field("error", "str", "What is wrong, for people."),
)

MODEL_FIELDS: tuple[Field, ...] = (
    Field("schema_version", "int", "Contract version.", minimum=1),
    Field("event_id", "str", "Unique id of the announcement.", max_len=128),
    Field("event_time", "float", "When the model was promoted.", exclusive_minimum=0),
    Field("model_version", "str", "Version now current.", max_len=128),
    Field("kind", "str", "Model kind.", choices=("lightgbm", "lookup")),
    Field("artifact", "str", "Path or URI of the artifact folder.", nullable=True, required=False),
    Field("metrics", "object", "Holdout metrics of the promoted model.", required=False),
)


# ---------------------------------------------------------------- event classes

E = TypeVar("E", bound="Event")


class Event:
    """Base of all events: decoding, validation and encoding from the class's ``FIELDS``."""

    FIELDS: ClassVar[tuple[Field, ...]]
    NAME: ClassVar[str]
    #: Size limit when decoding; dead letters carry a whole rejected message, so theirs is larger.
    MAX_BYTES: ClassVar[int] = MAX_EVENT_BYTES

    @classmethod
    def from_dict(cls: type[E], payload: Any) -> E:
        if not isinstance(payload, dict):
            raise EventError("bad_json", f"{cls.NAME}: expected a JSON object, got {_type_name(payload)}")
        version = payload.get("schema_version")
        if version is not None and version not in SUPPORTED_SCHEMA_VERSIONS:
            raise EventError(
                "unknown_schema_version",
                f"{cls.NAME}.schema_version: {version!r} is not supported "
                f"(supported: {sorted(SUPPORTED_SCHEMA_VERSIONS)})",
            )
        values = _validate_fields(cls.NAME, cls.FIELDS, payload)
        event = cls(**values)
        event._check_rules()
        return event

    @classmethod
    def decode(cls: type[E], raw: bytes | None) -> E:
        if raw is None:
            raise EventError("bad_json", f"{cls.NAME}: message has no value")
        if len(raw) > cls.MAX_BYTES:
            raise EventError("oversize", f"{cls.NAME}: {len(raw)} bytes exceeds the {cls.MAX_BYTES} limit")
        try:
            payload = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise EventError("bad_json", f"{cls.NAME}: not valid JSON ({exc})") from None
        return cls.from_dict(payload)

    def _check_rules(self) -> None:
        """Cross-field rules; subclasses override."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out

    def encode(self) -> bytes:
        return orjson.dumps(self.to_dict())


def _event(name: str, specs: tuple[Field, ...]) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        cls.NAME = name  # type: ignore[attr-defined]
        cls.FIELDS = specs  # type: ignore[attr-defined]
        declared = [f.name for f in fields(cls)]
        expected = [s.name for s in specs]
        assert declared == expected, f"{name}: dataclass fields {declared} != spec {expected}"
        return cls

    return wrap


@_event("submission", SUBMISSION_FIELDS)
@dataclass(frozen=True, slots=True)
class Submission(Event):
    schema_version: int
    event_id: str
    event_time: float
    job_key: str
    attempt_id: str
    model_type: str
    family: str
    params: float
    global_batch_size: int
    seq_len: int
    precision: str
    num_accelerators: int
    data_parallel: int
    tensor_parallel: int
    pipeline_parallel: int
    framework: str
    candidates: tuple[str, ...]
    requested_hardware: str | None = None

    def _check_rules(self) -> None:
        degree = self.data_parallel * self.tensor_parallel * self.pipeline_parallel
        if degree != self.num_accelerators:
            raise EventError(
                "inconsistent",
                f"submission: data_parallel x tensor_parallel x pipeline_parallel = {degree} "
                f"but num_accelerators = {self.num_accelerators}",
            )
        if len(set(self.candidates)) != len(self.candidates):
            raise EventError("bad_field", "submission.candidates: duplicate hardware types")


@_event("job_start", START_FIELDS)
@dataclass(frozen=True, slots=True)
class JobStart(Event):
    schema_version: int
    event_id: str
    event_time: float
    job_key: str
    attempt_id: str
    model_type: str
    family: str
    hardware: str
    num_accelerators: int


@_event("job_finish", FINISH_FIELDS)
@dataclass(frozen=True, slots=True)
class JobFinish(Event):
    schema_version: int
    event_id: str
    event_time: float
    job_key: str
    attempt_id: str
    model_type: str
    family: str
    hardware: str
    num_accelerators: int
    throughput: float | None
    accelerator_hours: float
    outcome: str
    start_time: float

    def _check_rules(self) -> None:
        if self.outcome == "completed" and self.throughput is None:
            raise EventError("missing_field", "job_finish.throughput: required when outcome is 'completed'")
        if self.start_time > self.event_time:
            raise EventError("inconsistent", "job_finish: start_time is after event_time (the finish)")


@_event("ranking", RANKING_FIELDS)
@dataclass(frozen=True, slots=True)
class Ranking(Event):
    MAX_BYTES: ClassVar[int] = 4 * MAX_EVENT_BYTES
    schema_version: int
    event_id: str
    event_time: float
    job_key: str
    attempt_id: str
    submission_event_id: str
    submission_time: float
    model_version: str
    candidates: tuple[dict[str, Any], ...]
    best_hardware: str | None
    features_used: dict[str, Any]
    fallback: str | None
    latency_ms: float


@_event("dead_letter", DEAD_LETTER_FIELDS)
@dataclass(frozen=True, slots=True)
class DeadLetter(Event):
    MAX_BYTES: ClassVar[int] = 512 * 1024
    schema_version: int
    event_id: str
    event_time: float
    source_topic: str
    partition: int
    offset: int
    key: str | None
    raw_base64: str | None
    reason: str
    error: str


@_event("model_announcement", MODEL_FIELDS)
@dataclass(frozen=True, slots=True)
class ModelAnnouncement(Event):
    schema_version: int
    event_id: str
    event_time: float
    model_version: str
    kind: str
    artifact: str | None = None
    metrics: dict[str, Any] | None = None


EVENT_TYPES: tuple[type[Event], ...] = (Submission, JobStart, JobFinish, Ranking, DeadLetter, ModelAnnouncement)


# ---------------------------------------------------------------- JSON Schema

def _field_schema(spec: Field) -> dict[str, Any]:
    out: dict[str, Any]
    if spec.kind == "str":
        out = {"type": "string", "minLength": 1}
        if spec.max_len is not None:
            out["maxLength"] = spec.max_len
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
        out = {"type": "array", "items": {"type": "string", "minLength": 1}}
        if spec.min_items is not None:
            out["minItems"] = spec.min_items
        if spec.max_items is not None:
            out["maxItems"] = spec.max_items
    elif spec.kind == "object":
        out = {"type": "object"}
    elif spec.kind == "records":
        assert spec.items is not None
        out = {"type": "array", "items": _object_schema(spec.items)}
    else:  # pragma: no cover - guarded by _check
        raise AssertionError(spec.kind)
    if spec.nullable:
        out = {"anyOf": [out, {"type": "null"}]}
    out["description"] = spec.doc
    return out


def _object_schema(specs: tuple[Field, ...]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {s.name: _field_schema(s) for s in specs},
        "required": [s.name for s in specs if s.required],
    }


def json_schema(cls: type[Event]) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one event type, derived from its field specs."""
    schema = _object_schema(cls.FIELDS)
    schema["properties"]["schema_version"]["enum"] = sorted(SUPPORTED_SCHEMA_VERSIONS)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://leap.dev/schemas/{cls.NAME}.v{SCHEMA_VERSION}.json",
        "title": cls.NAME,
        **schema,
    }
