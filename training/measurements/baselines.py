"""The two baselines LightGBM is measured against: ``lookup`` and ``transfer``."""

from __future__ import annotations

import numpy as np

from training.measurements.pairs import Pairs
from training.measurements.table import FloatArray, IntArray, Table


def _group(t: Table, i: int) -> tuple[str, str]:
    # Baseline statistics are per (suite, workload): a workload measured with another software
    # stack is a different population.
    return (t.suite[i], t.workload[i])


def predict_lookup(t: Table, pairs: Pairs, train_rows: IntArray, test: IntArray) -> FloatArray:
    """Median throughput of the workload on the target hardware, else the global median there.

    NaN (a miss) when the target hardware has no training row at all.
    """
    by_wh: dict[tuple[tuple[str, str], str], list[float]] = {}
    by_h: dict[str, list[float]] = {}
    for i in train_rows.tolist():
        by_wh.setdefault((_group(t, i), t.hardware[i]), []).append(float(t.throughput[i]))
        by_h.setdefault(t.hardware[i], []).append(float(t.throughput[i]))
    out = np.full(len(test), np.nan)
    for j, p in enumerate(test.tolist()):
        i = int(pairs.row[p])
        vals = by_wh.get((_group(t, i), t.hardware[i])) or by_h.get(t.hardware[i])
        if vals:
            out[j] = float(np.median(vals))
    return out


def transfer_ratios(t: Table, pairs: Pairs, train: IntArray, test: IntArray) -> tuple[FloatArray, FloatArray]:
    """Median training ratio target/prior for each test pair's (prior hw, target hw).

    Returns
    -------
    (within_workload, global)
        Median ratio over training pairs of the same (suite, workload) and hardware pair, and
        over all training pairs of that hardware pair; NaN where no training pair exists.
    """
    by_wah: dict[tuple[tuple[str, str], str, str], list[float]] = {}
    by_ah: dict[tuple[str, str], list[float]] = {}
    for p in train.tolist():
        i = int(pairs.row[p])
        r = float(t.throughput[i] / pairs.prior[p])
        by_wah.setdefault((_group(t, i), pairs.prior_hw[p], t.hardware[i]), []).append(r)
        by_ah.setdefault((pairs.prior_hw[p], t.hardware[i]), []).append(r)
    within = np.full(len(test), np.nan)
    glob = np.full(len(test), np.nan)
    for j, p in enumerate(test.tolist()):
        i = int(pairs.row[p])
        key = (pairs.prior_hw[p], t.hardware[i])
        if (w := by_wah.get((_group(t, i), *key))) is not None:
            within[j] = float(np.median(w))
        if (g := by_ah.get(key)) is not None:
            glob[j] = float(np.median(g))
    return within, glob


def predict_transfer(t: Table, pairs: Pairs, train: IntArray, test: IntArray) -> FloatArray:
    """Prior x median training ratio h/a: within the workload, else global, else 1."""
    within, glob = transfer_ratios(t, pairs, train, test)
    ratio = np.where(np.isfinite(within), within, np.where(np.isfinite(glob), glob, 1.0))
    return np.asarray(pairs.prior[test] * ratio, dtype=np.float64)
