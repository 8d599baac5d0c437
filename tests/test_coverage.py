"""Coverage over months: launches, arrivals and the two shares of a short compressed run."""

from __future__ import annotations

from leap.core.hardware import load_catalogue
from leap.fleet.capacity import load_capacity
from leap.fleet.coverage import LAUNCHES, CoverageConfig, coverage_over_months, simulate_records
from leap.fleet.engine import DAY

CAT = load_catalogue()
CAPACITY = load_capacity(CAT)


def test_parts_launch_and_model_types_arrive_during_the_run() -> None:
    cfg = CoverageConfig(days=50, attempts_per_day=150, seed=1)
    records = simulate_records(cfg, CAPACITY.scaled(cfg.attempts_per_day), CAT)
    start = records[0].attempt.submission.event_time // DAY * DAY
    for r in records:
        day = (r.attempt.submission.event_time - start) / DAY
        assert all(LAUNCHES.get(h, 0) <= day for h in r.attempt.candidates)
        assert r.preference[0] in r.attempt.candidates
    early = {r.attempt.submission.model_type for r in records[: len(records) // 5]}
    late = {r.attempt.submission.model_type for r in records[-len(records) // 5:]}
    assert len(late - early) > 10  # new model types keep arriving
    assert any("B200" in r.attempt.candidates for r in records)  # launched on day 40


def test_no_learned_prediction_before_the_first_night_and_shares_are_shares() -> None:
    result = coverage_over_months(CoverageConfig(days=21, attempts_per_day=150, seed=2), CAPACITY, CAT)
    weeks = result["weeks"]
    assert [w["week"] for w in weeks] == [0, 1, 2]
    assert all(0.0 <= w[k] <= 1.0 for w in weeks for k in ("eligible_hours_ranked_share",
                                                             "lookup_rankable_hours_share"))
    assert weeks[0]["eligible_hours_ranked_share"] < weeks[-1]["eligible_hours_ranked_share"]
    assert weeks[0]["lookup_rankable_hours_share"] < weeks[-1]["lookup_rankable_hours_share"]
