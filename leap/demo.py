"""``leap demo``: the whole system on this machine, driven by the scheduler simulator.

Services up, topics, workers (features + predictor, as child processes stopped with SIGTERM),
a warm start of simulated history, then ``duration`` seconds of live submissions with a
summary in the terminal and, optionally, as JSON.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from rich.console import Console
from rich.live import Live
from rich.table import Table

from leap.core.hardware import load_catalogue
from leap.core.settings import Settings
from leap.fleet.capacity import PRICE_SCHEDULES, load_capacity, schedule_prices, write_price_file
from leap.fleet.engine import Fleet
from leap.fleet.scheduler import SchedulerSimulator
from leap.services import stack
from leap.services.workers import WorkerProcess
from streams.client import SchedulerClient
from streams.events import DeadLetter, EventError
from streams.topics import (
    DEAD_LETTER,
    JOB_FINISHES,
    JOB_STARTS,
    SUBMISSIONS,
    consumer_group,
    create_topics,
    end_offsets,
)

console = Console(stderr=True)


def topic_ends(settings: Settings, topics: tuple[str, ...]) -> dict[tuple[str, int], int]:
    consumer = Consumer(settings.confluent_config(**{"group.id": "leap-demo-unused"}))
    try:
        return end_offsets(consumer, topics)
    finally:
        consumer.close()


def dead_letters_since(settings: Settings, dlq_start: dict[tuple[str, int], int],
                       input_start: dict[tuple[str, int], int]) -> tuple[int, int]:
    """Dead letters written since ``dlq_start``: (caused by input published since ``input_start``,
    caused by older input that a resumed consumer group read during the run)."""
    consumer = Consumer(settings.confluent_config(**{"group.id": "leap-demo-unused", "enable.auto.commit": False}))
    ends = topic_ends(settings, (DEAD_LETTER.name,))
    ours = older = 0
    try:
        consumer.assign([TopicPartition(t, p, dlq_start.get((t, p), 0)) for (t, p) in ends])
        remaining = sum(ends[k] - dlq_start.get(k, 0) for k in ends)
        deadline = time.monotonic() + 30
        while remaining > 0 and time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=0.5):
                if msg.error():
                    continue
                remaining -= 1
                try:
                    letter = DeadLetter.decode(msg.value())
                except EventError:
                    ours += 1
                    continue
                fresh = letter.offset >= input_start.get((letter.source_topic, letter.partition), 0)
                ours, older = (ours + 1, older) if fresh else (ours, older + 1)
    finally:
        consumer.close()
    return ours, older


def wait_caught_up(settings: Settings, group: str, topics: tuple[str, ...], timeout: float = 60.0) -> int:
    """Wait until ``group`` has committed up to the end of ``topics``; returns the remaining lag."""
    consumer = Consumer(settings.confluent_config(**{"group.id": group, "enable.auto.commit": False}))
    try:
        ends = end_offsets(consumer, topics)
        parts = [TopicPartition(t, p) for (t, p) in ends]
        deadline = time.monotonic() + timeout
        while True:
            committed = consumer.committed(parts, timeout=10)
            lag = sum(max(0, ends[(tp.topic, tp.partition)] - max(tp.offset, 0)) for tp in committed)
            if lag == 0 or time.monotonic() > deadline:
                return lag
            time.sleep(0.5)
    finally:
        consumer.close()


def start_workers(settings: Settings, log_dir: Path) -> list[WorkerProcess]:
    return [WorkerProcess(settings, role, log_dir / f"worker-{role}.log", metrics_port=port)
            for role, port in (("features", 9101), ("predictor", 9102))]


def wait_ready(client: SchedulerClient, fleet: Fleet, procs: list[WorkerProcess], timeout: float = 120) -> None:
    """Until the predictor answers: a canary submission from the fleet, re-sent every few seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if not p.alive():
                raise RuntimeError(f"a worker exited; its log ends:\n{p.log_tail()}")
        canary = fleet.sample_attempts(1)[0].submission
        client.publish(canary)
        client.flush()
        if client.wait_for([canary.attempt_id], timeout=5):
            return
    raise RuntimeError(f"workers not ready within {timeout}s; see .leap/logs")


DEMO_HISTORY = {"days": 14, "attempts_per_day": 3000, "seed": 7}


