"""Accelerator pools under a first-come-first-served queue, and where a scheduler places an attempt.

A :class:`Pool` knows every attempt it has committed to (running or queued) by its end time.
Queued attempts start in submission order (no backfilling), so a new attempt starts no earlier
than the last committed start, and then as soon as enough accelerators are free: that start is
exact at the moment of the decision. :func:`place` is the one placement rule that every routing
(LEAP's, default, lookup table, oracle) goes through, so they differ only in the order and the
cost estimates they bring.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field


@dataclass
class Pool:
    """Accelerators of one hardware type (``capacity`` ``inf``: never binds)."""

    capacity: float
    _ends: list[tuple[float, int, int]] = field(default_factory=list)  # (end, seq, accelerators)
    _committed: int = 0
    _last_start: float = -math.inf
    _seq: int = 0

    def _release(self, now: float) -> None:
        drop = bisect.bisect_right(self._ends, (now, math.inf, 0))
        if drop:
            self._committed -= sum(n for _, _, n in self._ends[:drop])
            del self._ends[:drop]

    def earliest_start(self, n: int, now: float) -> float:
        """When an attempt of ``n`` accelerators arriving at ``now`` would start (``inf``: never fits)."""
        if n > self.capacity:
            return math.inf
        if math.isinf(self.capacity):
            return now
        self._release(now)
        t = max(now, self._last_start)
        free = self.capacity - self._committed
        for end, _, m in self._ends:
            if end <= t:
                free += m
            elif free >= n:
                break
            else:
                free += m
                t = end
        return t

    def commit(self, start: float, end: float, n: int) -> None:
        """Hold ``n`` accelerators from ``start`` to ``end`` (``start`` from :meth:`earliest_start`)."""
        if math.isinf(self.capacity):
            return
        self._seq += 1
        bisect.insort(self._ends, (end, self._seq, n))
        self._committed += n
        self._last_start = max(self._last_start, start)


@dataclass(frozen=True)
class Option:
    """A candidate as a routing sees it: the part and what the routing expects its run to cost (USD)."""

    hardware: str
    expected_cost: float


@dataclass(frozen=True)
class Decision:
    hardware: str
    start: float
    wait_s: float


class Cluster:
    """Pools by hardware type, with a clock that only moves forward.

    Parameters
    ----------
    pools
        Accelerators per canonical hardware name; ``None`` for pools that never bind (capacity
        off). A part missing from ``pools`` has no accelerators.
    max_wait_s
        Longest wait accepted for a better part while another can start sooner.
    wait_cost
        Hours of the job's reference allocation that a waiting hour costs.
    """

    def __init__(self, pools: dict[str, int] | None, max_wait_s: float, wait_cost: float) -> None:
        self.pools = pools
        self.max_wait_s = max_wait_s
        self.wait_cost = wait_cost
        self._pools: dict[str, Pool] = {}
        self.clock = -math.inf

    def pool(self, hardware: str) -> Pool:
        if hardware not in self._pools:
            capacity = math.inf if self.pools is None else float(self.pools.get(hardware, 0))
            self._pools[hardware] = Pool(capacity)
        return self._pools[hardware]

    def place(self, options: list[Option], n: int, now: float, waiting_hourly: float) -> Decision | None:
        """Where an attempt of ``n`` accelerators arriving at ``now`` goes (None: no pool can ever hold it).

        Among the options that can start within ``max_wait_s``, the one with the lowest expected
        cost plus ``wait_cost x waiting_hourly`` per hour of wait: the best-ranked part with
        room, or a wait for it, or the next candidate. When none can start that soon, the one
        that starts first. Options are tried cheapest first and the search stops once no
        remaining one can beat the best found, since a wait only adds to a cost.
        """
        self.clock = now = max(self.clock, now)  # placements arrive slightly out of order
        best: tuple[float, Decision] | None = None
        for opt in sorted(options, key=lambda o: o.expected_cost):  # stable: ties keep the routing's order
            if best is not None and opt.expected_cost >= best[0]:
                break
            start = self.pool(opt.hardware).earliest_start(n, now)
            if start - now > self.max_wait_s:
                continue
            total = opt.expected_cost + (start - now) / 3600.0 * waiting_hourly * self.wait_cost
            if best is None or total < best[0]:
                best = (total, Decision(opt.hardware, start, start - now))
        if best is not None:
            return best[1]
        starts = [(self.pool(o.hardware).earliest_start(n, now), i, o.hardware) for i, o in enumerate(options)]
        start, _, hardware = min(starts, default=(math.inf, 0, ""))
        return Decision(hardware, start, start - now) if math.isfinite(start) else None

    def commit(self, decision: Decision, seconds: float, n: int) -> None:
        """Hold the pool of ``decision`` for ``seconds`` from its start."""
        self.pool(decision.hardware).commit(decision.start, decision.start + seconds, n)
