"""Attempts whose configuration differs from the job's earlier ones.

A job keeps its configuration across attempts unless its owner changes it when resubmitting:

* after a **failure**, :data:`P_CHANGE["failed"]` of retries change something: the usual fix
  for running out of memory is a smaller batch (half of the changes), and otherwise more or
  fewer accelerators, or another precision (fp32 to bf16 for speed, 16-bit to fp32 when the
  loss diverges);
* after a **preemption**, :data:`P_CHANGE["preempted"]` of restarts resume elastically on the
  accelerators that are free: twice or half as many data-parallel replicas, each with its
  batch, so the global batch follows;
* after a **completed** attempt, :data:`P_CHANGE["completed"]` of resubmissions are
  hyper-parameter iterations that change the batch size.

No public trace gives these rates; they are the simulator's assumption, set so that a changed
configuration is a common but not a typical event (``leap fleet history`` prints the share of
attempts that run a changed configuration; docs/simulator.md gives it). A job changes at most once; the change is
drawn as the configuration of a *variant* row of the job (:func:`variant_configs`), which
keeps the job's own factors. The submission and the finish of a changed attempt carry its own
batch, precision and accelerator count, so a predictor sees the change.
"""

from __future__ import annotations

import numpy as np

from leap.fleet.arrays import JobConfig
from streams.events import PRECISIONS

#: Kinds of change, in the order of :func:`variant_configs`.
KINDS = ("batch", "accelerators", "precision")
#: Share of attempts that change configuration, by how the job's previous attempt ended.
P_CHANGE = {"completed": 0.05, "failed": 0.25, "preempted": 0.15}
#: What a change is, by how the previous attempt ended (probabilities over :data:`KINDS`).
CHANGE_KIND = {
    "completed": (1.0, 0.0, 0.0),
    "failed": (0.5, 0.25, 0.25),
    "preempted": (0.0, 1.0, 0.0),
}
MAX_ACCELERATORS = 512
# fp32 and tf32 move to bf16 (speed), bf16 to fp32 (numerics), fp16 and fp8 to bf16 (stability)
_NEW_PRECISION = {"fp32": "bf16", "tf32": "bf16", "bf16": "fp32", "fp16": "bf16", "fp8": "bf16"}


def change_kind(outcome: str, u_change: float, u_kind: float) -> int | None:
    """Index into :data:`KINDS` of the change before an attempt, None when nothing changes.

    ``outcome`` is how the job's previous attempt ended; ``u_change`` and ``u_kind`` are uniform.
    """
    if u_change >= P_CHANGE[outcome]:
        return None
    return int(np.searchsorted(np.cumsum(CHANGE_KIND[outcome]), u_kind, side="right"))


def variant_configs(rng: np.random.Generator, cfg: JobConfig) -> list[JobConfig]:
    """For each kind of :data:`KINDS`, the configuration each job would change to.

    Batch: the global batch doubles or halves (half when it can). Accelerators: data
    parallelism doubles or halves, each replica keeping its batch. Precision: see
    :data:`_NEW_PRECISION`. Where a change is impossible (one sample per replica, one replica,
    512 accelerators) the other direction is taken.
    """
    up = rng.random(len(cfg)) < 0.5
    per_replica = cfg.batch / cfg.dp
    halve_batch = ~up & (per_replica >= 2)
    batch = JobConfig(**{**_fields(cfg), "batch": np.where(halve_batch, cfg.batch / 2, cfg.batch * 2)})
    grow = (up | (cfg.dp < 2)) & (cfg.n * 2 <= MAX_ACCELERATORS)
    dp = np.where(grow, cfg.dp * 2, np.maximum(cfg.dp / 2, 1.0))
    accelerators = JobConfig(**{**_fields(cfg), "dp": dp, "n": dp * cfg.tp * cfg.pp, "batch": per_replica * dp})
    new_precision = np.array([PRECISIONS.index(_NEW_PRECISION[p]) for p in PRECISIONS], dtype=np.int64)
    precision = JobConfig(**{**_fields(cfg), "precision": new_precision[cfg.precision]})
    return [batch, accelerators, precision]


def _fields(cfg: JobConfig) -> dict[str, np.ndarray]:
    return {k: getattr(cfg, k) for k in JobConfig.__dataclass_fields__}
