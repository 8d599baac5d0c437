"""Coverage over months: which accelerator-hours a learned prediction placed, against the lookup table.

A compressed half year of the simulated fleet, with what changes in a real one: model types arrive
over the months (half of them are there from the start, the others arrive on a uniform day), and
five parts launch during it (:data:`LAUNCHES`). Attempts are placed by the oracle's routing under
the fleet's pools (:mod:`leap.fleet.routing`), the placement a good ranking aims at; pinned jobs stay
on their part. Then, for each routable attempt, in time order:

* **learned**: the part had a finished attempt (any job) before the last nightly training — the
  served model has learned it (before that, a new part is ranked from its specs only, which is
  not counted here);
* **lookup-rankable**: the lookup table had a median for the part at that moment: a finished
  attempt of the same model type or family on it (the medians are updated on every finish);
  and, apart, by model type only (a table without the family fallback).

Both are weighed by the attempt's accelerator-hours and reported per week.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from leap.core.hardware import Catalogue
from leap.fleet.capacity import FleetCapacity, schedule_prices
from leap.fleet.engine import DAY, Attempt, Draws, Fleet
from leap.fleet.routing import Outcome, Record, route
from leap.fleet.workloads import model_types

#: Parts that launch during the half year, by day: the newest of each vendor.
LAUNCHES = {"B200": 40, "MI325X": 70, "Trainium2": 90, "Gaudi3": 110, "TPU-v6e": 130}


@dataclass(frozen=True)
class CoverageConfig:
    """The compressed half year: its length, rate, seed and the share of model types there at the start."""

    days: int = 182
    attempts_per_day: float = 600.0
    seed: int = 3
    present_share: float = 0.5


def _arrivals(cfg: CoverageConfig, rng: np.random.Generator) -> dict[str, float]:
    names = [m.name for m in model_types()]
    late = rng.random(len(names)) >= cfg.present_share
    return {n: float(rng.uniform(0, cfg.days)) if is_late else 0.0 for n, is_late in zip(names, late, strict=True)}


def _launched(a: Attempt, day: float) -> Attempt | None:
    """The attempt with only the parts launched by ``day`` (None when none of its parts has)."""
    keep = tuple(h for h in a.candidates if LAUNCHES.get(h, 0) <= day)
    if not keep:
        return None
    if len(keep) == len(a.candidates):
        return a
    preference = tuple(h for h in a.preference if h in keep) or keep[:1]
    sub = replace(a.submission, candidates=keep, requested_hardware=preference[0])
    return replace(a, submission=sub, oracle={h: a.oracle[h] for h in keep}, preference=preference,
                   default_hardware=preference[0])


def simulate_records(cfg: CoverageConfig, capacity: FleetCapacity, catalogue: Catalogue) -> list[Record]:
    """The half year's attempts whose model type has arrived, with their launched parts only."""
    rng = np.random.default_rng(cfg.seed)
    arrival = _arrivals(cfg, rng)
    fleet = Fleet(seed=cfg.seed, attempts_per_day=cfg.attempts_per_day, catalogue=catalogue)
    start = 1.75e9 - 1.75e9 % DAY
    out: list[Record] = []
    batch = fleet.sample_attempts(5000, start_time=start)
    while batch and batch[0].submission.event_time < start + cfg.days * DAY:
        for a in batch:
            day = (a.submission.event_time - start) / DAY
            if day >= cfg.days or arrival[a.submission.model_type] > day:
                continue
            launched = _launched(a, day)
            if launched is None:
                continue
            n = launched.submission.num_accelerators
            pinned = capacity.pinned(a.submission.job_key) and capacity.pools.get(launched.preference[0], 0) >= n
            out.append(Record(launched, frac=float(Draws.sample(rng, 1).frac[0]), pinned=pinned))
        batch = fleet.sample_attempts(5000)
    return out


def weekly_coverage(outcomes: list[Outcome], start: float) -> list[dict[str, Any]]:
    """Per week: routable accelerator-hours, and the shares learned and lookup-rankable."""
    finishes: list[tuple[float, str, str, str | None]] = []  # (end, hardware, model type, family)
    for o in outcomes:
        sub = o.record.attempt.submission
        heapq.heappush(finishes, (o.decision.start + o.record.seconds(o.decision.hardware),
                                  o.decision.hardware, sub.model_type, sub.family))
    ran: set[str] = set()
    trained: set[str] = set()
    medians: set[tuple[str, str]] = set()
    trained_day = -1
    weeks: dict[int, list[float]] = {}
    for o in sorted(outcomes, key=lambda x: x.record.attempt.submission.event_time):
        sub = o.record.attempt.submission
        now = sub.event_time
        while finishes and finishes[0][0] <= now:
            _, hw, model, family = heapq.heappop(finishes)
            ran.add(hw)
            medians.update({(model, hw), (family or model, hw)})
        day = int((now - start) // DAY)
        if day > trained_day:  # the nightly training learns every part that has run so far
            trained, trained_day = set(ran), day
        if o.record.pinned:
            continue
        hw, hours = o.decision.hardware, o.hours
        row = weeks.setdefault(day // 7, [0.0, 0.0, 0.0, 0.0])
        row[0] += hours
        row[1] += hours * (day >= 1 and hw in trained)  # no model before the first night
        row[2] += hours * ((sub.model_type, hw) in medians or (sub.family or sub.model_type, hw) in medians)
        row[3] += hours * ((sub.model_type, hw) in medians)
    return [{"week": w, "routable_hours": h, "eligible_hours_ranked_share": learned / h if h else 0.0,
             "lookup_rankable_hours_share": lookup / h if h else 0.0,
             "lookup_model_type_only_share": by_type / h if h else 0.0}
            for w, (h, learned, lookup, by_type) in sorted(weeks.items())]


def coverage_over_months(cfg: CoverageConfig, capacity: FleetCapacity, catalogue: Catalogue) -> dict[str, Any]:
    """The weekly series of a compressed half year (module docstring)."""
    records = simulate_records(cfg, capacity.scaled(cfg.attempts_per_day), catalogue)
    outcomes = route(records, "oracle", schedule_prices("list", catalogue), capacity.scaled(cfg.attempts_per_day))
    start = records[0].attempt.submission.event_time - records[0].attempt.submission.event_time % DAY
    return {"days": cfg.days, "attempts_per_day": cfg.attempts_per_day, "seed": cfg.seed,
            "present_share": cfg.present_share, "launches": LAUNCHES, "attempts": len(records),
            "weeks": weekly_coverage(outcomes, start)}


def plot_coverage(result: dict[str, Any], path: str) -> None:
    """Both shares per week, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    weeks = result["weeks"]
    x = [w["week"] for w in weeks]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.plot(x, [w["eligible_hours_ranked_share"] for w in weeks], label="learned prediction")
    ax.plot(x, [w["lookup_rankable_hours_share"] for w in weeks], label="lookup table could rank")
    ax.plot(x, [w["lookup_model_type_only_share"] for w in weeks], label="lookup by model type only", ls="--")
    for part, day in result["launches"].items():
        ax.axvline(day / 7, color="grey", lw=0.5, ls=":")
        ax.text(day / 7, 0.02, part, rotation=90, fontsize=7, color="grey")
    ax.set_xlabel("week")
    ax.set_ylabel("share of routable accelerator-hours")
    ax.set_ylim(0, 1.02)
    ax.legend(loc="center right")
    ax.set_title("Placements covered, simulated half year")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
