"""Jobs: configurations, candidates, the team's preferred hardware, the job's own effects, the oracle.

A *job* is a training run that persists across attempts (same ``job_key``): model type, input
size, batch, precision, parallelism and framework; a team; a persistent factor (input
pipeline, code quality: what any prior throughput of the job reveals); a job-by-hardware factor
per part (:mod:`leap.fleet.effects`: revealed only on the parts the job ran on); for some jobs an
input-pipeline cap in samples/s. A job may change its configuration once between attempts
(:mod:`leap.fleet.changes`): each of its possible changes is a *variant row* of :class:`Jobs` that
shares the job's factors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from leap.fleet.arrays import F, HardwareArrays, I, JobConfig, hardware_arrays, model_arrays
from leap.fleet.changes import KINDS, MAX_ACCELERATORS, variant_configs
from leap.fleet.effects import job_hardware_factor, model_architecture_effect
from leap.fleet.teams import Teams, assign_teams, preferences
from leap.fleet.throughput import eligibility, expected_throughput
from leap.fleet.workloads import FAMILIES, model_types

JOB_FACTOR_SIGMA = 0.3
INPUT_BOUND_SHARE = 0.15

# Precision mix per family (order of streams.events.PRECISIONS: fp32, tf32, bf16, fp16, fp8).
_PRECISION_MIX = {
    "dense_lm": (0.02, 0.02, 0.76, 0.10, 0.10),
    "moe": (0.0, 0.02, 0.80, 0.05, 0.13),
    "vision_cnn": (0.15, 0.15, 0.35, 0.35, 0.0),
    "vision_vit": (0.05, 0.10, 0.60, 0.25, 0.0),
    "diffusion": (0.05, 0.05, 0.70, 0.20, 0.0),
    "recsys": (0.45, 0.15, 0.20, 0.20, 0.0),
    "speech": (0.15, 0.15, 0.40, 0.30, 0.0),
    "gnn": (0.60, 0.20, 0.15, 0.05, 0.0),
}
# Framework mix per family (order of leap.fleet.arrays.FRAMEWORKS).
_FRAMEWORK_MIX = {
    "dense_lm": (0.58, 0.28, 0.02, 0.06, 0.06),
    "moe": (0.55, 0.35, 0.0, 0.05, 0.05),
    "vision_cnn": (0.70, 0.12, 0.15, 0.02, 0.01),
    "vision_vit": (0.62, 0.28, 0.06, 0.03, 0.01),
    "diffusion": (0.75, 0.20, 0.0, 0.03, 0.02),
    "recsys": (0.60, 0.10, 0.28, 0.01, 0.01),
    "speech": (0.75, 0.12, 0.10, 0.02, 0.01),
    "gnn": (0.85, 0.10, 0.05, 0.0, 0.0),
}
# Typical log2(accelerators) per family before size adjustments.
_SCALE_CENTER = {
    "dense_lm": 0.0,
    "moe": 1.0,
    "vision_cnn": 1.0,
    "vision_vit": 1.5,
    "diffusion": 2.5,
    "recsys": 1.5,
    "speech": 1.5,
    "gnn": 0.5,
}


@dataclass(frozen=True)
class Jobs:
    """A batch of jobs (struct of arrays) with their variant rows.

    Rows ``0 .. jobs-1`` are the jobs as first submitted; ``variants[j, k]`` is the row of job
    ``j`` after a change of kind ``KINDS[k]`` (``j`` itself where that change is impossible).
    Every per-row attribute of a variant row is the job's, except what its configuration
    decides (candidates, preferences, law, oracle).

    Attributes
    ----------
    cfg
        Training configuration per row.
    job
        The job (base row) of each row.
    team
        The job's team.
    eligible
        (rows x hardware) candidate mask.
    preference
        (rows x :data:`leap.fleet.teams.PREFERENCES`) the team's first eligible parts; column 0 is
        what the user requests (default routing).
    factor
        Persistent per-job factor (lognormal, sigma :data:`JOB_FACTOR_SIGMA`).
    job_hardware
        (rows x hardware) the job's own factor on each part (:func:`leap.fleet.effects.job_hardware_factor`).
    law
        (rows x hardware) noise-free samples/s of the law times the model type's effect on the
        part's architecture: everything but the job's own effects and its cap.
    cap
        Input-pipeline cap in samples/s (inf when the job is not input-bound).
    oracle
        (rows x hardware) ``min(law x factor x job_hardware, cap)``; NaN where not eligible.
    work
        Samples the job processes per attempt when it runs to completion.
    planned_attempts
        Attempts the owner intends to submit (resubmissions; retries come on top).
    variants
        (jobs x len(KINDS)) row of each kind of change.
    """

    cfg: JobConfig
    job: I
    team: I
    eligible: NDArray[np.bool_]
    preference: I
    factor: F
    job_hardware: F
    law: F
    cap: F
    oracle: F
    work: F
    planned_attempts: I
    variants: I

    def __len__(self) -> int:
        return len(self.factor)

    @property
    def jobs(self) -> int:
        """Number of jobs (base rows)."""
        return len(self.variants)

    @property
    def requested(self) -> I:
        """The part each row's user asks for: the team's first eligible choice."""
        return np.asarray(self.preference[:, 0], dtype=np.int64)


def _pick_padded(rng: np.random.Generator, choices: list[tuple[int, ...]], idx: I) -> F:
    width = max(len(c) for c in choices)
    table = np.array([list(c) + [c[-1]] * (width - len(c)) for c in choices], dtype=np.float64)
    counts = np.array([len(c) for c in choices])
    pos = np.floor(rng.random(len(idx)) * counts[idx]).astype(np.int64)
    return np.asarray(table[idx, pos], dtype=np.float64)


def _mix(rng: np.random.Generator, fam: I, mixes: Mapping[str, tuple[float, ...]]) -> I:
    probs = np.array([mixes[f] for f in FAMILIES])
    probs = probs / probs.sum(axis=1, keepdims=True)
    cum = np.cumsum(probs, axis=1)[fam]
    return np.asarray(
        (rng.random(len(fam))[:, None] > cum).sum(axis=1).clip(0, probs.shape[1] - 1), dtype=np.int64
    )


def sample_configs(rng: np.random.Generator, n: int) -> JobConfig:
    """Draw ``n`` job configurations (not yet checked for eligibility)."""
    ms = model_types()
    m = model_arrays()
    pop = m.popularity / m.popularity.sum()
    model = rng.choice(len(ms), size=n, p=pop)
    fam = m.family[model]
    seq = _pick_padded(rng, [mt.seq_choices for mt in ms], model)
    local = _pick_padded(rng, [mt.local_batches for mt in ms], model)
    precision = _mix(rng, fam, _PRECISION_MIX)
    framework = _mix(rng, fam, _FRAMEWORK_MIX)

    is_lm = (fam == FAMILIES.index("dense_lm")) | (fam == FAMILIES.index("moe"))
    # Model parallelism: smallest power of two that brings 16-bit weights+grads+sharded optimizer
    # (~6 B/param) under ~40 GB, sometimes doubled (users over-shard for speed or headroom).
    sharded = m.dense[model] + m.expert[model] / np.minimum(m.experts[model], 8.0)
    mp = 2.0 ** np.ceil(np.log2(np.maximum(1.0, sharded * 6.0 / 40e9)))
    mp = np.where(rng.random(n) < 0.3, mp * 2, mp)
    mp = np.where(is_lm, np.minimum(mp, 64.0), 1.0)
    tp = np.minimum(mp, 8.0)
    pp = mp / tp

    center = np.array([_SCALE_CENTER[f] for f in FAMILIES])[fam]
    center = center + np.where(is_lm, 0.8 * np.log2(np.maximum(m.active[model], 1e8) / 1e8), 0.0)
    emb_need = m.emb[model] * 5.0 / 40e9  # accelerators needed to hold the tables
    center = np.maximum(center, np.log2(np.maximum(emb_need, 1.0)) + 1.0)
    k = np.rint(center + rng.normal(0.0, 1.2, n))
    max_k = np.floor(np.log2(MAX_ACCELERATORS / mp))
    dp = 2.0 ** np.clip(k - np.log2(mp), 0.0, max_k)
    dp = np.where(is_lm, dp, 2.0 ** np.clip(k, 0.0, np.log2(MAX_ACCELERATORS)))
    return JobConfig(
        model=model.astype(np.int64),
        batch=local * dp,
        seq=seq,
        precision=precision,
        n=dp * tp * pp,
        dp=dp,
        tp=tp,
        pp=pp,
        framework=framework,
    )


def sample_jobs(rng: np.random.Generator, n: int, teams: Teams, hw: HardwareArrays | None = None) -> Jobs:
    """Draw ``n`` jobs that have at least one candidate, with their variants and oracle.

    Parameters
    ----------
    rng
        Source of randomness (the result is a pure function of its state).
    n
        Number of jobs.
    teams
        The fleet's teams (:func:`leap.fleet.teams.sample_teams`).
    hw
        Hardware arrays; default catalogue when None.

    Returns
    -------
    Jobs
    """
    hw = hw or hardware_arrays()
    parts: list[JobConfig] = []
    have = 0
    while have < n:
        cfg = sample_configs(rng, int((n - have) * 1.3) + 16)
        ok = eligibility(cfg, hw).any(axis=1)
        cfg = cfg.subset(np.flatnonzero(ok)[: n - have])
        parts.append(cfg)
        have += len(cfg)
    return complete_jobs(rng, JobConfig.concat(parts), teams, hw)


def _with_variants(rng: np.random.Generator, cfg: JobConfig, hw: HardwareArrays) -> tuple[JobConfig, I, I]:
    """Base configurations followed by their feasible variants; the job of each row; variant rows."""
    n = len(cfg)
    rows, job = [cfg], [np.arange(n)]
    variants = np.tile(np.arange(n)[:, None], (1, len(KINDS)))
    for k, alt in enumerate(variant_configs(rng, cfg)):
        ok = np.flatnonzero(eligibility(alt, hw).any(axis=1) & (alt.n <= MAX_ACCELERATORS))
        variants[ok, k] = sum(len(r) for r in rows) + np.arange(len(ok))
        rows.append(alt.subset(ok))
        job.append(ok)
    return JobConfig.concat(rows), np.concatenate(job).astype(np.int64), variants.astype(np.int64)


def complete_jobs(
    rng: np.random.Generator, cfg: JobConfig, teams: Teams, hw: HardwareArrays | None = None,
    factor: F | None = None,
) -> Jobs:
    """Add variants, teams, preferences, the job's effects, caps, the oracle and work to configurations."""
    hw = hw or hardware_arrays()
    n = len(cfg)
    all_cfg, job, variants = _with_variants(rng, cfg, hw)
    team = assign_teams(rng, teams, model_arrays().family[cfg.model])
    eligible = eligibility(all_cfg, hw)
    preference = preferences(teams.order[team[job]], eligible, hw.memory)
    if factor is None:
        factor = np.exp(rng.normal(0.0, JOB_FACTOR_SIGMA, n)).clip(0.3, 2.5)
    job_hw = job_hardware_factor(rng, n)[job]
    law = expected_throughput(all_cfg, hw) * model_architecture_effect()[all_cfg.model]
    base = law[:n] * factor[:, None] * job_hw[:n]
    on_req = base[np.arange(n), preference[:n, 0]]
    # the input pipeline scales with the accelerators (one loader per accelerator)
    cap = np.where(rng.random(n) < INPUT_BOUND_SHARE, on_req * rng.uniform(0.6, 1.5, n), np.inf)
    cap = cap[job] * all_cfg.n / cfg.n[job]
    oracle = np.where(eligible, np.minimum(law * factor[job, None] * job_hw, cap[:, None]), np.nan)
    hours = np.exp(rng.normal(np.log(3.0), 1.0, n)).clip(0.1, 72.0)
    work = oracle[np.arange(n), preference[:n, 0]] * hours * 3600.0
    planned = rng.geometric(0.22, n).astype(np.int64)
    return Jobs(
        cfg=all_cfg, job=job, team=team[job], eligible=eligible, preference=preference,
        factor=factor[job], job_hardware=job_hw, law=law, cap=cap, oracle=oracle,
        work=work[job], planned_attempts=planned[job], variants=variants,
    )
