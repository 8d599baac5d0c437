"""``leap``: the one command-line entry point.

This module is the composition root: it is the only place that wires the simulator (``leap.fleet``)
next to the production packages, which never import it.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import orjson
import pyarrow as pa
import typer
from rich.console import Console
from rich.markup import escape

from leap.bench.cli import app as bench_app
from leap.core.settings import Settings
from leap.dashboard.cli import dashboard_cmd
from leap.fleet import cli as fleet_cli
from leap.replay.cli import app as replay_app
from leap.replay.cli import explain_cmd
from leap.services.cli import app as services_app
from leap.services.cli import services_needed
from leap.services.processes import ServiceError
from leap.training import cli as training_cli
from leap.training.alternatives.command import alternatives_cmd, alternatives_report_cmd
from leap.training.measurements import evaluate_measurements_cmd

app = typer.Typer(
    name="leap",
    help="Throughput prediction and cost ranking of training jobs across accelerator types.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(services_app, name="services", help="Local Kafka (KRaft) and Redis: up, down, status.")
app.add_typer(fleet_cli.app, name="fleet", help="The simulated fleet: describe, calibrate, history.")
app.command("evaluate-measurements")(evaluate_measurements_cmd)
app.command("alternatives")(alternatives_cmd)
app.command("alternatives-report")(alternatives_report_cmd)
app.add_typer(replay_app, name="replay", help="Replay topics: rebuild features, re-rank, copy, inspect.")
app.command("dashboard")(dashboard_cmd)
app.command("train")(training_cli.train_cmd)
app.add_typer(training_cli.models_app, name="models")
app.command("backtest")(training_cli.backtest_cmd)
app.command("drivers")(training_cli.drivers_cmd)
app.add_typer(bench_app, name="bench", help="Benchmarks that print JSON figures.")
topics_app = typer.Typer(help="Kafka topics owned by LEAP.", no_args_is_help=True)
app.add_typer(topics_app, name="topics")

console = Console(stderr=True)


def fail(message: str, code: int = 2) -> typer.Exit:
    console.print(f"[bold red]error:[/] {escape(message)}")
    return typer.Exit(code)


def _checked(command: Callable[..., Any], redis: bool) -> Callable[..., Any]:
    """``command`` that first checks that Kafka (and Redis) answer; its options parse as before."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        services_needed(redis=redis)
        return command(*args, **kwargs)

    return run


# Every replay command reads topics; rebuilding features also writes Redis. The check runs after
# the options are parsed, so --help and bad options never need the services.
for _info in replay_app.registered_commands:
    if _info.callback is not None:
        _info.callback = _checked(_info.callback, redis=_info.name == "rebuild-features")
app.command("explain")(_checked(explain_cmd, redis=False))


