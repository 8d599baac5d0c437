"""Shared pieces of the benchmarks: machine facts, statistics over repeats, scratch prefixes, output.

Every benchmark returns one flat dict of figures per run; :func:`report` reduces ``--repeat``
runs to their medians (and the min/max spread) so that one slow run on a shared machine does not
become the headline.
"""

from __future__ import annotations

import gc
import os
import platform
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

Figures = dict[str, float]

#: Attempts per simulated day of the benchmarks' served model (over 6 days): enough training rows
#: (:data:`predictor.boosting.HOLDOUT_FROM`) for the held-out tenth and the selectors a fleet's
#: nightly model has; at 1,500 (earlier runs) the model had neither.
SERVED_PER_DAY = 5000


def _load() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not on every platform
        return []


#: Read when a benchmark command imports this module, i.e. before it measures anything.
_LOAD_AT_START = _load()


def machine() -> dict[str, Any]:
    """What the figures were measured on: the load averages when the command started and now."""
    return {
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "load_avg_at_start": _LOAD_AT_START,
        "load_avg_at_end": _load(),
    }


def resident_bytes(pid: int) -> int | None:
    """Resident memory of a process, bytes (Linux ``/proc``); None once it has ended."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return None  # a zombie: no memory of its own left


def percentiles_ms(seconds: Sequence[float], prefix: str) -> Figures:
    """p50 / p99 / max of per-batch (or per-message) times, in milliseconds."""
    a = np.asarray(seconds, dtype=np.float64) * 1000.0
    if a.size == 0:
        return {f"{prefix}_p50_ms": float("nan"), f"{prefix}_p99_ms": float("nan"), f"{prefix}_max_ms": float("nan")}
    return {
        f"{prefix}_p50_ms": float(np.percentile(a, 50)),
        f"{prefix}_p99_ms": float(np.percentile(a, 99)),
        f"{prefix}_max_ms": float(a.max()),
    }


def _round(x: float) -> float:
    """Four significant digits are plenty for figures that vary by percent between runs; counts
    (whole numbers) stay exact, or 578,346 training rows would print as 578,300."""
    if not np.isfinite(x) or x == int(x):
        return x
    return float(f"{x:.4g}")


def median_figures(runs: Sequence[Figures]) -> tuple[Figures, dict[str, list[float]]]:
    """Per key: the median over runs, and [min, max] to show how noisy the machine was."""
    keys = [k for k in runs[0] if all(k in r for r in runs)]
    med = {k: _round(float(np.median([r[k] for r in runs]))) for k in keys}
    spread = {k: [_round(min(r[k] for r in runs)), _round(max(r[k] for r in runs))] for k in keys}
    return med, spread


def median_call_us(call: Callable[[], object], calls: int) -> float:
    """Median wall time of ``calls`` calls, in µs."""
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e6


def report(name: str, params: dict[str, Any], runs: Sequence[Figures], extra: dict[str, Any] | None = None,
           started: float | None = None) -> dict[str, Any]:
    """The one JSON object a benchmark prints."""
    med, spread = median_figures(runs)
    out: dict[str, Any] = {
        "benchmark": name,
        "machine": machine(),
        "params": params,
        "repeat": len(runs),
        "median": med,
        "spread": spread,
    }
    if extra:
        out.update(extra)
    if started is not None:
        out["wall_s"] = round(time.perf_counter() - started, 1)
    return out


def emit(obj: dict[str, Any]) -> None:
    """Print one JSON object on stdout (progress goes to stderr)."""
    sys.stdout.write(orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY).decode() + "\n")
    sys.stdout.flush()


def say(message: str) -> None:
    """Progress on stderr, so stdout stays one JSON object."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def scratch_prefix() -> str:
    """A Redis key prefix no deployment uses; deleted by the benchmark when it ends."""
    return f"bench-{uuid.uuid4().hex[:10]}"


def freeze_heap() -> None:
    """Move the set-up objects out of the collector's reach, as ``leap worker`` does at start-up.

    Without it, full collections over the simulator's and model's objects land in random
    batches and dominate p99 (DESIGN §9 measured 250 ms -> 54 ms for this alone).
    """
    gc.collect()
    gc.freeze()


def unfreeze_heap() -> None:
    gc.unfreeze()
