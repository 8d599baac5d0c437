"""Turns the aggregator's state into the JSON the page and ``/api/summary`` receive.

Built a few times a second at most; the work here grows with window sizes, never with the
number of events seen.
"""

from __future__ import annotations

import math
from typing import Any

from leap.dashboard.aggregator import Aggregator

FEED_TOP = 3


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[k]


def _basis_brief(basis: Any) -> dict[str, Any] | None:
    """What the feed shows of a candidate's ``basis``: evidence, estimate, the prior's hardware, the ratio
    (None for a schema-version-1 ranking, which has none)."""
    if not isinstance(basis, dict):
        return None
    return {"evidence": basis.get("evidence"), "estimate": basis.get("estimate"), "prior_hardware": basis.get("prior"),
            "ratio": basis.get("ratio")}


def _feed_item(received: float, r: dict[str, Any]) -> dict[str, Any]:
    ranked = [c for c in r.get("candidates", []) if isinstance(c.get("rank"), int)]
    ranked.sort(key=lambda c: c["rank"])
    return {
        "received": received,
        "job_key": r.get("job_key"),
        "attempt_id": r.get("attempt_id"),
        "model_version": r.get("model_version"),
        "best_hardware": r.get("best_hardware"),
        "fallback": r.get("fallback"),
        "latency_ms": r.get("latency_ms"),
        "candidates": len(r.get("candidates", [])),
        "top": [
            {
                "hardware": c.get("hardware"),
                "rank": c.get("rank"),
                "throughput_per_dollar": c.get("throughput_per_dollar"),
                "predicted_throughput": c.get("predicted_throughput"),
                "hourly_cost": c.get("hourly_cost"),
                "basis": _basis_brief(c.get("basis")),
            }
            for c in ranked[:FEED_TOP]
        ],
    }


def _savings(usd_requested: float, usd_best: float, changed: float, n: float) -> dict[str, Any]:
    return {
        "n": int(n),
        "savings": _share(usd_requested - usd_best, usd_requested),
        "usd_saved_per_requested_hour": (usd_requested - usd_best) / n if n else None,
        "rank1_differs_share": _share(changed, n),
    }


def _accuracy(agg: Aggregator) -> dict[str, Any]:
    acc = agg.accuracy
    n_acc = len(acc)
    return {
        "window": agg.config.accuracy_window,
        "n": n_acc,
        "acc@10": acc.sums[0] / n_acc if n_acc else None,
        "acc@20": acc.sums[1] / n_acc if n_acc else None,
        "mape": acc.sums[2] / acc.sums[3] if acc.sums[3] else None,
        "n_missing": int(n_acc - acc.sums[3]),
        "joined_total": agg.joined,
        "finishes_without_ranking": len(agg.early_finishes) + agg.early_finishes.evicted,
        "finishes_unmeasured": agg.finish_unmeasured,
        "finishes_not_candidate": agg.finish_not_candidate,
        "pending": len(agg.pending),
        "pending_evicted": agg.pending.evicted,
    }


def _series(agg: Aggregator, now: float) -> dict[str, Any]:
    seconds = agg.config.history_seconds
    end = int(now)
    rates = {k: ps.series(now) for k, ps in agg.per_second.items()}
    return {
        "end": end,
        "seconds": seconds,
        "rankings": rates["rankings"],
        "finishes": rates["finishes"],
        "submissions": rates["submissions"],
        "accuracy": [
            {"t": s, "acc@10": _finite(a10), "acc@20": _finite(a20)}
            for s, a10, a20 in agg.acc_series
            if s > end - seconds
        ],
    }


def build_summary(agg: Aggregator, now: float) -> dict[str, Any]:
    """See ``docs/dashboard.md`` for the meaning of every field."""
    lat = list(agg.latency_ms)
    return {
        "generated_at": now,
        "started_at": agg.started_at,
        "totals": {
            "rankings": agg.rankings,
            "finishes": agg.finishes,
            "submissions": agg.submissions,
            "duplicates": agg.duplicates,
            "malformed": {k: dict(v.counts) for k, v in agg.malformed.items() if v.counts},
        },
        "rates": {
            "rankings_per_s_10s": agg.per_second["rankings"].rate(now, 10),
            "rankings_per_s_60s": agg.per_second["rankings"].rate(now, 60),
            "finishes_per_s_10s": agg.per_second["finishes"].rate(now, 10),
            "submissions_per_s_10s": agg.per_second["submissions"].rate(now, 10),
        },
        "coverage": _share(agg.ranked, agg.rankings),
        "fallback_rate": _share(agg.with_fallback, agg.rankings),
        "fallback_reasons": dict(agg.fallback_reasons.top()),
        "best_hardware_share": [
            {"hardware": name, "count": count, "share": count / agg.ranked} for name, count in agg.best_share.top()
        ],
        "models": dict(agg.models.top()),
        "latency_ms": {
            "n": len(lat),
            "p50": _percentile(lat, 0.50),
            "p99": _percentile(lat, 0.99),
        },
        "accuracy": _accuracy(agg),
        "savings": {
            "window": agg.config.savings_window,
            "recent": _savings(agg.savings.sums[0], agg.savings.sums[1], agg.savings.sums[2], len(agg.savings)),
            "total": _savings(*agg.savings_total[:4]),
            "unpriced": agg.savings_unpriced,
            "awaiting_submission": len(agg.awaiting_submission),
        },
        "series": _series(agg, now),
        "feed": [_feed_item(t, r) for t, r in reversed(agg.feed)],
    }
