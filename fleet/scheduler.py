"""The scheduler simulator: publishes submissions, waits for rankings, places and runs attempts.

It plays the real scheduler's part against the live workers over Kafka:

1. submissions from :class:`fleet.engine.Fleet` are published at ``rate`` per second;
2. each waits up to ``deadline_s`` for its ranking; none in time means default routing (the
   team's usual part, or its next choice when that one is busy: :attr:`Attempt.default_hardware`),
   counted as unranked;
3. the attempt goes to the best-ranked candidate with free capacity and its start and finish
   events are published; the finish is emitted when the simulated clock passes its end.

Simulated time runs faster than wall time (``attempts_per_day`` sets how much), so jobs come
back with a history within a short demo. The report compares what was paid with what default
routing, lookup-table routing and the oracle would have paid for the same attempts.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from core.hardware import Catalogue
from features.rows import build_rows
from features.snapshot import FeatureSnapshot
from fleet.engine import Attempt, Fleet
from predictor.models import LookupTable
from predictor.ranking import rank_candidates
from streams.client import SchedulerClient
from streams.events import JobFinish, Ranking

#: Accelerators per hardware type when none are given: large enough not to bind, so that the
#: savings figures compare routing policies rather than queueing. Pass ``capacity`` to study
#: contention (the counterfactual routings in the report do not model capacity).
DEFAULT_CAPACITY = 1_000_000


@dataclass
class Placement:
    """One attempt's fate, kept for the report."""

    attempt: Attempt
    published_at: float
    ranking: Ranking | None = None
    ranked_at: float | None = None
    chosen: str | None = None
    lookup_choice: str | None = None
    finish: JobFinish | None = None


@dataclass
class SimulatorReport:
    submissions: int = 0
    rankings: int = 0
    late_rankings: int = 0
    ranked_in_time: int = 0
    finishes_published: int = 0


def choose(ranking: Ranking, has_capacity: Callable[[str], bool]) -> str | None:
    """Best-ranked candidate with free capacity."""
    for cand in ranking.candidates:  # ranked candidates come first, in rank order
        if cand["rank"] is not None and has_capacity(cand["hardware"]):
            return str(cand["hardware"])
    return None


def lookup_choice(attempt: Attempt, snapshot: FeatureSnapshot, catalogue: Catalogue) -> str:
    """Where the lookup table that LEAP replaced would have put the attempt, given the same features.

    The table knows the median throughput of a model type (else its family) on the parts where
    such jobs ran before, and nothing else: it moves a job from its default part to the
    cheapest per sample among the parts it has medians for, and only when it has one for the
    default part too (it cannot tell that a part it knows nothing about is worse). Without
    medians the job stays where default routing puts it.
    """
    sub = attempt.submission
    default = default_hardware(attempt)
    rows = build_rows(sub, snapshot, sub.candidates, catalogue)
    pred = LookupTable().predict(rows)
    known = dict(zip(sub.candidates, pred.tolist(), strict=True))
    if not np.isfinite(known.get(default, np.nan)):
        return default
    priced = rank_candidates(sub.candidates, sub.num_accelerators, pred, pred, pred, [None] * len(pred), catalogue)
    return priced.best or default


def default_hardware(attempt: Attempt) -> str:
    """Where default routing puts an attempt (the team's usual part, or the next when it is busy)."""
    sub = attempt.submission
    return attempt.default_hardware or sub.requested_hardware or attempt.candidates[0]


def cost_per_sample(attempt: Attempt, hardware: str, catalogue: Catalogue) -> float:
    """USD per sample on ``hardware`` at the attempt's expected (oracle) throughput."""
    price = catalogue.price(hardware) or float("nan")
    return price * attempt.submission.num_accelerators / 3600.0 / attempt.oracle[hardware]


