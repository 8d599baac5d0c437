"""Configurations and the held-out folds of the two protocols."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from training.measurements.table import IntArray, Table

N_FOLDS = 5
PROTOCOLS = ("config_fold", "leave_one_workload_out")


def config_ids(t: Table) -> IntArray:
    """Configuration id of each row: (suite, workload, accelerators, batch, precision)."""
    keys = list(zip(t.suite, t.workload, t.num_accelerators, t.batch, t.precision, strict=True))
    index: dict[tuple[Any, ...], int] = {}
    return np.array([index.setdefault(k, len(index)) for k in keys], dtype=np.int64)


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
