"""Prices candidates and orders them by predicted throughput per dollar."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from features.roofline import peak_bound_log
from features.rows import Rows
from leap.core.hardware import Catalogue
from predictor.models import PairedTransfer, ThroughputModel

#: Candidate-level reasons, stable strings for dashboards and metrics.
UNKNOWN_HARDWARE = "unknown_hardware"
NO_PRICE = "no_price"
NO_ESTIMATE = "no_estimate"
COLD_START = "cold_start_roofline"
#: Ranking-level reason: the submission left out fields that stand-ins filled (features.completion).
PARTIAL_SUBMISSION = "partial_submission"
#: Candidate-level reason: no parameter count was given or could be derived, so the estimate is what
#: history holds (:func:`history_where_params_unknown`), not the model's.
HISTORY_FALLBACK = "params_unknown_history"
#: Candidate-level reason: the prediction was above what the part can physically deliver, and was
#: cut to that (:func:`bound_by_peak`).
PEAK_BOUND = "peak_bound"


def bound_by_peak(pred: np.ndarray, lower: np.ndarray, upper: np.ndarray, rows: Rows
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Predictions (and their bands) cut to what each part can physically deliver.

    Parameters
    ----------
    pred, lower, upper
        Per-accelerator predictions and band (NaN = no estimate).
    rows
        Their model rows: the bound is the part's peak FLOP/s over the configuration's FLOPs per
        sample (:func:`features.roofline.peak_bound_log`); rows where either is unknown are left as
        they are. Where the job was measured on the part faster than that, the measurement is the
        bound: the submission's size or sequence length is then wrong for the job, and observation
        outranks a bound derived from stated fields.

    Returns
    -------
    The bounded ``pred``, ``lower``, ``upper`` (new arrays) and a mask of the predictions cut.
    """
    bound = np.exp(peak_bound_log(rows))
    measured = np.exp(rows["prior_same_log"])
    bound = np.where(np.isfinite(measured), np.maximum(bound, measured), bound)  # NaN bound stays NaN
    with np.errstate(invalid="ignore"):
        cut = np.isfinite(bound) & (pred > bound)
    if not cut.any():
        return pred, lower, upper, cut
    # fmin ignores a NaN bound: a band is cut only where the bound is known
    return np.where(cut, bound, pred), np.fmin(lower, bound), np.fmin(upper, bound), cut


def history_where_params_unknown(pred: np.ndarray, lower: np.ndarray, upper: np.ndarray, rows: Rows
                                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows without a parameter count (none given, none derivable) served from history instead.

    The model was fitted on submissions that all said their size; without it, its prediction
    carries little of the part's signal (it came out flat across parts). The paired transfer (the
    job's prior moved by the ratio earlier jobs showed, else by the lookup ratio, else the model
    type's or family's median on the part) is served where it has an estimate, with the model's
    band around it in proportion.

    Returns
    -------
    ``pred``, ``lower``, ``upper`` (new arrays where changed) and a mask of the rows served from history.
    """
    unknown = np.isnan(rows["log_params"])
    if not unknown.any():
        return pred, lower, upper, unknown
    history = PairedTransfer().predict(rows)
    with np.errstate(invalid="ignore", divide="ignore"):
        use = unknown & np.isfinite(history) & (history > 0)
        scale = np.where(use, history / pred, 1.0)
        # without a model estimate the band is the history's own
        lower = np.where(use & ~np.isfinite(scale), history, lower * scale)
        upper = np.where(use & ~np.isfinite(scale), history, upper * scale)
    return np.where(use, history, pred), lower, upper, use


class AsServed(ThroughputModel):
    """A model's predictions as the ranking service serves them: history where the parameter count
    is unknown (:func:`history_where_params_unknown`), never above a part's peak (:func:`bound_by_peak`).

    Parameters
    ----------
    model
        A fitted model; its band is kept, moved and cut with its predictions.
    """

    kind: ClassVar[str] = "as_served"

    def __init__(self, model: ThroughputModel) -> None:
        super().__init__()
        self.model = model

    def _predict_log(self, rows: Rows) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return np.asarray(np.log(self.predict(rows)))

    def _served(self, rows: Rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        pred = self.model.predict(rows)
        lower, upper = self.model.predict_band(pred, rows)
        pred, lower, upper, _ = history_where_params_unknown(pred, lower, upper, rows)
        return bound_by_peak(pred, lower, upper, rows)[:3]

    def predict(self, rows: Rows) -> np.ndarray:
        return self._served(rows)[0]

    def predict_band(self, pred: np.ndarray, rows: Rows | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The band served with :meth:`predict`'s predictions of ``rows`` (``pred`` must be those)."""
        if rows is None:
            return self.model.predict_band(pred, rows)
        return self._served(rows)[1:3]


