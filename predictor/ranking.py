"""Prices candidates and orders them by predicted throughput per dollar."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from core.hardware import Catalogue

#: Candidate-level reasons, stable strings for dashboards and metrics.
UNKNOWN_HARDWARE = "unknown_hardware"
NO_PRICE = "no_price"
NO_ESTIMATE = "no_estimate"
COLD_START = "cold_start_roofline"


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
