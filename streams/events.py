"""Event contracts: the records on every LEAP topic, their validation and their encoding.

Each event type is described once, as a tuple of :class:`Field` specs. Validation, the
dataclass the rest of the code uses, and the published JSON Schema (``schemas/*.json``) are all
derived from that one description, so they cannot drift apart. The derivation (validator and
schema generator, for any tuple of specs) lives in :mod:`streams.contract`; this module holds
the descriptions and the event classes.

Values are JSON (orjson); times are Unix seconds (float, UTC); throughput is samples per
second summed over all accelerators of the attempt.

Sanity bounds. Every number an event brings in has bounds, published in the schemas, and a value
outside them is dead-lettered (``out_of_range``; times ``time_out_of_range``) instead of being
ranked or stored. The bounds are wide enough for any real training job and narrow enough to
catch unit mistakes (milliseconds for seconds, bytes for parameters, tokens for samples):

- times (:data:`EARLIEST_TIME`, :data:`LATEST_TIME`): 2000-01-01 to 2100-01-01 UTC. A time in
  milliseconds (1.7e12) or a small number (1.0) is refused. The bound is fixed, not "now plus a
  margin": a JSON Schema can state it, a replay of a topic judges an event exactly as the worker
  did, and the simulator (``leap demo``, the benchmarks) runs its clock days ahead of the wall
  clock on purpose. Clock skew is what ``since_submit_ms`` in rankings shows, not a reason to drop.
- ``params`` (1 to :data:`MAX_PARAMS`, 1e15): the largest published models hold ~2e12
  parameters, recommendation models with their embedding tables up to ~1e14.
- ``global_batch_size`` (:data:`MAX_BATCH`, 1e8 samples): published global batches reach ~1e6
  samples; a batch given in tokens (4M) still fits, 1e12 does not.
- ``seq_len`` (:data:`MAX_SEQ_LEN`, 2^24): 10M-token contexts exist; images are far smaller.
- ``num_accelerators`` and parallel degrees (:data:`MAX_ACCELERATORS`, 2^20): single jobs run on
  ~1e5 accelerators today.
- ``throughput`` (:data:`MIN_THROUGHPUT` 1e-6 to :data:`MAX_THROUGHPUT` 1e10 samples/s): 2^20
  accelerators at 1e4 samples/s; below one sample in 11 days is no measurement (and divided by
  the accelerators it could round to 0, which the store's scripts refuse).
- ``accelerator_hours`` (:data:`MAX_ACCELERATOR_HOURS`, 1e10): 2^20 accelerators for a year.

Hardware names may not start with :data:`leap.core.keyspace.RESERVED_PREFIX` (``reserved_name``):
the feature store keeps its own fields beside them; nor may a job key start with
:data:`leap.core.keyspace.HASH_TAG_CLOSE`: its keys' Redis Cluster hash tag would be empty. What
LEAP itself computes (predictions, costs, latencies in rankings) is bounded below and finite,
but not above: a bound there would turn a model's extrapolation into a lost ranking.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar, TypeVar

import orjson

# EventError and Field stay importable from here, beside the events whose contracts they carry.
from leap.core.keyspace import HASH_TAG_CLOSE, RESERVED_PREFIX
from streams.contract import TIME_OUT_OF_RANGE, EventError, Field, object_schema, type_name, validate_fields

SCHEMA_VERSION = 1
SUPPORTED_SCHEMA_VERSIONS = frozenset({1})
#: Rankings have their own version: 2 added each candidate's ``basis``. A version-1 ranking (no
#: basis) still decodes; a version-2 ranking read with the version-1 field list is valid apart
#: from its version number (it only adds a field), so readers that ignore the version keep working.
RANKING_SCHEMA_VERSION = 2
RANKING_SUPPORTED_VERSIONS = frozenset({1, 2})
#: What a ranked candidate's prediction rests on (``basis.evidence``): the job ran on this
#: hardware before, only on other hardware, or never.
EVIDENCE = ("ran_here", "ran_elsewhere", "none")
#: Largest encoded event accepted on any topic. A submission with 64 candidates is ~4 KiB.
MAX_EVENT_BYTES = 64 * 1024

PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")
OUTCOMES = ("completed", "failed", "preempted")


# ---------------------------------------------------------------- field specs

#: Longest id (job_key, attempt_id, model_type) accepted.
ID_LEN = 256
#: Longest event id accepted.
EVENT_ID_LEN = 128
#: A ranking's event id is this and its submission's event id: a ranking sent again for a
#: redelivered submission has the same id.
RANKING_ID_PREFIX = "rank:"
#: Longest hardware name accepted.
HARDWARE_LEN = 64
#: Most candidates a submission may list (and so the largest rank).
MAX_CANDIDATES = 64

#: Sanity bounds (module docstring): 2000-01-01 and 2100-01-01 UTC, Unix seconds.
EARLIEST_TIME = 946_684_800.0
LATEST_TIME = 4_102_444_800.0
MAX_PARAMS = 1e15
MAX_BATCH = 100_000_000
MAX_SEQ_LEN = 2**24
MAX_ACCELERATORS = 2**20
MIN_THROUGHPUT = 1e-6
MAX_THROUGHPUT = 1e10
MAX_ACCELERATOR_HOURS = 1e10


def time_field(name: str, doc: str, **kw: Any) -> Field:
    """A Unix-seconds field within [:data:`EARLIEST_TIME`, :data:`LATEST_TIME`]."""
    return Field(name, "float", f"{doc} Unix seconds (UTC), 2000-01-01 to 2100-01-01.", minimum=EARLIEST_TIME,
                 maximum=LATEST_TIME, range_reason=TIME_OUT_OF_RANGE, **kw)


def hardware_field(name: str, doc: str, **kw: Any) -> Field:
    """A hardware type's name: at most :data:`HARDWARE_LEN` characters, never the store's marker."""
    return Field(name, "str", doc, max_len=HARDWARE_LEN, reserved_prefix=RESERVED_PREFIX,
                 **kw)


def count_field(name: str, doc: str, maximum: int, **kw: Any) -> Field:
    """A positive integer up to ``maximum``."""
    return Field(name, "int", doc, minimum=1, maximum=maximum, **kw)


COMMON_FIELDS: tuple[Field, ...] = (
    Field("schema_version", "int", "Contract version; this code reads 1.", minimum=1),
    Field("event_id", "str", "Unique id of this event; used to drop duplicates.", max_len=EVENT_ID_LEN),
    time_field("event_time", "When the event happened."),
    Field("job_key", "str", "Names the job across attempts (also the Kafka key).", max_len=ID_LEN,
          reserved_prefix=HASH_TAG_CLOSE),
)

SUBMISSION_FIELDS: tuple[Field, ...] = (
    *COMMON_FIELDS,
    Field("attempt_id", "str", "Names this attempt of the job.", max_len=ID_LEN),
    Field("model_type", "str", "Model type, e.g. 'llama-7b'.", max_len=ID_LEN),
    Field("family", "str", "Model family, e.g. 'dense_lm', 'moe', 'vision_cnn'; null or absent: unknown.",
          max_len=64, required=False, nullable=True),
    Field("params", "float", "Parameter count; null or absent: unknown.", minimum=1, maximum=MAX_PARAMS,
          required=False, nullable=True),
    count_field("global_batch_size", "Global batch size in samples.", MAX_BATCH),
    count_field("seq_len", "Sequence length (tokens) or input size (pixels per side); null or absent: unknown.",
                MAX_SEQ_LEN, required=False, nullable=True),
    Field("precision", "str", "Training precision; null or absent: unknown.", choices=PRECISIONS, required=False,
          nullable=True),
    count_field("num_accelerators", "Accelerators the attempt asks for.", MAX_ACCELERATORS),
    count_field("data_parallel", "Data-parallel degree; null or absent: unknown.", MAX_ACCELERATORS,
                required=False, nullable=True),
    count_field("tensor_parallel", "Tensor-parallel degree; null or absent: unknown.", MAX_ACCELERATORS,
                required=False, nullable=True),
    count_field("pipeline_parallel", "Pipeline-parallel degree; null or absent: unknown.", MAX_ACCELERATORS,
                required=False, nullable=True),
    Field("framework", "str", "Training framework, e.g. 'pytorch', 'jax'; null or absent: unknown.", max_len=64,
          required=False, nullable=True),
    Field("candidates", "strlist", "Candidate hardware types to rank.", min_items=1, max_items=MAX_CANDIDATES,
          max_len=HARDWARE_LEN, reserved_prefix=RESERVED_PREFIX),
    hardware_field("requested_hardware", "Hardware the user asked for (default routing when no ranking arrives).",
                   required=False, nullable=True),
)

START_FIELDS: tuple[Field, ...] = (
    *COMMON_FIELDS,
    Field("attempt_id", "str", "Names this attempt of the job.", max_len=ID_LEN),
    Field("model_type", "str", "Model type.", max_len=ID_LEN),
    Field("family", "str", "Model family; null or absent: unknown.", max_len=64, required=False, nullable=True),
    hardware_field("hardware", "Hardware type the attempt was placed on."),
    count_field("num_accelerators", "Accelerators used.", MAX_ACCELERATORS),
)

FINISH_FIELDS: tuple[Field, ...] = (
    *START_FIELDS,
    Field(
        "throughput",
        "float",
        "Measured throughput, samples/s over all accelerators; null when nothing was measured.",
        nullable=True,
        minimum=MIN_THROUGHPUT,
        maximum=MAX_THROUGHPUT,
    ),
    Field("accelerator_hours", "float", "Accelerator-hours the attempt used.", minimum=0,
          maximum=MAX_ACCELERATOR_HOURS),
    Field("outcome", "str", "How the attempt ended.", choices=OUTCOMES),
    time_field("start_time", "When the attempt started."),
    count_field("global_batch_size", "Global batch size the attempt ran with; null or absent: unknown.", MAX_BATCH,
                required=False, nullable=True),
    Field("precision", "str", "Precision the attempt ran with; null or absent: unknown.", choices=PRECISIONS,
          required=False, nullable=True),
)

BASIS_FIELDS: tuple[Field, ...] = (
    Field("evidence", "str", "What the job's own history holds: it ran on this hardware, only elsewhere, or "
          "never.", choices=EVIDENCE),
    Field("estimate", "str", "Which estimate was served: a key of predictor.models.ESTIMATES (model, "
          "measured_here, prior_carried, paired_ratio, lookup, cold_start, peak_bound, ...).", max_len=32),
    hardware_field("prior", "Hardware of the job's measurement the estimate is compared with: this hardware when "
                   "the job ran here, else its most-observed other hardware. Its per-accelerator throughput and "
                   "time are features_used.prior[<prior>] (robust, last_time). Absent when the job never ran.",
                   required=False, nullable=True),
    Field("ratio", "float", "Served per-accelerator throughput over the prior's, four significant digits; absent "
          "without a prior, null without an estimate.", minimum=0, required=False, nullable=True),
    Field("stand_ins", "object", "Submission fields that were missing, each with what stood in for it; absent "
          "(or null) when nothing was missing.", required=False, nullable=True),
)

CANDIDATE_FIELDS: tuple[Field, ...] = (
    hardware_field("hardware", "Hardware type as given in the submission."),
    Field("predicted_throughput", "float", "Predicted samples/s.", nullable=True, minimum=0),
    Field("lower", "float", "Lower end of the uncertainty band (samples/s).", nullable=True, minimum=0),
    Field("upper", "float", "Upper end of the uncertainty band (samples/s).", nullable=True, minimum=0),
    Field("hourly_cost", "float", "USD per hour for all accelerators of the attempt.", nullable=True, minimum=0),
    Field("throughput_per_dollar", "float", "Predicted samples per USD.", nullable=True, minimum=0),
    count_field("rank", "1 = best throughput per dollar; null when unranked.", MAX_CANDIDATES, nullable=True),
    Field("reason", "str", "Why the candidate is unranked or used a fallback.", nullable=True),
    Field("basis", "record", "What the prediction rests on: present from schema version 2 (absent or null in "
          "version 1).", items=BASIS_FIELDS, required=False, nullable=True),
)

RANKING_FIELDS: tuple[Field, ...] = (
    # the id holds a whole submission id after its prefix (ranking_id), so it may be that much longer
    *(dataclasses.replace(f, max_len=EVENT_ID_LEN + len(RANKING_ID_PREFIX),
                          doc=f"'{RANKING_ID_PREFIX}' and the submission's event_id.") if f.name == "event_id"
      else dataclasses.replace(f, doc="Contract version; this code writes 2 and reads 1 and 2.")
      if f.name == "schema_version" else f
      for f in COMMON_FIELDS),
    Field("attempt_id", "str", "The ranked attempt.", max_len=ID_LEN),
    Field("submission_event_id", "str", "event_id of the submission ranked.", max_len=EVENT_ID_LEN),
    time_field("submission_time", "event_time of the submission."),
    Field("model_version", "str", "Model that produced the predictions.", max_len=128),
    Field("candidates", "records", "Every candidate, ranked or not.", items=CANDIDATE_FIELDS),
    Field("best_hardware", "str", "Rank-1 hardware, null when nothing could be ranked.", nullable=True),
    Field("features_used", "object", "Feature values the prediction used, for audit and training."),
    Field("fallback", "str", "Why a fallback was used (null when none).", nullable=True, required=False),
    Field("latency_ms", "float", "Time from receiving the submission to emitting this.", minimum=0),
    Field("since_submit_ms", "float", "Time from the submission's event_time (the scheduler's clock) to emitting "
          "this: queueing, outages and failovers included; clock skew shows in it. Null or absent: not measured.",
          minimum=0, required=False, nullable=True),
)

DEAD_LETTER_FIELDS: tuple[Field, ...] = (
    Field("schema_version", "int", "Contract version.", minimum=1),
    Field("event_id", "str", "Unique id of the dead letter.", max_len=128),
    time_field("event_time", "When the event was rejected."),
    Field("source_topic", "str", "Topic the bad event was read from."),
    Field("partition", "int", "Partition of the bad event.", minimum=0, maximum=2**31 - 1),
    Field("offset", "int", "Offset of the bad event.", minimum=0, maximum=2**63 - 1),
    Field("key", "str", "Message key as text (lossy), null when absent.", nullable=True, required=False,
          min_len=0),
    Field("raw_base64", "str", "The message value, byte for byte, base64-encoded: \"\" for an empty value, null "
          "for none (a tombstone) or when too large to carry (then fetch it at source_topic/partition/offset).",
          required=False, nullable=True, min_len=0),
    Field("reason", "str", "Short code, e.g. bad_json, missing_field, not_finite."),
    Field("error", "str", "What is wrong, for people."),
)

MODEL_FIELDS: tuple[Field, ...] = (
    Field("schema_version", "int", "Contract version.", minimum=1),
    Field("event_id", "str", "Unique id of the announcement.", max_len=128),
    time_field("event_time", "When the model was promoted."),
    Field("model_version", "str", "Version now current.", max_len=128),
    Field("kind", "str", "Model kind.", choices=("lightgbm", "lookup")),
    Field("artifact", "str", "Path or URI of the artifact folder.", nullable=True, required=False),
    Field("metrics", "object", "Holdout metrics of the promoted model; null or absent for a baseline.",
          required=False, nullable=True),
)


def ranking_id(submission_event_id: str) -> str:
    """The event id of the ranking of the submission with this event id."""
    return RANKING_ID_PREFIX + submission_event_id


# ---------------------------------------------------------------- event classes


def _supported(version: Any, supported: frozenset[int]) -> bool:
    """Whether ``version`` is in ``supported``; False for a list or an object too (they are unhashable)."""
    try:
        return version in supported
    except TypeError:
        return False

E = TypeVar("E", bound="Event")


class Event:
    """Base of all events: decoding, validation and encoding from the class's ``FIELDS``."""

    FIELDS: ClassVar[tuple[Field, ...]]
    NAME: ClassVar[str]
    #: The version this code writes, and the versions it reads.
    VERSION: ClassVar[int] = SCHEMA_VERSION
    SUPPORTED_VERSIONS: ClassVar[frozenset[int]] = SUPPORTED_SCHEMA_VERSIONS
    #: Size limit when decoding; dead letters carry a whole rejected message, so theirs is larger.
    MAX_BYTES: ClassVar[int] = MAX_EVENT_BYTES

    @classmethod
    def from_dict(cls: type[E], payload: Any) -> E:
        if not isinstance(payload, dict):
            raise EventError("bad_json", f"{cls.NAME}: expected a JSON object, got {type_name(payload)}")
        version = payload.get("schema_version")
        if version is not None and not _supported(version, cls.SUPPORTED_VERSIONS):
            raise EventError(
                "unknown_schema_version",
                f"{cls.NAME}.schema_version: {version!r} is not supported "
                f"(supported: {sorted(cls.SUPPORTED_VERSIONS)})",
                f"{cls.NAME}.schema_version",
            )
        values = validate_fields(cls.NAME, cls.FIELDS, payload)
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
    family: str | None
    params: float | None
    global_batch_size: int
    seq_len: int | None
    precision: str | None
    num_accelerators: int
    data_parallel: int | None
    tensor_parallel: int | None
    pipeline_parallel: int | None
    framework: str | None
    candidates: tuple[str, ...]
    requested_hardware: str | None = None

    def _check_rules(self) -> None:
        parallel = (self.data_parallel, self.tensor_parallel, self.pipeline_parallel)
        degree = None if None in parallel else math.prod(p for p in parallel if p is not None)
        if degree is not None and degree != self.num_accelerators:
            raise EventError(
                "inconsistent",
                f"submission: data_parallel x tensor_parallel x pipeline_parallel = {degree} "
                f"but num_accelerators = {self.num_accelerators}",
            )
        if len(set(self.candidates)) != len(self.candidates):
            raise EventError("bad_field", "submission.candidates: duplicate hardware types", "submission.candidates")


