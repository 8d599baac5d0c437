"""The one definition of LEAP's accuracy and ranking metrics.

Every report (evaluation on public measurements, nightly training, backtest, benchmarks) imports
these functions, so a number called ``acc@10`` means the same thing everywhere.

Conventions
-----------
- Relative error is ``|pred - actual| / actual``; ``actual`` must be positive (a measured
  throughput).
- A NaN (or infinite) prediction is a prediction that was not made. For ``acc@tol`` it counts as a
  miss, so a model cannot raise its accuracy by abstaining. ``mape`` is computed over the finite
  predictions only, and :func:`summary` reports how many were left out (``n_missing``) so the
  exclusion is visible.
- ``mape`` is a fraction (0.12 means 12 %), like the accuracies.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

ArrayLike = npt.ArrayLike
FloatArray = npt.NDArray[np.float64]


def _pair(pred: ArrayLike, actual: ArrayLike) -> tuple[FloatArray, FloatArray]:
    p = np.asarray(pred, dtype=np.float64).ravel()
    a = np.asarray(actual, dtype=np.float64).ravel()
    if p.shape != a.shape:
        raise ValueError(f"pred and actual differ in length: {p.size} != {a.size}")
    if not np.all(np.isfinite(a) & (a > 0)):
        raise ValueError("actual throughputs must be finite and positive")
    return p, a


def relative_errors(pred: ArrayLike, actual: ArrayLike) -> FloatArray:
    """Relative error of each prediction.

    Parameters
    ----------
    pred
        Predicted throughputs; NaN marks a missing prediction.
    actual
        Measured throughputs, positive.

    Returns
    -------
    numpy.ndarray
        ``|pred - actual| / actual``, NaN where the prediction is not finite.
    """
    p, a = _pair(pred, actual)
    err = np.abs(p - a) / a
    err[~np.isfinite(p)] = np.nan
    return err


def acc_at(pred: ArrayLike, actual: ArrayLike, tol: float) -> float:
    """Share of predictions within ``tol`` relative error of the measured throughput.

    Parameters
    ----------
    pred
        Predicted throughputs; NaN counts as a miss.
    actual
        Measured throughputs, positive.
    tol
        Relative tolerance, e.g. ``0.10`` for acc@10.

    Returns
    -------
    float
        ``mean(|pred - actual| / actual <= tol)`` over all rows; NaN for empty input.
    """
    err = relative_errors(pred, actual)
    if err.size == 0:
        return float("nan")
    # NaN <= tol is False: a missing prediction is a miss.
    with np.errstate(invalid="ignore"):
        return float(np.mean(err <= tol + 1e-12))


def mape(pred: ArrayLike, actual: ArrayLike) -> float:
    """Mean absolute percentage error, as a fraction, over finite predictions.

    Parameters
    ----------
    pred
        Predicted throughputs; non-finite values are excluded (see :func:`summary`, which reports
        how many).
    actual
        Measured throughputs, positive.

    Returns
    -------
    float
        ``mean(|pred - actual| / actual)``; NaN if no prediction is finite.
    """
    err = relative_errors(pred, actual)
    ok = np.isfinite(err)
    if not ok.any():
        return float("nan")
    return float(np.mean(err[ok]))


def summary(pred: ArrayLike, actual: ArrayLike) -> dict[str, Any]:
    """The standard accuracy block of every report.

    Parameters
    ----------
    pred
        Predicted throughputs; NaN marks a missing prediction.
    actual
        Measured throughputs, positive.

    Returns
    -------
    dict
        ``{"acc@10", "acc@20", "mape", "n", "n_missing"}``: ``n`` counts all predictions asked
        for, ``n_missing`` those that were NaN (misses for acc, excluded from mape).
    """
    p, a = _pair(pred, actual)
    return {
        "acc@10": acc_at(p, a, 0.10),
        "acc@20": acc_at(p, a, 0.20),
        "mape": mape(p, a),
        "n": int(a.size),
        "n_missing": int(np.sum(~np.isfinite(p))),
    }


def _per_dollar(tput: ArrayLike, price: ArrayLike | None) -> FloatArray:
    m = np.asarray(tput, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError("expected a (jobs x hardware) matrix")
    if price is None:
        return m
    pr = np.asarray(price, dtype=np.float64)
    if np.any(pr <= 0):
        raise ValueError("prices must be positive")
    return m / pr


def _choices(
    pred: ArrayLike, true: ArrayLike, price: ArrayLike | None
) -> tuple[npt.NDArray[np.intp], FloatArray]:
    """Chosen column per row (by prediction) and the true per-dollar matrix."""
    pv = _per_dollar(pred, price)
    tv = _per_dollar(true, price)
    if pv.shape != tv.shape:
        raise ValueError(f"pred and true matrices differ in shape: {pv.shape} != {tv.shape}")
    if not np.all(np.isfinite(tv) & (tv > 0)):
        raise ValueError("every candidate's true throughput must be known and positive")
    # A NaN prediction is never chosen; a row with no finite prediction falls to column 0,
    # a deterministic (and usually wrong) pick rather than a silently dropped row.
    pv = np.where(np.isfinite(pv), pv, -np.inf)
    return np.argmax(pv, axis=1).astype(np.intp), tv


def top1(pred: ArrayLike, true: ArrayLike, price: ArrayLike | None = None) -> float:
    """Share of jobs whose predicted best hardware is the truly best one.

    Parameters
    ----------
    pred, true
        ``(jobs x hardware)`` matrices of predicted and measured throughput.
    price
        Hourly price per hardware column (broadcast over rows, or a full matrix). ``None`` means
        the matrices are already throughput per dollar (or all prices are equal).

    Returns
    -------
    float
        Share of rows where the hardware with the highest predicted throughput per dollar has
        the highest true throughput per dollar. A tie in the truth counts as a hit.
    """
    chosen, tv = _choices(pred, true, price)
    if tv.shape[0] == 0:
        return float("nan")
    picked = tv[np.arange(tv.shape[0]), chosen]
    return float(np.mean(picked >= tv.max(axis=1)))


def regret(pred: ArrayLike, true: ArrayLike, price: ArrayLike | None = None) -> float:
    """Mean extra cost per unit of work of the chosen hardware over the best one.

    Parameters
    ----------
    pred, true
        ``(jobs x hardware)`` matrices of predicted and measured throughput.
    price
        Hourly price per hardware column (or full matrix); ``None`` as in :func:`top1`.

    Returns
    -------
    float
        ``mean((cost_chosen / true_tput_chosen) / (cost_best / true_tput_best) - 1)``, i.e.
        0.05 means the picks cost 5 % more per unit of work than the best picks.
    """
    chosen, tv = _choices(pred, true, price)
    if tv.shape[0] == 0:
        return float("nan")
    picked = tv[np.arange(tv.shape[0]), chosen]
    # cost per unit of work = 1 / throughput-per-dollar
    return float(np.mean(tv.max(axis=1) / picked - 1.0))


#: Weights :func:`best_weight` chooses from.
TRUST_GRID: tuple[float, ...] = tuple(k / 10 for k in range(11))


def best_weight(base_log: ArrayLike, departure: ArrayLike, actual: ArrayLike) -> float:
    """The weight ``w`` in :data:`TRUST_GRID` for which ``exp(base_log + w x departure)`` has
    the best acc@10 against ``actual``; the largest such ``w`` on a tie.

    How much of a model's correction to an anchor to keep, chosen on held-out rows.
    """
    b, d, y = (np.asarray(x, dtype=np.float64)[:, None] for x in (base_log, departure, actual))
    hits = (np.abs(np.exp(b + d * np.array(TRUST_GRID)) / y - 1) <= 0.1).sum(axis=0)
    return TRUST_GRID[int(np.flatnonzero(hits == hits.max())[-1])]
