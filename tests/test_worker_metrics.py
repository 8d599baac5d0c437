"""leap.bench.worker_metrics: a worker's commit histogram, read over HTTP, and a run's commit figures."""

from __future__ import annotations

import math

from leap.bench.private_services import free_port
from leap.bench.worker_metrics import Histogram, commit_figures, read_commits
from streams.metrics import TRANSACTION_COMMIT, serve


def test_a_runs_figures_are_the_commits_between_two_reads() -> None:
    before = Histogram(10, 0.5, ((0.01, 8), (0.1, 10), (math.inf, 10)))
    after = Histogram(110, 2.5, ((0.01, 50), (0.1, 109), (math.inf, 110)))
    got = commit_figures(before, after, seconds=4.0)
    assert got["commits_per_s"] == 25.0  # 100 commits in 4 s
    assert math.isclose(got["commit_mean_ms"], 20.0)  # 2.0 s over 100 commits
    assert got["commit_p99_ms_at_most"] == 100.0  # 99 of 100 at most 0.1 s (42 at most 0.01 s)
    beyond = Histogram(110, 2.5, ((0.01, 50), (0.1, 60), (math.inf, 110)))
    assert math.isnan(commit_figures(before, beyond, seconds=4.0)["commit_p99_ms_at_most"])  # above every bound
    none = commit_figures(before, before, seconds=4.0)
    assert none["commits_per_s"] == 0.0 and math.isnan(none["commit_mean_ms"])


def test_the_histogram_is_read_from_a_metrics_endpoint() -> None:
    port = free_port()
    serve(port)  # this process's registry, as a worker serves it
    first = read_commits(port)
    TRANSACTION_COMMIT.observe(0.004)
    TRANSACTION_COMMIT.observe(0.3)
    second = read_commits(port)
    assert second.count - first.count == 2 and math.isclose(second.total_s - first.total_s, 0.304)
    bounds = [bound for bound, _ in second.buckets]
    assert bounds == sorted(bounds) and bounds[-1] == math.inf
    assert commit_figures(first, second, seconds=1.0)["commit_p99_ms_at_most"] == 500.0