@_event("job_start", START_FIELDS)
@dataclass(frozen=True, slots=True)
class JobStart(Event):
    schema_version: int
    event_id: str
    event_time: float
    job_key: str
    attempt_id: str
    model_type: str
    family: str | None
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
    family: str | None
    hardware: str
    num_accelerators: int
    throughput: float | None
    accelerator_hours: float
    outcome: str
    start_time: float
    global_batch_size: int | None = None
    precision: str | None = None

    def _check_rules(self) -> None:
        if self.outcome == "completed" and self.throughput is None:
            raise EventError("missing_field", "job_finish.throughput: required when outcome is 'completed'",
                             "job_finish.throughput")
        if self.start_time > self.event_time:
            raise EventError("inconsistent", "job_finish: start_time is after event_time (the finish)")


@_event("ranking", RANKING_FIELDS)
@dataclass(frozen=True, slots=True)
class Ranking(Event):
    MAX_BYTES: ClassVar[int] = 4 * MAX_EVENT_BYTES
    VERSION: ClassVar[int] = RANKING_SCHEMA_VERSION
    SUPPORTED_VERSIONS: ClassVar[frozenset[int]] = RANKING_SUPPORTED_VERSIONS
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
    since_submit_ms: float | None = None

    def _check_rules(self) -> None:
        if self.schema_version >= 2 and any("basis" not in c or c["basis"] is None for c in self.candidates):
            raise EventError("missing_field", "ranking.candidates[].basis: required from schema version 2",
                             "ranking.candidates")


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

def json_schema(cls: type[Event]) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one event type, derived from its field specs."""
    schema = object_schema(cls.FIELDS)
    schema["properties"]["schema_version"]["enum"] = sorted(cls.SUPPORTED_VERSIONS)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://leap.dev/schemas/{cls.NAME}.v{cls.VERSION}.json",
        "title": cls.NAME,
        **schema,
    }
