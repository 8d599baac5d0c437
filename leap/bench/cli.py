"""``bench`` commands: each prints one JSON object (medians over ``--repeat`` runs) on stdout.

Progress goes to stderr. All of them use the broker and Redis of ``Settings.from_env()`` and
write Redis keys only under a scratch prefix that they delete when they end.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from leap.bench.common import SERVED_PER_DAY, emit
from leap.core.settings import Settings
from leap.services.cli import services_needed

app = typer.Typer(help="Benchmarks that print JSON figures.", no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False)

Repeat = Annotated[int, typer.Option("--repeat", min=1, help="Runs; the JSON holds their medians.")]
Seed = Annotated[int, typer.Option("--seed", help="Fleet simulator seed.")]
# The served model's options, shared by the commands that rank (predict, growth).
Warm = Annotated[int, typer.Option(min=0, help="Earlier attempts written to the store first.")]
HistoryDays = Annotated[int, typer.Option(min=2, help="Days of simulated history to fit on.")]
HistoryPerDay = Annotated[int, typer.Option(min=10, help="Attempts per simulated day.")]
Trees = Annotated[int | None, typer.Option(min=1, help="Override n_estimators (default: leap train's).")]
ReusedHistory = Annotated[Path | None, typer.Option(help="History folder to reuse (simulated into it if absent).")]
ModelDir = Annotated[Path | None, typer.Option(help="Load the model saved in this folder instead of fitting.")]


@app.command("features")
def features_cmd(
    events: Annotated[int, typer.Option(min=1, help="Finish (and start) events written per run.")] = 20000,
    reads: Annotated[int, typer.Option(min=1, help="Submissions read per round, 256 per read().")] = 4096,
    read_rounds: Annotated[int, typer.Option(min=1, help="Passes over those submissions per run.")] = 5,
    repeat: Repeat = 3,
    seed: Seed = 0,
) -> None:
    """FeatureStore write throughput (batches of 500) and batched read throughput (256 per read)."""
    from leap.bench.features import bench_features

    emit(bench_features(services_needed(kafka=False), events, reads, read_rounds, repeat, seed))


@app.command("feast")
def feast_cmd(
    feast_python: Annotated[str, typer.Option(help="Python with feast[redis] (default: this one).")] = "",
    events: Annotated[int, typer.Option(min=1, help="Finish (and start) events written first.")] = 20000,
    entities: Annotated[int, typer.Option(min=1, help="Submissions (entities) read per pass, 256 per call.")] = 4096,
    rounds: Annotated[int, typer.Option(min=1, help="Alternating LEAP/Feast passes per run.")] = 3,
    repeat: Repeat = 3,
    seed: Seed = 0,
) -> None:
    """LEAP's store reads against Feast's Redis online store: same redis-server, same entities, one run."""
    import sys

    from leap.bench.feast import FeastMissing, bench_feast

    try:
        settings = services_needed(kafka=False)
        emit(bench_feast(settings, feast_python or sys.executable, events, entities, rounds, repeat, seed))
    except FeastMissing as exc:
        typer.echo(f"bench feast: {exc}", err=True)
        raise typer.Exit(2) from exc


@app.command("predict")
def predict_cmd(
    submissions: Annotated[int, typer.Option(min=1, help="Submissions ranked per pass.")] = 5000,
    warm: Warm = 20000,
    batch: Annotated[int, typer.Option(min=1, help="Submissions per rank() call.")] = 500,
    history_days: HistoryDays = 6,
    history_per_day: HistoryPerDay = SERVED_PER_DAY,
    trees: Trees = None,
    no_redis: Annotated[bool, typer.Option(help="Also run each model on snapshots read beforehand.")] = True,
    profile: Annotated[Path | None, typer.Option(help="Folder for cProfile dumps (extra untimed pass).")] = None,
    model: ModelDir = None,
    save_model: Annotated[Path | None, typer.Option(help="Save the fitted model in this (new) folder.")] = None,
    candidates: Annotated[int, typer.Option(min=0, help="Candidates per submission (0: as simulated).")] = 0,
    repeat: Repeat = 3,
    seed: Seed = 0,
) -> None:
    """RankingService.rank without Kafka: lookup fallback, the served LightGBM and DESIGN §9's plain
    loop, with per-stage costs."""
    from leap.bench.predict import bench_predict

    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
    emit(bench_predict(services_needed(kafka=False), submissions, warm, batch, (history_days, history_per_day), trees,
                       no_redis, repeat, seed, profile, model, save_model, candidates))


@app.command("trees")
def trees_cmd(
    history_days: HistoryDays = 6,
    history_per_day: HistoryPerDay = SERVED_PER_DAY,
    model: ModelDir = None,
    rows_days: Annotated[int, typer.Option(min=1, help="Days of a fresh simulated history whose rows are scored.")] = 2,
    repeat: Annotated[int, typer.Option("--repeat", min=1, help="Bulk calls per figure (median).")] = 5,
    calls: Annotated[int, typer.Option(min=1, help="24-row calls per figure (median).")] = 300,
    seed: Seed = 0,
) -> None:
    """The served model's boosters compiled by predictor.compiled, lleaves and tl2cgen, side by side
    (exactness against Booster.predict, µs per row, compile time). Needs neither Kafka nor Redis."""
    from leap.bench.trees import bench_trees

    emit(bench_trees((history_days, history_per_day), seed, model, rows_days, repeat, calls))


@app.command("growth")
def growth_cmd(
    candidates: Annotated[list[int] | None, typer.Option(min=1, help="Candidate count (repeat: side by side).")] = None,
    submissions: Annotated[int, typer.Option(min=1, help="Submissions ranked per pass and count.")] = 2000,
    warm: Warm = 20000,
    memory_attempts: Annotated[int, typer.Option(min=0, help="Attempts written for bytes per job (0: skip).")] = 50000,
    history_days: HistoryDays = 6,
    history_per_day: HistoryPerDay = SERVED_PER_DAY,
    trees: Trees = None,
    model: ModelDir = None,
    repeat: Repeat = 3,
    seed: Seed = 0,
) -> None:
    """Cost against work: the ranking loop at several candidate counts side by side, Redis bytes per job."""
    from leap.bench.growth import bench_growth

    settings = services_needed(kafka=False)
    emit(bench_growth(settings, tuple(candidates or (4, 24, 64)), submissions, warm, memory_attempts,
                      (history_days, history_per_day), repeat, seed, model, trees))


@app.command("e2e")
def e2e_cmd(
    rate: Annotated[float, typer.Option(min=0, help="Submissions/s to publish; 0 = as fast as answered.")] = 200.0,
    duration: Annotated[float, typer.Option(min=0.5, help="Seconds of publishing per run.")] = 6.0,
    window: Annotated[int, typer.Option(min=1, help="With --rate 0: most submissions unanswered.")] = 200,
    drain: Annotated[float, typer.Option(min=0, help="Seconds to wait for the last rankings.")] = 5.0,
    role: Annotated[str, typer.Option(help="Worker role: predictor | all.")] = "predictor",
    warm: Warm = 20000,
    startup_timeout: Annotated[float, typer.Option(min=1, help="Seconds for the worker's first ranking.")] = 90.0,
    delivery: Annotated[str, typer.Option(
        help="How the predictor commits: exactly_once | at_least_once | both (one after the other).")]
    = "exactly_once",
    transaction_interval: Annotated[float | None, typer.Option(
        min=0, help="Longest open transaction, s [default: $LEAP_TRANSACTION_INTERVAL or 0.05].")] = None,
    model: Annotated[Path | None, typer.Option(help="Pin the worker to this saved model folder (or lookup).")] = None,
    private: Annotated[bool, typer.Option(help="Use a broker and redis-server of the benchmark's own.")] = False,
    repeat: Repeat = 3,
    seed: Seed = 0,
    warmup: Annotated[float, typer.Option(
        min=0, help="Seconds of publishing before each mode's runs, not recorded.")] = 3.0,
) -> None:
    """Submission-to-ranking latency and rankings/s through a `leap worker` child process."""
    from leap.bench.e2e import Load, bench_e2e

    if role not in ("predictor", "all"):
        raise typer.BadParameter("role must be predictor or all", param_hint="--role")
    if delivery not in ("exactly_once", "at_least_once", "both"):
        raise typer.BadParameter("delivery must be exactly_once, at_least_once or both", param_hint="--delivery")
    settings = Settings.from_env() if private else services_needed()  # --private starts services of its own
    if transaction_interval is not None:
        settings = dataclasses.replace(settings, transaction_interval=transaction_interval)
    emit(bench_e2e(settings, Load(rate, duration, window, drain, repeat, warmup), role, warm, startup_timeout,
                   seed, delivery, model, private))  # type: ignore[arg-type]


@app.command("scale")
def scale_cmd(
    duration: Annotated[float, typer.Option(min=1, help="Seconds per phase.")] = 10.0,
    window: Annotated[int, typer.Option(min=1, help="Closed loops: most submissions unanswered.")] = 400,
    rate: Annotated[float, typer.Option(min=1, help="Submissions/s of the open loop with a join and a leave.")] = 200.0,
    pause_window: Annotated[float, typer.Option(min=0.5, help="Seconds after a change counted as rebalance.")] = 10.0,
    warm: Warm = 20000,
    seed: Seed = 0,
) -> None:
    """Rankings/s with one and two predictor workers; latency while a worker joins and leaves."""
    from leap.bench.scale import bench_scale

    emit(bench_scale(services_needed(), duration, window, rate, pause_window, warm, seed=seed))


@app.command("soak")
def soak_cmd(
    minutes: Annotated[float, typer.Option(min=0.1, help="Minutes of steady load.")] = 30.0,
    rate: Annotated[float, typer.Option(min=1, help="Submissions/s (plus rate/2 starts and finishes).")] = 500.0,
    bad_share: Annotated[float, typer.Option(min=0, max=1, help="Share of malformed messages added.")] = 0.005,
    sample_s: Annotated[float, typer.Option(min=0.5, help="Seconds between RSS samples.")] = 5.0,
    warmup_s: Annotated[float, typer.Option(min=0, help="Seconds before the first RSS window.")] = 60.0,
    warm: Warm = 20000,
    seed: Seed = 0,
) -> None:
    """Workers under steady load: RSS at start and end, lag, rankings, dead letters."""
    from leap.bench.soak import bench_soak

    emit(bench_soak(services_needed(), minutes, rate, bad_share, sample_s, warmup_s, warm, seed))


@app.command("train")
def train_cmd(
    days: Annotated[int, typer.Option(min=3, help="Days of simulated history.")] = 60,
    attempts_per_day: Annotated[int, typer.Option(min=10, help="Simulated attempts per day.")] = 20000,
    window_days: Annotated[int, typer.Option(min=1, help="leap train --window-days.")] = 30,
    history: ReusedHistory = None,
    trees: Annotated[int | None, typer.Option(min=1, help="leap train --trees (default: the served model's).")]
    = None,
    repeat: Repeat = 3,
    seed: Seed = 0,
    nightly: Annotated[bool, typer.Option(help="Also time the next night resumed from a row checkpoint "
                                                "(two more runs per repeat).")] = True,
) -> None:
    """Wall time and peak RSS of `leap train` (a child process per run) on a simulated history."""
    from leap.bench.train import bench_train

    emit(bench_train(days, attempts_per_day, window_days, repeat, seed, history, trees, nightly))


@app.command("backtest")
def backtest_cmd(
    days: Annotated[int, typer.Option(min=1, help="leap backtest --days: nightly retrains.")] = 30,
    jobs: Annotated[int, typer.Option(min=1, help="leap backtest --jobs: worker processes.")] = 2,
    history_days: Annotated[int, typer.Option(min=3, help="Days of simulated history.")] = 45,
    attempts_per_day: Annotated[int, typer.Option(min=10, help="Simulated attempts per day.")] = 5000,
    history: ReusedHistory = None,
    repeat: Repeat = 1,
    seed: Seed = 41,
    result_json: Annotated[Path | None, typer.Option(help="Keep the last run's backtest JSON here.")] = None,
    row_cache: Annotated[Path | None, typer.Option(help="leap backtest --row-cache: rows built once, then read.")]
    = None,
) -> None:
    """Wall time and peak RSS (summed over its processes) of `leap backtest` on a simulated history."""
    from leap.bench.backtest import bench_backtest

    emit(bench_backtest(days, history_days, attempts_per_day, jobs, repeat, seed, history, result_json, row_cache))


@app.command("dashboard-ingest")
def dashboard_ingest_cmd(
    rankings: Annotated[int, typer.Option(min=1, help="Synthetic rankings (each with its submission and finish).")]
    = 100_000,
    repeat: Repeat = 1,
    seed: Seed = 0,
) -> None:
    """The dashboard aggregator alone, one thread: rankings/s ingested, summary build time, memory kept.
    Needs neither Kafka nor Redis."""
    import time

    from leap.bench.common import report
    from leap.bench.dashboard_ingest import measure

    began = time.perf_counter()
    runs = [measure(rankings, seed) for _ in range(repeat)]
    emit(report("dashboard_ingest", {"rankings": rankings, "seed": seed}, runs, started=began))


@app.command("dashboard-live")
def dashboard_live_cmd(
    rate: Annotated[float, typer.Option(min=1, help="Rankings published per second.")] = 1000.0,
    seconds: Annotated[float, typer.Option(min=1, help="Seconds of publishing.")] = 10.0,
) -> None:
    """The dashboard served while RATE rankings/s flow through the broker (fresh topics, deleted at the
    end): time until all are counted and /api/summary latency meanwhile. Needs Kafka."""
    import time

    from leap.bench.common import report
    from leap.bench.dashboard_live import measure_live

    began = time.perf_counter()
    settings = services_needed(redis=False)
    emit(report("dashboard_live", {"rate": rate, "seconds": seconds}, [measure_live(settings, rate, seconds)],
                started=began))


if __name__ == "__main__":
    app()
