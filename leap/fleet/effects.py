"""What makes a job's speed differ from the law: model-type-by-architecture effects and
job-by-hardware factors, with sizes taken from the public tables.

Both are lognormal and independent of everything the submission says:

* **model type x architecture** (:func:`model_architecture_effect`): kernels of a model type
  that happen to suit an architecture's libraries and compiler, or not. Fixed for the
  simulator (drawn once, from a seed of its own), shared by every job of the model type on
  every part of the architecture; part of the law, which the backtest's ceiling knows from the
  first finish of a job of the model type on the architecture.
* **job x hardware** (:func:`job_hardware_factor`): the job's own code on each part: its input
  pipeline, custom kernels, memory pressure. Drawn per job; a job's history reveals it only on
  the hardware it ran on.

Sizes, from the spread of measured cross-hardware log ratios within one hardware pair across
the groups (workloads and their configurations) that measured it
(:func:`leap.fleet.calibrate.derive_effect_sizes` reproduces them; ``leap fleet calibrate`` prints
the resulting dispersion check):

* ``s_job`` = :data:`JOB_HARDWARE_SIGMA`: on a pair of parts of one architecture the
  model-type effect cancels, so the measured variance of log ratios beyond the law's is
  ``2 s_job^2`` (A100 40/80 GB, H100 PCIe/SXM, H100/H200 in Lambda and MLPerf: 0.08);
* ``s_a`` = :data:`ARCH_SIGMA`: small on the architectures every framework tunes for (NVIDIA
  from Volta on: matches Lambda's and MLPerf's spread), large on the others, whose libraries
  cover model types unevenly: legacy parts without tensor cores (Gavel's K80 and P100 spread
  ratios by 0.5 in log across workloads where the law predicts 0.1: matches Gavel's spread)
  and, by assumption, other vendors' stacks (MLPerf's one MI300X BERT submission ran 20x slower
  than the law says, its Llama LoRA as expected).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

from leap.fleet.arrays import F, I, hardware_arrays
from leap.fleet.workloads import model_types

#: sd of the log job-by-hardware factor.
JOB_HARDWARE_SIGMA = 0.08
#: Architectures whose libraries every framework tunes for every model type.
TUNED_ARCHITECTURES = ("volta", "turing", "ampere", "ada", "hopper", "blackwell")
#: sd of the log model-type-by-architecture effect: tuned architectures, the others.
ARCH_SIGMA = {"tuned": 0.08, "other": 0.55}
_SEED = 7_000_001


def architecture_sigma(architectures: tuple[str, ...], sizes: dict[str, float] | None = None) -> F:
    """sd of the model-type effect on each architecture (``sizes``: override :data:`ARCH_SIGMA`)."""
    sigma = {**ARCH_SIGMA, **(sizes or {})}
    return np.array([sigma["tuned" if a in TUNED_ARCHITECTURES else "other"] for a in architectures])


@lru_cache(maxsize=1)
def model_architecture_effect() -> F:
    """(model types x hardware) multiplier: the model type's effect on each part's architecture."""
    hw = hardware_arrays()
    rng = np.random.default_rng(_SEED)
    sigma = architecture_sigma(hw.architectures)
    per_arch = rng.normal(0.0, 1.0, size=(len(model_types()), len(hw.architectures))) * sigma[None, :]
    return np.asarray(np.exp(per_arch[:, hw.arch]), dtype=np.float64)


def job_hardware_factor(rng: np.random.Generator, jobs: int) -> F:
    """(jobs x hardware) multiplier: each job's own code on each part."""
    return np.exp(rng.normal(0.0, JOB_HARDWARE_SIGMA, size=(jobs, len(hardware_arrays().names))))


def effect_draws(rng: np.random.Generator, draws: int, model: I, job: I, hardware: I,
                 sizes: dict[str, float] | None = None) -> NDArray[np.float64]:
    """(draws x points) log effects of points (a model type, a job and a part each), redrawn each time.

    Used by the calibration's dispersion check: the measured tables are one draw of these effects
    around the law; the model types' effects are redrawn too, as the public workloads are a
    sample of model types. ``sizes`` overrides the module's sizes (keys ``job_hardware``,
    ``tuned``, ``other``).
    """
    hw = hardware_arrays()
    sigma = architecture_sigma(hw.architectures, sizes)[hw.arch[hardware]]
    job_sigma = (sizes or {}).get("job_hardware", JOB_HARDWARE_SIGMA)
    arch = hw.arch[hardware]
    n_models, n_jobs = int(model.max()) + 1, int(job.max()) + 1
    model_arch = rng.normal(size=(draws, n_models, len(hw.architectures)))[:, model, arch] * sigma[None, :]
    job_hw = rng.normal(0.0, job_sigma, size=(draws, n_jobs, len(hw.names)))[:, job, hardware]
    return np.asarray(model_arch + job_hw, dtype=np.float64)
