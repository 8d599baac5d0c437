"""``rebuild-features``: replay job starts and finishes through :class:`FeatureStore`, then diff.

The update scripts are idempotent and their results do not depend on the order events arrive
in, so replaying a job's whole history into an empty prefix must reproduce what the workers
built live. What differs points at lost events, a bug, or a hand-edited key. Values are read
with the declarations of :mod:`features.layout`, the ones the scripts write with.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

import redis

from features.keys import LOOKUP_WINDOW, KeyLayout
from features.layout import LOOKUP_FIELD, RETIRED_FIELDS, text, unpack_window
from features.redis_batch import Batch, Client
from features.store import FeatureStore
from leap.replay.decode import decode
from leap.replay.reader import Reader, ReplayError
from streams.events import Event, JobFinish, JobStart

#: Events per pipelined round trip, as the feature agents batch them.
BATCH = 500
#: Entities whose hashes are fetched per pipelined round trip when comparing.
COMPARE_BATCH = 250
#: Mismatches listed in full; the count covers all of them.
MAX_DETAILS = 50


@dataclass
class RebuildResult:
    """Outcome of a rebuild; ``mismatches`` is ``None`` when nothing was compared."""

    events: int = 0
    applied: int = 0
    duplicates: int = 0
    jobs: int = 0
    model_types: int = 0
    families: int = 0
    keys: int = 0
    mismatches: int | None = None
    order_dependent: int = 0
    details: list[dict[str, Any]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        replay_s = self.seconds.get("replay", 0.0)
        return {
            "events": self.events, "keys": self.keys, "mismatches": self.mismatches,
            "applied": self.applied, "duplicates": self.duplicates, "jobs": self.jobs,
            "model_types": self.model_types, "families": self.families,
            "order_dependent": self.order_dependent, "details": self.details,
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
            "events_per_s": round(self.events / replay_s, 1) if replay_s > 0 else None,
        }


class _Batcher:
    """Applies events in pipelined batches and counts what the scripts did."""

    def __init__(self, store: FeatureStore | None, result: RebuildResult) -> None:
        self.store = store
        self.result = result
        self.starts: list[JobStart] = []
        self.finishes: list[JobFinish] = []

    def add(self, ev: Event) -> None:
        if isinstance(ev, JobFinish):
            self.finishes.append(ev)
            if len(self.finishes) >= BATCH:
                self.flush()
        elif isinstance(ev, JobStart):
            self.starts.append(ev)
            if len(self.starts) >= BATCH:
                self.flush()

    def flush(self) -> None:
        if self.store is not None:
            try:
                done = self.store.apply_starts(self.starts) + self.store.apply_finishes(self.finishes)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                raise ReplayError(f"cannot reach Redis: {exc}") from None
            self.result.applied += sum(done)
            self.result.duplicates += len(done) - sum(done)
        self.starts.clear()
        self.finishes.clear()


def replay_events(reader: Reader, store: FeatureStore | None, jobs: Sequence[str] = ()) -> tuple[
        RebuildResult, set[str], set[str], set[str]]:
    """Apply every start and finish the reader yields (``store=None``: count only, a dry run).

    Returns
    -------
    The result so far, and the job keys, model types and families seen.
    """
    result = RebuildResult()
    seen_jobs: set[str] = set()
    models: set[str] = set()
    families: set[str] = set()
    batcher = _Batcher(store, result)
    began = time.perf_counter()
    for msg in reader:
        ev = decode(msg, reader.tally)
        if not isinstance(ev, JobStart | JobFinish):
            if ev is not None:
                reader.tally.add_bad(msg, "unexpected_type", f"{type(ev).__name__} is not a job start or finish")
            continue
        if jobs and not any(fnmatchcase(ev.job_key, pattern) for pattern in jobs):
            continue
        result.events += 1
        seen_jobs.add(ev.job_key)
        if isinstance(ev, JobFinish) and ev.throughput is not None:  # only measured finishes feed lookups
            models.add(ev.model_type)
            if ev.family is not None:
                families.add(ev.family)
        batcher.add(ev)
    batcher.flush()
    result.seconds["replay"] = time.perf_counter() - began
    result.jobs, result.model_types, result.families = len(seen_jobs), len(models), len(families)
    return result, seen_jobs, models, families


def _pairs(rep: KeyLayout, live: KeyLayout, jobs: Iterable[str], models: Iterable[str],
           families: Iterable[str]) -> list[tuple[str, str, str, str]]:
    """(kind, name, replay key, live key) of every hash that the replayed events touch."""
    out = [("job", j, rep.job(j), live.job(j)) for j in sorted(jobs)]
    out += [("lookup_model", m, rep.lookup_model(m), live.lookup_model(m)) for m in sorted(models)]
    out += [("lookup_family", f, rep.lookup_family(f), live.lookup_family(f)) for f in sorted(families)]
    return out


def _text(raw: dict[bytes, bytes]) -> dict[str, str]:
    """A hash as text, without the fields older versions wrote that the replay no longer does."""
    decoded = {text(k): text(v) for k, v in raw.items()}
    return {k: v for k, v in decoded.items() if k not in RETIRED_FIELDS}


def _window_full(window: dict[str, str], hw: str) -> bool:
    try:
        return len(unpack_window(window.get(hw))) >= LOOKUP_WINDOW
    except ValueError:  # a hand-edited window: reported as a mismatch, never excused
        return False


_N = LOOKUP_FIELD.parts.index("n")


def _same_but_count(a: str, b: str) -> bool:
    """Two lookup fields equal but for their count ``n`` (a malformed one never is)."""
    try:
        pa, pb = LOOKUP_FIELD.unpack(a), LOOKUP_FIELD.unpack(b)
    except ValueError:
        return False
    return pa[:_N] + pa[_N + 1:] == pb[:_N] + pb[_N + 1:]


def _order_dependent(label: str, fld: str, a: dict[str, str], b: dict[str, str], rwin: dict[str, str],
                     lwin: dict[str, str]) -> bool:
    """A lookup field whose only difference is ``n`` while both windows are equal and full."""
    return (label.startswith("lookup") and not label.endswith("window") and fld in a and fld in b
            and _same_but_count(a[fld], b[fld]) and rwin.get(fld) == lwin.get(fld) and _window_full(rwin, fld))


def compare(client: Client, replay: KeyLayout, live: KeyLayout, jobs: Iterable[str], models: Iterable[str],
            families: Iterable[str], result: RebuildResult) -> None:
    """Diff every touched hash (and its window) field by field between two prefixes.

    A lookup aggregate's count ``n`` counts observations that entered its window when they
    arrived; once more than ``LOOKUP_WINDOW`` events exist for one (model type, hardware), that
    count depends on arrival order. Such differences (median and window equal, only ``n``
    differs, window full on both sides) are counted as ``order_dependent``, not as mismatches.
    """
    began = time.perf_counter()
    pairs = _pairs(replay, live, jobs, models, families)
    mismatches = 0
    for i in range(0, len(pairs), COMPARE_BATCH):
        chunk = pairs[i:i + COMPARE_BATCH]
        batch = Batch(client)
        for _, _, rkey, lkey in chunk:
            for key in (rkey, lkey, KeyLayout.window_of(rkey), KeyLayout.window_of(lkey)):
                batch.hgetall(key)
        raw = batch.execute()
        for j, (kind, name, _, _) in enumerate(chunk):
            rep, liv, rwin, lwin = (_text(raw[4 * j + k]) for k in range(4))
            result.keys += 1
            for label, a, b in ((kind, rep, liv), (kind + "_window", rwin, lwin)):
                for fld in sorted(a.keys() | b.keys()):
                    if a.get(fld) == b.get(fld):
                        continue
                    if _order_dependent(label, fld, a, b, rwin, lwin):
                        result.order_dependent += 1
                        continue
                    mismatches += 1
                    if len(result.details) < MAX_DETAILS:
                        result.details.append({"kind": label, "name": name, "field": fld,
                                               "live": b.get(fld), "replay": a.get(fld)})
    result.mismatches = mismatches
    result.seconds["compare"] = time.perf_counter() - began
