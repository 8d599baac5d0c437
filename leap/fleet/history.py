"""Simulated history: D days of submissions, starts and finishes, as day-partitioned Parquet.

Layout (the live archive's, :mod:`streams.archive`: its day folders and, for the event tables,
its column types)::

    DIR/submissions/day=YYYY-MM-DD/part-0.parquet   columns = Submission fields
    DIR/starts/day=YYYY-MM-DD/part-0.parquet        columns = JobStart fields
    DIR/finishes/day=YYYY-MM-DD/part-0.parquet      columns = JobFinish fields
    DIR/oracle/day=YYYY-MM-DD/part-0.parquet        evaluation only: noise-free expected
                                                    throughput of every (attempt, candidate)

Events are filed under the UTC day of their ``event_time``. Attempts still running at the end of
the window have no finish (and no start if not yet started).
"""

from __future__ import annotations

import datetime as dt
import heapq
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from leap.fleet.arrays import FRAMEWORKS, F, HardwareArrays, I, JobConfig, hardware_arrays
from leap.fleet.changes import change_kind
from leap.fleet.effects import model_architecture_effect
from leap.fleet.engine import (
    DAY,
    MAX_RUN_H,
    MAX_WAIT_S,
    OUTCOME_NAMES,
    P_DEFAULT_ROUTE,
    P_RECUR,
    Draws,
    day_times,
    job_key,
    next_ready,
)
from leap.fleet.jobs import Jobs, sample_jobs
from leap.fleet.teams import PREFERENCES, Teams, sample_teams
from leap.fleet.workloads import model_types
from streams.archive import from_columns, table_name, write_by_day
from streams.events import PRECISIONS, SCHEMA_VERSION, JobFinish, JobStart, Submission


@dataclass(frozen=True)
class History:
    """Attempt-level arrays of a simulated window (one entry per submitted attempt).

    ``jobs`` holds every row (configuration) of every job that submitted; ``job`` is an
    attempt's job number (its ``job_key``) and ``row`` the row of the configuration it ran.
    """

    seed: int
    start: float
    end: float
    jobs: Jobs
    job: I
    row: I
    attempt_no: I
    submit: F
    hardware: I
    throughput: F  # NaN when nothing was measured
    start_time: F
    finish_time: F
    outcome: I
    prior_measured: np.ndarray  # a finished attempt of the job with a throughput came before

    def __len__(self) -> int:
        return len(self.job)

    @property
    def prior_share(self) -> float:
        """Share of attempts whose job had a measured earlier attempt at submission time."""
        return float(self.prior_measured.mean()) if len(self) else 0.0

    @property
    def changed_share(self) -> float:
        """Share of attempts that run another configuration than their job's first."""
        return float((self.jobs.job[self.row] != self.row).mean()) if len(self) else 0.0


def _concat_jobs(chunks: list[Jobs]) -> Jobs:
    """One :class:`Jobs` of all chunks, with row and job indices made global."""
    offsets = np.cumsum([0] + [len(c) for c in chunks[:-1]])
    per_row = {k: np.concatenate([getattr(c, k) for c in chunks])
               for k in Jobs.__dataclass_fields__ if k not in ("cfg", "job", "variants")}
    return Jobs(
        cfg=JobConfig.concat([c.cfg for c in chunks]),
        job=np.concatenate([c.job + o for c, o in zip(chunks, offsets, strict=True)]),
        variants=np.concatenate([c.variants + o for c, o in zip(chunks, offsets, strict=True)]),
        **per_row,
    )


