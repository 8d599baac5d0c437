"""Fleet simulator: determinism, eligibility, history volume and recurrence (calibration: test_fleet_calibration.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from leap.fleet.arrays import hardware_arrays
from leap.fleet.cli import app
from leap.fleet.engine import Fleet
from leap.fleet.history import History, simulate, write_history
from leap.fleet.jobs import sample_jobs
from leap.fleet.teams import sample_teams
from leap.fleet.throughput import MEMORY_USABLE, memory_needed
from leap.fleet.workloads import FAMILIES, model_types
from streams.events import JobFinish, JobStart, Submission


@pytest.fixture(scope="module")
def small_history(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, History]:
    h = simulate(seed=11, days=7, attempts_per_day=3000)
    out = tmp_path_factory.mktemp("hist")
    write_history(h, out)
    return out, h


def test_describe_counts() -> None:
    result = CliRunner().invoke(app, ["describe", "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["hardware_types"] >= 22
    assert info["model_types"] >= 300
    assert set(info["families"]) == set(FAMILIES)
    assert all(n >= 20 for n in info["model_types_per_family"].values())
    sizes = [m.params for m in model_types() if m.family == "dense_lm"]
    assert min(sizes) <= 1e8 and max(sizes) >= 7e10


def test_history_is_deterministic_under_a_seed() -> None:
    a, b, c = simulate(3, 2, 1500), simulate(3, 2, 1500), simulate(4, 2, 1500)
    for field in ("job", "hardware", "submit", "finish_time", "outcome"):
        assert np.array_equal(getattr(a, field), getattr(b, field))
    assert np.array_equal(a.throughput, b.throughput, equal_nan=True)
    assert not np.array_equal(a.hardware, c.hardware)


def test_generator_is_deterministic_and_continues() -> None:
    f1, f2 = Fleet(seed=9, attempts_per_day=5000), Fleet(seed=9, attempts_per_day=5000)
    a1 = f1.sample_attempts(300, start_time=1.75e9)
    a2 = f2.sample_attempts(300, start_time=1.75e9)
    assert [x.submission for x in a1] == [x.submission for x in a2]
    assert [x.oracle for x in a1] == [x.oracle for x in a2]
    more = f1.sample_attempts(300)
    assert more[0].submission.event_time >= a1[-1].submission.event_time
    keys = [x.submission.job_key for x in a1 + more]
    assert len(set(keys)) < len(keys)  # jobs recur
    r1 = f1.run(a1[0], a1[0].candidates[0], np.random.default_rng(1))
    r2 = f2.run(a2[0], a2[0].candidates[0], np.random.default_rng(1))
    assert r1 == r2
    JobFinish.from_dict(r1.finish.to_dict())
    JobStart.from_dict(r1.start.to_dict())


def test_eligibility_no_job_where_it_cannot_fit() -> None:
    hw = hardware_arrays()
    rng = np.random.default_rng(5)
    jobs = sample_jobs(rng, 5000, sample_teams(rng, hw))
    need = memory_needed(jobs.cfg)
    assert jobs.eligible.any(axis=1).all()
    fits = need[:, None] <= MEMORY_USABLE * hw.memory[None, :]
    assert not (jobs.eligible & ~fits).any()
    assert not (jobs.eligible & ~hw.supports[jobs.cfg.framework]).any()
    assert jobs.eligible[np.arange(len(jobs)), jobs.requested].all()
    assert np.isnan(jobs.oracle[~jobs.eligible]).all()
    assert (jobs.oracle[jobs.eligible] > 0).all()
    assert (jobs.cfg.dp * jobs.cfg.tp * jobs.cfg.pp == jobs.cfg.n).all()
    assert jobs.cfg.n.max() <= 512
    # big models really are excluded from small parts
    big = need > 80e9
    assert big.any() and not jobs.eligible[big][:, hw.names.index("T4")].any()


def test_placements_are_candidates(small_history: tuple[Path, History]) -> None:
    _, h = small_history
    assert h.jobs.eligible[h.row, h.hardware].all()
    fleet = Fleet(seed=1)
    attempt = fleet.sample_attempts(1, start_time=1.75e9)[0]
    not_candidate = next(n for n in hardware_arrays().names if n not in attempt.candidates)
    with pytest.raises(ValueError):
        fleet.run(attempt, not_candidate, np.random.default_rng(0))


def test_history_layout_volume_and_recurrence(small_history: tuple[Path, History]) -> None:
    out, h = small_history
    subs = pq.read_table(out / "submissions")
    assert subs.num_rows == 7 * 3000
    days = sorted(p.name for p in (out / "submissions").iterdir())
    assert days[0] == "day=2025-01-01" and len(days) == 7
    assert (out / "submissions" / days[0] / "part-0.parquet").exists()
    for name, cls in (("submissions", Submission), ("starts", JobStart), ("finishes", JobFinish)):
        table = pq.read_table(out / name / days[2] / "part-0.parquet")
        assert table.column_names == [f.name for f in cls.FIELDS]
        for row in table.slice(0, 200).to_pylist():
            cls.from_dict(row)
    oracle = pq.read_table(out / "oracle")
    assert {"attempt_id", "hardware", "oracle_throughput", "job_factor"} <= set(oracle.column_names)
    assert {"law_throughput", "job_hardware_factor", "input_cap"} <= set(oracle.column_names)
    assert oracle.num_rows == sum(len(c) for c in subs.column("candidates").to_pylist())
    share = h.prior_share
    assert 0.6 <= share <= 0.8, share
    outcomes = pq.read_table(out / "finishes").column("outcome").to_pylist()
    assert 0.8 < outcomes.count("completed") / len(outcomes) < 0.95
    # daily rhythm: afternoons (UTC) are busier than nights
    hours = (np.asarray(subs.column("event_time").to_numpy()) % 86400) // 3600
    assert (hours == 14).sum() > 2 * (hours == 2).sum()


def test_history_speed(tmp_path: Path) -> None:
    began = time.perf_counter()
    h = simulate(seed=2, days=5, attempts_per_day=20000)
    write_history(h, tmp_path)
    elapsed = time.perf_counter() - began
    assert len(h) == 100_000
    assert elapsed < 60.0, f"{elapsed:.1f} s for 100,000 attempts"
