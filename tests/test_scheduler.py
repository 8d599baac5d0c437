"""The scheduler simulator: its report arithmetic, and its fallback when the predictor stalls."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from core.hardware import load_catalogue
from core.settings import Settings
from fleet.engine import Fleet
from fleet.scheduler import Placement, SchedulerSimulator, cost_per_sample, default_hardware, summarize
from services.workers import WorkerProcess
from streams.client import SchedulerClient

CAT = load_catalogue()


def test_report_arithmetic_on_known_placements() -> None:
    fleet = Fleet(seed=3)
    attempts = [a for a in fleet.sample_attempts(200) if len(a.candidates) >= 3][:20]
    placements = []
    for a in attempts:
        best = min(a.candidates, key=lambda h: cost_per_sample(a, h, CAT))
        p = Placement(a, published_at=0.0, ranked_at=0.1, chosen=best, lookup_choice=default_hardware(a))
        p.ranking = None  # counted as unranked: coverage must be 0
        placements.append(p)
    report = summarize(placements, CAT, 500.0)
    assert report["coverage"] == 0.0
    assert report["cost_overrun_vs_oracle"] == pytest.approx(0.0, abs=1e-12)  # every pick was the best one
    default = sum(a.work_samples * cost_per_sample(a, default_hardware(a), CAT) for a in attempts)
    oracle = sum(a.work_samples * min(cost_per_sample(a, h, CAT) for h in a.candidates) for a in attempts)
    assert report["savings_vs_default"] == pytest.approx(1 - oracle / default)
    assert report["savings_vs_lookup"] == pytest.approx(1 - oracle / default)


def test_placements_respect_eligibility() -> None:
    fleet = Fleet(seed=9)
    for a in fleet.sample_attempts(300):
        assert a.submission.requested_hardware in a.candidates
        assert a.default_hardware in a.candidates
        assert set(a.oracle) == set(a.candidates)
        with pytest.raises(ValueError):
            fleet.run(a, "not-a-candidate", np.random.default_rng(0))


@pytest.mark.integration
@pytest.mark.e2e
def test_stalled_predictor_means_default_routing_and_nothing_lost(settings: Settings, worker: WorkerProcess) -> None:
    fleet = Fleet(seed=int(time.time()) % 100_000, attempts_per_day=5000, catalogue=CAT)
    os.kill(worker.proc.pid, signal.SIGSTOP)  # the predictor is there but answers nothing
    try:
        with SchedulerClient(settings) as client:
            sim = SchedulerSimulator(client, fleet, CAT, rate=20, deadline_s=0.3, seed=1)
            report = sim.run(3.0)
    finally:
        os.kill(worker.proc.pid, signal.SIGCONT)
    assert report["submissions"] >= 50
    assert report["attempts_placed"] == report["submissions"]  # nothing lost
    assert report["ranked_in_time"] == 0 and report["coverage"] == 0.0
    assert all(p.chosen == default_hardware(p.attempt) for p in sim.placements)
    assert report["savings_vs_default"] == pytest.approx(0.0)


@pytest.mark.integration
@pytest.mark.e2e
def test_live_run_ranks_everything_in_time(settings: Settings, worker: WorkerProcess) -> None:
    fleet = Fleet(seed=int(time.time()) % 100_000 + 1, attempts_per_day=5000, catalogue=CAT)
    with SchedulerClient(settings) as client:
        sim = SchedulerSimulator(client, fleet, CAT, rate=30, deadline_s=2.0, seed=2)
        report = sim.run(4.0)
    assert report["submissions"] >= 100
    assert report["coverage"] >= 0.99
    assert report["attempts_placed"] == report["submissions"]
    # every placement is on a candidate that fits the job
    assert all(p.chosen in p.attempt.candidates for p in sim.placements)
