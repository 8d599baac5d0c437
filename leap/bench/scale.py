"""``bench scale``: rankings/s with one and with two predictor workers, and what a rebalance costs.

Against the real broker and Redis, with a scratch key prefix warmed by simulated history (as
``bench e2e``):

1. one ``leap worker predictor``, closed loop (at most ``window`` submissions unanswered):
   rankings/s;
2. a second worker joins the group; once both hold partitions, the same closed loop;
3. an open loop at ``rate`` submissions/s, during which a third worker joins and later one leaves:
   latency percentiles over the whole loop and over the ``pause_window`` seconds after each
   change, and the longest gap between two rankings (how long rankings stopped).

On a two-core machine the second worker competes with the first (and with the broker, Redis and
this process) for the same cores: the ratio says what the machine allows, not what a second
machine would add.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from features.store import open_store
from leap.bench.common import Figures, percentiles_ms, report, say, scratch_prefix
from leap.bench.e2e import Collector, group_members, run_once, tagged, wait_until_ranking
from leap.bench.workload import make_workload, seed_store
from leap.core.hardware import load_catalogue
from leap.core.settings import Settings
from leap.services.workers import WorkerProcess
from streams.client import SchedulerClient
from streams.events import Submission
from streams.topics import consumer_group


def _await_members(settings: Settings, members: int, timeout: float) -> float:
    """Seconds until the predictor group has ``members`` members."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if group_members(settings, consumer_group(settings, "predictor")) == members:
            return time.monotonic() - t0
        time.sleep(0.5)
    raise RuntimeError(f"the predictor group did not reach {members} members within {timeout:.0f} s")


def _open_loop_with_changes(client: SchedulerClient, collector: Collector, pool: list[Submission], rate: float,
                            changes: list[tuple[float, Any]], duration: float, drain: float) -> dict[str, Any]:
    """Publish at ``rate`` for ``duration`` s, calling each change at its second; per-submission times."""
    tag = uuid.uuid4().hex[:8]
    collector.tag, collector.answered = tag, 0
    sent: dict[str, float] = {}
    done: list[float] = []
    start = time.time()
    i = 0
    todo = sorted(changes, key=lambda c: c[0])
    while (now := time.time()) - start < duration:
        if todo and now - start >= todo[0][0]:
            # off this thread: a leaving worker takes a while to stop, and publishing goes on
            threading.Thread(target=todo.pop(0)[1], daemon=True).start()
            done.append(now - start)
            continue
        due = start + i / rate
        if due > now:
            time.sleep(min(due - now, 0.005))
            continue
        sub = tagged(pool[i % len(pool)], f"{tag}-{i}")
        sent[sub.attempt_id] = time.time()
        client.publish(sub)
        i += 1
    client.flush()
    deadline = time.time() + drain
    while time.time() < deadline and any(a not in collector.got for a in sent):
        time.sleep(0.05)
    return {"start": start, "sent": sent, "got": {a: collector.got[a][0] for a in sent if a in collector.got},
            "changes_at_s": done}


def _pause_figures(run: dict[str, Any], window: float) -> Figures:
    sent, got, start = run["sent"], run["got"], run["start"]
    lat = [got[a] - t for a, t in sent.items() if a in got]
    near = [got[a] - t for a, t in sent.items() if a in got
            and any(0 <= t - start - c <= window for c in run["changes_at_s"])]
    arrivals = sorted(got.values())
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    return {
        "open_loop_published": float(len(sent)), "open_loop_unanswered": float(len(sent) - len(got)),
        **percentiles_ms(lat, "open_loop_latency"), **percentiles_ms(near, "rebalance_latency"),
        "open_loop_longest_gap_ms": 1000 * max(gaps, default=0.0),
    }


def bench_scale(settings: Settings, duration: float = 10.0, window: int = 400, rate: float = 200.0,
                pause_window: float = 10.0, warm: int = 20000, startup_timeout: float = 120.0,
                seed: int = 0) -> dict[str, Any]:
    """Run the scale benchmark and return its JSON report (parameters: see the module docstring)."""
    began = time.perf_counter()
    prefix = scratch_prefix()
    home = Path(tempfile.mkdtemp(prefix="leap-bench-home-"))
    w = make_workload(warm, 2000, seed, start_time=None)
    store = open_store(settings, load_catalogue(), prefix=prefix)
    scoped = replace(settings, home=home, key_prefix=prefix)
    workers: list[WorkerProcess] = []

    def add() -> None:
        workers.append(WorkerProcess(scoped, "predictor", home / f"worker-{len(workers)}.log"))

    def leave() -> None:
        workers.pop(0).stop()

    try:
        seed_store(store, w)
        add()
        with SchedulerClient(settings, deployment=prefix) as client:
            wait_until_ranking(client, workers[0], w.submissions[0], startup_timeout)
            collector = Collector(client)
            collector.start()
            try:
                one = run_once(client, collector, w.submissions, 0, duration, window, 10.0)
                say(f"one worker: {one['rankings_per_s']:.0f} rankings/s")
                add()
                joined_s = _await_members(scoped, 2, startup_timeout)
                time.sleep(2.0)  # let the second worker finish its first fetches
                two = run_once(client, collector, w.submissions, 0, duration, window, 10.0)
                say(f"two workers: {two['rankings_per_s']:.0f} rankings/s")
                third = 3 * duration
                run = _open_loop_with_changes(client, collector, w.submissions, rate,
                                              [(duration, add), (2 * duration, leave)], third, 15.0)
            finally:
                collector.stop()
    finally:
        for worker in workers:
            worker.stop()
        store.delete_all()
        store.client.close()
        shutil.rmtree(home, ignore_errors=True)
    pause = _pause_figures(run, pause_window)
    figures: Figures = {
        **{f"one_worker_{k}": v for k, v in one.items()},
        **{f"two_workers_{k}": v for k, v in two.items()},
        "two_over_one": two["rankings_per_s"] / max(1e-9, one["rankings_per_s"]),
        **pause,
    }
    params = {"duration_s": duration, "window": window, "rate": rate, "pause_window_s": pause_window,
              "warm_attempts": warm, "seed": seed, "key_prefix": prefix, "kafka": settings.kafka_bootstrap}
    extra = {"second_worker_joined_s": round(joined_s, 1),
             "changes_at_s": [round(c, 1) for c in run["changes_at_s"]]}
    return report("scale", params, [figures], extra=extra, started=began)
