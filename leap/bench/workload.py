"""Benchmark inputs from the fleet simulator: submissions, and the finishes that give them history.

A benchmark that ranked only brand-new jobs would never touch the prior-throughput path, so the
online store is first warmed with the finishes of earlier attempts of the same simulated fleet;
later submissions then include retries and resubmissions of jobs the store knows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from features.store import FeatureStore
from leap.fleet.engine import Attempt, Fleet
from streams.events import JobFinish, JobStart, Submission

#: Events per write call, as the feature agents batch them (``streams.app.FEATURE_BATCH``).
WRITE_BATCH = 500
#: A fixed first submission time (2025-06-15 UTC) for workloads that never reach a broker: the
#: simulator's arrivals and catalogue depend on the date, so a wall-clock start gave other jobs,
#: candidates and paired ratios on every run.
FIXED_START = 1.75e9


@dataclass(frozen=True)
class Workload:
    """Events of ``warm`` earlier attempts, and the submissions that follow them."""

    starts: list[JobStart]
    finishes: list[JobFinish]
    submissions: list[Submission]

    @property
    def mean_candidates(self) -> float:
        return float(np.mean([len(s.candidates) for s in self.submissions])) if self.submissions else 0.0


def make_workload(warm: int, submissions: int, seed: int = 0, start_time: float | None = FIXED_START) -> Workload:
    """Run ``warm`` attempts on their requested hardware, then sample ``submissions`` more.

    Parameters
    ----------
    warm
        Attempts whose start and finish events make up the history.
    submissions
        Attempts submitted after them (what gets ranked or read).
    seed
        Fleet seed; with a fixed ``start_time`` the same seed gives the same events.
    start_time
        Unix seconds of the first attempt; None: now (for events sent through Kafka, whose
        time-based retention and lag figures want current timestamps).
    """
    fleet = Fleet(seed=seed)
    rng = np.random.default_rng(seed)
    starts, finishes = [], []
    for a in fleet.sample_attempts(warm, start_time) if warm else []:
        hw = a.submission.requested_hardware or a.candidates[0]
        ran = fleet.run(a, hw, rng)
        starts.append(ran.start)
        finishes.append(ran.finish)
    later: list[Attempt] = (fleet.sample_attempts(submissions, None if warm else start_time)
                            if submissions else [])
    return Workload(starts, finishes, [a.submission for a in later])


def seed_store(store: FeatureStore, w: Workload) -> None:
    """Write the workload's history into the store, in the agents' batch size."""
    for i in range(0, len(w.starts), WRITE_BATCH):
        store.apply_starts(w.starts[i : i + WRITE_BATCH])
    for i in range(0, len(w.finishes), WRITE_BATCH):
        store.apply_finishes(w.finishes[i : i + WRITE_BATCH])


def batches(items: Sequence[Submission], size: int) -> list[Sequence[Submission]]:
    """Consecutive slices of ``size`` (the last one may be shorter)."""
    return [items[i : i + size] for i in range(0, len(items), size)]
