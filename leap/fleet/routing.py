"""Four routings of the same attempts under the same pools and prices, side by side.

Every attempt the scheduler simulator saw becomes a :class:`Record`: what LEAP's ranking and the
lookup table predicted for it, the oracle, and whether it is pinned. :func:`evaluate` then plays
the records in submission order through one :class:`leap.fleet.pools.Cluster` per routing, all built
from the same pools (or all unlimited when capacity is off) and priced with the same schedule:

* **leap**: the ranked candidates, costed with LEAP's predicted throughput;
* **default**: the team's preference order (the requested part first), no cost estimate: the
  first part that can start soonest;
* **lookup**: the table that LEAP replaced: the parts it has medians for, costed by the
  medians, only when it has one for the requested part too, else default routing;
* **oracle**: every candidate costed at its noise-free throughput.

Pinned attempts go to their part in every routing and take capacity there. A routing pays
the work of each attempt at the price per sample of where it ran (expected throughput, so run
noise favours none); waits are reported apart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from leap.fleet.capacity import FleetCapacity
from leap.fleet.engine import Attempt, run_seconds
from leap.fleet.pools import Cluster, Decision, Option

ROUTINGS = ("leap", "default", "lookup", "oracle")


@dataclass
class Record:
    """One attempt as the routings see it.

    Attributes
    ----------
    attempt
        From the fleet generator (oracle, work, preference).
    frac
        Share of the work done before it ends (failures and preemptions end early); the same
        in every routing.
    pinned
        Not routable: runs on its requested part.
    leap
        LEAP's predicted throughput (samples/s, all accelerators) per ranked candidate; None when
        no ranking arrived in time.
    learned
        Candidates whose prediction came from a learned model (not a baseline, not a cold start).
    lookup
        The lookup table's median throughput (all accelerators) per candidate it knows.
    warm
        Part of the warm start: placed by default routing in every routing and not counted.
    """

    attempt: Attempt
    frac: float = 1.0
    pinned: bool = False
    leap: dict[str, float] | None = None
    learned: frozenset[str] = frozenset()
    lookup: dict[str, float] = field(default_factory=dict)
    warm: bool = False

    @property
    def n(self) -> int:
        return self.attempt.submission.num_accelerators

    @property
    def preference(self) -> tuple[str, ...]:
        a = self.attempt
        return a.preference or (a.submission.requested_hardware or a.candidates[0],)

    def seconds(self, hardware: str) -> float:
        return run_seconds(self.attempt.work_samples, self.attempt.oracle[hardware], self.frac)

    def cost(self, hardware: str, prices: dict[str, float], throughput: float | None = None) -> float:
        """USD for the attempt's work on ``hardware`` at ``throughput`` (default: the oracle's)."""
        thr = self.attempt.oracle[hardware] if throughput is None else throughput
        return self.attempt.work_samples * prices[hardware] * self.n / 3600.0 / thr


def _default(r: Record) -> list[Option]:
    return [Option(h, 0.0) for h in dict.fromkeys(r.preference)]


def _lookup(r: Record, prices: dict[str, float]) -> list[Option]:
    requested = r.preference[0]
    if requested not in r.lookup:
        return _default(r)
    known = [Option(h, r.cost(h, prices, thr)) for h, thr in r.lookup.items()]
    # The rest of the team's order, where the table knows nothing: as costly as the requested part.
    rest = [Option(h, r.cost(requested, prices, r.lookup[requested])) for h in r.preference if h not in r.lookup]
    return known + rest


def options(routing: str, r: Record, prices: dict[str, float]) -> list[Option]:
    """The options ``routing`` brings for ``r``, in its order of preference."""
    if r.pinned or r.warm:
        return _default(r)[:1] if r.pinned else _default(r)
    if routing == "default":
        return _default(r)
    if routing == "lookup":
        return _lookup(r, prices)
    if routing == "oracle":
        return [Option(h, r.cost(h, prices)) for h in r.attempt.candidates]
    if r.leap:
        return [Option(h, r.cost(h, prices, thr)) for h, thr in r.leap.items()]
    return _default(r)  # no ranking in time: the scheduler's default routing


@dataclass
class Outcome:
    """Where one routing put one record."""

    record: Record
    decision: Decision

    @property
    def hours(self) -> float:
        return self.record.n * self.record.seconds(self.decision.hardware) / 3600.0


def route(records: Sequence[Record], routing: str, prices: dict[str, float],
          capacity: FleetCapacity | None, unlimited_wait_s: float = 7200.0) -> list[Outcome]:
    """Play ``records`` (in submission order) through a fresh cluster under ``routing``.

    Records no pool can hold (bigger than every pool of their candidates) are left out, in
    every routing alike since a pool's size does not depend on the routing.
    """
    cluster = (Cluster(capacity.pools, capacity.max_wait_s, capacity.wait_cost) if capacity is not None
               else Cluster(None, unlimited_wait_s, 1.0))
    out = []
    for r in sorted(records, key=lambda x: x.attempt.submission.event_time):
        requested = r.preference[0]
        now = r.attempt.submission.event_time
        decision = cluster.place(options(routing, r, prices), r.n, now, prices[requested] * r.n)
        if decision is None:
            continue
        cluster.commit(decision, r.seconds(decision.hardware), r.n)
        if not r.warm:
            out.append(Outcome(r, decision))
    return out


def _cost(outcomes: list[Outcome], prices: dict[str, float], keep: Callable[[Record], bool]) -> float:
    return sum(o.record.cost(o.decision.hardware, prices) for o in outcomes if keep(o.record))


def _share(num: float, den: float) -> float:
    return num / den if den else 0.0


def scenario(records: Sequence[Record], prices: dict[str, float], capacity: FleetCapacity | None,
             schedule: str) -> dict[str, Any]:
    """The figures of one scenario (capacity on or off, one price schedule), every routing played.

    Savings compare the USD paid for the same work; ``eligible_*`` restrict them to routable
    attempts. ``eligible_hours_ranked_share``: of the routable attempts' accelerator-hours under
    LEAP's routing, the share placed on a part that a learned model predicted;
    ``lookup_rankable_hours_share``: the share placed on a part the lookup table had a median for.
    """
    played = {name: route(records, name, prices, capacity) for name in ROUTINGS}
    common = set.intersection(*({id(o.record) for o in outs} for outs in played.values()))
    played = {k: [o for o in v if id(o.record) in common] for k, v in played.items()}
    total = {k: _cost(v, prices, lambda r: True) for k, v in played.items()}
    eligible = {k: _cost(v, prices, lambda r: not r.pinned) for k, v in played.items()}
    routable = [o for o in played["leap"] if not o.record.pinned]
    hours = sum(o.hours for o in routable)
    waits = np.array([o.decision.wait_s for o in played["leap"]])
    out: dict[str, Any] = {
        "capacity": capacity is not None,
        "price_schedule": schedule,
        "attempts": len(played["leap"]),
        "pinned_attempts": sum(o.record.pinned for o in played["leap"]),
        "savings_vs_default": 1.0 - _share(total["leap"], total["default"]),
        "savings_vs_lookup": 1.0 - _share(total["leap"], total["lookup"]),
        "cost_overrun_vs_oracle": _share(total["leap"], total["oracle"]) - 1.0,
        "eligible_savings_vs_default": 1.0 - _share(eligible["leap"], eligible["default"]),
        "eligible_savings_vs_lookup": 1.0 - _share(eligible["leap"], eligible["lookup"]),
        "queue_wait_p50_s": float(np.percentile(waits, 50)) if waits.size else 0.0,
        "queue_wait_p99_s": float(np.percentile(waits, 99)) if waits.size else 0.0,
        "eligible_hours_ranked_share": _share(
            sum(o.hours for o in routable if o.decision.hardware in o.record.learned), hours),
        "lookup_rankable_hours_share": _share(
            sum(o.hours for o in routable if o.decision.hardware in o.record.lookup), hours),
    }
    for name in ("default", "lookup", "oracle"):
        w = np.array([o.decision.wait_s for o in played[name]])
        out[f"{name}_cost_overrun_vs_oracle"] = _share(total[name], total["oracle"]) - 1.0
        out[f"{name}_queue_wait_p99_s"] = float(np.percentile(w, 99)) if w.size else 0.0
    return out


def side_by_side(records: Sequence[Record], schedules: dict[str, dict[str, float]],
                 capacity: FleetCapacity) -> list[dict[str, Any]]:
    """:func:`scenario` for capacity on and off under every price schedule."""
    return [scenario(records, prices, cap, name)
            for cap in (capacity, None) for name, prices in schedules.items()]

