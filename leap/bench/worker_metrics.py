"""What a benchmarked worker says about itself on ``/metrics``: its transaction commits.

An exactly-once predictor's rankings are readable only once their transaction commits, and while
it commits it takes no submission: ``bench e2e`` reads the worker's
``leap_transaction_commit_seconds`` histogram before and after each run and reports the run's
commits, so that a tail can be told apart from the ranking itself.
"""

from __future__ import annotations

import math
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from leap.bench.common import Figures

COMMITS = "leap_transaction_commit_seconds"


@dataclass(frozen=True)
class Histogram:
    """A Prometheus histogram read at one moment: observations, their sum (seconds) and the
    cumulative count at each bucket's upper bound, in ascending order of bound."""

    count: float
    total_s: float
    buckets: tuple[tuple[float, float], ...]


def read_commits(port: int, host: str = "127.0.0.1", timeout: float = 5.0) -> Histogram:
    """The worker's commit histogram, scraped from ``http://host:port/metrics`` (empty when the
    worker never committed a transaction)."""
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout) as reply:
        text = reply.read().decode()
    count, total, buckets = 0.0, 0.0, []
    for family in text_string_to_metric_families(text):
        if family.name != COMMITS:
            continue
        for sample in family.samples:
            if sample.name == COMMITS + "_bucket":
                buckets.append((float(sample.labels["le"]), sample.value))
            elif sample.name == COMMITS + "_count":
                count = sample.value
            elif sample.name == COMMITS + "_sum":
                total = sample.value
    return Histogram(count, total, tuple(sorted(buckets)))


def commit_figures(before: Histogram, after: Histogram, seconds: float) -> Figures:
    """The commits between two reads: ``commits_per_s``, ``commit_mean_ms`` and
    ``commit_p99_ms_at_most`` (the upper bound of the bucket that holds the 99th percentile; NaN
    without commits, or when it lies above the largest finite bound)."""
    n = after.count - before.count
    if n <= 0:
        return {"commits_per_s": 0.0, "commit_mean_ms": math.nan, "commit_p99_ms_at_most": math.nan}
    earlier = dict(before.buckets)
    p99 = next((bound for bound, cum in after.buckets if cum - earlier.get(bound, 0.0) >= 0.99 * n), math.inf)
    return {"commits_per_s": n / seconds, "commit_mean_ms": (after.total_s - before.total_s) / n * 1000.0,
            "commit_p99_ms_at_most": p99 * 1000.0 if math.isfinite(p99) else math.nan}
