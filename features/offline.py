"""In-process feature state with exactly the semantics of the Redis scripts.

Training and backtests replay history in event order through this class to get point-in-time
snapshots (what Redis held when each submission arrived) without a server round trip per event.
``tests/test_offline.py`` applies the same events to both and checks they agree field for field,
so the Lua scripts and this class cannot silently diverge.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from features.keys import JOB_WINDOW, LOOKUP_WINDOW
from features.snapshot import FeatureSnapshot, LookupStat, PriorStat
from features.store import packable_id, per_accelerator
from streams.events import JobFinish, JobStart, Submission

Entry = tuple[float, str, float]  # (event time, event id, per-accelerator throughput)


def _median(values: list[float]) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


@dataclass
class _Window:
    limit: int
    entries: list[Entry] = field(default_factory=list)
    n: int = 0

    def insert(self, entry: Entry) -> tuple[bool, bool]:
        """Insert; returns (inserted, kept) like ``window_insert`` in window.lua."""
        if any(e[1] == entry[1] for e in self.entries):
            return False, True
        self.entries.append(entry)
        self.entries.sort(key=lambda e: (e[0], e[1]))
        del self.entries[: max(0, len(self.entries) - self.limit)]
        return True, any(e[1] == entry[1] for e in self.entries)

    def median(self) -> float:
        return _median([e[2] for e in self.entries])


@dataclass
class _Job:
    seen: set[str] = field(default_factory=set)
    windows: dict[str, _Window] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    last_start: tuple[float, str] | None = None


class OfflineFeatureState:
    """Feature state held in memory; :meth:`snapshot` equals what the online store would read."""

    def __init__(self, canonicalize: Callable[[str], str] | None = None) -> None:
        self._hw = canonicalize or (lambda name: name)
        self.jobs: dict[str, _Job] = defaultdict(_Job)
        self.models: dict[str, dict[str, _Window]] = defaultdict(dict)
        self.families: dict[str, dict[str, _Window]] = defaultdict(dict)

    def apply_finish(self, ev: JobFinish) -> bool:
        job = self.jobs[ev.job_key]
        eid = packable_id(ev.event_id)
        if eid in job.seen:
            return False
        job.seen.add(eid)
        job.counters[ev.outcome] += 1
        if ev.throughput is None:
            return True
        hw = self._hw(ev.hardware)
        entry = (ev.event_time, eid, per_accelerator(ev.throughput, ev.num_accelerators))
        win = job.windows.setdefault(hw, _Window(JOB_WINDOW))
        win.insert(entry)
        win.n += 1
        for table, name in ((self.models, ev.model_type), (self.families, ev.family)):
            agg = table[name].setdefault(hw, _Window(LOOKUP_WINDOW))
            inserted, kept = agg.insert(entry)
            if inserted and kept:
                agg.n += 1
        return True

    def apply_start(self, ev: JobStart) -> bool:
        job = self.jobs[ev.job_key]
        eid = packable_id(ev.event_id)
        if eid in job.seen:
            return False
        job.seen.add(eid)
        job.counters["starts"] += 1
        key = (ev.event_time, eid)
        if job.last_start is None or key > job.last_start:
            job.last_start = key
        return True

    def snapshot(self, sub: Submission) -> FeatureSnapshot:
        job = self.jobs.get(sub.job_key)
        prior: dict[str, PriorStat] = {}
        counters: dict[str, int] = {}
        if job is not None:
            counters = job.counters
            for hw, win in job.windows.items():
                newest = win.entries[-1]
                prior[hw] = PriorStat(win.n, newest[0], newest[2], win.median())
        return FeatureSnapshot(
            prior=prior,
            lookup_model=_lookups(self.models.get(sub.model_type)),
            lookup_family=_lookups(self.families.get(sub.family)),
            starts=counters.get("starts", 0),
            completed=counters.get("completed", 0),
            failed=counters.get("failed", 0),
            preempted=counters.get("preempted", 0),
        )


def _lookups(windows: dict[str, _Window] | None) -> dict[str, LookupStat]:
    if not windows:
        return {}
    return {hw: LookupStat(w.n, w.median()) for hw, w in windows.items() if w.entries}
