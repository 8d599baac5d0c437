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

    from leap.core.hardware import load_catalogue
    from leap.fleet.workloads import FAMILIES, model_types

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
def calibrate(
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    write: bool = typer.Option(False, "--write", help="Refit the law on every measurement and store it first."),
) -> None:
    """Score simulated cross-hardware ratios against public measurements, out of sample."""
    from leap.fleet.calibrate import METHODS, refit_shipped_law
    from leap.fleet.calibrate import calibrate as run

    if write:
        with console.status("fitting the law on every measurement"):
            console.print(f"law written to {refit_shipped_law()}")
    with console.status("refitting the law once per held-out workload") as status:
        result = run(progress=lambda unit: status.update(f"held out: {unit}"))
    if as_json:
        print(json.dumps({k: result[k] for k in ("held_out", "by_source", "dispersion")}))
        return
    console.print("median |log ratio error| on held-out pairs (every workload weighs the same):")
    console.print("  " + " ".join(f"{m:>12}" for m in ("", *METHODS)))
    rows = {"all": result["held_out"], **result["by_source"]}
    for name, s in rows.items():
        console.print("  " + f"{name:>12}" + " ".join(f"{s[m]:>12.3f}" for m in METHODS))
    console.print(f"shipped law on every pair (in sample): {result['in_sample']:.3f}")
    console.print("spread (sd) of log ratios across workloads within a hardware pair:")
    for source, d in result["dispersion"].items():
        console.print(f"  {source:<7} simulated {d['simulated']:.3f}  measured {d['measured']:.3f}")


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

    from leap.fleet.history import simulate, write_history

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
        "changed_configuration_share": round(h.changed_share, 4),
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
            f"{h.prior_share:.1%} have a measured prior attempt, {h.changed_share:.1%} run a changed "
            f"configuration; written to {out}"
        )


@app.command()
def coverage(
    days: Annotated[int, typer.Option(min=14, help="Simulated days.")] = 182,
    attempts_per_day: Annotated[float, typer.Option(min=50, help="Attempts per simulated day.")] = 600.0,
    seed: Annotated[int, typer.Option(help="Fleet seed.")] = 3,
    plot: Annotated[Path | None, typer.Option(help="Write the weekly shares as a PNG here.")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the weekly series as JSON here.")] = None,
) -> None:
    """Coverage over months: accelerator-hours placed with a learned prediction vs the lookup table."""
    from leap.core.hardware import load_catalogue
    from leap.fleet.capacity import load_capacity
    from leap.fleet.coverage import CoverageConfig, coverage_over_months, plot_coverage

    cat = load_catalogue()
    t0 = time.monotonic()
    result = coverage_over_months(CoverageConfig(days, attempts_per_day, seed), load_capacity(cat), cat)
    console.print(f"{result['attempts']} attempts over {days} days in {time.monotonic() - t0:.1f}s")
    for w in result["weeks"]:
        console.print(f"week {w['week']:2d}: learned {w['eligible_hours_ranked_share']:.3f}  "
                      f"lookup {w['lookup_rankable_hours_share']:.3f}  "
                      f"by model type {w['lookup_model_type_only_share']:.3f}  "
                      f"({w['routable_hours']:.0f} h)")
    if plot is not None:
        plot_coverage(result, str(plot))
    if json_out is not None:
        json_out.write_text(json.dumps(result, indent=2) + "\n")