@topics_app.command("create")
def topics_create(json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Create LEAP's topics (idempotent)."""
    from streams.topics import create_topics

    result = create_topics(services_needed(redis=False))
    if json_out:
        print(orjson.dumps(result).decode())
    else:
        for name, state in result.items():
            console.print(f"{name}: {state}")


@topics_app.command("list")
def topics_list() -> None:
    """Show the topic definitions (names, partitions, configs)."""
    from streams.topics import ALL_TOPICS

    settings = Settings.from_env()
    for t in ALL_TOPICS:
        print(f"{t.name}\tpartitions={t.partitions_in(settings)}\t{t.config}\t{t.doc}")


@app.command()
def worker(
    role: Annotated[str, typer.Argument(help="features | predictor | all | archiver | trainer")],
    metrics_port: Annotated[int | None, typer.Option(help="Prometheus port (0 = off).")] = None,
    archive_dir: Annotated[Path | None, typer.Option(
        help="archiver, trainer: the history archive [default: $LEAP_ARCHIVE_DIR or .leap/archive].")] = None,
    schedule: Annotated[str, typer.Option(help="trainer: time of the daily run, HH:MM UTC.")] = "02:00",
    run_now: Annotated[bool, typer.Option(help="trainer: train once now and exit.")] = False,
    model: Annotated[Path | None, typer.Option(
        help="predictor, all: serve this saved model folder (or baseline: lookup) and ignore announcements.")]
    = None,
) -> None:
    """Run a worker until SIGTERM (offsets are committed on the way out)."""
    from dataclasses import replace

    from leap import worker as worker_mod
    from leap.training.nightly import NightlyConfig, parse_schedule
    from streams.archive import ArchiveConfig

    if role not in worker_mod.ROLES:
        raise fail(f"unknown role {role!r}; choose one of: {', '.join(worker_mod.ROLES)}")
    port = worker_mod.DEFAULT_METRICS_PORTS[role] if metrics_port is None else metrics_port
    try:
        settings = Settings.from_env()
    except ValueError as exc:
        raise fail(str(exc)) from None
    archive = ArchiveConfig.from_settings(settings)
    archive = replace(archive, root=archive_dir) if archive_dir is not None else archive
    try:
        nightly = NightlyConfig(archive.root, settings.registry_dir, parse_schedule(schedule), run_now=run_now,
                                row_cache=settings.row_cache_dir)
    except ValueError as exc:
        raise fail(str(exc)) from None
    sys.argv = [sys.argv[0]]  # faust's Worker parses argv; ours are already consumed
    from leap.services.stack import wait_for_services

    try:
        # Kafka only: a worker needs the broker to create its topics and join its group, while a
        # Redis outage, at start or later, is waited out by the running agents, which serve
        # metrics (leap_dependency_up) and say "redis is unavailable" / "redis is back" meanwhile.
        wait_for_services(settings, lambda line: console.print(f"[worker {role}] {line}", markup=False,
                                                                 highlight=False, soft_wrap=True), redis=False)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    worker_mod.run(settings, role, port, archive, nightly, model)


@app.command()
def submit(
    file: Annotated[Path, typer.Argument(help="JSON lines, one submission per line ('-' = stdin).")],
    wait: Annotated[bool, typer.Option(help="Wait for and print each ranking.")] = True,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for rankings.")] = 30.0,
) -> None:
    """Publish submissions and print their rankings as JSON lines.

    A line may leave out schema_version, event_id and event_time: they are filled in (and shown).
    """
    from streams.client import SchedulerClient

    read = _read_submissions_file(file, "nothing was published")
    for number, filled in read.filled:
        console.print(f"line {number}: filled in " + ", ".join(f"{k}={v}" for k, v in filled.items()),
                      markup=False, highlight=False, soft_wrap=True)
    subs = read.submissions
    with SchedulerClient(services_needed(redis=False), follow_rankings=wait) as client:
        for sub in subs:
            client.publish(sub)
        client.flush()
        console.print(f"published {len(subs)} submission(s)")
        if wait:
            got = client.wait_for([s.attempt_id for s in subs], timeout=timeout)
            for sub in subs:
                if sub.attempt_id in got:
                    print(got[sub.attempt_id][0].encode().decode())
            missing = len(subs) - len(got)
            if missing:
                raise fail(f"{missing} ranking(s) did not arrive within {timeout}s. Fix: check that a predictor "
                           "runs (`leap worker predictor` or `all`), or wait longer with --timeout", code=1)


def _read_submissions_file(file: Path, refused: str) -> Any:
    """Submissions from a JSON-lines file ('-': standard input); every refused line printed, then
    the command stops (``refused`` says what did not happen), as it does for an empty file."""
    from leap.submit import read_submissions

    if str(file) != "-" and not file.is_file():
        raise fail(f"{file}: no such file. Fix: give a file of JSON lines, or '-' to read standard input")
    lines = sys.stdin.read().splitlines() if str(file) == "-" else file.read_text().splitlines()
    read = read_submissions(lines)
    if read.refusals:
        for refusal in read.refusals:
            console.print(refusal, markup=False, highlight=False, style="red", soft_wrap=True)
        raise fail(f"{len(read.refusals)} invalid line(s); {refused}")
    if not read.submissions:
        raise fail(f"{file}: no submissions. Fix: write one JSON object per line")
    return read


@app.command("what-if")
def what_if(
    file: Annotated[Path, typer.Argument(help="JSON lines, one hypothetical submission per line ('-' = stdin).")],
) -> None:
    """Rank hypothetical configurations with the served model and today's features.

    Lines are written as for `leap submit` (schema_version, event_id and event_time may be left
    out). Nothing is published and nothing is written to the feature store: the jobs' history
    and rankings stay as they were. Prints one ranking per line as JSON.
    """
    from predictor.whatif import WhatIf

    read = _read_submissions_file(file, "nothing was ranked")
    rankings = WhatIf(services_needed(redis=True)).rank(read.submissions)
    for ranking in rankings:
        print(ranking.encode().decode())
    console.print(f"ranked {len(rankings)} hypothetical submission(s) with {rankings[0].model_version}; "
                  "nothing published", soft_wrap=True)


@app.command()
def demo(
    duration: Annotated[float, typer.Option(min=1, help="Seconds of live traffic.")] = 60.0,
    rate: Annotated[float, typer.Option(min=0.1, help="Submissions per second.")] = 50.0,
    summary_json: Annotated[Path | None, typer.Option(help="Write the summary here as JSON.")] = None,
    seed: Annotated[int, typer.Option(help="Simulator seed.")] = 0,
    warmup: Annotated[int, typer.Option(min=0, help="Earlier attempts published as history first.")] = 5000,
    deadline_ms: Annotated[float, typer.Option(min=1, help="How long the scheduler waits for a ranking.")] = 500.0,
    attempts_per_day: Annotated[float, typer.Option(min=1, help="Simulated submission rate per day.")] = 5000.0,
    model: Annotated[str, typer.Option(help="auto (promoted LightGBM, trained first if none), lookup, or a version.")]
    = "auto",
    capacity: Annotated[bool, typer.Option(
        help="Place live attempts within the fleet's pools (leap/fleet/data/capacity.toml); "
             "the report plays both.")] = True,
    price_schedule: Annotated[str, typer.Option(
        help="Prices the workers rank with and live placements pay: list | flat (negotiated).")] = "list",
) -> None:
    """Bring everything up and run the scheduler simulator against the live workers."""
    from leap.demo import run_demo

    if summary_json is not None and not summary_json.parent.exists():
        raise fail(f"{summary_json.parent}: folder does not exist")
    try:
        summary = run_demo(duration, rate, seed, warmup, deadline_ms, attempts_per_day, model, capacity, price_schedule)
    except LookupError as exc:
        raise fail(str(exc)) from None
    except ServiceError as exc:  # a service that cannot start: what holds it, not a traceback
        raise fail(str(exc), code=1) from None
    text = orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode()
    if summary_json is not None:
        summary_json.write_text(text + "\n")
    print(text)


SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"


@app.command()
def schemas(
    out: Annotated[Path, typer.Option(help="Folder to write the JSON Schema files into.")] = SCHEMA_DIR,
    check: Annotated[bool, typer.Option(help="Only check that the files match the code.")] = False,
) -> None:
    """Write (or check) the JSON Schema of every event, generated from the contracts."""
    from streams.events import EVENT_TYPES, json_schema

    stale = []
    for cls in EVENT_TYPES:
        path = out / f"{cls.NAME}.schema.json"
        text = orjson.dumps(json_schema(cls), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode() + "\n"
        if check:
            if not path.is_file() or path.read_text() != text:
                stale.append(path.name)
        else:
            out.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        raise fail(f"schemas out of date: {', '.join(stale)} (run `leap schemas`)", code=1)


def arrow_memory_pool() -> None:
    """Make Arrow allocate from jemalloc, which gives freed memory back, unless the environment
    chose a pool (``ARROW_DEFAULT_MEMORY_POOL``) or this platform's pyarrow lacks jemalloc.

    pyarrow's default here, mimalloc, kept a training run's freed archive tables resident through
    the fit; glibc's malloc, sharing its arenas with Python's objects, fragmented worse
    (docs/benchmarks.md, training). The variable carries the choice to worker processes.
    """
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        return
    try:
        pool = pa.jemalloc_memory_pool()
    except NotImplementedError:
        return
    os.environ["ARROW_DEFAULT_MEMORY_POOL"] = "jemalloc"
    pa.set_memory_pool(pool)


def main() -> None:
    arrow_memory_pool()
    app()


if __name__ == "__main__":
    main()
