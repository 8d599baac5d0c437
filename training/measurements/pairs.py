"""Configurations, (prior, target) pairs and the held-out folds of the two protocols."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from training.measurements.table import FloatArray, IntArray, Table

N_FOLDS = 5
PROTOCOLS = ("config_fold", "leave_one_workload_out")


def config_ids(t: Table) -> IntArray:
    """Configuration id of each row: (suite, workload, accelerators, batch, precision)."""
    keys = list(zip(t.suite, t.workload, t.num_accelerators, t.batch, t.precision, strict=True))
    index: dict[tuple[Any, ...], int] = {}
    return np.array([index.setdefault(k, len(index)) for k in keys], dtype=np.int64)


@dataclass(frozen=True)
class Pairs:
    """(prior, target) pairs: row ``row`` (on its hardware) predicted from ``prior`` on ``prior_hw``.

    ``prior`` is the median of the configuration's measurements on ``prior_hw`` (a job measured
    several times on one hardware type keeps a robust estimate, as the online store does);
    ``cfg`` is the configuration id of the target row (for grouped splits of pairs).
    """

    row: IntArray
    prior_hw: list[str]
    prior: FloatArray
    cfg: IntArray

    def __len__(self) -> int:
        return len(self.row)


def build_pairs(t: Table, cfg: IntArray) -> Pairs:
    """All (prior, target) pairs of a table; see :class:`Pairs`."""
    by_cfg_hw: dict[tuple[int, str], list[float]] = {}
    for i, (c, h) in enumerate(zip(cfg.tolist(), t.hardware, strict=True)):
        by_cfg_hw.setdefault((c, h), []).append(float(t.throughput[i]))
    hw_of_cfg: dict[int, list[str]] = {}
    for c, h in sorted(by_cfg_hw):
        hw_of_cfg.setdefault(c, []).append(h)
    rows: list[int] = []
    prior_hw: list[str] = []
    prior: list[float] = []
    for i, (c, h) in enumerate(zip(cfg.tolist(), t.hardware, strict=True)):
        for a in hw_of_cfg[c]:
            if a != h:
                rows.append(i)
                prior_hw.append(a)
                prior.append(float(np.median(by_cfg_hw[(c, a)])))
    row = np.array(rows, dtype=np.int64)
    return Pairs(row, prior_hw, np.array(prior, dtype=np.float64), cfg[row])


def folds(t: Table, cfg: IntArray, protocol: str, seed: int = 0) -> Iterator[npt.NDArray[np.bool_]]:
    """Yield the test-row mask of each fold; every other row is training data.

    Parameters
    ----------
    t, cfg
        The table and its configuration ids.
    protocol
        ``config_fold`` (configurations in :data:`N_FOLDS` seeded folds) or
        ``leave_one_workload_out`` (one fold per workload name, across suites).
    seed
        Seed of the configuration shuffle.
    """
    if protocol == "config_fold":
        n_cfg = int(cfg.max()) + 1
        fold_of_cfg = np.empty(n_cfg, dtype=np.int64)
        fold_of_cfg[np.random.default_rng(seed).permutation(n_cfg)] = np.arange(n_cfg) % N_FOLDS
        fold = fold_of_cfg[cfg]
        for k in range(min(N_FOLDS, n_cfg)):
            yield fold == k
    elif protocol == "leave_one_workload_out":
        wl = np.array(t.workload, dtype=object)
        for w in sorted(set(t.workload)):
            yield wl == w
    else:
        raise ValueError(f"unknown protocol {protocol!r}; one of {PROTOCOLS}")