class _JobPool:
    """The jobs drawn so far, ``chunk`` at a time, as Python lists indexed by global row.

    The attempt loop reads one element at a time, which is much faster from lists than from
    numpy arrays; the arrays are kept for :class:`History`. Job ``j``'s first row is
    ``base[j]``, its variants ``variants[j]``.
    """

    def __init__(self, rng: np.random.Generator, hw: HardwareArrays, teams: Teams, chunk: int) -> None:
        self.rng, self.hw, self.teams, self.chunk = rng, hw, teams, chunk
        self.chunks: list[Jobs] = []
        self.rows = 0
        self.base: list[int] = []
        self.variants: list[list[int]] = []
        self.work: list[float] = []
        self.planned: list[int] = []
        self.oracle: list[list[float]] = []
        self.preference: list[list[int]] = []

    def ensure(self, job: int) -> None:
        """Draw the next chunk when ``job`` (at most one past the last) is not drawn yet."""
        if job >= len(self.base):
            jobs = sample_jobs(self.rng, self.chunk, self.teams, self.hw)
            self.chunks.append(jobs)
            self.base.extend(range(self.rows, self.rows + jobs.jobs))
            self.variants.extend((jobs.variants + self.rows).tolist())
            self.work.extend(jobs.work.tolist())
            self.planned.extend(jobs.planned_attempts.tolist())
            self.oracle.extend(np.nan_to_num(jobs.oracle).tolist())
            self.preference.extend(jobs.preference.tolist())
            self.rows += len(jobs)

    def jobs(self) -> Jobs:
        return _concat_jobs(self.chunks)


@dataclass(frozen=True)
class _Placed:
    """Per-attempt results of :func:`_run_attempts` (see :class:`History`)."""

    job: I
    row: I
    attempt_no: I
    hardware: I
    throughput: F
    start_time: F
    finish_time: F
    prior_measured: np.ndarray

    @classmethod
    def empty(cls, n: int) -> _Placed:
        return cls(job=np.empty(n, dtype=np.int64), row=np.empty(n, dtype=np.int64),
                   attempt_no=np.empty(n, dtype=np.int64), hardware=np.empty(n, dtype=np.int64),
                   throughput=np.empty(n), start_time=np.empty(n), finish_time=np.empty(n),
                   prior_measured=np.zeros(n, dtype=bool))


def _run_attempts(times: F, draws: Draws, u: np.ndarray, pool: _JobPool) -> _Placed:
    """Assign each submission time to a new or returning job and place and run its attempt."""
    n = len(times)
    out = _Placed.empty(n)
    attempts: list[int] = []  # attempts so far, per job
    measured: list[bool] = []  # per job: an attempt reported a throughput
    current: list[int] = []  # per job: row of its configuration
    heap: list[tuple[float, int, int]] = []  # (ready time, push order, job) of jobs coming back
    # Local names and lists, not attributes and arrays, in the loop (see _JobPool); the pool's
    # lists grow in place.
    job_of, row_of, att_of, hw_of, thr_of = out.job, out.row, out.attempt_no, out.hardware, out.throughput
    start_of, fin_of, prior = out.start_time, out.finish_time, out.prior_measured
    pref, oracle, work, planned, variants = pool.preference, pool.oracle, pool.work, pool.planned, pool.variants
    mult, outcome, meas = draws.mult.tolist(), draws.outcome.tolist(), draws.measured.tolist()
    frac, wait, us, tl = draws.frac.tolist(), draws.wait.tolist(), u.tolist(), times.tolist()
    for i in range(n):
        t, ui = tl[i], us[i]
        job = -1
        if ui[0] < P_RECUR:  # a job coming back, if one is due (inline: this loop is the hot path)
            while heap and heap[0][0] <= t:
                ready_at, _, cand = heapq.heappop(heap)
                if t - ready_at <= MAX_WAIT_S:  # else abandoned: waited longer than a week
                    job = cand
                    break
        if job < 0:
            job = len(attempts)
            pool.ensure(job)
            attempts.append(0)
            measured.append(False)
            current.append(pool.base[job])
        k, r = attempts[job], current[job]
        attempts[job] = k + 1
        # the team's usual part when it is free, else its next choices in turn
        h = pref[r][0] if ui[1] < P_DEFAULT_ROUTE else pref[r][1 + k % (PREFERENCES - 1)]
        thr = oracle[r][h] * mult[i]
        st = t + wait[i]
        fin = st + min(work[r] / thr / 3600.0, MAX_RUN_H) * frac[i] * 3600.0
        prior[i] = measured[job]
        job_of[i], row_of[i], att_of[i], hw_of[i], start_of[i], fin_of[i] = job, r, k, h, st, fin
        thr_of[i] = thr if meas[i] else math.nan
        if meas[i]:
            measured[job] = True
        ready = next_ready(ui[2], outcome[i], k + 1, planned[r], fin, ui[3])
        if ready is not None:
            kind = change_kind(OUTCOME_NAMES[outcome[i]], ui[4], ui[5]) if r == pool.base[job] else None
            if kind is not None:
                current[job] = variants[job][kind]
            heapq.heappush(heap, (ready, i, job))  # i orders equal ready times by push order
    return out


