"""``bench dashboard-ingest``: how many rankings per second the dashboard aggregator ingests, on
synthetic payloads, in one thread. Payloads are built with
the production ranking code (``predictor.ranking.rank_candidates`` and the hardware catalogue)
so their size and shape match what the predictor publishes; building them is not timed.
"""

from __future__ import annotations

import resource
import time
import tracemalloc
from typing import Any

import numpy as np
import orjson

from leap.core.hardware import load_catalogue
from leap.dashboard.aggregator import Aggregator
from leap.dashboard.summary import build_summary
from predictor.ranking import rank_candidates
from streams.events import SCHEMA_VERSION

T0 = 1_790_000_000.0


def synthetic_events(n: int, seed: int = 0, candidates: int = 16) -> list[tuple[bytes, bytes, bytes]]:
    """``n`` (submission, ranking, finish) value triples of one attempt each.

    Parameters
    ----------
    n
        Attempts.
    seed
        Random seed.
    candidates
        Candidate hardware types per submission (the fleet simulator averages ~16).

    Returns
    -------
    list of tuple of bytes
        JSON values as they appear on ``leap.submissions``, ``leap.rankings`` and
        ``leap.job-finishes``.
    """
    rng = np.random.default_rng(seed)
    cat = load_catalogue()
    names_all = [h for h in cat.names() if cat.price(h)]
    out = []
    for i in range(n):
        names = [str(h) for h in rng.choice(names_all, size=min(candidates, len(names_all)), replace=False)]
        per_acc = rng.lognormal(5.0, 1.0, len(names))
        priced = rank_candidates(names, 8, per_acc, per_acc * 0.8, per_acc * 1.25, [None] * len(names), cat)
        attempt = f"job-{i % 5000}-a{i}"
        requested = names[int(rng.integers(len(names)))]
        sub = {"schema_version": SCHEMA_VERSION, "event_id": f"sub-{attempt}", "event_time": T0 + i,
               "job_key": f"job-{i % 5000}", "attempt_id": attempt, "requested_hardware": requested}
        features: dict[str, Any] = {
            "prior": {names[0]: [2, T0, 100.0, 101.0]},
            "lookup_model": {h: [12, 95.0] for h in names},
            "lookup_family": {h: [40, 90.0] for h in names},
            "attempts": [2, 1, 1, 0],
        }
        ranking = {
            "schema_version": SCHEMA_VERSION, "event_id": f"rank:sub-{attempt}", "event_time": T0 + i + 0.01,
            "job_key": f"job-{i % 5000}", "attempt_id": attempt, "submission_event_id": f"sub-{attempt}",
            "submission_time": T0 + i, "model_version": "lgbm-bench", "candidates": priced.candidates,
            "best_hardware": priced.best, "features_used": features, "fallback": None, "latency_ms": 4.2,
        }
        ran = priced.best or requested
        measured = float(per_acc[names.index(ran)]) * 8 * float(rng.lognormal(0.0, 0.15))
        finish = {
            "schema_version": SCHEMA_VERSION, "event_id": f"finish-{attempt}", "event_time": T0 + i + 3600,
            "job_key": f"job-{i % 5000}", "attempt_id": attempt, "model_type": "m", "family": "dense_lm",
            "hardware": ran, "num_accelerators": 8, "throughput": measured, "accelerator_hours": 8.0,
            "outcome": "completed", "start_time": T0 + i + 60,
        }
        out.append((orjson.dumps(sub), orjson.dumps(ranking), orjson.dumps(finish)))
    return out


def measure(n: int = 100_000, seed: int = 0) -> dict[str, Any]:
    """Time the aggregator on ``n`` synthetic attempts, in one process, one thread.

    Returns
    -------
    dict
        ``rankings_only_per_s``: rankings alone; ``mixed_rankings_per_s``: each ranking together
        with its submission and finish (3 messages per ranking, as the dashboard reads them);
        sizes; memory the aggregator retains; the whole process's peak RSS (payloads included).
    """
    events = synthetic_events(n, seed)
    agg = Aggregator()
    now = time.time()
    start = time.perf_counter()
    for _, ranking, _ in events:
        agg.add("ranking", ranking, now)
    ranking_s = time.perf_counter() - start
    del agg

    # Memory the aggregator keeps (not timed: tracemalloc slows allocation). Rankings without
    # finishes are the worst case: every one waits in the pending map until it is evicted.
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    agg = Aggregator()
    for _, ranking, _ in events:
        agg.add("ranking", ranking, now)
    retained_mb = (tracemalloc.get_traced_memory()[0] - base) / 2**20
    tracemalloc.stop()
    pending = len(agg.pending)
    del agg

    agg = Aggregator()
    start = time.perf_counter()
    for sub, ranking, finish in events:
        agg.add("submission", sub, now)
        agg.add("ranking", ranking, now)
        agg.add("finish", finish, now)
    mixed_s = time.perf_counter() - start
    summary_start = time.perf_counter()
    summary = build_summary(agg, now)
    summary_ms = (time.perf_counter() - summary_start) * 1000
    return {
        "rankings": n,
        "ranking_bytes_mean": sum(len(r) for _, r, _ in events) / n,
        "rankings_only_per_s": n / ranking_s,
        "mixed_rankings_per_s": n / mixed_s,
        "us_per_ranking_mixed": mixed_s / n * 1e6,
        "summary_ms": summary_ms,
        "retained_mb_rankings_only": retained_mb,
        "pending_after_rankings_only": pending,
        "summary_bytes": len(orjson.dumps(summary)),
        "joined": summary["accuracy"]["joined_total"],
        "process_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
