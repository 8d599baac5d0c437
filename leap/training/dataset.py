"""Training examples from the history archive, with features as of each submission.

The archive (``leap fleet history`` or the live archiver) holds day-partitioned Parquet of
submissions, starts and finishes. :func:`build_examples` replays them in event-time order
through :class:`features.offline.OfflineFeatureState` (the same semantics as the Redis scripts)
and, at each submission, builds its model row with :func:`features.rows.build_batch_rows` (a
batch of examples at a time), the same function the predictor serves with. No row can see an
outcome that happened after its submission.
"""

from __future__ import annotations

import gc
import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from features.offline import OfflineFeatureState, all_with_pairs
from features.pairs import PairAsk
from features.rows import Rows, build_batch_rows, build_rows
from features.snapshot import FeatureSnapshot
from leap.core.hardware import Catalogue
from leap.training.events import (
    FINISH,
    START,
    SharedStrings,
    ids_unique,
    measured_finish,
    replay,
)
from streams.archive import arrow_schema, drop_duplicate_events
from streams.events import Event, JobFinish, JobStart, Submission

DAY = 86400.0
#: Examples whose rows are built at a time: one builder call per this many, and only this many
#: snapshots wait for it.
ROW_BATCH = 10_000
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


def _read(folder: Path, cls: type[Event] | None = None) -> pa.Table:
    """One table of the archive; with an event class, in its current schema: part files written
    before an optional column existed read that column as null instead of deciding the schema."""
    schema = arrow_schema(cls).append(pa.field("day", pa.string())) if cls is not None else None
    table = ds.dataset(folder, format="parquet", partitioning="hive", schema=schema).to_table()
    # The live archive is at-least-once: an event replayed after a crash is stored twice.
    return drop_duplicate_events(table.drop_columns([c for c in ("day",) if c in table.column_names]))


def read_history(folder: Path, with_oracle: bool = True) -> History:
    """Read a history folder; the digest covers every Parquet file's name and size."""
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
    return History(_read(folder / "submissions", Submission), _read(folder / "starts", JobStart),
                   _read(folder / "finishes", JobFinish), oracle, digest.hexdigest()[:16])


def _stack(parts: Sequence[Rows]) -> Rows:
    return {c: np.concatenate([p[c] for p in parts]) for c in parts[0]}


@dataclass
class Examples:
    """One example per finished attempt with a measured throughput.

    ``rows`` are built for the hardware the attempt ran on; ``y`` is its measured
    per-accelerator throughput. ``full`` holds, for a sample of attempts, the rows of every
    candidate (for top-1 and regret), keyed by example index. ``new_type_rows`` (a fleet's:
    :mod:`leap.training.new_types`; a table's: ``measurements.runner.with_new_type_rows``) are the
    same examples' rows as a model type never seen has them: built against the other types' aggregates.
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
    new_type_rows: Rows | None = None

    def __len__(self) -> int:
        return len(self.y)

    @classmethod
    def concat(cls, parts: Sequence[Examples]) -> Examples:
        """The examples of ``parts`` one after the other (``full`` indices shifted along)."""
        full: dict[int, tuple[Submission, Rows]] = {}
        offset = 0
        for part in parts:
            full.update({offset + i: v for i, v in part.full.items()})
            offset += len(part)
        columns = ("y", "submit_time", "finish_time", "attempt_id", "job_key", "hardware", "num_accelerators")
        views = [p.new_type_rows for p in parts]
        new_type = None if any(v is None for v in views) else _stack([v for v in views if v is not None])
        return cls(rows=_stack([p.rows for p in parts]),
                   **{c: np.concatenate([getattr(p, c) for p in parts]) for c in columns}, full=full,
                   new_type_rows=new_type)

    def select(self, mask: np.ndarray) -> Examples:
        idx = np.flatnonzero(mask)
        remap = {int(old): new for new, old in enumerate(idx)}
        return Examples(
            rows={c: v[idx] for c, v in self.rows.items()},
            y=self.y[idx], submit_time=self.submit_time[idx], finish_time=self.finish_time[idx],
            attempt_id=self.attempt_id[idx], job_key=self.job_key[idx], hardware=self.hardware[idx],
            num_accelerators=self.num_accelerators[idx],
            full={remap[i]: v for i, v in self.full.items() if i in remap},
            new_type_rows=None if self.new_type_rows is None else {c: v[idx] for c, v in self.new_type_rows.items()},
        )


class Outcome(Protocol):
    """What an example takes from its attempt's finish (a :class:`JobFinish` has it)."""

    @property
    def throughput(self) -> float | None: ...
    @property
    def num_accelerators(self) -> int: ...
    @property
    def event_time(self) -> float: ...
    @property
    def hardware(self) -> str: ...


@dataclass(frozen=True, slots=True)
class _Outcome:
    throughput: float | None
    num_accelerators: int
    event_time: float
    hardware: str


