"""Simulated history: D days of submissions, starts and finishes, as day-partitioned Parquet.

Layout (the same as the live archive)::

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
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fleet.engine import (
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
from fleet.jobs import Jobs, sample_jobs
from fleet.throughput import FRAMEWORKS, F, HardwareArrays, I, hardware_arrays
from fleet.workloads import model_types
from streams.events import PRECISIONS, SCHEMA_VERSION, JobFinish, JobStart, Submission

_ALTS = 4


@dataclass(frozen=True)
class History:
    """Attempt-level arrays of a simulated window (one entry per submitted attempt)."""

    seed: int
    start: float
    end: float
    jobs: Jobs  # every job that submitted, row = global job number
    job: I
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


def _concat_jobs(chunks: list[Jobs]) -> Jobs:
    from fleet.throughput import JobConfig

    cfg = JobConfig(
        **{k: np.concatenate([getattr(c.cfg, k) for c in chunks]) for k in JobConfig.__dataclass_fields__}
    )
    rest = {
        k: np.concatenate([getattr(c, k) for c in chunks]) for k in Jobs.__dataclass_fields__ if k != "cfg"
    }
    return Jobs(cfg=cfg, **rest)


def _alternatives(rng: np.random.Generator, jobs: Jobs, hw: HardwareArrays) -> I:
    """Per job, a few eligible types where the fleet's routing may place it instead (by availability)."""
    keys = np.log(hw.popularity)[None, :] + rng.gumbel(size=jobs.eligible.shape)
    keys = np.where(jobs.eligible, keys, -np.inf)
    top = np.argsort(-keys, axis=1)[:, :_ALTS]
    # fewer eligible types than _ALTS: fall back to the requested one
    ok = np.take_along_axis(jobs.eligible, top, axis=1)
    return np.where(ok, top, jobs.requested[:, None]).astype(np.int64)


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
    end = t0 + days * DAY
    times = np.concatenate([day_times(rng, t0 + d * DAY, attempts_per_day) for d in range(days)])
    n = len(times)
    draws = Draws.sample(rng, n)
    u = rng.random((n, 4))

    chunks: list[Jobs] = []
    req: list[int] = []
    work: list[float] = []
    planned: list[int] = []
    oracle: list[list[float]] = []
    alts: list[list[int]] = []

    def grow() -> None:
        jobs = sample_jobs(rng, chunk, hw)
        chunks.append(jobs)
        req.extend(jobs.requested.tolist())
        work.extend(jobs.work.tolist())
        planned.extend(jobs.planned_attempts.tolist())
        oracle.extend(np.nan_to_num(jobs.oracle).tolist())
        alts.extend(_alternatives(rng, jobs, hw).tolist())

    job_of = np.empty(n, dtype=np.int64)
    att_of = np.empty(n, dtype=np.int64)
    hw_of = np.empty(n, dtype=np.int64)
    thr_of = np.empty(n)
    start_of = np.empty(n)
    fin_of = np.empty(n)
    prior = np.zeros(n, dtype=bool)
    attempts: list[int] = []
    measured: list[bool] = []
    heap: list[tuple[float, int, int]] = []
    import heapq

    mult, outcome, meas, frac, wait = (
        draws.mult.tolist(),
        draws.outcome.tolist(),
        draws.measured.tolist(),
        draws.frac.tolist(),
        draws.wait.tolist(),
    )
    us = u.tolist()
    tl = times.tolist()
    counter = 0
    for i in range(n):
        t = tl[i]
        ui = us[i]
        job = -1
        if ui[0] < P_RECUR:
            while heap and heap[0][0] <= t:
                ready_at, _, cand = heapq.heappop(heap)
                if t - ready_at <= MAX_WAIT_S:
                    job = cand
                    break
        if job < 0:
            job = len(attempts)
            attempts.append(0)
            measured.append(False)
            if job >= len(req):
                grow()
        k = attempts[job]
        attempts[job] = k + 1
        h = req[job] if ui[1] < P_DEFAULT_ROUTE else alts[job][k % _ALTS]
        thr = oracle[job][h] * mult[i]
        st = t + wait[i]
        fin = st + min(work[job] / thr / 3600.0, MAX_RUN_H) * frac[i] * 3600.0
        prior[i] = measured[job]
        job_of[i], att_of[i], hw_of[i], start_of[i], fin_of[i] = job, k, h, st, fin
        thr_of[i] = thr if meas[i] else math.nan
        if meas[i]:
            measured[job] = True
        ready = next_ready(ui[2], outcome[i], k + 1, planned[job], fin, ui[3])
        if ready is not None:
            counter += 1
            heapq.heappush(heap, (ready, counter, job))
    jobs = _concat_jobs(chunks)
    return History(
        seed=seed,
        start=t0,
        end=end,
        jobs=jobs,
        job=job_of,
        attempt_no=att_of,
        submit=times,
        hardware=hw_of,
        throughput=thr_of,
        start_time=start_of,
        finish_time=fin_of,
        outcome=draws.outcome,
        prior_measured=prior,
    )


# ------------------------------------------------------------------------------ Parquet output


def _arrow_type(cls: type) -> dict[str, pa.DataType]:
    types: dict[str, pa.DataType] = {}
    for spec in cls.FIELDS:  # type: ignore[attr-defined]
        types[spec.name] = {
            "str": pa.string(),
            "int": pa.int64(),
            "float": pa.float64(),
            "strlist": pa.list_(pa.string()),
        }[spec.kind]
    return types


