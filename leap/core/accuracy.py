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
- A prediction is a *hit* at ``tol`` when its relative error is ``<= tol`` (plus :data:`TOL_EPS`).
  :func:`within` is that one comparison; :func:`acc_at`, :func:`hits`, :func:`is_hit`,
  :func:`best_weight` and the dashboard's rolling hit counts all go through it.
"""

from __future__ import annotations

import math
from typing import Any, overload

import numpy as np
import numpy.typing as npt

ArrayLike = npt.ArrayLike
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

#: Slack added to every tolerance. ``|1.1 - 1.0| / 1.0`` is ``0.10000000000000009`` in floating
#: point: without it a prediction 10 % off by any human count would miss acc@10. Every hit test
#: uses the same slack (through :func:`within`), so no two reports disagree at the boundary.
TOL_EPS = 1e-12


@overload
def within(err: float, tol: float) -> bool: ...


@overload
def within(err: FloatArray, tol: float) -> BoolArray: ...


def within(err: float | FloatArray, tol: float) -> bool | BoolArray:
    """The hit test: is a relative error within ``tol``?

    Parameters
    ----------
    err
        Relative error(s), as from :func:`relative_error` or :func:`relative_errors`; NaN marks a
        missing prediction.
    tol
        Relative tolerance, e.g. ``0.10`` for acc@10.

    Returns
    -------
    bool or numpy.ndarray of bool
        ``err <= tol + TOL_EPS``, elementwise for an array. NaN compares false, so a missing
        prediction is a miss.
    """
    return err <= tol + TOL_EPS


def _pair(pred: ArrayLike, actual: ArrayLike) -> tuple[FloatArray, FloatArray]:
    p = np.asarray(pred, dtype=np.float64).ravel()
    a = np.asarray(actual, dtype=np.float64).ravel()
    if p.shape != a.shape:
        raise ValueError(f"pred and actual differ in length: {p.size} != {a.size}")
    if not np.all(np.isfinite(a) & (a > 0)):
        raise ValueError("actual throughputs must be finite and positive")
    return p, a


def _error(p: FloatArray, a: FloatArray) -> FloatArray:
    """``|p - a| / a``, broadcast; infinite or NaN where ``p`` is not finite."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.abs(p - a) / a


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
    err = _error(p, a)
    err[~np.isfinite(p)] = np.nan
    return err


def relative_error(pred: float, actual: float) -> float:
    """Relative error of one prediction: the scalar form of :func:`relative_errors`.

    For per-event callers (the dashboard scores every joined finish): plain float arithmetic,
    no array round trip.

    Parameters
    ----------
    pred
        Predicted throughput; NaN marks a missing prediction.
    actual
        Measured throughput, positive.

    Returns
    -------
    float
        ``|pred - actual| / actual``, NaN when the prediction is not finite.

    Raises
    ------
    ValueError
        When ``actual`` is not finite and positive.
    """
    if not 0.0 < actual < math.inf:
        raise ValueError(f"actual throughput must be finite and positive, got {actual!r}")
    return abs(pred - actual) / actual if math.isfinite(pred) else math.nan


def is_hit(pred: float, actual: float, tol: float) -> bool:
    """Whether one prediction is within ``tol`` relative error of the measured throughput.

    Parameters
    ----------
    pred
        Predicted throughput; NaN counts as a miss.
    actual
        Measured throughput, positive.
    tol
        Relative tolerance, e.g. ``0.10`` for acc@10.

    Returns
    -------
    bool
        ``within(relative_error(pred, actual), tol)``.
    """
    return within(relative_error(pred, actual), tol)


def hits(pred: ArrayLike, actual: ArrayLike, tol: float) -> BoolArray:
    """Which predictions are within ``tol`` relative error: the array form of :func:`is_hit`.

    Parameters
    ----------
    pred
        Predicted throughputs; NaN (or infinite) counts as a miss.
    actual
        Measured throughputs, positive. Broadcast against ``pred``, so a ``(rows x k)`` matrix of
        predictions can be scored against a ``(rows x 1)`` column of actuals in one call.
    tol
        Relative tolerance, e.g. ``0.10`` for acc@10.

    Returns
    -------
    numpy.ndarray of bool
        ``within(|pred - actual| / actual, tol)`` in the broadcast shape.

    Raises
    ------
    ValueError
        When an actual is not finite and positive, or the shapes do not broadcast.
    """
    p = np.asarray(pred, dtype=np.float64)
    a = np.asarray(actual, dtype=np.float64)
    if not np.all(np.isfinite(a) & (a > 0)):
        raise ValueError("actual throughputs must be finite and positive")
    # A non-finite prediction gives an infinite or NaN error, which within() rejects.
    return within(_error(p, a), tol)


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
    p, a = _pair(pred, actual)  # unlike hits(), rows must pair one to one
    if a.size == 0:
        return float("nan")
    return float(np.mean(hits(p, a, tol)))


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


def best_weight(base_log: ArrayLike, departure: ArrayLike, actual: ArrayLike, margin: float = 0.0) -> float:
    """The weight ``w`` in :data:`TRUST_GRID` for which ``exp(base_log + w x departure)`` has
    the best acc@10 against ``actual``; the smallest such ``w`` on a tie.

    How much of a model's correction to an anchor to keep, chosen on held-out rows. A tie keeps
    the anchor's side: a correction earns its weight only by more hits (on a few dozen held-out
    rows many weights tie, and the larger ones then fit noise).

    Parameters
    ----------
    base_log
        Log of the anchor prediction per row.
    departure
        The model's correction to the anchor per row, in log space.
    actual
        Measured throughput per row, positive.
    margin
        In standard errors: a weight above 0 is kept only if its hits exceed those of 0 by more
        than ``margin`` x the square root of the rows on which the two disagree (a sign test),
        so that on few rows a correction must beat its anchor by more than chance.

    Returns
    -------
    float
        An element of :data:`TRUST_GRID`.
    """
    b, d, y = (np.asarray(x, dtype=np.float64)[:, None] for x in (base_log, departure, actual))
    # (rows x weights) predictions against a column of actuals: acc@10 hits per weight.
    hit = hits(np.exp(b + d * np.array(TRUST_GRID)), y, 0.10)
    return TRUST_GRID[clear_winner(hit, reference=0, margin=margin)]


def clear_winner(hit: npt.NDArray[np.bool_], reference: int, margin: float,
                 clusters: npt.NDArray[Any] | None = None) -> int:
    """The column of a ``(rows x options)`` hit matrix with the most hits (the first on a tie),
    unless it beats column ``reference`` by no more than ``margin`` standard errors of the
    difference in hits: then ``reference``.

    The squared standard error is the sum over ``clusters`` (a label per row) of the squared
    difference in hits within each: rows of one cluster (one workload's configurations) are not
    independent, and a win that one cluster carries is not a win. Without clusters each row is its
    own, and that sum is the number of rows where the two disagree.
    """
    n_hits = hit.sum(axis=0)
    best = int(np.flatnonzero(n_hits == n_hits.max())[0])
    diff = hit[:, best].astype(np.int64) - hit[:, reference].astype(np.int64)
    if clusters is None:
        variance = float(np.sum(diff != 0))
    else:
        _, index = np.unique(np.asarray(clusters).astype(str), return_inverse=True)
        variance = float(np.sum(np.bincount(index.ravel(), weights=diff) ** 2))
    if best != reference and n_hits[best] - n_hits[reference] <= margin * math.sqrt(variance):
        return reference
    return best
