"""Fleet simulator: job-by-hardware effects, changing configurations, routing, and the law's shape."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from features.snapshot import FeatureSnapshot, LookupStat
from leap.core.hardware import load_catalogue
from leap.fleet.arrays import JobConfig, hardware_arrays, model_arrays
from leap.fleet.changes import CHANGE_KIND, KINDS, P_CHANGE, change_kind
from leap.fleet.effects import ARCH_SIGMA, JOB_HARDWARE_SIGMA, TUNED_ARCHITECTURES, model_architecture_effect
from leap.fleet.engine import P_DEFAULT_ROUTE, Attempt, Fleet
from leap.fleet.history import History, simulate, write_history
from leap.fleet.jobs import sample_jobs
from leap.fleet.scheduler import default_hardware, lookup_choice
from leap.fleet.teams import USUAL_PARTS, sample_teams
from leap.fleet.throughput import expected_throughput, memory_plan, soft_max
from leap.fleet.workloads import model_index
from streams.events import PRECISIONS

CAT = load_catalogue()


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, History]:
    h = simulate(seed=21, days=6, attempts_per_day=2500)
    out = tmp_path_factory.mktemp("hist")
    write_history(h, out)
    return out, h


# ----------------------------------------------------------------------------- effects


def test_model_type_effect_is_shared_by_an_architecture_and_sized_by_its_tier() -> None:
    hw = hardware_arrays()
    effect = np.log(model_architecture_effect())
    names = list(hw.names)
    assert np.array_equal(effect[:, names.index("H100-SXM")], effect[:, names.index("H200")])  # both hopper
    for h, name in enumerate(names):
        arch = hw.architectures[hw.arch[h]]
        sigma = ARCH_SIGMA["tuned" if arch in TUNED_ARCHITECTURES else "other"]
        assert effect[:, h].std() == pytest.approx(sigma, rel=0.15), name


def test_job_effects_are_the_jobs_own_and_make_the_oracle() -> None:
    rng = np.random.default_rng(3)
    hw = hardware_arrays()
    jobs = sample_jobs(rng, 4000, sample_teams(rng, hw))
    base = np.arange(jobs.jobs)
    assert np.log(jobs.job_hardware[base]).std() == pytest.approx(JOB_HARDWARE_SIGMA, rel=0.05)
    # a variant row is the same job: same factors, its own configuration
    rows = np.flatnonzero(jobs.job != np.arange(len(jobs)))
    assert len(rows) > jobs.jobs  # most jobs can change in several ways
    assert np.array_equal(jobs.job_hardware[rows], jobs.job_hardware[jobs.job[rows]])
    assert np.array_equal(jobs.factor[rows], jobs.factor[jobs.job[rows]])
    expected = np.minimum(jobs.law * jobs.factor[:, None] * jobs.job_hardware, jobs.cap[:, None])
    assert np.allclose(jobs.oracle[jobs.eligible], expected[jobs.eligible])
    # the law includes the model type's effect on the architecture
    plain = expected_throughput(jobs.cfg, hw)
    assert np.allclose(jobs.law, plain * model_architecture_effect()[jobs.cfg.model])


# ----------------------------------------------------------------------------- changes


def test_change_rates_and_kinds() -> None:
    u = np.random.default_rng(0).random((100_000, 2))
    for outcome, rate in P_CHANGE.items():
        kinds = [change_kind(outcome, a, b) for a, b in u]
        changed = [k for k in kinds if k is not None]
        assert len(changed) / len(kinds) == pytest.approx(rate, abs=0.005)
        share = np.bincount(changed, minlength=len(KINDS)) / len(changed)
        assert share == pytest.approx(CHANGE_KIND[outcome], abs=0.01)


def test_changed_attempts_show_their_own_configuration(history: tuple[Path, History]) -> None:
    out, h = history
    changed = h.jobs.job[h.row] != h.row
    assert 0.08 < changed.mean() < 0.25, changed.mean()
    subs = pq.read_table(out / "submissions").to_pylist()
    first = {s["job_key"]: s for s in sorted(subs, key=lambda s: s["event_time"]) if s["attempt_id"].endswith("-a0")}
    kinds = set()
    for s in subs:
        f = first.get(s["job_key"])
        if f is None or s is f:
            continue
        diff = {k for k in ("global_batch_size", "num_accelerators", "precision", "data_parallel") if s[k] != f[k]}
        if diff:
            kinds.add(frozenset(diff))
            assert diff in ({"global_batch_size"}, {"precision"},
                            {"global_batch_size", "num_accelerators", "data_parallel"})
    assert len(kinds) == 3  # every kind of change happens
    finishes = pq.read_table(out / "finishes").to_pylist()
    by_attempt = {s["attempt_id"]: s for s in subs}
    for fin in finishes:
        sub = by_attempt[fin["attempt_id"]]
        assert (fin["global_batch_size"], fin["precision"], fin["num_accelerators"]) == (
            sub["global_batch_size"], sub["precision"], sub["num_accelerators"])
        assert fin["hardware"] in sub["candidates"]


def test_generator_changes_configurations_too() -> None:
    fleet = Fleet(seed=4, attempts_per_day=20000)
    attempts = fleet.sample_attempts(6000, start_time=1.75e9)
    seen: dict[str, tuple[int, int, str | None]] = {}
    changed = 0
    for a in attempts:
        s = a.submission
        cfg = (s.global_batch_size, s.num_accelerators, s.precision)
        changed += seen.setdefault(s.job_key, cfg) != cfg
        assert set(a.oracle) == set(a.candidates)
    assert changed > 50


# ----------------------------------------------------------------------------- routing


def test_requests_follow_the_team_and_placements_its_availability(history: tuple[Path, History]) -> None:
    _, h = history
    jobs = h.jobs
    fam = model_arrays().family
    assert jobs.preference.shape[1] == 4
    assert jobs.eligible[np.arange(len(jobs)), jobs.requested].all()
    on_requested = h.hardware == jobs.requested[h.row]
    assert on_requested.mean() == pytest.approx(P_DEFAULT_ROUTE, abs=0.05)
    assert all(hw in jobs.preference[r] for hw, r in zip(h.hardware, h.row, strict=True))
    # a job's team works on the job's family
    rng = np.random.default_rng(8)
    teams = sample_teams(rng, hardware_arrays())
    sample = sample_jobs(rng, 2000, teams)
    assert (teams.family[sample.team] == fam[sample.cfg.model]).all()
    # the request: of the team's usual parts that run the job the one with least memory, else
    # the first part in the team's order that runs it
    memory = hardware_arrays().memory
    for r in range(300):
        order = teams.order[sample.team[r]]
        usual = [h for h in order[:USUAL_PARTS] if sample.eligible[r, h]]
        first = min(usual, key=lambda h: memory[h]) if usual else next(h for h in order if sample.eligible[r, h])
        assert memory[sample.requested[r]] == memory[first]


def test_default_routing_uses_the_next_choice_when_busy() -> None:
    attempts = Fleet(seed=6).sample_attempts(3000, start_time=1.75e9)
    usual = np.mean([a.default_hardware == a.submission.requested_hardware for a in attempts])
    assert usual == pytest.approx(P_DEFAULT_ROUTE, abs=0.04)
    assert all(default_hardware(a) in a.candidates for a in attempts)


def test_lookup_routing_moves_only_between_parts_it_knows() -> None:
    a = next(x for x in Fleet(seed=2).sample_attempts(500, start_time=1.75e9) if len(x.candidates) >= 4)
    default = default_hardware(a)
    other = next(h for h in a.candidates if h != default)
    assert lookup_choice(a, FeatureSnapshot(), CAT) == default  # nothing known: stays
    fast = {other: LookupStat(5, 1e6)}
    assert lookup_choice(a, FeatureSnapshot(lookup_model=fast), CAT) == default  # nothing known of the default
    both = {**fast, default: LookupStat(5, 1e-3)}
    assert lookup_choice(a, FeatureSnapshot(lookup_model=both), CAT) == other
    assert lookup_choice(a, FeatureSnapshot(lookup_model={**both, default: LookupStat(5, 1e9)}), CAT) == default


def test_attempt_default_is_optional_for_callers() -> None:
    a = Fleet(seed=1).sample_attempts(1, start_time=1.75e9)[0]
    bare = Attempt(a.submission, a.oracle, a.job_factor, a.work_samples)
    assert default_hardware(bare) == a.submission.requested_hardware


# ----------------------------------------------------------------------------- the law's shape


def _config(model: str, batch: np.ndarray, seq: np.ndarray) -> JobConfig:
    k = len(batch)
    return JobConfig(
        model=np.full(k, model_index()[model], dtype=np.int64), batch=batch.astype(float), seq=seq.astype(float),
        precision=np.full(k, PRECISIONS.index("bf16"), dtype=np.int64), n=np.ones(k), dp=np.ones(k),
        tp=np.ones(k), pp=np.ones(k), framework=np.zeros(k, dtype=np.int64),
    )


def test_memory_cliff_recomputation_when_activations_do_not_fit() -> None:
    hw = hardware_arrays()
    small, large = hw.names.index("A100-40GB"), hw.names.index("A100-80GB")  # one chip, 40 or 80 GB
    seq = np.array([2048.0, 4096.0, 8192.0])
    cfg = _config("llama-2b", np.full(3, 4.0), seq)
    plan = memory_plan(cfg, hw)
    assert plan.recompute[:, small].tolist() == [False, False, True]  # long sequences no longer fit
    assert not plan.recompute[:, large].any()
    assert plan.micro[0, small] > plan.micro[1, small]  # before that: gradient accumulation
    tput = expected_throughput(cfg, hw)
    ratio = tput[:, large] / tput[:, small]
    # the extra bandwidth of the 80 GB part is worth ~15 %; recomputation on the 40 GB one ~50 %
    assert ratio[1] < 1.25 and ratio[2] > 1.35


def test_big_parts_need_big_batches() -> None:
    hw = hardware_arrays()
    cfg = _config("resnet50", np.array([4.0, 256.0]), np.array([224.0, 224.0]))
    tput = expected_throughput(cfg, hw)
    b200, t4 = hw.names.index("B200"), hw.names.index("T4")
    small, large = tput[0, b200] / tput[0, t4], tput[1, b200] / tput[1, t4]
    assert large > 1.3 * small


def test_soft_max_lies_between_the_sum_and_the_maximum() -> None:
    a, b = np.array([1.0, 3.0]), np.array([2.0, 0.0])
    assert soft_max(a, b, 1.0) == pytest.approx(a + b)
    assert soft_max(a, b, 60.0) == pytest.approx(np.maximum(a, b), rel=0.02)
    mid = soft_max(a, b, 2.0)
    assert (mid <= a + b).all() and (mid >= np.maximum(a, b)).all() and mid[0] < a[0] + b[0]
    assert mid[0] == pytest.approx(math.sqrt(5.0))
