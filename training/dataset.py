"""Training examples from the history archive, with features as of each submission.

The archive (``leap fleet history`` or the live archiver) holds day-partitioned Parquet of
submissions, starts and finishes. :func:`build_examples` replays them in event-time order
through :class:`features.offline.OfflineFeatureState` (the same semantics as the Redis scripts)
and, at each submission, builds its model row with :func:`features.rows.build_rows`, the same
function the predictor serves with. No row can see an outcome that happened after its
submission.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

from core.hardware import Catalogue
from features.offline import OfflineFeatureState
from features.rows import Rows, build_rows, row_dicts, to_columns
from streams.archive import drop_duplicate_events
from streams.events import JobFinish, JobStart, Submission

DAY = 86400.0
TABLES = ("submissions", "starts", "finishes")


class HistoryError(ValueError):
    """The history folder is missing or malformed."""


@dataclass
class History:
    submissions: pa.Table
    starts: pa.Table
    finishes: pa.Table
    oracle: pa.Table | None
    digest: str

    @property
    def first_day(self) -> float:
        return float(np.floor(np.min(self.submissions.column("event_time").to_numpy()) / DAY) * DAY)

    @property
    def last_day(self) -> float:
        return float(np.floor(np.max(self.submissions.column("event_time").to_numpy()) / DAY) * DAY)


def _read(folder: Path) -> pa.Table:
    table = ds.dataset(folder, format="parquet", partitioning="hive").to_table()
    # The live archive is at-least-once: an event replayed after a crash is stored twice.
    return drop_duplicate_events(table.drop_columns([c for c in ("day",) if c in table.column_names]))


def read_history(folder: Path, with_oracle: bool = True) -> History:
    """Read a history folder; the digest covers every Parquet file's name and bytes."""
    if not folder.is_dir():
        raise HistoryError(f"{folder}: no such folder")
    missing = [t for t in TABLES if not (folder / t).is_dir()]
    if missing:
        raise HistoryError(f"{folder}: missing {', '.join(missing)} (expected {', '.join(TABLES)} folders)")
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*/day=*/*.parquet")):
        if path.parts[-3] in TABLES:
            digest.update(str(path.relative_to(folder)).encode())
            digest.update(str(path.stat().st_size).encode())
    oracle = _read(folder / "oracle") if with_oracle and (folder / "oracle").is_dir() else None
    return History(_read(folder / "submissions"), _read(folder / "starts"), _read(folder / "finishes"),
                   oracle, digest.hexdigest()[:16])


@dataclass
class Examples:
    """One example per finished attempt with a measured throughput.

    ``rows`` are built for the hardware the attempt ran on; ``y`` is its measured
    per-accelerator throughput. ``full`` holds, for a sample of attempts, the rows of every
    candidate (for top-1 and regret), keyed by example index.
    """

    rows: Rows
    y: np.ndarray
    submit_time: np.ndarray
    finish_time: np.ndarray
    attempt_id: np.ndarray
    job_key: np.ndarray
    hardware: np.ndarray
    num_accelerators: np.ndarray
    full: dict[int, tuple[Submission, Rows]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.y)

    def select(self, mask: np.ndarray) -> Examples:
        idx = np.flatnonzero(mask)
        remap = {int(old): new for new, old in enumerate(idx)}
        return Examples(
            rows={c: v[idx] for c, v in self.rows.items()},
            y=self.y[idx], submit_time=self.submit_time[idx], finish_time=self.finish_time[idx],
            attempt_id=self.attempt_id[idx], job_key=self.job_key[idx], hardware=self.hardware[idx],
            num_accelerators=self.num_accelerators[idx],
            full={remap[i]: v for i, v in self.full.items() if i in remap},
        )


def _events(table: pa.Table, cls: type) -> list[Any]:
    names = [f.name for f in cls.FIELDS]  # type: ignore[attr-defined]
    cols = [table.column(n).to_pylist() if n in table.column_names else [None] * table.num_rows for n in names]
    if cls is Submission:
        k = names.index("candidates")
        cols[k] = [tuple(c or ()) for c in cols[k]]
    # Built without re-validation: the archive holds only events that passed validation.
    return [cls(*values) for values in zip(*cols, strict=True)]


def build_examples(
    history: History,
    catalogue: Catalogue,
    full_from: float | None = None,
    full_per_day: int = 1500,
    seed: int = 0,
    rows_from: float | None = None,
    until: float | None = None,
) -> Examples:
    """Replay the history in event-time order and build point-in-time training examples.

    Parameters
    ----------
    history
        From :func:`read_history`.
    catalogue
        Specs for the rows.
    full_from
        Submissions at or after this time may also get rows for every candidate (a random
        sample of ``full_per_day`` per day), for top-1 pick accuracy and regret.
    rows_from
        Build rows only for submissions from this time on (earlier events still shape state).
    until
        Ignore every event at or after this time (what was not known yet).
    """
    finishes: list[JobFinish] = _events(history.finishes, JobFinish)
    starts: list[JobStart] = _events(history.starts, JobStart)
    subs: list[Submission] = _events(history.submissions, Submission)
    measured = {f.attempt_id: f for f in finishes if f.throughput is not None}

    # Merge by time; at equal times outcomes are applied before the submission reads them.
    times = np.concatenate([[f.event_time for f in finishes], [s.event_time for s in starts],
                            [s.event_time for s in subs]])
    kinds = np.concatenate([np.zeros(len(finishes)), np.ones(len(starts)), np.full(len(subs), 2)])
    index = np.concatenate([np.arange(len(finishes)), np.arange(len(starts)), np.arange(len(subs))])
    order = np.lexsort((kinds, times))

    rng = np.random.default_rng(seed)
    state = OfflineFeatureState(catalogue.canonical)
    row_list: list[dict[str, Any]] = []
    y: list[float] = []
    t_sub: list[float] = []
    t_fin: list[float] = []
    aid: list[str] = []
    jobs: list[str] = []
    hw: list[str] = []
    nacc: list[int] = []
    full: dict[int, tuple[Submission, Rows]] = {}

    def wants_full(sub: Submission) -> bool:
        return full_from is not None and sub.event_time >= full_from and len(sub.candidates) > 1

    # Selection sampling (Knuth's algorithm S): exactly min(full_per_day, eligible) per day.
    eligible: dict[int, int] = {}
    seen: dict[int, int] = {}
    taken: dict[int, int] = {}
    for s in subs:
        if wants_full(s) and s.attempt_id in measured:
            d = int(s.event_time // DAY)
            eligible[d] = eligible.get(d, 0) + 1

    if until is not None:
        order = order[times[order] < until]
    for k in order.tolist():
        kind, i = kinds[k], int(index[k])
        if kind == 0:
            state.apply_finish(finishes[i])
        elif kind == 1:
            state.apply_start(starts[i])
        else:
            sub = subs[i]
            if rows_from is not None and sub.event_time < rows_from:
                continue
            done = measured.get(sub.attempt_id)
            if done is None or done.throughput is None:
                continue
            snap = state.snapshot(sub)
            row_list.extend(row_dicts(sub, snap, (done.hardware,), catalogue))
            n = len(y)
            y.append(done.throughput / done.num_accelerators)
            t_sub.append(sub.event_time)
            t_fin.append(done.event_time)
            aid.append(sub.attempt_id)
            jobs.append(sub.job_key)
            hw.append(done.hardware)
            nacc.append(sub.num_accelerators)
            if wants_full(sub):
                d = int(sub.event_time // DAY)
                left = eligible[d] - seen.get(d, 0)
                if rng.random() * left < full_per_day - taken.get(d, 0):
                    full[n] = (sub, build_rows(sub, snap, sub.candidates, catalogue))
                    taken[d] = taken.get(d, 0) + 1
                seen[d] = seen.get(d, 0) + 1
    return Examples(
        rows=to_columns(row_list), y=np.array(y), submit_time=np.array(t_sub), finish_time=np.array(t_fin),
        attempt_id=np.array(aid, dtype=object), job_key=np.array(jobs, dtype=object),
        hardware=np.array(hw, dtype=object),
        num_accelerators=np.array(nacc, dtype=np.float64), full=full,
    )