#: Ranked, but the model never saw the part: its estimate rests on the catalogue specs (a part
#: added by the fleet's operator file, leap.core.operator_hardware).
SPECS_ONLY = "ranked_from_specs"


def specs_only_reasons(names: tuple[str, ...] | list[str], reasons: list[str | None],
                       trained: frozenset[str] | None, catalogue: Catalogue) -> list[str | None]:
    """``reasons`` with :data:`SPECS_ONLY` for known parts the model did not train on."""
    if trained is None:
        return reasons
    out = list(reasons)
    for i, name in enumerate(names):
        hw = catalogue.resolve(name)
        if out[i] is None and hw is not None and hw.name not in trained:
            out[i] = SPECS_ONLY
    return out


@dataclass(frozen=True)
class Priced:
    candidates: list[dict[str, Any]]
    best: str | None


def price_candidate(
    name: str,
    num_accelerators: int,
    per_acc: float,
    lower: float,
    upper: float,
    reason: str | None,
    catalogue: Catalogue,
    basis: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], bool]:
    """Price one candidate, before ranks are known.

    Parameters
    ----------
    name
        The candidate as the submission named it.
    num_accelerators
        Accelerators of the attempt; throughput and cost scale with it.
    per_acc, lower, upper
        Predicted per-accelerator samples/s and its band (NaN = no estimate).
    reason
        Fallback reason already known (e.g. cold start), or None; replaced when the candidate
        cannot be ranked.
    basis
        What the prediction rests on (:mod:`predictor.basis`), or None to leave it out.

    Returns
    -------
    The candidate's entry (``rank`` still None) and whether it can take a rank.
    """
    hw = catalogue.resolve(name)
    price = hw.price_per_hour if hw is not None else None  # catalogue.price(hw.name), one lookup fewer
    tput = per_acc * num_accelerators
    has_estimate = math.isfinite(tput) and tput > 0
    if hw is None:
        reason = UNKNOWN_HARDWARE
    elif price is None or price <= 0:
        reason = NO_PRICE
    elif not has_estimate:
        reason = NO_ESTIMATE
    cost = price * num_accelerators if price else None
    rankable = hw is not None and cost is not None and has_estimate
    entry: dict[str, Any] = {
        "hardware": name,
        "predicted_throughput": tput if has_estimate else None,
        "lower": lower * num_accelerators if has_estimate else None,
        "upper": upper * num_accelerators if has_estimate else None,
        "hourly_cost": cost,
        "throughput_per_dollar": tput * 3600.0 / cost if rankable and cost else None,
        "rank": None,
        "reason": reason,
    }
    if basis is not None:
        entry["basis"] = basis
    return entry, rankable


def rank_candidates(
    names: tuple[str, ...] | list[str],
    num_accelerators: int,
    per_acc: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    reasons: list[str | None],
    catalogue: Catalogue,
    bases: Sequence[dict[str, Any]] | None = None,
) -> Priced:
    """Build the ranking's candidate list.

    Parameters
    ----------
    names
        Candidate hardware as the submission named them (kept as given).
    num_accelerators
        Accelerators of the attempt; throughput and cost scale with it.
    per_acc, lower, upper
        Predicted per-accelerator samples/s and its band (NaN = no estimate).
    reasons
        Per-candidate fallback reason already known (e.g. cold start), or None.
    bases
        Per-candidate basis (:mod:`predictor.basis`), or None to leave it out.

    Returns
    -------
    Every candidate, ranked ones first by descending samples per dollar, then unranked ones
    with the reason; ``best`` is rank 1 or None.
    """
    priced = [
        price_candidate(name, num_accelerators, float(per_acc[i]), float(lower[i]), float(upper[i]), reasons[i],
                        catalogue, bases[i] if bases is not None else None)
        for i, name in enumerate(names)
    ]
    # sorted() is stable: candidates of equal value per dollar keep the submission's order.
    ranked = sorted((entry for entry, ok in priced if ok), key=lambda r: -r["throughput_per_dollar"])
    for position, entry in enumerate(ranked, start=1):
        entry["rank"] = position
    unranked = [entry for entry, ok in priced if not ok]
    return Priced(ranked + unranked, ranked[0]["hardware"] if ranked else None)
