"""Server-side aggregation of the ranking stream: O(1) work per event, bounded memory.

The Kafka thread feeds raw message values in; the web server asks for :meth:`Aggregator.summary`
a few times a second. The page never sees individual events beyond a short feed.

Events are read with ``orjson`` and only the fields the dashboard shows are checked. The full
contract check (``Ranking.decode``) costs several times what ``orjson.loads`` alone does, and the
workers already validate what they publish; a value the dashboard cannot read is counted as
malformed and skipped, never raised.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from array import array
from collections import deque
from dataclasses import dataclass
from typing import Any

import orjson

from leap.core.accuracy import relative_error, within
from leap.dashboard.rolling import BoundedMap, LabelCounter, PerSecond, SeenSet, WindowSums

NAN = float("nan")


@dataclass(frozen=True)
class AggregatorConfig:
    """Sizes of every window and map the aggregator keeps.

    Parameters
    ----------
    feed_size
        Rankings shown in the live feed.
    accuracy_window
        Joined (ranking, finish) pairs behind the rolling acc@10 / acc@20 / MAPE.
    savings_window
        Rankings behind the rolling savings estimate.
    pending_limit
        Rankings kept while they wait for their attempt's finish, and finishes kept while they wait
        for their ranking; the oldest are dropped beyond it.
    requested_limit
        Submissions kept (their requested hardware) while they wait for their ranking.
    history_seconds
        Length of the per-second series behind the line charts.
    seen_limit
        Event ids remembered to drop re-delivered duplicates.
    max_labels
        Distinct hardware / reason / model labels counted before the rest go to ``(other)``.
    candidate_lists
        Distinct candidate lists kept as one shared copy each (the cache is emptied when full).
    """

    feed_size: int = 25
    accuracy_window: int = 1000
    savings_window: int = 1000
    pending_limit: int = 50_000
    requested_limit: int = 50_000
    history_seconds: int = 120
    seen_limit: int = 65_536
    max_labels: int = 64
    candidate_lists: int = 4096


class Malformed(ValueError):
    """A value the dashboard cannot read; ``reason`` is a short code."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _num(value: Any) -> float:
    """A JSON number as float; NaN for null or anything else."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return NAN


def _str(payload: dict[str, Any], key: str) -> str:
    value = payload.get(key)
    if not isinstance(value, str) or not value:
        raise Malformed(f"bad_{key}")
    return value


def _opt_str(payload: dict[str, Any], key: str) -> str | None:
    value = payload.get(key)
    if value is not None and not isinstance(value, str):
        raise Malformed(f"bad_{key}")
    return value or None


def _load(raw: bytes | None) -> dict[str, Any]:
    if raw is None:
        raise Malformed("no_value")
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise Malformed("bad_json") from None
    if not isinstance(payload, dict):
        raise Malformed("bad_json")
    return payload


class _Ranked:
    """What one ranking leaves behind until its attempt finishes.

    Kept compact because up to ``pending_limit`` of them live at once: interned candidate names
    and one float array ``[throughput..., per_dollar..., hourly_cost...]`` (NaN = null).
    """

    __slots__ = ("best", "names", "values")

    def __init__(self, names: tuple[str, ...], values: array, best: int) -> None:
        self.names = names
        self.values = values
        self.best = best  # index of rank 1, -1 when nothing was ranked

    def throughput(self, i: int) -> float:
        return self.values[i]

    def per_dollar(self, i: int) -> float:
        return self.values[len(self.names) + i]

    def cost(self, i: int) -> float:
        return self.values[2 * len(self.names) + i]


class Aggregator:
    """Counts, rolling windows and joins over rankings, finishes and submissions.

    Not thread-safe by itself: callers hold :attr:`lock` around ``add_*``/``tick`` batches and
    around :func:`leap.dashboard.summary.build_summary` (the Kafka thread and the web server do).

    Parameters
    ----------
    config
        Window and map sizes.
    """

    def __init__(self, config: AggregatorConfig | None = None) -> None:
        c = self.config = config or AggregatorConfig()
        self.lock = threading.Lock()
        self.started_at = time.time()
        self.rankings = 0
        self.ranked = 0  # rankings with a best_hardware
        self.with_fallback = 0
        self.finishes = 0
        self.submissions = 0
        self.duplicates = 0
        self.malformed: dict[str, LabelCounter] = {t: LabelCounter(16) for t in ("ranking", "finish", "submission")}
        self.best_share = LabelCounter(c.max_labels)
        self.fallback_reasons = LabelCounter(c.max_labels)
        self.models = LabelCounter(c.max_labels)
        self.latency_ms: deque[float] = deque(maxlen=2048)
        self.feed: deque[tuple[float, dict[str, Any]]] = deque(maxlen=c.feed_size)
        self.per_second = {k: PerSecond(c.history_seconds) for k in ("rankings", "finishes", "submissions")}
        # accuracy: rows of (hit@10, hit@20, error or 0, 1 if error is finite)
        self.accuracy = WindowSums(c.accuracy_window, 4)
        self.acc_series: deque[tuple[int, float, float]] = deque(maxlen=c.history_seconds)
        self.joined = 0
        self.finish_unmeasured = 0  # failed/preempted without throughput: nothing to compare
        self.finish_not_candidate = 0  # ran on hardware the ranking did not list
        # savings: rows of (USD on requested, USD on rank 1 for the same samples, 1 if rank 1 != requested)
        self.savings = WindowSums(c.savings_window, 3)
        self.savings_total = [0.0, 0.0, 0.0, 0.0]  # same three sums + count, since start
        self.savings_unpriced = 0  # requested hardware known but not priced in the ranking
        self.pending: BoundedMap[str, _Ranked] = BoundedMap(c.pending_limit)
        self.requested: BoundedMap[str, str] = BoundedMap(c.requested_limit)
        self.awaiting_submission: BoundedMap[str, _Ranked] = BoundedMap(c.requested_limit)
        # measured finishes whose ranking has not been read (yet): (hardware, throughput)
        self.early_finishes: BoundedMap[str, tuple[str, float]] = BoundedMap(c.pending_limit)
        self._seen = {t: SeenSet(c.seen_limit) for t in ("ranking", "finish", "submission")}
        self._names: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._last_second = 0

    # ------------------------------------------------------------------ ingest

    def add(self, kind: str, raw: bytes | None, now: float) -> bool:
        """Ingest one message value of ``kind`` (``ranking``, ``finish`` or ``submission``).

        Returns ``False`` when the value was malformed or a duplicate (counted, then skipped).
        """
        try:
            if kind == "ranking":
                return self.add_ranking(_load(raw), now)
            if kind == "finish":
                return self.add_finish(_load(raw), now)
            if kind == "submission":
                return self.add_submission(_load(raw), now)
            raise ValueError(f"unknown kind {kind!r}")
        except Malformed as exc:
            self.malformed[kind].add(exc.reason)
            return False

    def _intern(self, names: tuple[str, ...]) -> tuple[str, ...]:
        # Most submissions share a handful of candidate lists: keep one copy of each.
        got = self._names.get(names)
        if got is None:
            if len(self._names) >= self.config.candidate_lists:
                self._names.clear()
            got = self._names[names] = tuple(sys.intern(n) for n in names)
        return got

    def add_ranking(self, payload: dict[str, Any], now: float) -> bool:
        """Ingest a decoded ranking (see :data:`streams.events.RANKING_FIELDS`)."""
        attempt = _str(payload, "attempt_id")
        event_id = _str(payload, "event_id")
        best_hw = _opt_str(payload, "best_hardware")
        fallback = _opt_str(payload, "fallback")
        cands = payload.get("candidates")
        if not isinstance(cands, list) or not all(isinstance(c, dict) for c in cands):
            raise Malformed("bad_candidates")
        names = []
        tput, per_dollar, cost = [], [], []
        best = -1
        for i, c in enumerate(cands):
            hw = c.get("hardware")
            if not isinstance(hw, str):
                raise Malformed("bad_candidates")
            names.append(hw)
            tput.append(_num(c.get("predicted_throughput")))
            per_dollar.append(_num(c.get("throughput_per_dollar")))
            cost.append(_num(c.get("hourly_cost")))
            if c.get("rank") == 1:
                best = i
        if not self._seen["ranking"].add(event_id):
            self.duplicates += 1
            return False
        self.rankings += 1
        self.per_second["rankings"].add(now)
        self.ranked += best_hw is not None
        if best_hw is not None:
            self.best_share.add(best_hw)
        if fallback:
            self.with_fallback += 1
            for reason in fallback.split(","):
                self.fallback_reasons.add(reason)
        model = payload.get("model_version")
        self.models.add(model if isinstance(model, str) else "?")
        latency = _num(payload.get("latency_ms"))
        if math.isfinite(latency):
            self.latency_ms.append(latency)
        self.feed.append((now, payload))
        entry = _Ranked(self._intern(tuple(names)), array("d", tput + per_dollar + cost), best)
        early = self.early_finishes.pop(attempt)
        if early is not None:
            self._score(entry, *early)
        else:
            self.pending.put(attempt, entry)
        requested = self.requested.pop(attempt)
        if requested is None:
            self.awaiting_submission.put(attempt, entry)
        elif requested:
            self._add_savings(entry, requested)
        self.tick(now)
        return True

    def add_submission(self, payload: dict[str, Any], now: float) -> bool:
        """Ingest a decoded submission: only its requested hardware is kept, for savings."""
        attempt = _str(payload, "attempt_id")
        if not self._seen["submission"].add(_str(payload, "event_id")):
            self.duplicates += 1
            return False
        requested = _opt_str(payload, "requested_hardware")
        self.submissions += 1
        self.per_second["submissions"].add(now)
        entry = self.awaiting_submission.pop(attempt)
        if entry is not None:  # the ranking was read first (two topics are not ordered together)
            if requested is not None:
                self._add_savings(entry, requested)
        else:
            # "" marks a submission that named no requested hardware: nothing to compare with
            self.requested.put(attempt, sys.intern(requested) if requested else "")
        return True

    def add_finish(self, payload: dict[str, Any], now: float) -> bool:
        """Ingest a decoded job finish and, if its attempt was ranked, score the prediction."""
        attempt = _str(payload, "attempt_id")
        hardware = _str(payload, "hardware")
        if not self._seen["finish"].add(_str(payload, "event_id")):
            self.duplicates += 1
            return False
        self.finishes += 1
        self.per_second["finishes"].add(now)
        measured = _num(payload.get("throughput"))
        entry = self.pending.pop(attempt)
        if not (math.isfinite(measured) and measured > 0):
            self.finish_unmeasured += 1
        elif entry is None:
            # Either never ranked (or ranked before the dashboard started), or the ranking is still
            # on its way: two topics are not read in order, and on replay finishes can come first.
            self.early_finishes.put(attempt, (sys.intern(hardware), measured))
        else:
            self._score(entry, hardware, measured)
        self.tick(now)
        return True

    def _score(self, entry: _Ranked, hardware: str, measured: float) -> None:
        if hardware not in entry.names:
            self.finish_not_candidate += 1
            return
        pred = entry.throughput(entry.names.index(hardware))
        # The scalar forms of leap.core.accuracy's definitions, so these rolling sums equal
        # leap.core.accuracy.summary on the same pairs: a missing prediction (NaN error) is a miss
        # and is left out of MAPE. ``measured`` was checked positive by add_finish.
        err = relative_error(pred, measured)
        finite = math.isfinite(err)
        self.accuracy.add((
            float(within(err, 0.10)),
            float(within(err, 0.20)),
            err if finite else 0.0,
            float(finite),
        ))
        self.joined += 1

    def _add_savings(self, entry: _Ranked, requested: str) -> None:
        if entry.best < 0 or requested not in entry.names:
            return
        i = entry.names.index(requested)
        req_tput, req_pd, req_cost = entry.throughput(i), entry.per_dollar(i), entry.cost(i)
        best_pd = entry.per_dollar(entry.best)
        if not all(math.isfinite(x) and x > 0 for x in (req_tput, req_pd, req_cost, best_pd)):
            self.savings_unpriced += 1
            return
        # One hour of the requested hardware's predicted work, priced there and on rank 1.
        row = (req_cost, req_tput * 3600.0 / best_pd, float(entry.names[entry.best] != requested))
        self.savings.add(row)
        total = self.savings_total
        total[0] += row[0]
        total[1] += row[1]
        total[2] += row[2]
        total[3] += 1

    def tick(self, now: float) -> None:
        """Record one point of the rolling-accuracy line per elapsed second (cheap when called often)."""
        second = int(now)
        if second == self._last_second:
            return
        self._last_second = second
        acc = self.accuracy
        n = len(acc)
        self.acc_series.append((second, acc.sums[0] / n if n else NAN, acc.sums[1] / n if n else NAN))
