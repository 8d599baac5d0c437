"""``inspect``: events of a slice as JSON lines, filtered by job, event type and hardware."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from fnmatch import fnmatchcase
from typing import Any

import orjson
from confluent_kafka import Message

from leap.core.hardware import Catalogue
from leap.replay.decode import coordinates, event_json, key_text, raw_preview, try_decode
from leap.replay.reader import Reader
from streams.events import Event, EventError


def hardware_of(ev: Event) -> set[str]:
    """Every hardware name an event mentions (placed on, candidates, ranked)."""
    names: set[str] = set()
    hw = getattr(ev, "hardware", None)
    if isinstance(hw, str):
        names.add(hw)
    for c in getattr(ev, "candidates", ()) or ():
        names.add(c if isinstance(c, str) else str(c.get("hardware", "")))
    return names


def matcher(jobs: Sequence[str], types: Sequence[str], hardware: Sequence[str],
            catalogue: Catalogue) -> Callable[[Message, Event | EventError], bool]:
    """A predicate over decoded (or rejected) messages; all given filters must hold."""

    def canonical(name: str) -> str:
        hw = catalogue.resolve(name)
        return hw.name if hw is not None else name.lower()

    wanted_hw = {canonical(h) for h in hardware}

    def match(msg: Message, ev: Event | EventError) -> bool:
        if isinstance(ev, EventError):
            # A rejected message has only its key to go by.
            return not types and not hardware and (not jobs or any(fnmatchcase(key_text(msg) or "", p) for p in jobs))
        if jobs and not any(fnmatchcase(getattr(ev, "job_key", key_text(msg) or ""), p) for p in jobs):
            return False
        if types and ev.NAME not in types:
            return False
        return not wanted_hw or bool(wanted_hw & {canonical(h) for h in hardware_of(ev)})

    return match


def line(msg: Message, ev: Event | EventError) -> dict[str, Any]:
    """One output line: where the message is, its type and the event (or why it was rejected)."""
    out = coordinates(msg)
    if isinstance(ev, EventError):
        out.update(type=None, error=str(ev), raw=raw_preview(msg))
    else:
        out.update(type=ev.NAME, event=event_json(ev))
    return out


def inspect_slice(reader: Reader, match: Callable[[Message, Event | EventError], bool], limit: int | None,
                  write: Callable[[bytes], Any] | None) -> int:
    """Write matching events as JSON lines (``write=None``: count only); returns how many matched."""
    shown = 0
    # closing(): stopping at --limit must close the consumer now, not when garbage is collected.
    with closing(reader.__iter__()) as messages:
        shown = _emit(messages, reader, match, limit, write)
    return shown


def _emit(messages: Iterator[Message], reader: Reader, match: Callable[[Message, Event | EventError], bool],
          limit: int | None, write: Callable[[bytes], Any] | None) -> int:
    shown = 0
    for msg in messages:
        ev = try_decode(msg)
        if isinstance(ev, EventError):
            reader.tally.add_bad(msg, ev.reason, ev.message)
        if not match(msg, ev):
            continue
        shown += 1
        if write is not None:
            write(orjson.dumps(line(msg, ev)) + b"\n")
        if limit is not None and shown >= limit:
            break
    return shown
