"""The scheduler simulator: publishes submissions, waits for rankings, places and runs attempts.

It plays the real scheduler's part against the live workers over Kafka:

1. attempts from :class:`leap.fleet.engine.Fleet` arrive at ``rate`` per second; pinned ones (a share
   of jobs, :class:`leap.fleet.capacity.FleetCapacity`) are not routable and go straight to their part;
   the others are published as submissions;
2. each waits up to ``deadline_s`` for its ranking; none in time means default routing (the
   team's preference order), counted as unranked;
3. the attempt is placed in the fleet's pools (:class:`leap.fleet.pools.Cluster`): on the
   best-ranked candidate with room, or after a bounded wait for it, or on the next candidate;
   its start and finish events are published; the finish is emitted when the simulated clock
   passes its end.

Simulated time runs faster than wall time (``attempts_per_day`` sets how much), so jobs come
back with a history within a short demo. The report plays every attempt through LEAP's, default,
lookup-table and oracle routing under the same pools and prices (:mod:`leap.fleet.routing`), with
capacity on and off and under each price schedule.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from features.rows import build_rows
from features.snapshot import FeatureSnapshot
from leap.core.hardware import Catalogue
from leap.fleet.capacity import FleetCapacity
from leap.fleet.engine import Attempt, Draws, Fleet
from leap.fleet.pools import Cluster
from leap.fleet.routing import Record, options, side_by_side
from predictor.models import BASELINES, LookupTable
from predictor.ranking import rank_candidates
from predictor.service import NO_TRAINED_MODEL
from streams.client import SchedulerClient
from streams.events import JobFinish, Ranking


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
    record: Record | None = None
    wait_s: float = 0.0


@dataclass
class SimulatorReport:
    submissions: int = 0
    rankings: int = 0
    late_rankings: int = 0
    ranked_in_time: int = 0
    finishes_published: int = 0
    pinned: int = 0


def choose(ranking: Ranking, has_capacity: Callable[[str], bool]) -> str | None:
    """Best-ranked candidate with free capacity."""
    for cand in ranking.candidates:  # ranked candidates come first, in rank order
        if cand["rank"] is not None and has_capacity(cand["hardware"]):
            return str(cand["hardware"])
    return None


def lookup_throughputs(attempt: Attempt, snapshot: FeatureSnapshot, catalogue: Catalogue) -> dict[str, float]:
    """The lookup table's throughput (samples/s, all accelerators) per candidate it has a median for."""
    sub = attempt.submission
    pred = LookupTable().predict(build_rows(sub, snapshot, sub.candidates, catalogue))
    return {h: float(p) * sub.num_accelerators for h, p in zip(sub.candidates, pred.tolist(), strict=True)
            if np.isfinite(p) and p > 0}


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
    """Where default routing without capacity puts an attempt (the team's usual part, or the next
    when it is busy); :mod:`leap.fleet.routing` tries the team's whole order under capacity instead."""
    sub = attempt.submission
    return attempt.default_hardware or sub.requested_hardware or attempt.candidates[0]


def learned_candidates(ranking: Ranking) -> frozenset[str]:
    """Candidates a learned model predicted: ranked, no fallback reason, not a baseline's ranking."""
    model = ranking.model_version.split("-")[0]
    if model in BASELINES or NO_TRAINED_MODEL in (ranking.fallback or ""):
        return frozenset()
    return frozenset(str(c["hardware"]) for c in ranking.candidates if c["rank"] is not None and not c["reason"])


def ranked_throughputs(ranking: Ranking) -> dict[str, float]:
    """Predicted throughput (all accelerators) of each ranked candidate, in rank order."""
    return {str(c["hardware"]): float(c["predicted_throughput"]) for c in ranking.candidates
            if c["rank"] is not None and c["predicted_throughput"]}