def ensure_model(settings: Settings, model: str) -> str:
    """Make ``model`` current: ``auto`` keeps a promoted LightGBM model or trains one on a
    simulated history; ``lookup`` switches to the baseline; anything else is a registered version."""
    from leap.fleet.history import simulate, write_history
    from leap.training.nightly import promote_and_announce
    from leap.training.train import parse_day, train
    from predictor.models import BASELINES
    from predictor.registry import Registry
    from predictor.reload import announce

    registry = Registry(settings.registry_dir)
    current = registry.current()
    if model == "auto" and current is not None and current not in BASELINES:
        announce(settings, registry.record(current))  # predictors may have followed something else
        return current
    if model != "auto":
        promote_and_announce(registry, model, "demo", settings)
        return model
    folder = settings.home / "demo-history"
    if not (folder / "finishes").is_dir():
        t0 = time.monotonic()
        h = simulate(DEMO_HISTORY["seed"], DEMO_HISTORY["days"], DEMO_HISTORY["attempts_per_day"],
                     start=parse_day("2025-01-01"))
        write_history(h, folder)
        console.print(f"simulated {len(h)} attempts of history in {time.monotonic() - t0:.1f}s")
    t0 = time.monotonic()
    record, report = train(folder, registry, window_days=30)
    promote_and_announce(registry, record.version, "demo: first model", settings)
    acc = report["metrics"]
    console.print(f"trained {record.version} in {time.monotonic() - t0:.1f}s; holdout acc@10 "
                  f"lightgbm {acc['lightgbm']['acc@10']:.3f}, transfer {acc['transfer']['acc@10']:.3f}, "
                  f"lookup {acc['lookup']['acc@10']:.3f}")
    return record.version


def compile_before_serving(settings: Settings, version: str) -> None:
    """Fill the compiled-trees cache for ``version`` before the clock starts.

    Workers compile a new model's trees in the background and serve with LightGBM's predict until
    then; a large model's compile takes longer than a short demo, whose workers would stop before it
    finished and leave the cache empty, so every run would measure its latency beside a compiler.
    A cached library loads at once.
    """
    from predictor.lgbm import LightGBMThroughput
    from predictor.registry import Registry

    model = Registry(settings.registry_dir).load(version)
    if not isinstance(model, LightGBMThroughput):  # a baseline: no trees
        return
    t0 = time.monotonic()
    model.compile_trees(settings.compiled_dir)
    console.print(f"trees of {version} compiled (or found cached) in {time.monotonic() - t0:.1f}s")


def _table(sim: SchedulerSimulator, elapsed: float, duration: float, final: dict[str, Any] | None = None) -> Table:
    s = final if final is not None else sim.summary()
    t = Table(title=f"LEAP demo — {elapsed:.0f}/{duration:.0f} s", show_header=False)
    rows = [
        ("submissions", f"{s['submissions']}"),
        ("rankings (in time / late)", f"{s['ranked_in_time']} / {s['late_rankings']}"),
        ("coverage (accelerator-hours)", f"{s['coverage']:.4f}"),
        ("latency p50 / p99", f"{s['p50_ms'] or 0:.1f} / {s['p99_ms'] or 0:.1f} ms"),
        ("pinned attempts (not submitted)", f"{s['pinned_attempts_live']}"),
        ("live queue wait p50 / p99",
         f"{s['live_queue_wait_p50_s'] / 60:.0f} / {s['live_queue_wait_p99_s'] / 60:.0f} min"),
        ("finishes published", f"{s['finishes_published']}"),
    ]
    for scenario in s.get("side_by_side", []):
        name = f"capacity {'on' if scenario['capacity'] else 'off'}, {scenario['price_schedule']} prices"
        rows.append((name, f"savings vs default {scenario['savings_vs_default']:+.1%}, vs lookup "
                     f"{scenario['savings_vs_lookup']:+.1%}, "
                     f"overrun vs oracle {scenario['cost_overrun_vs_oracle']:+.1%}"))
    for k, v in rows:
        t.add_row(k, v)
    return t