class _Outcomes:
    """The finishes table's outcome columns, as Python values: row ``i``'s is ``self[i]``.

    A lookahead (a submission's example needs its attempt's later finish) without making every
    finish an object up front.
    """

    def __init__(self, finishes: pa.Table) -> None:
        self.throughput = finishes.column("throughput").to_pylist()
        self.num_accelerators = finishes.column("num_accelerators").to_pylist()
        self.event_time = finishes.column("event_time").to_pylist()
        self.hardware = SharedStrings().column(finishes.column("hardware").to_pylist())

    def __getitem__(self, i: int) -> _Outcome:
        return _Outcome(self.throughput[i], self.num_accelerators[i], self.event_time[i], self.hardware[i])


def _candidate_counts(subs: pa.Table) -> np.ndarray:
    """Number of candidates of each submission (0 for none)."""
    lengths = pc.list_value_length(subs.column("candidates"))
    return np.asarray(pc.fill_null(lengths, 0).to_numpy(zero_copy_only=False), dtype=np.int64)


def new_state(history: History, catalogue: Catalogue, unseen_types: frozenset[str] = frozenset()
              ) -> OfflineFeatureState:
    """The empty offline feature state a replay of ``history`` starts from."""
    return OfflineFeatureState(catalogue.canonical, unique_ids=ids_unique(history.starts, history.finishes),
                               unseen_types=unseen_types)


@contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector paused, as it was before afterwards.

    A replay builds millions of small objects that live as long as the feature state, and the
    collector's passes over them were a third of a replay's time; the replay makes almost no
    cyclic garbage (what it makes is collected once the collector runs again).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@paused_gc()
def build_examples(
    history: History,
    catalogue: Catalogue,
    full_from: float | None = None, full_per_day: int = 1500, seed: int = 0,
    rows_from: float | None = None, until: float | None = None,
    unseen_types: frozenset[str] = frozenset(),
    state: OfflineFeatureState | None = None, since: float | None = None,
) -> Examples:
    """Replay the history in event-time order and build point-in-time training examples.

    Parameters
    ----------
    history, catalogue
        From :func:`read_history`; specs for the rows.
    full_from, full_per_day, seed
        From ``full_from`` on, a seeded sample of ``full_per_day`` submissions a day (all if fewer
        are eligible) also get every candidate's rows, for top-1 pick accuracy and regret.
    rows_from
        Build rows only for submissions from this time on (earlier events still shape state).
    until
        Ignore every event at or after this time (what was not known yet).
    unseen_types
        If given, rows only for these model types, built as if the fleet had never run them (their
        events feed no shared aggregate: :class:`features.offline.OfflineFeatureState`).
    state, since
        Resume a replay (:mod:`leap.training.row_cache`): ``state`` (changed in place) holds every
        event before ``since``; only the later ones are replayed. None: a fresh state, every event.

    Returns
    -------
    Examples
        One example per measured attempt, in submission order.
    """
    state = state if state is not None else new_state(history, catalogue, unseen_types)
    subs = history.submissions
    finish_of = measured_finish(history.finishes, subs.column("attempt_id"))
    outcomes = _Outcomes(history.finishes)
    keep = _kept(subs, finish_of >= 0, rows_from, unseen_types)
    sample = _CandidateSample(subs.column("event_time").to_numpy(), _candidate_counts(subs), finish_of >= 0,
                              full_from, full_per_day, seed)
    out = ExampleColumns(catalogue)
    for kind, row, event in replay(history.finishes, history.starts, subs, until, since=since):
        if kind == FINISH:
            state.apply_finish(event)
        elif kind == START:
            state.apply_start(event)
        else:
            sub = event
            state.apply_submission(sub)  # every one feeds the configuration aggregates; those kept get a row
            if not keep[row]:
                continue
            done = outcomes[int(finish_of[row])]
            # Events before this submission only, never its outcome; paired ratios summarised only
            # for the rows built (the costly part of a snapshot), with the rest of the row batch's.
            n = out.add(sub, done, *state.unpaired_snapshot(sub, candidates=(done.hardware,)))
            if sample.wants(sub) and sample.take(sub):
                out.full[n] = (sub, build_rows(sub, state.snapshot(sub), sub.candidates, catalogue))
    return out.examples()


def _kept(subs: pa.Table, measured: np.ndarray, rows_from: float | None, unseen_types: frozenset[str]) -> np.ndarray:
    """Which submissions get a row: measured ones, from ``rows_from`` on, of ``unseen_types`` if any."""
    keep = measured & (subs.column("event_time").to_numpy() >= rows_from if rows_from is not None else True)
    if unseen_types:
        keep &= np.isin(subs.column("model_type").to_numpy(zero_copy_only=False).astype(str), list(unseen_types))
    return np.asarray(keep)