def summarize(placements: list[Placement], catalogue: Catalogue, deadline_ms: float) -> dict[str, Any]:
    """Coverage, savings and cost overrun over the attempts that were placed.

    Coverage weighs attempts by their accelerator-hours (measured on the finish, else expected);
    costs weigh by the attempt's work, priced at expected throughput so noise does not favour
    one routing over another. ``cost_overrun_vs_oracle`` is the total cost of where the attempts
    ran (under capacity limits) over the oracle's, minus one: not the backtest's regret
    (:func:`core.accuracy.regret`, a mean per-attempt ratio without capacity), hence the name.
    """
    placed = [p for p in placements if p.chosen is not None]
    hours = np.array([
        p.finish.accelerator_hours if p.finish is not None
        else p.attempt.work_samples / p.attempt.oracle[p.chosen] * p.attempt.submission.num_accelerators / 3600.0
        for p in placed if p.chosen is not None
    ])
    ranked = np.array([p.ranking is not None for p in placed])
    cost: dict[str, float] = {"leap": 0.0, "default": 0.0, "lookup": 0.0, "oracle": 0.0}
    for p in placed:
        a, chosen = p.attempt, p.chosen
        assert chosen is not None
        default = default_hardware(a)
        best = min(a.candidates, key=lambda h: cost_per_sample(a, h, catalogue))
        cost["leap"] += a.work_samples * cost_per_sample(a, chosen, catalogue)
        cost["default"] += a.work_samples * cost_per_sample(a, default, catalogue)
        cost["lookup"] += a.work_samples * cost_per_sample(a, p.lookup_choice or default, catalogue)
        cost["oracle"] += a.work_samples * cost_per_sample(a, best, catalogue)
    lat = np.array([x for p in placements if (x := _latency(p)) is not None])
    return {
        "attempts_placed": len(placed),
        "coverage": float(hours[ranked].sum() / hours.sum()) if hours.size else 0.0,
        "coverage_by_count": float(ranked.mean()) if ranked.size else 0.0,
        "savings_vs_default": 1.0 - cost["leap"] / cost["default"] if cost["default"] else 0.0,
        "savings_vs_lookup": 1.0 - cost["leap"] / cost["lookup"] if cost["lookup"] else 0.0,
        "cost_overrun_vs_oracle": cost["leap"] / cost["oracle"] - 1.0 if cost["oracle"] else 0.0,
        "lookup_cost_overrun_vs_oracle": cost["lookup"] / cost["oracle"] - 1.0 if cost["oracle"] else 0.0,
        "default_cost_overrun_vs_oracle": cost["default"] / cost["oracle"] - 1.0 if cost["oracle"] else 0.0,
        "p50_ms": float(np.percentile(lat, 50)) if lat.size else None,
        "p99_ms": float(np.percentile(lat, 99)) if lat.size else None,
        "deadline_ms": deadline_ms,
    }


def _latency(p: Placement) -> float | None:
    return (p.ranked_at - p.published_at) * 1000.0 if p.ranked_at is not None else None


