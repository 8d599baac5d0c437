"""``bench train``: wall time and peak memory of ``leap train`` on a simulated history.

Each run is a child process (``python -m leap.cli train``) on the same history, into a scratch
registry. Its peak resident memory is measured from outside: ``os.wait4`` returns the child's own
``ru_maxrss`` (the kernel's high-water mark of its resident set, LightGBM's threads included), so
one run's peak is not mixed with another's as ``RUSAGE_CHILDREN`` would mix them. The seconds are
the child's wall time, start-up included; the training report's own split (rows, fit) comes along.

``nightly_*``: the same figures of the run a nightly trainer makes the day after a run as of the
archive's last day, resumed from the rows' checkpoint that run left (``--row-cache``); what the
checkpointing run itself took is ``checkpoint_run_seconds`` and ``checkpoint_run_peak_rss_gb``.

The history is what ``leap fleet history`` writes; ``--history`` reuses a folder written before
(a 60-day history of 20,000 attempts a day takes minutes to simulate), otherwise one is simulated
into a temporary folder and removed at the end.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from leap.bench.common import Figures, report, say
from leap.fleet.history import simulate, write_history
from leap.training.days import day_text
from leap.training.nightly import last_archived_day

HISTORY_START = dt.datetime(2025, 1, 1, tzinfo=dt.UTC).timestamp()


def history_to_reuse(history: Path | None, scratch: Path, days: int, per_day: int, seed: int,
                     params: dict[str, Any]) -> Path:
    """``history`` when it holds an archive; otherwise one simulated into it (or into ``scratch``),
    what was simulated and how long it took recorded in ``params``, as is the folder."""
    if history is None or not (history / "submissions").is_dir():
        folder = history or scratch / "history"
        say(f"simulating {days} days x {per_day} attempts (seed {seed}) into {folder} ...")
        t0 = time.perf_counter()
        write_history(simulate(seed, days, per_day, start=HISTORY_START), folder)
        params.update(simulate_s=round(time.perf_counter() - t0, 1), history_days=days, attempts_per_day=per_day,
                      seed=seed)
        history = folder
    params["history"] = str(history)
    return history


def train_once(history: Path, window_days: int, scratch: Path, trees: int | None = None,
               as_of: str | None = None, row_cache: Path | None = None) -> Figures:
    """One ``leap train`` in a child process: its wall seconds, peak RSS and the report's timings."""
    registry = scratch / f"registry-{time.monotonic_ns()}"
    out = scratch / f"report-{time.monotonic_ns()}.json"
    cmd = [sys.executable, "-m", "leap.cli", "train", "--history", str(history), "--registry", str(registry),
           "--window-days", str(window_days), "--json", str(out), *(["--trees", str(trees)] if trees else []),
           *(["--as-of", as_of] if as_of else []), *(["--row-cache", str(row_cache)] if row_cache else [])]
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - t0
    child.returncode = os.waitstatus_to_exitcode(status)
    err = child.stderr.read().decode(errors="replace") if child.stderr is not None else ""
    if child.returncode != 0:
        raise RuntimeError(f"leap train failed ({child.returncode}): {err[-2000:]}")
    rep = json.loads(out.read_text())
    return {
        "seconds": seconds,
        "peak_rss_gb": usage.ru_maxrss * 1024 / 1e9,  # Linux reports kilobytes
        "rows_s": float(rep["timings_s"]["rows"]),
        "fit_s": float(rep["timings_s"]["fit"]),
        "train_rows": float(rep["training_window"]["rows"]),
        "holdout_acc10": float(rep["metrics"]["lightgbm"]["acc@10"]),
        "main_trees": float(rep["trees"]["main"]),
        "resumed": float(bool(rep["row_cache"]["used"])),
    }


def nightly_once(history: Path, window_days: int, scratch: Path, trees: int | None) -> Figures:
    """The night after a run as of the archive's last day: ``leap train`` resumed from the
    checkpoint that run left (:mod:`leap.training.row_cache`), so it replays the last day only."""
    cache = scratch / f"row-cache-{time.monotonic_ns()}"
    last = last_archived_day(history)
    if last is None:
        raise ValueError(f"{history}: no day folders under submissions/")
    first = train_once(history, window_days, scratch, trees, as_of=day_text(last), row_cache=cache)
    night = train_once(history, window_days, scratch, trees, row_cache=cache)
    return {"checkpoint_run_seconds": first["seconds"], "checkpoint_run_peak_rss_gb": first["peak_rss_gb"],
            **{f"nightly_{k}": v for k, v in night.items()}}


def bench_train(days: int, per_day: int, window_days: int, repeat: int, seed: int, history: Path | None,
                trees: int | None = None, nightly: bool = True) -> dict[str, Any]:
    """``repeat`` runs of ``leap train`` on one history; medians of :func:`train_once`'s figures,
    and with ``nightly`` those of :func:`nightly_once` (``nightly_*``), run in turn with them."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="leap-bench-train-") as tmp:
        scratch = Path(tmp)
        params: dict[str, Any] = {"window_days": window_days, "trees": trees or "leap train's",
                                  "rss": "os.wait4 ru_maxrss of the child"}
        history = history_to_reuse(history, scratch, days, per_day, seed, params)
        runs = []
        for r in range(repeat):
            run = train_once(history, window_days, scratch, trees)
            say(f"run {r + 1}/{repeat}: {run['seconds']:.1f} s, peak {run['peak_rss_gb']:.2f} GB "
                f"(rows {run['rows_s']} s, fit {run['fit_s']} s)")
            if nightly:
                run.update(nightly_once(history, window_days, scratch, trees))
                say(f"run {r + 1}/{repeat}, the next night from a checkpoint: {run['nightly_seconds']:.1f} s, "
                    f"peak {run['nightly_peak_rss_gb']:.2f} GB (rows {run['nightly_rows_s']} s, "
                    f"fit {run['nightly_fit_s']} s)")
            runs.append(run)
    return report("train", params, runs, started=started)