def summarize(placements: list[Placement], deadline_ms: float) -> dict[str, Any]:
    """Coverage and latency of the live run (the routing figures come from :mod:`leap.fleet.routing`).

    Coverage weighs routable attempts by their accelerator-hours (measured on the finish);
    pinned attempts are not submitted and not counted.
    """
    placed = [p for p in placements if p.chosen is not None and not (p.record and p.record.pinned)]
    hours = np.array([p.finish.accelerator_hours if p.finish is not None else 0.0 for p in placed])
    ranked = np.array([p.ranking is not None for p in placed])
    lat = np.array([x for p in placements if (x := _latency(p)) is not None])
    waits = np.array([p.wait_s for p in placements if p.chosen is not None])
    return {
        "attempts_placed": sum(p.chosen is not None for p in placements),
        "coverage": float(hours[ranked].sum() / hours.sum()) if hours.sum() > 0 else 0.0,
        "coverage_by_count": float(ranked.mean()) if ranked.size else 0.0,
        "live_queue_wait_p50_s": float(np.percentile(waits, 50)) if waits.size else 0.0,
        "live_queue_wait_p99_s": float(np.percentile(waits, 99)) if waits.size else 0.0,
        "p50_ms": float(np.percentile(lat, 50)) if lat.size else None,
        "p99_ms": float(np.percentile(lat, 99)) if lat.size else None,
        "deadline_ms": deadline_ms,
    }


def _latency(p: Placement) -> float | None:
    return (p.ranked_at - p.published_at) * 1000.0 if p.ranked_at is not None else None