def tables(h: History, hw: HardwareArrays | None = None) -> dict[str, pa.Table]:
    """The four tables (submissions, starts, finishes, oracle) of a history, unpartitioned."""
    hw = hw or hardware_arrays()
    jobs, j = h.jobs, h.job
    ms = model_types()
    names = np.array(hw.names, dtype=object)
    keys = np.array([job_key(h.seed, x) for x in j.tolist()], dtype=object)
    attempt_ids = np.array(
        [f"{k}-a{a}" for k, a in zip(keys.tolist(), h.attempt_no.tolist(), strict=True)], dtype=object
    )
    model_names = np.array([m.name for m in ms], dtype=object)[jobs.cfg.model[j]]
    families = np.array([m.family for m in ms], dtype=object)[jobs.cfg.model[j]]
    params = np.array([m.params for m in ms])[jobs.cfg.model[j]]
    elig = jobs.eligible[j]
    cand_lists = [names[row].tolist() for row in elig]

    sub_cols = {
        "schema_version": np.full(len(h), SCHEMA_VERSION),
        "event_id": "sub-" + attempt_ids,
        "event_time": h.submit,
        "job_key": keys,
        "attempt_id": attempt_ids,
        "model_type": model_names,
        "family": families,
        "params": params,
        "global_batch_size": jobs.cfg.batch[j].astype(np.int64),
        "seq_len": jobs.cfg.seq[j].astype(np.int64),
        "precision": np.array(PRECISIONS, dtype=object)[jobs.cfg.precision[j]],
        "num_accelerators": jobs.cfg.n[j].astype(np.int64),
        "data_parallel": jobs.cfg.dp[j].astype(np.int64),
        "tensor_parallel": jobs.cfg.tp[j].astype(np.int64),
        "pipeline_parallel": jobs.cfg.pp[j].astype(np.int64),
        "framework": np.array(FRAMEWORKS, dtype=object)[jobs.cfg.framework[j]],
        "candidates": cand_lists,
        "requested_hardware": names[jobs.requested[j]],
    }
    started = h.start_time <= h.end
    finished = h.finish_time <= h.end
    base = {
        "schema_version": np.full(len(h), SCHEMA_VERSION),
        "job_key": keys,
        "attempt_id": attempt_ids,
        "model_type": model_names,
        "family": families,
        "hardware": names[h.hardware],
        "num_accelerators": sub_cols["num_accelerators"],
    }
    start_cols = {**base, "event_id": "start-" + attempt_ids, "event_time": h.start_time}
    thr = h.throughput
    fin_cols = {
        **base,
        "event_id": "finish-" + attempt_ids,
        "event_time": h.finish_time,
        "throughput": [None if math.isnan(x) else x for x in thr.tolist()],
        "accelerator_hours": jobs.cfg.n[j] * (h.finish_time - h.start_time) / 3600.0,
        "outcome": np.array(OUTCOME_NAMES, dtype=object)[h.outcome],
        "start_time": h.start_time,
    }

    def table(cls: type, cols: dict[str, object], keep: np.ndarray | None) -> pa.Table:
        types = _arrow_type(cls)
        arrays = []
        for spec in cls.FIELDS:  # type: ignore[attr-defined]
            col = cols[spec.name]
            if keep is not None:
                col = [x for x, k in zip(col, keep, strict=True) if k] if isinstance(col, list) else col[keep]  # type: ignore[index]
            arrays.append(pa.array(col, type=types[spec.name]))
        return pa.Table.from_arrays(arrays, names=[s.name for s in cls.FIELDS])  # type: ignore[attr-defined]

    rows, cols_ = np.nonzero(elig)
    oracle = pa.table(
        {
            "event_time": pa.array(h.submit[rows]),
            "job_key": pa.array(keys[rows], pa.string()),
            "attempt_id": pa.array(attempt_ids[rows], pa.string()),
            "hardware": pa.array(names[cols_], pa.string()),
            "oracle_throughput": pa.array(jobs.oracle[j[rows], cols_]),
            "job_factor": pa.array(jobs.factor[j[rows]]),
            "input_cap": pa.array(
                np.where(np.isinf(jobs.cap[j[rows]]), np.nan, jobs.cap[j[rows]]), from_pandas=True
            ),
            "hourly_price_per_accelerator": pa.array(hw.price[cols_]),
        }
    )
    return {
        "submissions": table(Submission, sub_cols, None),
        "starts": table(JobStart, start_cols, started),
        "finishes": table(JobFinish, fin_cols, finished),
        "oracle": oracle,
    }


def write_history(h: History, out: Path, hw: HardwareArrays | None = None) -> dict[str, int]:
    """Write a history as day-partitioned Parquet under ``out``; returns rows written per table."""
    counts: dict[str, int] = {}
    for name, tab in tables(h, hw).items():
        days = (np.asarray(tab.column("event_time").to_numpy()) // DAY).astype(np.int64)
        counts[name] = tab.num_rows
        order = np.argsort(days, kind="stable")
        tab, days = tab.take(pa.array(order)), days[order]
        bounds = np.flatnonzero(np.diff(days)) + 1
        for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(days)], strict=True):
            if hi <= lo:
                continue
            day = dt.datetime.fromtimestamp(int(days[lo]) * DAY, tz=dt.UTC).strftime("%Y-%m-%d")
            folder = out / name / f"day={day}"
            folder.mkdir(parents=True, exist_ok=True)
            pq.write_table(tab.slice(int(lo), int(hi - lo)), folder / "part-0.parquet")
    return counts