class SchedulerSimulator:
    """Drives submissions through the live system and places the attempts.

    Parameters
    ----------
    client
        Connected scheduler client (following rankings).
    fleet
        Attempt generator.
    catalogue
        Prices, for placement reports and lookup routing.
    rate
        Submissions per wall-clock second.
    deadline_s
        How long a submission waits for its ranking before default routing.
    capacity
        Accelerators per hardware type (default: :data:`DEFAULT_CAPACITY`, scarcer new parts).
    seed
        Seeds run-to-run noise, stragglers and failures.
    """

    def __init__(
        self,
        client: SchedulerClient,
        fleet: Fleet,
        catalogue: Catalogue,
        rate: float = 50.0,
        deadline_s: float = 0.5,
        capacity: dict[str, int] | None = None,
        seed: int = 0,
    ) -> None:
        self.client = client
        self.fleet = fleet
        self.catalogue = catalogue
        self.rate = rate
        self.deadline_s = deadline_s
        self.capacity = dict(capacity) if capacity else {}
        self.in_use: dict[str, int] = {}
        self.rng = np.random.default_rng(seed)
        self.placements: list[Placement] = []
        self.report = SimulatorReport()
        self._pending: dict[str, Placement] = {}
        self._finishes: list[tuple[float, int, JobFinish, str, int]] = []  # (sim end, seq, event, hw, n)
        self._seq = 0
        self.sim_clock = 0.0

    # -------------------------------------------------------------- history for a warm start

    def warm_up(self, attempts: int) -> int:
        """Publish the starts and finishes of ``attempts`` attempts placed by default routing.

        Returns the number of events published. Their jobs come back during the live run with
        a prior throughput, as they would in a fleet that has been running for a while.
        """
        published = 0
        batch = self.fleet.sample_attempts(attempts)
        for a in batch:
            result = self.fleet.run(a, default_hardware(a), self.rng)
            self.client.publish_start(result.start)
            self.client.publish_finish(result.finish)
            published += 2
        self.client.flush()
        self.sim_clock = batch[-1].submission.event_time if batch else self.sim_clock
        return published

    # -------------------------------------------------------------- the live loop

    def _has_capacity(self, hw: str, n: int) -> bool:
        return self.in_use.get(hw, 0) + n <= self.capacity.get(hw, DEFAULT_CAPACITY)

    def _place(self, p: Placement, now: float) -> None:
        a = p.attempt
        n = a.submission.num_accelerators
        chosen = choose(p.ranking, lambda h: self._has_capacity(h, n)) if p.ranking is not None else None
        if chosen is None:
            chosen = default_hardware(a)
        if p.ranking is not None:
            snap = FeatureSnapshot.from_json(p.ranking.features_used)
            p.lookup_choice = lookup_choice(a, snap, self.catalogue)
        p.chosen = chosen
        result = self.fleet.run(a, chosen, self.rng)
        p.finish = result.finish
        self.in_use[chosen] = self.in_use.get(chosen, 0) + n
        self.client.publish_start(result.start)
        self._seq += 1
        heapq.heappush(self._finishes, (result.finish.event_time, self._seq, result.finish, chosen, n))

    def _emit_due_finishes(self) -> None:
        while self._finishes and self._finishes[0][0] <= self.sim_clock:
            _, _, finish, hw, n = heapq.heappop(self._finishes)
            self.client.publish_finish(finish)
            self.in_use[hw] -= n
            self.report.finishes_published += 1

    def _collect_rankings(self, now: float, wait: float) -> None:
        for ranking, at in self.client.rankings(timeout=wait):
            p = self._pending.get(ranking.attempt_id)
            self.report.rankings += p is not None
            if p is None:
                continue
            if at - p.published_at <= self.deadline_s:
                p.ranking, p.ranked_at = ranking, at
                self.report.ranked_in_time += 1
            else:
                self.report.late_rankings += 1
                p.ranked_at = at
            del self._pending[ranking.attempt_id]
            self._place(p, at)

    def _expire(self, now: float) -> None:
        for attempt_id, p in list(self._pending.items()):
            if now - p.published_at > self.deadline_s:
                del self._pending[attempt_id]
                self._place(p, now)  # default routing: counted as unranked

    def run(self, duration_s: float, on_tick: Callable[[SchedulerSimulator], None] | None = None) -> dict[str, Any]:
        """Run for ``duration_s`` wall seconds, then drain; returns the summary."""
        start = time.monotonic()
        sent = 0
        last_tick = start
        queue: list[Attempt] = []
        while (elapsed := time.monotonic() - start) < duration_s:
            due = int(elapsed * self.rate) + 1 - sent
            if due > 0:
                if len(queue) < due:
                    queue.extend(self.fleet.sample_attempts(max(due, 200)))
                now = time.time()
                for a in queue[:due]:
                    self.client.publish(a.submission)
                    p = Placement(a, published_at=now)
                    self.placements.append(p)
                    self._pending[a.submission.attempt_id] = p
                    self.sim_clock = max(self.sim_clock, a.submission.event_time)
                del queue[:due]
                sent += due
                self.report.submissions = sent
                self.client.producer.poll(0)
            self._collect_rankings(time.time(), wait=0.005)
            self._expire(time.time())
            self._emit_due_finishes()
            if on_tick is not None and time.monotonic() - last_tick >= 1.0:
                last_tick = time.monotonic()
                on_tick(self)
        drain_until = time.monotonic() + self.deadline_s + 0.2
        while self._pending and time.monotonic() < drain_until:
            self._collect_rankings(time.time(), wait=0.02)
        self._expire(time.time() + self.deadline_s + 1)
        self.client.flush()
        return self.summary()

    def summary(self) -> dict[str, Any]:
        out = summarize(self.placements, self.catalogue, self.deadline_s * 1000.0)
        out.update(
            submissions=self.report.submissions,
            rankings=self.report.rankings,
            ranked_in_time=self.report.ranked_in_time,
            late_rankings=self.report.late_rankings,
            finishes_published=self.report.finishes_published,
        )
        return out