def price_settings(settings: Settings, schedule: str) -> Settings:
    """``settings`` whose workers rank with ``schedule``'s prices (a price file under the home)."""
    from dataclasses import replace

    if schedule == "list":
        return settings
    prices = schedule_prices(schedule, load_catalogue(settings))
    path = write_price_file(prices, settings.home / f"prices-{schedule}.csv",
                            f"{schedule} schedule (leap.fleet.capacity)")
    return replace(settings, prices_file=path)


def prepare(settings: Settings, model: str) -> None:
    """Services, topics and a served model with its trees compiled."""
    t0 = time.monotonic()
    console.print("[bold]services[/] ...")
    stack.up(settings)
    create_topics(settings)
    console.print(f"services and topics ready in {time.monotonic() - t0:.1f}s")
    version = ensure_model(settings, model)
    console.print(f"model in use: [bold]{version}[/]")
    compile_before_serving(settings, version)


def run_demo(duration: float, rate: float, seed: int, warmup: int, deadline_ms: float,
             attempts_per_day: float, model: str = "auto", capacity: bool = True,
             price_schedule: str = "list") -> dict[str, Any]:
    if price_schedule not in PRICE_SCHEDULES:
        raise LookupError(f"unknown price schedule {price_schedule!r}; choose one of: {', '.join(PRICE_SCHEDULES)}")
    base = Settings.from_env()
    settings = price_settings(base, price_schedule)
    t0 = time.monotonic()
    prepare(settings, model)
    catalogue = load_catalogue(base)
    schedules = {name: schedule_prices(name, catalogue) for name in PRICE_SCHEDULES}
    pools = load_capacity(catalogue).scaled(attempts_per_day)
    # A fresh job namespace per run: the demo's jobs never collide with an earlier run's.
    fleet = Fleet(seed=seed ^ (uuid.uuid4().int & 0xFFFFFFFF), attempts_per_day=attempts_per_day, catalogue=catalogue)
    inputs = (SUBMISSIONS.name, JOB_STARTS.name, JOB_FINISHES.name)
    input_start = topic_ends(settings, inputs)
    dlq_start = topic_ends(settings, (DEAD_LETTER.name,))
    procs = start_workers(settings, settings.home / "logs")
    try:
        with SchedulerClient(settings) as client:
            wait_ready(client, fleet, procs)
            console.print(f"workers ready in {time.monotonic() - t0:.1f}s")
            sim = SchedulerSimulator(client, fleet, catalogue, rate=rate, deadline_s=deadline_ms / 1000.0,
                                     capacity=pools, limit=capacity, schedules=schedules,
                                     schedule=price_schedule, seed=seed)
            if warmup:
                events = sim.warm_up(warmup)
                console.print(f"warm start: {events} start/finish events of {warmup} earlier attempts published")
            start = time.monotonic()
            if console.is_terminal:
                with Live(_table(sim, 0, duration), console=console, refresh_per_second=2) as live:
                    summary = sim.run(duration, lambda s: live.update(_table(s, time.monotonic() - start, duration)))
            else:
                def log_line(s: SchedulerSimulator) -> None:
                    if int(time.monotonic() - start) % 10 == 0:
                        x = s.summary()
                        console.print(f"t={time.monotonic() - start:.0f}s submissions={x['submissions']} "
                                      f"ranked={x['ranked_in_time']} coverage={x['coverage']:.4f}")
                summary = sim.run(duration, log_line)
            # Stop only once the feature worker has applied everything published, so the live
            # state equals a replay of the topics (`leap replay rebuild-features`).
            lag = wait_caught_up(settings, consumer_group(settings, "features"), (JOB_STARTS.name, JOB_FINISHES.name))
            if lag:
                console.print(f"[yellow]feature worker still {lag} events behind when stopping[/]")
    finally:
        for p in procs:
            p.stop()
    # Only this run's input counts; older messages a resumed consumer group read meanwhile
    # (e.g. a test suite's deliberately malformed events) are reported apart.
    summary["dead_letters"], summary["dead_letters_from_earlier_input"] = dead_letters_since(
        settings, dlq_start, input_start)
    summary["duration_s"] = duration
    summary["rate"] = rate
    summary["model_version"] = _model_version(sim)
    console.print(_table(sim, duration, duration, summary))
    return summary


def _model_version(sim: SchedulerSimulator) -> str | None:
    versions = {p.ranking.model_version for p in sim.placements if p.ranking is not None}
    return ",".join(sorted(versions)) or None