class SchedulerSimulator:
    """Drives submissions through the live system and places the attempts in the fleet's pools.

    Parameters
    ----------
    client
        Connected scheduler client (following rankings).
    fleet
        Attempt generator.
    catalogue
        Specs for the lookup table's rows.
    rate
        Submissions per wall-clock second.
    deadline_s
        How long a submission waits for its ranking before default routing.
    capacity
        Pools, pinning and queueing (:func:`leap.fleet.capacity.load_capacity`, scaled to the fleet's
        rate); None: no pool ever binds, no job is pinned and the report has no routing figures.
    limit
        Whether the live placements respect the pools (capacity on); the report plays both.
    schedules
        Price schedule name -> USD per accelerator-hour of every part; the report plays each.
    schedule
        The schedule the live placements (and the workers' rankings) use.
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
        capacity: FleetCapacity | None = None,
        limit: bool = True,
        schedules: dict[str, dict[str, float]] | None = None,
        schedule: str = "list",
        seed: int = 0,
    ) -> None:
        self.client = client
        self.fleet = fleet
        self.catalogue = catalogue
        self.rate = rate
        self.deadline_s = deadline_s
        self.capacity = capacity
        self.limit = limit
        self.schedules = schedules
        self.schedule = schedule
        self.seed = seed

    def _state(self) -> None:
        """Run state, built on first use so the constructor only stores its parameters."""
        if hasattr(self, "cluster"):
            return
        cap = self.capacity if self.limit else None
        self.cluster = Cluster(cap.pools if cap else None, cap.max_wait_s if cap else 0.0,
                               cap.wait_cost if cap else 0.0)
        self.prices = (self.schedules or {}).get(self.schedule) or {h.name: h.price_per_hour for h in self.catalogue}
        self.rng = np.random.default_rng(self.seed)
        self.placements: list[Placement] = []
        self.warm: list[Record] = []
        self.report = SimulatorReport()
        self._pending: dict[str, Placement] = {}
        self._finishes: list[tuple[float, int, JobFinish, str, int]] = []  # (sim end, seq, event, hw, n)
        self._seq = 0
        self.sim_clock = 0.0

    def _record(self, a: Attempt, warm: bool = False) -> Record:
        frac = float(Draws.sample(self.rng, 1).frac[0])
        cap, n = self.capacity, a.submission.num_accelerators
        # A job is pinned only to a part whose pool can hold it (else its team would not pin it there).
        pinned = (not warm and cap is not None and cap.pinned(a.submission.job_key)
                  and cap.pools.get(a.preference[0] if a.preference else "", 0) >= n)
        return Record(a, frac=frac, pinned=pinned, warm=warm)

    def _start(self, record: Record, routing: str) -> tuple[str, JobFinish, float] | None:
        """Place ``record`` in the live pools, publish its start; (part, finish, wait) or None."""
        a, n = record.attempt, record.n
        decision = self.cluster.place(options(routing, record, self.prices), n, a.submission.event_time,
                                      self.prices[record.preference[0]] * n)
        if decision is None:
            return None
        result = self.fleet.run(a, decision.hardware, self.rng, start_time=decision.start)
        self.cluster.commit(decision, result.finish.event_time - decision.start, n)
        self.client.publish_start(result.start)
        return decision.hardware, result.finish, decision.wait_s

    # -------------------------------------------------------------- history for a warm start

    def warm_up(self, attempts: int) -> int:
        """Publish the starts and finishes of ``attempts`` attempts placed by default routing.

        Returns the number of events published. Their jobs come back during the live run with
        a prior throughput, as they would in a fleet that has been running for a while, and
        the pools start as full as those runs leave them.
        """
        self._state()
        published = 0
        batch = self.fleet.sample_attempts(attempts)
        for a in batch:
            record = self._record(a, warm=True)
            placed = self._start(record, "default")
            if placed is None:
                continue
            self.warm.append(record)
            hw, finish, _ = placed
            self._seq += 1
            heapq.heappush(self._finishes, (finish.event_time, self._seq, finish, hw, record.n))
            published += 1
        self.sim_clock = batch[-1].submission.event_time if batch else self.sim_clock
        self._emit_due_finishes()
        published += self.report.finishes_published
        self.client.flush()
        return published

    # -------------------------------------------------------------- the live loop

    def _place(self, p: Placement, now: float) -> None:
        record = p.record
        assert record is not None
        if p.ranking is not None:
            record.leap = ranked_throughputs(p.ranking)
            record.learned = learned_candidates(p.ranking)
            record.lookup = lookup_throughputs(p.attempt, FeatureSnapshot.from_json(p.ranking.features_used),
                                               self.catalogue)
        placed = self._start(record, "leap")
        if placed is None:
            return
        p.chosen, p.finish, p.wait_s = placed
        self._seq += 1
        heapq.heappush(self._finishes, (p.finish.event_time, self._seq, p.finish, p.chosen, record.n))

    def _emit_due_finishes(self) -> None:
        while self._finishes and self._finishes[0][0] <= self.sim_clock:
            _, _, finish, _, _ = heapq.heappop(self._finishes)
            self.client.publish_finish(finish)
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

    def _arrive(self, a: Attempt, now: float) -> None:
        p = Placement(a, published_at=now, record=self._record(a))
        self.placements.append(p)
        self.sim_clock = max(self.sim_clock, a.submission.event_time)
        if p.record is not None and p.record.pinned:
            self.report.pinned += 1
            self._place(p, now)
            return
        self.client.publish(a.submission)
        self._pending[a.submission.attempt_id] = p
        self.report.submissions += 1

    def run(self, duration_s: float, on_tick: Callable[[SchedulerSimulator], None] | None = None) -> dict[str, Any]:
        """Run for ``duration_s`` wall seconds, then drain; returns the summary."""
        self._state()
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
                    self._arrive(a, now)
                del queue[:due]
                sent += due
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
        return self.summary(final=True)

    def summary(self, final: bool = False) -> dict[str, Any]:
        """Live figures; with ``final``, also every routing under every scenario (seconds of CPU)."""
        self._state()
        out = summarize(self.placements, self.deadline_s * 1000.0)
        out.update(
            submissions=self.report.submissions,
            pinned_attempts_live=self.report.pinned,
            rankings=self.report.rankings,
            ranked_in_time=self.report.ranked_in_time,
            late_rankings=self.report.late_rankings,
            finishes_published=self.report.finishes_published,
        )
        if final and self.capacity is not None and self.schedules:
            records = self.warm + [p.record for p in self.placements if p.record is not None]
            table = side_by_side(records, self.schedules, self.capacity)
            ours = next(s for s in table if s["capacity"] == self.limit and s["price_schedule"] == self.schedule)
            out.update(ours)
            out["side_by_side"] = table
        return out
