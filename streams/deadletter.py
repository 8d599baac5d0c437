"""Turning a rejected message into a dead letter that keeps everything needed to replay it."""

from __future__ import annotations

import base64
import dataclasses
import time

from streams.events import SCHEMA_VERSION, DeadLetter

#: Dead-letter reason of a valid event that processing rejected: a Redis script (features) or the
#: ranking code (a submission) raised for it alone.
PROCESSING_ERROR = "processing_error"


def dead_letter(
    topic: str, partition: int, offset: int, key: bytes | None, raw: bytes | None, reason: str, error: str
) -> DeadLetter:
    """A dead letter for one message: source coordinates, raw bytes (base64) and the reason.

    The id names the message (topic, partition, offset): a message rejected twice, e.g. read
    again after a restart, gives two letters with one id, so a reader can drop the copy.
    An empty value is kept as ``raw_base64 == ""``, a missing one (a tombstone) as null.
    """
    return DeadLetter(
        schema_version=SCHEMA_VERSION,
        event_id=f"dl:{topic}:{partition}:{offset}",
        event_time=time.time(),
        source_topic=topic,
        partition=partition,
        offset=offset,
        key=key.decode("utf-8", "replace") if key is not None else None,
        raw_base64=base64.b64encode(raw).decode("ascii") if raw is not None else None,
        reason=reason,
        error=error[:2000],
    )


def fit_dead_letter(letter: DeadLetter) -> DeadLetter:
    """``letter``, or, when it would exceed :attr:`DeadLetter.MAX_BYTES`, the same letter without
    its raw bytes (the broker would refuse it): the coordinates still lead to them while the
    source topic retains the message."""
    if letter.raw_base64 is None or len(letter.raw_base64) + 4096 <= DeadLetter.MAX_BYTES:
        return letter
    size = len(letter.raw_base64) * 3 // 4
    where = f"{letter.source_topic}[{letter.partition}]@{letter.offset}"
    note = f" [raw value of ~{size} bytes left out: read it at {where}]"
    return dataclasses.replace(letter, raw_base64=None, error=letter.error[:2000 - len(note)] + note)
