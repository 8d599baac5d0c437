"""Pricing and ordering of candidates, and the ranking service's fallbacks."""

from __future__ import annotations

import numpy as np

from core.hardware import load_catalogue
from predictor.ranking import NO_ESTIMATE, UNKNOWN_HARDWARE, rank_candidates

CAT = load_catalogue()


def test_orders_by_throughput_per_dollar_and_keeps_unknowns_unranked() -> None:
    names = ["H100-SXM", "Quantum-9000", "T4", "A100-80GB"]
    per_acc = np.array([100.0, 50.0, 10.0, np.nan])
    priced = rank_candidates(names, 4, per_acc, per_acc * 0.9, per_acc * 1.1, [None] * 4, CAT)
    by_name = {c["hardware"]: c for c in priced.candidates}
    assert len(priced.candidates) == 4  # nothing dropped
    assert by_name["Quantum-9000"]["rank"] is None and by_name["Quantum-9000"]["reason"] == UNKNOWN_HARDWARE
    assert by_name["A100-80GB"]["rank"] is None and by_name["A100-80GB"]["reason"] == NO_ESTIMATE
    ranked = [c for c in priced.candidates if c["rank"] is not None]
    assert [c["rank"] for c in ranked] == [1, 2]
    assert ranked[0]["throughput_per_dollar"] >= ranked[1]["throughput_per_dollar"]
    h100 = by_name["H100-SXM"]
    price = CAT.price("H100-SXM")
    assert price is not None
    assert h100["hourly_cost"] == price * 4
    assert h100["throughput_per_dollar"] == 400.0 * 3600 / (price * 4)
    assert priced.best == ranked[0]["hardware"]


def test_nothing_rankable_gives_no_best() -> None:
    priced = rank_candidates(["Nope"], 1, np.array([1.0]), np.array([1.0]), np.array([1.0]), [None], CAT)
    assert priced.best is None and priced.candidates[0]["reason"] == UNKNOWN_HARDWARE
