"""Configurations and the held-out folds of the two protocols."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from leap.training.measurements.table import IntArray, Table

N_FOLDS = 5
PROTOCOLS = ("config_fold", "leave_one_workload_out")


def _ids(keys: list[tuple[Any, ...]]) -> IntArray:
    index: dict[tuple[Any, ...], int] = {}
    return np.array([index.setdefault(k, len(index)) for k in keys], dtype=np.int64)


def job_ids(t: Table) -> IntArray:
    """Job id of each row: (suite, workload, accelerators, batch, precision).

    A suite (software release, MLPerf round) is part of the job: the same configuration measured
    under two releases is two jobs, each with its own history. Folds group by
    :func:`configuration_ids` instead.
    """
    return _ids(list(zip(t.suite, t.workload, t.num_accelerators, t.batch, t.precision, strict=True)))


def configuration_ids(t: Table) -> IntArray:
    """Configuration id of each row: (workload, accelerators, batch, precision), whatever the suite.

    What ``config_fold`` holds out together: were the suite part of it, the same configuration
    measured in two suites could sit in training and test at once, and the test would score a
    configuration the model was trained on.
    """
    return _ids(list(zip(t.workload, t.num_accelerators, t.batch, t.precision, strict=True)))


def folds(t: Table, protocol: str, seed: int = 0) -> Iterator[npt.NDArray[np.bool_]]:
    """Yield the test-row mask of each fold; every other row is training data.

    Parameters
    ----------
    t
        The table.
    protocol
        ``config_fold``: configurations (:func:`configuration_ids`, every suite of one together)
        in :data:`N_FOLDS` folds drawn by ``seed``. ``leave_one_workload_out``: one fold per
        workload name, across suites. These folds are **fixed**: they do not depend on
        ``seed``, so another seed reports the same folds (only the attempts' order and the
        models' seeds change); choices made on them must come from other tables, not other seeds.
    seed
        Seed of the configuration shuffle (``config_fold`` only).
    """
    if protocol == "config_fold":
        cfg = configuration_ids(t)
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
