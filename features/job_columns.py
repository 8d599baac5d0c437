"""Per-job feature state held as columns, as a checkpoint keeps it, until an event touches a job.

A long replay's state is mostly its jobs: a few hundred thousand, each a handful of small Python
objects per window entry. Held as objects, a checkpoint is slow to pickle and load, and once let go
its memory stays with the interpreter (the few objects built beside it keep most of its allocator
arenas in use). Held as a few NumPy arrays and one byte string, it loads in one piece, frees in one
piece, and a night's replay turns back into objects only the jobs its events touch
(:meth:`JobColumns.take`, from :class:`features.offline.OfflineFeatureState`).

A job is plain data here: its counters (name -> count, none zero), the ids it has applied (None
when the archive's ids are known unique and none were kept), and its windows in order, each
``(hardware, applied count, entries)`` with entries ``(time, id, value)`` in window order.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np

Entry = tuple[float, str, float]  # (event time, event id, per-accelerator throughput)
JobData = tuple[dict[str, int], tuple[str, ...] | None, list[tuple[str, int, list[Entry]]]]


def _offsets(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def _gather(offsets: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """The positions of the kept groups' members, groups laid out by ``offsets``."""
    return np.repeat(keep, np.diff(offsets))


@dataclass
class JobColumns:
    """The jobs of a feature state as columns; :meth:`take` hands one back as :data:`JobData`."""

    keys: list[str]
    counter_names: list[str]
    counts: np.ndarray  # (jobs, counters)
    seen: list[tuple[str, ...] | None] | None  # per job; None when no job kept its ids
    job_windows: np.ndarray  # (jobs + 1) offsets into the windows
    hardware_names: list[str]
    window_hardware: np.ndarray  # index into hardware_names
    window_count: np.ndarray
    window_entries: np.ndarray  # (windows + 1) offsets into the entries
    time: np.ndarray
    value: np.ndarray
    ids: bytes  # the entries' ids, UTF-8, one after the other
    id_offsets: np.ndarray  # (entries + 1) offsets into ids
    _index: dict[str, int] | None = field(default=None, repr=False)  # the jobs not taken; made on first take

    def __getstate__(self) -> dict[str, object]:
        """The jobs not taken (a taken job's state is its object's now)."""
        return {k: v for k, v in self._kept().__dict__.items() if k != "_index"}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state, _index=None)

    def __len__(self) -> int:
        """How many jobs have not been taken."""
        return len(self._index) if self._index is not None else len(self.keys)

    def take(self, key: str) -> JobData | None:
        """Job ``key`` as plain data, no longer held here; None when it is not (or no longer) here."""
        if self._index is None:
            self._index = {k: i for i, k in enumerate(self.keys)}
        i = self._index.pop(key, None)
        if i is None:
            return None
        counters = {name: int(c) for name, c in zip(self.counter_names, self.counts[i].tolist(), strict=True) if c}
        windows = []
        for w in range(int(self.job_windows[i]), int(self.job_windows[i + 1])):
            a, b = int(self.window_entries[w]), int(self.window_entries[w + 1])
            cuts = self.id_offsets[a:b + 1].tolist()
            ids = [self.ids[s:e].decode() for s, e in pairwise(cuts)]
            entries = list(zip(self.time[a:b].tolist(), ids, self.value[a:b].tolist(), strict=True))
            windows.append((self.hardware_names[int(self.window_hardware[w])], int(self.window_count[w]), entries))
        return counters, self.seen[i] if self.seen is not None else None, windows

    @classmethod
    def of(cls, jobs: Iterable[tuple[str, JobData]], rest: JobColumns | None = None) -> JobColumns:
        """Columns of ``jobs`` after the jobs of ``rest`` not taken from it."""
        made = cls._of_objects(list(jobs), rest.counter_names if rest is not None else [],
                               rest.hardware_names if rest is not None else [])
        return made if rest is None else rest._kept()._followed_by(made)

    @classmethod
    def _of_objects(cls, jobs: list[tuple[str, JobData]], counter_names: list[str],
                    hardware_names: list[str]) -> JobColumns:
        counter_names = list(counter_names)
        hardware_names = list(hardware_names)
        names = {n: i for i, n in enumerate(counter_names)}
        hw_at = {n: i for i, n in enumerate(hardware_names)}
        for _, (counters, _, windows) in jobs:
            for name in counters:
                names.setdefault(name, len(names))
            for hw, _, _ in windows:
                hw_at.setdefault(hw, len(hw_at))
        counts = np.zeros((len(jobs), len(names)), dtype=np.int64)
        window_lengths, window_hw, window_count, times, values, ids = [], [], [], [], [], []
        jobs_windows = np.zeros(len(jobs), dtype=np.int64)
        for j, (_, (counters, _, windows)) in enumerate(jobs):
            for name, c in counters.items():
                counts[j, names[name]] = c
            jobs_windows[j] = len(windows)
            for hw, n, entries in windows:
                window_hw.append(hw_at[hw])
                window_count.append(n)
                window_lengths.append(len(entries))
                for t, eid, v in entries:
                    times.append(t)
                    ids.append(eid.encode())
                    values.append(v)
        seen = [data[1] for _, data in jobs]
        return cls(
            keys=[k for k, _ in jobs], counter_names=list(names), counts=counts,
            seen=seen if any(s is not None for s in seen) else None, job_windows=_offsets(jobs_windows),
            hardware_names=list(hw_at), window_hardware=np.array(window_hw, dtype=np.int32),
            window_count=np.array(window_count, dtype=np.int64),
            window_entries=_offsets(np.array(window_lengths, dtype=np.int64)),
            time=np.array(times, dtype=np.float64), value=np.array(values, dtype=np.float64),
            ids=b"".join(ids), id_offsets=_offsets(np.array([len(i) for i in ids], dtype=np.int64)))

    def _kept(self) -> JobColumns:
        """The jobs not taken, as columns of their own."""
        if self._index is None or len(self._index) == len(self.keys):
            return self
        keep = np.zeros(len(self.keys), dtype=bool)
        keep[np.fromiter(self._index.values(), dtype=np.int64, count=len(self._index))] = True
        kept = keep.tolist()
        windows = _gather(self.job_windows, keep)
        entries = _gather(self.window_entries, windows)
        id_bytes = _gather(self.id_offsets, entries)
        return JobColumns(
            keys=[k for k, k_kept in zip(self.keys, kept, strict=True) if k_kept],
            counter_names=self.counter_names, counts=self.counts[keep],
            seen=[s for s, s_kept in zip(self.seen, kept, strict=True) if s_kept] if self.seen is not None else None,
            job_windows=_offsets(np.diff(self.job_windows)[keep]), hardware_names=self.hardware_names,
            window_hardware=self.window_hardware[windows], window_count=self.window_count[windows],
            window_entries=_offsets(np.diff(self.window_entries)[windows]),
            time=self.time[entries], value=self.value[entries],
            ids=np.frombuffer(self.ids, dtype=np.uint8)[id_bytes].tobytes(),
            id_offsets=_offsets(np.diff(self.id_offsets)[entries]))

    def _followed_by(self, other: JobColumns) -> JobColumns:
        """These jobs, then ``other``'s (whose counter and hardware names extend these)."""
        counts = np.zeros((len(self.keys), len(other.counter_names)), dtype=np.int64)
        counts[:, :self.counts.shape[1]] = self.counts
        seen = None if self.seen is None and other.seen is None else \
            (self.seen or [None] * len(self.keys)) + (other.seen or [None] * len(other.keys))
        return JobColumns(
            keys=self.keys + other.keys, counter_names=other.counter_names,
            counts=np.concatenate([counts, other.counts]), seen=seen,
            job_windows=np.concatenate([self.job_windows, self.job_windows[-1] + other.job_windows[1:]]),
            hardware_names=other.hardware_names,
            window_hardware=np.concatenate([self.window_hardware, other.window_hardware]),
            window_count=np.concatenate([self.window_count, other.window_count]),
            window_entries=np.concatenate([self.window_entries, self.window_entries[-1] + other.window_entries[1:]]),
            time=np.concatenate([self.time, other.time]), value=np.concatenate([self.value, other.value]),
            ids=self.ids + other.ids,
            id_offsets=np.concatenate([self.id_offsets, self.id_offsets[-1] + other.id_offsets[1:]]))
