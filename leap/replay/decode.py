"""Which event class a message holds, and decoding that counts bad events instead of failing."""

from __future__ import annotations

import base64
from typing import Any

import orjson
from confluent_kafka import Message

from leap.replay.reader import Tally
from streams.events import (
    DeadLetter,
    Event,
    EventError,
    JobFinish,
    JobStart,
    ModelAnnouncement,
    Ranking,
    Submission,
)
from streams.topics import DEAD_LETTER, JOB_FINISHES, JOB_STARTS, MODELS, RANKINGS, SUBMISSIONS

BY_TOPIC: dict[str, type[Event]] = {
    SUBMISSIONS.name: Submission,
    JOB_STARTS.name: JobStart,
    JOB_FINISHES.name: JobFinish,
    RANKINGS.name: Ranking,
    MODELS.name: ModelAnnouncement,
    DEAD_LETTER.name: DeadLetter,
}
#: Event type names accepted by ``--type``.
TYPE_NAMES: dict[str, type[Event]] = {cls.NAME: cls for cls in BY_TOPIC.values()}
#: Order to try on a topic LEAP does not own (a copy): the more specific contract first, since
#: validation ignores extra fields and a finish would also pass as a start.
_TRIAL_ORDER: tuple[type[Event], ...] = (Ranking, Submission, JobFinish, JobStart, DeadLetter, ModelAnnouncement)


def try_decode(msg: Message, expect: type[Event] | None = None) -> Event | EventError:
    """The event in ``msg`` or the error that rejects it.

    Parameters
    ----------
    msg
        A Kafka message.
    expect
        Event class to decode as; default: from the topic, or by trial on topics LEAP does not own.
    """
    cls = expect or BY_TOPIC.get(msg.topic() or "")
    raw = msg.value()
    if cls is not None:
        try:
            return cls.decode(raw)
        except EventError as exc:
            return exc
    first: EventError | None = None
    for candidate in _TRIAL_ORDER:
        try:
            return candidate.decode(raw)
        except EventError as exc:
            first = first or exc
    assert first is not None
    if first.reason in ("bad_json", "oversize"):  # not about any one contract: drop the class name
        return EventError(first.reason, first.message.split(": ", 1)[-1])
    return EventError(first.reason, "not any LEAP event; " + first.message)


def decode(msg: Message, tally: Tally, expect: type[Event] | None = None) -> Event | None:
    """The event in ``msg``, or ``None`` after counting it as bad in ``tally``."""
    out = try_decode(msg, expect)
    if isinstance(out, EventError):
        tally.add_bad(msg, out.reason, out.message)
        return None
    return out


def key_text(msg: Message) -> str | None:
    key = msg.key()
    if key is None:
        return None
    return key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)


def coordinates(msg: Message) -> dict[str, Any]:
    """Topic, partition, offset, timestamp and key of a message, for JSON output."""
    _, ts = msg.timestamp()
    headers = header_pairs(msg)
    return {
        "topic": msg.topic(),
        "partition": msg.partition(),
        "offset": msg.offset(),
        "timestamp_ms": ts if ts and ts > 0 else None,
        "key": key_text(msg),
        **({"headers": {k: _header_text(v) for k, v in headers}} if headers else {}),
    }


def header_pairs(msg: Message) -> list[tuple[str, str | bytes | None]]:
    """Headers of a message as (name, value) pairs, in order (consumers give a list)."""
    headers = msg.headers()
    if not headers:
        return []
    return list(headers.items()) if isinstance(headers, dict) else list(headers)


def _header_text(value: bytes | str | None) -> str | None:
    if value is None or isinstance(value, str):
        return value
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(value).decode("ascii")


def raw_preview(msg: Message, limit: int = 500) -> str:
    """The first bytes of a message value as text (lossy), for showing a bad event."""
    value = msg.value() or b""
    text = value[:limit].decode("utf-8", "replace") if isinstance(value, bytes) else str(value)[:limit]
    return text + ("…" if len(value) > limit else "")


def event_json(ev: Event) -> Any:
    """An event as plain JSON data (the dict it was decoded from, normalised)."""
    return orjson.loads(ev.encode())
