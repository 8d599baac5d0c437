"""Turning a rejected message into a dead letter that keeps everything needed to replay it."""

from __future__ import annotations

import base64
import time
import uuid

from streams.events import SCHEMA_VERSION, DeadLetter


def dead_letter(
    topic: str, partition: int, offset: int, key: bytes | None, raw: bytes | None, reason: str, error: str
) -> DeadLetter:
    """A dead letter for one message: source coordinates, raw bytes (base64) and the reason."""
    return DeadLetter(
        schema_version=SCHEMA_VERSION,
        event_id=f"dl:{topic}:{partition}:{offset}:{uuid.uuid4().hex[:8]}",
        event_time=time.time(),
        source_topic=topic,
        partition=partition,
        offset=offset,
        key=key.decode("utf-8", "replace") if key is not None else None,
        raw_base64=base64.b64encode(raw).decode("ascii") if raw is not None else None,
        reason=reason,
        error=error[:2000],
    )
