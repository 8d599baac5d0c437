"""Prices candidates and orders them by predicted throughput per dollar."""

from __future__ import annotations

import math
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


def rank_candidates(
    names: tuple[str, ...] | list[str],
    num_accelerators: int,
    per_acc: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    reasons: list[str | None],
    catalogue: Catalogue,
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

    Returns
    -------
    Every candidate, ranked ones first by descending samples per dollar, then unranked ones
    with the reason; ``best`` is rank 1 or None.
    """
    rows: list[dict[str, Any]] = []
    for i, name in enumerate(names):
        hw = catalogue.resolve(name)
        reason = reasons[i]
        price = catalogue.price(hw.name) if hw is not None else None
        tput = float(per_acc[i]) * num_accelerators
        has_estimate = math.isfinite(tput) and tput > 0
        if hw is None:
            reason = UNKNOWN_HARDWARE
        elif price is None or price <= 0:
            reason = NO_PRICE
        elif not has_estimate:
            reason = NO_ESTIMATE
        cost = price * num_accelerators if price else None
        rankable = hw is not None and cost is not None and has_estimate
        rows.append(
            {
                "hardware": name,
                "predicted_throughput": tput if has_estimate else None,
                "lower": float(lower[i]) * num_accelerators if has_estimate else None,
                "upper": float(upper[i]) * num_accelerators if has_estimate else None,
                "hourly_cost": cost,
                "throughput_per_dollar": tput * 3600.0 / cost if rankable and cost else None,
                "rank": None,
                "reason": reason,
                "_rankable": rankable,
            }
        )
    ranked = sorted((r for r in rows if r["_rankable"]), key=lambda r: -r["throughput_per_dollar"])
    for position, row in enumerate(ranked, start=1):
        row["rank"] = position
    unranked = [r for r in rows if not r["_rankable"]]
    ordered = ranked + unranked
    for row in ordered:
        del row["_rankable"]
    return Priced(ordered, ranked[0]["hardware"] if ranked else None)
