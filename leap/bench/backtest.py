"""``bench backtest``: wall time and peak memory of ``leap backtest`` on a simulated history.

Each run is a child process (``python -m leap.cli backtest``). With ``--jobs`` above 1 the nights
are scored in worker processes the child starts, so the peak that matters is the sum over the
whole process tree at one moment: it is sampled from ``/proc`` every half second
(``peak_tree_rss_gb``), with the largest single process beside it (``peak_process_rss_gb``).
The backtest's own mean acc@10 of the served model comes along, so that a faster run is seen to
score the same nights.

The history is what ``leap fleet history`` writes; ``--history`` reuses a folder written before
(the README's 45-day history takes minutes to simulate), otherwise one is simulated into a
temporary folder and removed at the end.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from leap.bench.common import Figures, report, resident_bytes, say
from leap.bench.train import history_to_reuse

#: How often the process tree's resident memory is sampled, seconds.
SAMPLE_S = 0.5


def _children(pid: int) -> list[int]:
    """The process and its descendants (Linux ``/proc/PID/task/*/children``)."""
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            with contextlib.suppress(OSError):  # the task ended between the listing and the read
                todo += [int(c) for c in task.read_text().split()]
    return seen


def backtest_once(history: Path, days: int, jobs: int, scratch: Path, result_json: Path | None = None,
                  row_cache: Path | None = None) -> Figures:
    """One ``leap backtest`` in a child process: wall seconds, peak summed and single-process RSS,
    acc@10; the backtest's whole JSON is written to ``result_json`` when given."""
    out = result_json or scratch / f"backtest-{time.monotonic_ns()}.json"
    cmd = [sys.executable, "-m", "leap.cli", "backtest", "--history", str(history), "--days", str(days),
           "--jobs", str(jobs), "--json", str(out), *(["--row-cache", str(row_cache)] if row_cache else [])]
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak_tree = peak_one = 0
    while child.poll() is None:
        sizes = [resident_bytes(p) or 0 for p in _children(child.pid)]
        peak_tree, peak_one = max(peak_tree, sum(sizes)), max(peak_one, max(sizes, default=0))
        time.sleep(SAMPLE_S)
    seconds = time.perf_counter() - t0
    err = child.stderr.read().decode(errors="replace") if child.stderr is not None else ""
    if child.returncode != 0:
        raise RuntimeError(f"leap backtest failed ({child.returncode}): {err[-2000:]}")
    result = json.loads(out.read_text())
    return {"seconds": seconds, "peak_tree_rss_gb": peak_tree / 1e9, "peak_process_rss_gb": peak_one / 1e9,
            "lightgbm_acc10": float(result["mean"]["lightgbm"]["acc@10"]), "nights": float(len(result["per_day"]))}


def bench_backtest(days: int, history_days: int, per_day: int, jobs: int, repeat: int, seed: int,
                   history: Path | None, result_json: Path | None = None, row_cache: Path | None = None
                   ) -> dict[str, Any]:
    """``repeat`` runs of ``leap backtest --days DAYS --jobs JOBS`` on one history; medians of
    :func:`backtest_once`'s figures; the last run's backtest JSON kept in ``result_json`` if given.
    With ``row_cache`` every run reads the rows kept there (the first one builds them when absent)."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="leap-bench-backtest-") as tmp:
        scratch = Path(tmp)
        params: dict[str, Any] = {"nights": days, "jobs": jobs, "rss": f"/proc of the process tree every {SAMPLE_S} s",
                                  "row_cache": str(row_cache) if row_cache else None}
        history = history_to_reuse(history, scratch, history_days, per_day, seed, params)
        runs = []
        for r in range(repeat):
            run = backtest_once(history, days, jobs, scratch, result_json, row_cache)
            say(f"run {r + 1}/{repeat}: {run['seconds']:.1f} s, peak {run['peak_tree_rss_gb']:.2f} GB summed "
                f"({run['peak_process_rss_gb']:.2f} GB one process), acc@10 {run['lightgbm_acc10']:.4f}")
            runs.append(run)
    return report("backtest", params, runs, started=started)
