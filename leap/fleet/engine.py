"""Attempts: who submits what when, where it runs and how it ends.

Two entry points share the same laws:

* :class:`Fleet` — a stateful generator for the scheduler simulator:
  ``sample_attempts(n, start_time)`` returns :class:`Attempt` objects (Submission event,
  candidates, oracle per candidate) and ``run(attempt, hardware, rng)`` returns the JobStart and
  JobFinish of running it there.
* :func:`simulate` — bulk history for ``leap fleet history`` (vectorised, plus one cheap Python
  pass that assigns submission slots to jobs).

Recurrence: a submission slot goes to a job whose previous attempt has ended and that wants to
run again (a retry after a failure or preemption, or a resubmission) with probability
``P_RECUR``, otherwise to a new job. That is what makes a job's prior throughput available.
A returning job may come back with another configuration (:mod:`leap.fleet.changes`).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from leap.core.hardware import Catalogue
from leap.fleet.arrays import FRAMEWORKS, F, HardwareArrays, I, hardware_arrays
from leap.fleet.changes import change_kind
from leap.fleet.jobs import Jobs, sample_jobs
from leap.fleet.teams import sample_teams
from leap.fleet.workloads import model_types
from streams.events import PRECISIONS, SCHEMA_VERSION, JobFinish, JobStart, Submission

P_RECUR = 0.85
#: History: share of attempts placed on the requested hardware (the team's usual part); the rest
#: find it busy and go to the team's next choice.
P_DEFAULT_ROUTE = 0.7
P_FAILED, P_PREEMPTED = 0.06, 0.05
P_FAILED_UNMEASURED = 0.5  # failed before the first throughput report
P_STRAGGLER = 0.04
NOISE_SIGMA = 0.03
MAX_ATTEMPTS = 10
MAX_WAIT_S = 7 * 86400.0  # a job not resubmitted within a week is abandoned
MAX_RUN_H = 72.0

DAY = 86400.0


def rhythm(hour: F) -> F:
    """Relative submission rate by UTC hour: a working-day peak at 14:00, a trough at 02:00."""
    return np.asarray(1.0 + 0.6 * np.cos(2.0 * np.pi * (hour - 14.0) / 24.0), dtype=np.float64)


def day_times(rng: np.random.Generator, day_start: float, n: int) -> F:
    """``n`` sorted submission times within one day following :func:`rhythm`."""
    minutes = np.arange(1440)
    cdf = np.cumsum(rhythm(minutes / 60.0))
    cdf /= cdf[-1]
    pos = np.searchsorted(cdf, rng.random(n))
    return np.sort(day_start + (pos + rng.random(n)) * 60.0)


@dataclass(frozen=True)
class Draws:
    """Per-attempt randomness, drawn in bulk: throughput multiplier, outcome, share of work done."""

    mult: F
    outcome: I  # 0 completed, 1 failed, 2 preempted
    measured: np.ndarray
    frac: F
    wait: F

    @classmethod
    def sample(cls, rng: np.random.Generator, n: int) -> Draws:
        mult = np.exp(rng.normal(0.0, NOISE_SIGMA, n))
        straggler = rng.random(n) < P_STRAGGLER
        mult = np.where(straggler, mult * rng.uniform(0.6, 0.9, n), mult)  # 10-40 % slower
        u = rng.random(n)
        outcome = np.where(u < P_FAILED, 1, np.where(u < P_FAILED + P_PREEMPTED, 2, 0)).astype(np.int64)
        measured = (outcome != 1) | (rng.random(n) >= P_FAILED_UNMEASURED)
        frac = np.where(
            outcome == 1, rng.uniform(0.01, 0.5, n), np.where(outcome == 2, rng.uniform(0.1, 0.9, n), 1.0)
        )
        wait = rng.exponential(300.0, n)  # queueing between submission and start
        return cls(mult=mult, outcome=outcome, measured=measured, frac=frac, wait=wait)


OUTCOME_NAMES = ("completed", "failed", "preempted")


def run_seconds(work: float, throughput: float, frac: float) -> float:
    """Wall-clock seconds of an attempt that processes ``frac`` of ``work`` at ``throughput``."""
    return min(work / throughput / 3600.0, MAX_RUN_H) * frac * 3600.0


@dataclass(frozen=True)
class Attempt:
    """One submitted attempt, with what only the simulator knows.

    Attributes
    ----------
    submission
        The event the scheduler publishes.
    oracle
        Noise-free expected throughput (samples/s) on each candidate, per-job factor included.
    job_factor
        The job's persistent factor.
    work_samples
        Samples the attempt processes if it completes.
    default_hardware
        Where default routing puts it: the requested part (the team's usual one), or the team's
        next choice when that one is busy (:data:`P_DEFAULT_ROUTE`).
    preference
        The team's order over the parts that run the job, the requested part first: where a
        scheduler that models capacity tries them (:mod:`leap.fleet.routing`).
    """

    submission: Submission
    oracle: dict[str, float]
    job_factor: float
    work_samples: float
    default_hardware: str = ""
    preference: tuple[str, ...] = ()

    @property
    def candidates(self) -> tuple[str, ...]:
        return self.submission.candidates

    def best(self, prices: dict[str, float]) -> str:
        """Candidate with the highest oracle throughput per dollar (``prices`` per accelerator-hour)."""
        return max(self.candidates, key=lambda h: self.oracle[h] / prices[h])


@dataclass(frozen=True)
class RunResult:
    """Events of running one attempt."""

    start: JobStart
    finish: JobFinish


def job_key(seed: int, job: int) -> str:
    """Stable job key for job number ``job`` of a fleet with ``seed``."""
    return f"job-{seed:x}-{job:08d}"


def submission_event(
    jobs: Jobs, j: int, key: str, attempt_no: int, t: float, hw: HardwareArrays
) -> Submission:
    """The Submission event of attempt ``attempt_no`` running the configuration of row ``j``."""
    cfg = jobs.cfg
    m = model_types()[int(cfg.model[j])]
    cands = tuple(hw.names[h] for h in np.flatnonzero(jobs.eligible[j]))
    attempt_id = f"{key}-a{attempt_no}"
    return Submission(
        schema_version=SCHEMA_VERSION,
        event_id=f"sub-{attempt_id}",
        event_time=t,
        job_key=key,
        attempt_id=attempt_id,
        model_type=m.name,
        family=m.family,
        params=float(m.params),
        global_batch_size=int(cfg.batch[j]),
        seq_len=int(cfg.seq[j]),
        precision=PRECISIONS[int(cfg.precision[j])],
        num_accelerators=int(cfg.n[j]),
        data_parallel=int(cfg.dp[j]),
        tensor_parallel=int(cfg.tp[j]),
        pipeline_parallel=int(cfg.pp[j]),
        framework=FRAMEWORKS[int(cfg.framework[j])],
        candidates=cands,
        requested_hardware=hw.names[int(jobs.requested[j])],
    )


@dataclass
class _Recurrence:
    """Jobs waiting to run again, by the time they are ready."""

    heap: list[tuple[float, int, int]] = field(default_factory=list)
    counter: int = 0

    def pop_ready(self, t: float) -> int | None:
        while self.heap and self.heap[0][0] <= t:
            ready, _, job = heapq.heappop(self.heap)
            if t - ready <= MAX_WAIT_S:
                return job
        return None

    def push(self, ready: float, job: int) -> None:
        self.counter += 1
        heapq.heappush(self.heap, (ready, self.counter, job))


def next_ready(
    draw_u: float, outcome: int, attempts: int, planned: int, end: float, gap_u: float
) -> float | None:
    """When a job wants to run again after an attempt ending at ``end`` (None: it is done)."""
    if outcome != 0 and attempts < MAX_ATTEMPTS:
        return end + 60.0 + 3600.0 * gap_u  # retry/restart within the hour
    if outcome == 0 and attempts < planned:
        # resubmission (new data, hyper-parameters, continued training): hours to days later
        return end + 6 * 3600.0 * math.exp(4.0 * (draw_u - 0.5))  # ~50 min to ~2 days
    return None


class Fleet:
    """Stateful attempt generator for the scheduler simulator.

    Parameters
    ----------
    seed
        Makes everything deterministic.
    attempts_per_day
        Mean submission rate; times follow :func:`rhythm`.
    catalogue
        Hardware catalogue; default when None.
    """

    def __init__(
        self,
        seed: int = 0,
        attempts_per_day: float = 20000.0,
        catalogue: Catalogue | None = None,
        job_chunk: int = 4096,
    ) -> None:
        self.seed = seed
        self.attempts_per_day = attempts_per_day
        self.hw = hardware_arrays(catalogue)
        self._rng = np.random.default_rng(seed)
        self.teams = sample_teams(self._rng, self.hw)
        self._job_chunk = job_chunk
        self._chunks: list[Jobs] = []
        self._next_job = 0
        self._attempts: dict[int, int] = {}
        self._row: dict[int, int] = {}  # job -> row of its current configuration, once changed
        self._pool = _Recurrence()
        self._clock: float | None = None

    def _job(self, job: int) -> tuple[Jobs, int]:
        """The chunk holding ``job`` and the row of its current configuration in it."""
        while job >= len(self._chunks) * self._job_chunk:
            self._chunks.append(sample_jobs(self._rng, self._job_chunk, self.teams, self.hw))
        return self._chunks[job // self._job_chunk], self._row.get(job, job % self._job_chunk)

    def _times(self, n: int, start: float) -> F:
        # Poisson arrivals with the daily rhythm: invert the cumulative intensity on a grid.
        rate = self.attempts_per_day / DAY
        span = max(4.0 * n / rate, DAY)
        grid = start + np.linspace(0.0, span, int(span / 60.0) + 2)
        intensity = rate * rhythm((grid % DAY) / 3600.0) / 1.0
        cum = np.concatenate([[0.0], np.cumsum((intensity[1:] + intensity[:-1]) / 2.0 * np.diff(grid))])
        targets = np.cumsum(self._rng.exponential(1.0, n))
        return np.asarray(np.interp(targets, cum, grid), dtype=np.float64)

    def _maybe_change(self, job: int, outcome: int, u_change: float, u_kind: float) -> None:
        """Move a returning job to a variant row when its owner changes the configuration."""
        if job in self._row:
            return  # a job changes at most once
        kind = change_kind(OUTCOME_NAMES[outcome], u_change, u_kind)
        if kind is not None:
            jobs = self._chunks[job // self._job_chunk]
            self._row[job] = int(jobs.variants[job % self._job_chunk, kind])

    def sample_attempts(self, n: int, start_time: float | None = None) -> list[Attempt]:
        """The next ``n`` submitted attempts, in submission order.

        Parameters
        ----------
        n
            Number of attempts.
        start_time
            Unix seconds to continue from; default where the previous call stopped (or now).

        Returns
        -------
        list of Attempt
        """
        import time as _time

        start = start_time if start_time is not None else (self._clock or _time.time())
        times = self._times(n, start)
        u = self._rng.random((n, 6))
        draws = Draws.sample(self._rng, n)  # used only to decide when the job comes back
        out = []
        for i, t in enumerate(times.tolist()):
            job = self._pool.pop_ready(t) if u[i, 0] < P_RECUR else None
            if job is None:
                job = self._next_job
                self._next_job += 1
            jobs, j = self._job(job)
            k = self._attempts.get(job, 0)
            self._attempts[job] = k + 1
            sub = submission_event(jobs, j, job_key(self.seed, job), k, t, self.hw)
            oracle = {self.hw.names[h]: float(jobs.oracle[j, h]) for h in np.flatnonzero(jobs.eligible[j])}
            choice = 0 if u[i, 5] < P_DEFAULT_ROUTE else 1 + k % (jobs.preference.shape[1] - 1)
            default = self.hw.names[int(jobs.preference[j, choice])]
            preference = tuple(dict.fromkeys(self.hw.names[int(h)] for h in jobs.preference[j]))
            out.append(Attempt(sub, oracle, float(jobs.factor[j]), float(jobs.work[j]), default, preference))
            req = int(jobs.requested[j])
            end = (
                t
                + draws.wait[i]
                + run_seconds(float(jobs.work[j]), float(jobs.oracle[j, req]), draws.frac[i])
            )
            outcome = int(draws.outcome[i])
            ready = next_ready(u[i, 1], outcome, k + 1, int(jobs.planned_attempts[j]), end, u[i, 2])
            if ready is not None:
                self._maybe_change(job, outcome, u[i, 3], u[i, 4])
                self._pool.push(ready, job)
        self._clock = float(times[-1]) if n else start
        return out

    def run(
        self, attempt: Attempt, hardware: str, rng: np.random.Generator, start_time: float | None = None
    ) -> RunResult:
        """Run ``attempt`` on ``hardware`` and return its start and finish events.

        Parameters
        ----------
        attempt
            From :meth:`sample_attempts`.
        hardware
            One of ``attempt.candidates``.
        rng
            Noise, stragglers and failures come from here.
        start_time
            Default: submission time plus a queueing delay.
        """
        if hardware not in attempt.oracle:
            raise ValueError(f"{hardware!r} is not a candidate of {attempt.submission.attempt_id}")
        d = Draws.sample(rng, 1)
        sub = attempt.submission
        start = start_time if start_time is not None else sub.event_time + float(d.wait[0])
        thr = attempt.oracle[hardware] * float(d.mult[0])
        seconds = run_seconds(attempt.work_samples, thr, float(d.frac[0]))
        aid = sub.attempt_id
        js = JobStart(
            schema_version=SCHEMA_VERSION, event_id=f"start-{aid}", event_time=start, job_key=sub.job_key,
            attempt_id=aid, model_type=sub.model_type, family=sub.family, hardware=hardware,
            num_accelerators=sub.num_accelerators,
        )
        jf = JobFinish(
            schema_version=SCHEMA_VERSION, event_id=f"finish-{aid}", event_time=start + seconds,
            job_key=sub.job_key, attempt_id=aid, model_type=sub.model_type, family=sub.family,
            hardware=hardware, num_accelerators=sub.num_accelerators,
            throughput=thr if bool(d.measured[0]) else None,
            accelerator_hours=sub.num_accelerators * seconds / 3600.0,
            outcome=OUTCOME_NAMES[int(d.outcome[0])], start_time=start,
            global_batch_size=sub.global_batch_size, precision=sub.precision,
        )
        return RunResult(js, jf)