def build_examples_with_progress(history: History, catalogue: Catalogue, progress: Any, **options: Any) -> Examples:
    """:func:`build_examples`, announced first on ``progress`` (anything with ``print``; None: quiet).

    Building the rows is the slow step of a backtest or a drivers report, so it says so.
    """
    if progress is not None:
        progress.print(f"building point-in-time rows for {history.submissions.num_rows} submissions ...")
    return build_examples(history, catalogue, **options)


class _CandidateSample:
    """Which submissions also get every candidate's rows: ``min(per_day, eligible)`` each day.

    Selection sampling (Knuth's algorithm S): the eligible submissions of each day are counted
    up front, so every eligible one is taken with probability (still needed) / (still to come)
    and each day ends with exactly the sample size, whatever the replay order within it.
    """

    def __init__(self, times: np.ndarray, candidates: np.ndarray, measured: np.ndarray, full_from: float | None,
                 per_day: int, seed: int) -> None:
        self.full_from = full_from
        self.per_day = per_day
        self.rng = np.random.default_rng(seed)
        self.seen: dict[int, int] = {}
        self.taken: dict[int, int] = {}
        self.eligible: dict[int, int] = {}
        if full_from is not None:
            # what wants() says of each submission, for all of them at once
            eligible = measured & (times >= full_from) & (candidates > 1)
            days, counts = np.unique((times[eligible] // DAY).astype(np.int64), return_counts=True)
            self.eligible = dict(zip(days.tolist(), counts.tolist(), strict=True))

    def wants(self, sub: Submission) -> bool:
        """Whether ``sub`` is eligible: late enough, with more than one candidate to rank."""
        return self.full_from is not None and sub.event_time >= self.full_from and len(sub.candidates) > 1

    def take(self, sub: Submission) -> bool:
        """Whether the eligible ``sub`` is in the sample (call once per eligible submission)."""
        d = int(sub.event_time // DAY)
        left = self.eligible[d] - self.seen.get(d, 0)
        chosen = bool(self.rng.random() * left < self.per_day - self.taken.get(d, 0))
        if chosen:
            self.taken[d] = self.taken.get(d, 0) + 1
        self.seen[d] = self.seen.get(d, 0) + 1
        return chosen


@dataclass
class ExampleColumns:
    """The examples built so far, column by column (see :class:`Examples`).

    An example's row, on the hardware its attempt ran on, is built from its snapshot with those
    of the next examples, :data:`ROW_BATCH` at a time (a submission's row does not depend on the
    others of its batch).
    """

    catalogue: Catalogue
    pending: list[tuple[Submission, FeatureSnapshot, PairAsk | None, tuple[str]]] = field(default_factory=list)
    parts: list[Rows] = field(default_factory=list)
    y: list[float] = field(default_factory=list)
    submit_time: list[float] = field(default_factory=list)
    finish_time: list[float] = field(default_factory=list)
    attempt_id: list[str] = field(default_factory=list)
    job_key: list[str] = field(default_factory=list)
    hardware: list[str] = field(default_factory=list)
    num_accelerators: list[int] = field(default_factory=list)
    full: dict[int, tuple[Submission, Rows]] = field(default_factory=dict)

    def add(self, sub: Submission, done: Outcome, snap: FeatureSnapshot, pairs: PairAsk | None = None) -> int:
        """Append the example of ``sub``, measured by ``done``, with what the store held for its job
        (``snap``, its paired ratios still to summarise from ``pairs`` if given); returns its index."""
        assert done.throughput is not None
        n = len(self.y)
        self.pending.append((sub, snap, pairs, (done.hardware,)))
        if len(self.pending) >= ROW_BATCH:
            self._flush()
        self.y.append(done.throughput / done.num_accelerators)
        self.submit_time.append(sub.event_time)
        self.finish_time.append(done.event_time)
        self.attempt_id.append(sub.attempt_id)
        self.job_key.append(sub.job_key)
        self.hardware.append(done.hardware)
        self.num_accelerators.append(sub.num_accelerators)
        return n

    def _flush(self) -> None:
        subs, snaps, asks, candidates = zip(*self.pending, strict=True) if self.pending else ((), (), (), ())
        snaps = tuple(all_with_pairs(snaps, asks))  # every window of the batch in one pass
        self.parts.append(build_batch_rows(subs, snaps, self.catalogue, candidates))
        self.pending = []

    def examples(self) -> Examples:
        """The columns as arrays (categorical ones as object arrays)."""
        if self.pending or not self.parts:
            self._flush()
        parts, self.parts = self.parts, []
        # Column by column, each column's parts dropped once joined: the rows are never held twice.
        rows = {c: np.concatenate([p.pop(c) for p in parts]) for c in list(parts[0])}
        return Examples(
            rows=rows, y=np.array(self.y), submit_time=np.array(self.submit_time),
            finish_time=np.array(self.finish_time), attempt_id=np.array(self.attempt_id, dtype=object),
            job_key=np.array(self.job_key, dtype=object), hardware=np.array(self.hardware, dtype=object),
            num_accelerators=np.array(self.num_accelerators, dtype=np.float64), full=self.full,
        )
