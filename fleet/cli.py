"""``leap fleet ...``: describe the simulated fleet, calibrate it, write simulated history."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

app = typer.Typer(
    help="Fleet simulator: workloads, hardware, calibration and simulated history.", no_args_is_help=True
)
console = Console(stderr=True)


def describe_dict() -> dict[str, object]:
    """Counts of hardware types, model types and families of the simulator."""
    from collections import Counter

    from core.hardware import load_catalogue
    from fleet.workloads import FAMILIES, model_types

    cat = load_catalogue()
    ms = model_types()
    return {
        "hardware_types": len(cat.names()),
        "hardware": cat.names(),
        "vendors": sorted({h.vendor for h in cat}),
        "model_types": len(ms),
        "families": list(FAMILIES),
        "model_types_per_family": dict(Counter(m.family for m in ms)),
    }


@app.command()
def describe(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Hardware types, model types and families the simulator knows."""
    info = describe_dict()
    if as_json:
        print(json.dumps(info))
        return
    console.print(f"{info['hardware_types']} hardware types ({', '.join(info['vendors'])})")  # type: ignore[arg-type]
    console.print(f"{info['model_types']} model types in {len(info['families'])} families:")  # type: ignore[arg-type]
    for fam, n in info["model_types_per_family"].items():  # type: ignore[attr-defined]
        console.print(f"  {fam:<12} {n}")


@app.command()
def calibrate(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Compare simulated cross-hardware throughput ratios with public measurements."""
    from fleet.calibrate import calibrate as run

    result = run()
    if as_json:
        print(json.dumps(result))
        return
    console.print(
        f"median |log(sim ratio / measured ratio)| = {result['median_abs_log_ratio_error']:.3f} "
        f"over {result['pairs']} hardware pairs ({result['within_20pct']:.0%} within 20 %)"
    )
    for source, s in result["by_source"].items():
        console.print(f"  {source:<7} {s['median_abs_log_ratio_error']:.3f} ({s['pairs']} pairs)")


@app.command()
def history(
    out: Annotated[Path, typer.Option("--out", help="Output folder (day-partitioned Parquet).")],
    days: int = typer.Option(30, "--days", min=1),
    attempts_per_day: int = typer.Option(20000, "--attempts-per-day", min=1),
    seed: int = typer.Option(0, "--seed"),
    start: str = typer.Option("2025-01-01", "--start", help="First day (UTC), YYYY-MM-DD."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary."),
) -> None:
    """Write simulated submissions, starts, finishes and the oracle as Parquet by day."""
    import datetime as dt

    from fleet.history import simulate, write_history

    t0 = dt.datetime.strptime(start, "%Y-%m-%d").replace(tzinfo=dt.UTC).timestamp()
    began = time.perf_counter()
    with console.status(f"simulating {days * attempts_per_day:,} attempts"):
        h = simulate(seed, days, attempts_per_day, start=t0)
    simulated = time.perf_counter() - began
    with console.status(f"writing Parquet to {out}"):
        counts = write_history(h, out)
    elapsed = time.perf_counter() - began
    summary = {
        "attempts": len(h),
        "rows": counts,
        "prior_throughput_share": round(h.prior_share, 4),
        "simulate_s": round(simulated, 2),
        "total_s": round(elapsed, 2),
        "attempts_per_minute": round(len(h) / elapsed * 60.0),
        "out": str(out),
    }
    if as_json:
        print(json.dumps(summary))
    else:
        console.print(
            f"{len(h):,} attempts in {elapsed:.1f} s ({summary['attempts_per_minute']:,} / min); "
            f"{h.prior_share:.1%} have a measured prior attempt; written to {out}"
        )