def simulate(
    seed: int,
    days: int,
    attempts_per_day: int,
    start: float | None = None,
    hw: HardwareArrays | None = None,
    chunk: int = 50_000,
) -> History:
    """Simulate ``days`` days of attempts under the fleet's default routing.

    Parameters
    ----------
    seed
        Makes the history deterministic.
    days, attempts_per_day
        Window length and submissions per day (intra-day times follow the daily rhythm).
    start
        Unix seconds of the first day's midnight UTC; default 2025-01-01.
    hw
        Hardware arrays; default catalogue when None.
    chunk
        Jobs drawn at a time (bounds memory).
    """
    hw = hw or hardware_arrays()
    rng = np.random.default_rng(seed)
    t0 = start if start is not None else dt.datetime(2025, 1, 1, tzinfo=dt.UTC).timestamp()
    times = np.concatenate([day_times(rng, t0 + d * DAY, attempts_per_day) for d in range(days)])
    # Every per-attempt draw is made up front, before any job: the order of draws fixes the history.
    draws = Draws.sample(rng, len(times))
    u = rng.random((len(times), 6))
    # a window needs about a job per four attempts: small windows draw small chunks
    pool = _JobPool(rng, hw, sample_teams(rng, hw), min(chunk, max(1000, len(times) // 3)))
    placed = _run_attempts(times, draws, u, pool)
    return History(
        seed=seed,
        start=t0,
        end=t0 + days * DAY,
        jobs=pool.jobs(),
        job=placed.job,
        row=placed.row,
        attempt_no=placed.attempt_no,
        submit=times,
        hardware=placed.hardware,
        throughput=placed.throughput,
        start_time=placed.start_time,
        finish_time=placed.finish_time,
        outcome=draws.outcome,
        prior_measured=placed.prior_measured,
    )


# ------------------------------------------------------------------------------ Parquet output


def _labels(h: History) -> dict[str, np.ndarray]:
    """Per-attempt identifiers and model columns that every event table repeats."""
    ms = model_types()
    model = h.jobs.cfg.model[h.row]
    keys = np.array([job_key(h.seed, x) for x in h.job.tolist()], dtype=object)
    attempt_ids = np.array(
        [f"{k}-a{a}" for k, a in zip(keys.tolist(), h.attempt_no.tolist(), strict=True)], dtype=object
    )
    return {
        "schema_version": np.full(len(h), SCHEMA_VERSION),
        "job_key": keys,
        "attempt_id": attempt_ids,
        "model_type": np.array([m.name for m in ms], dtype=object)[model],
        "family": np.array([m.family for m in ms], dtype=object)[model],
        "num_accelerators": h.jobs.cfg.n[h.row].astype(np.int64),
    }


def _submission_columns(h: History, hw: HardwareArrays, labels: dict[str, np.ndarray]) -> dict[str, Any]:
    """The attempt's own configuration (a job may change it between attempts) and candidates."""
    jobs, j = h.jobs, h.row
    names = np.array(hw.names, dtype=object)
    return {
        **labels,
        "event_id": "sub-" + labels["attempt_id"],
        "event_time": h.submit,
        "params": np.array([m.params for m in model_types()])[jobs.cfg.model[j]],
        "global_batch_size": jobs.cfg.batch[j].astype(np.int64),
        "seq_len": jobs.cfg.seq[j].astype(np.int64),
        "precision": np.array(PRECISIONS, dtype=object)[jobs.cfg.precision[j]],
        "data_parallel": jobs.cfg.dp[j].astype(np.int64),
        "tensor_parallel": jobs.cfg.tp[j].astype(np.int64),
        "pipeline_parallel": jobs.cfg.pp[j].astype(np.int64),
        "framework": np.array(FRAMEWORKS, dtype=object)[jobs.cfg.framework[j]],
        "candidates": [names[row].tolist() for row in jobs.eligible[j]],
        "requested_hardware": names[jobs.requested[j]],
    }


def _finish_columns(h: History, labels: dict[str, np.ndarray]) -> dict[str, Any]:
    return {
        "event_id": "finish-" + labels["attempt_id"],
        "event_time": h.finish_time,
        "throughput": [None if math.isnan(x) else x for x in h.throughput.tolist()],
        "accelerator_hours": h.jobs.cfg.n[h.row] * (h.finish_time - h.start_time) / 3600.0,
        "outcome": np.array(OUTCOME_NAMES, dtype=object)[h.outcome],
        "start_time": h.start_time,
        # the attempt's own configuration, which a job may change between attempts
        "global_batch_size": h.jobs.cfg.batch[h.row].astype(np.int64),
        "precision": np.array(PRECISIONS, dtype=object)[h.jobs.cfg.precision[h.row]],
    }


def _rows(columns: dict[str, Any], keep: np.ndarray) -> dict[str, Any]:
    """The rows of ``columns`` where ``keep`` is true (columns are arrays or lists)."""
    return {
        k: [x for x, ok in zip(col, keep, strict=True) if ok] if isinstance(col, list) else col[keep]
        for k, col in columns.items()
    }


def _oracle_table(h: History, hw: HardwareArrays, labels: dict[str, np.ndarray]) -> pa.Table:
    """One row per (attempt, eligible candidate): evaluation only, never a model input.

    ``oracle_throughput`` = ``min(law_throughput x job_factor x job_hardware_factor, input_cap)``
    (NaN cap: none), all whole-job samples/s at the attempt's configuration; ``law_throughput``
    includes the model type's effect on the part's architecture, ``architecture_effect`` (so the
    backtest's ceiling can leave it out where no earlier job revealed it).
    """
    jobs, j = h.jobs, h.row
    rows, cols = np.nonzero(jobs.eligible[j])
    r = j[rows]
    cap = jobs.cap[r]
    return pa.table(
        {
            "event_time": pa.array(h.submit[rows]),
            "job_key": pa.array(labels["job_key"][rows], pa.string()),
            "attempt_id": pa.array(labels["attempt_id"][rows], pa.string()),
            "hardware": pa.array(np.array(hw.names, dtype=object)[cols], pa.string()),
            "oracle_throughput": pa.array(jobs.oracle[r, cols]),
            "law_throughput": pa.array(jobs.law[r, cols]),
            "architecture_effect": pa.array(model_architecture_effect()[jobs.cfg.model[r], cols]),
            "job_factor": pa.array(jobs.factor[r]),
            "job_hardware_factor": pa.array(jobs.job_hardware[r, cols]),
            "input_cap": pa.array(np.where(np.isinf(cap), np.nan, cap), from_pandas=True),
            "hourly_price_per_accelerator": pa.array(hw.price[cols]),
        }
    )


def tables(h: History, hw: HardwareArrays | None = None) -> dict[str, pa.Table]:
    """The four tables (submissions, starts, finishes, oracle) of a history, unpartitioned.

    The event tables have the live archive's schema (:func:`streams.archive.arrow_schema`);
    starts and finishes only of attempts that started or finished by the end of the window.
    """
    hw = hw or hardware_arrays()
    labels = _labels(h)
    placed = {**labels, "hardware": np.array(hw.names, dtype=object)[h.hardware]}
    starts = {**placed, "event_id": "start-" + labels["attempt_id"], "event_time": h.start_time}
    finishes = {**placed, **_finish_columns(h, labels)}
    return {
        table_name(Submission): from_columns(Submission, _submission_columns(h, hw, labels)),
        table_name(JobStart): from_columns(JobStart, _rows(starts, h.start_time <= h.end)),
        table_name(JobFinish): from_columns(JobFinish, _rows(finishes, h.finish_time <= h.end)),
        "oracle": _oracle_table(h, hw, labels),
    }


def write_history(h: History, out: Path, hw: HardwareArrays | None = None) -> dict[str, int]:
    """Write a history as day-partitioned Parquet under ``out``; returns rows written per table.

    One ``part-0.parquet`` per table and day, in the archive's day folders
    (:func:`streams.archive.day_folder`).
    """
    return write_by_day(out, tables(h, hw))
