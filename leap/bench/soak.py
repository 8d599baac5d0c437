"""``bench soak``: the workers under a steady load for many minutes; does anything grow?

A ``leap worker features`` and a ``leap worker predictor`` run against the real broker and Redis
(scratch key prefix and home). This process publishes, every second, ``rate`` submissions and
``rate / 2`` job starts and finishes (of the warmed jobs, so the prior-throughput path is busy),
plus a few malformed messages per topic (``bad_share``), and follows the rankings topic.
Worker memory (RSS from ``/proc``) is sampled every ``sample_s`` seconds; growth compares the
mean of the first and of the last minute after a warm-up. At the end: the consumer groups' lag,
rankings received against submissions sent, dead letters counted on their topic.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import Consumer, TopicPartition

from features.store import open_store
from leap.bench.common import Figures, report, resident_bytes, say, scratch_prefix
from leap.bench.e2e import Collector, tagged, wait_until_ranking
from leap.bench.workload import Workload, make_workload, seed_store
from leap.core.hardware import load_catalogue
from leap.core.settings import Settings
from leap.services.workers import WorkerProcess
from streams.client import SchedulerClient
from streams.topics import (
    DEAD_LETTER,
    JOB_FINISHES,
    JOB_STARTS,
    SUBMISSIONS,
    consumer_group,
    end_offsets,
    skip_to_end,
)


def rss_mb(pid: int) -> float:
    """Resident memory of a running process, MB."""
    rss = resident_bytes(pid)
    if rss is None:
        raise RuntimeError(f"no resident memory for pid {pid}: the process has ended")
    return rss / 1024 / 1024


def group_lag(settings: Settings, group: str, topics: tuple[str, ...]) -> int:
    """Messages of ``topics`` the group has not committed yet."""
    consumer = Consumer(settings.confluent_config(**{"group.id": group, "enable.auto.commit": False}))
    try:
        ends = end_offsets(consumer, topics)
        committed = consumer.committed([TopicPartition(t, p) for t, p in ends], timeout=10)
        return sum(end - max(tp.offset, 0) for tp, end in zip(committed, ends.values(), strict=True))
    finally:
        consumer.close()


def _publisher(client: SchedulerClient, w: Workload, rate: float, bad_share: float, seconds: float,
               sent: dict[str, float], stop: threading.Event) -> dict[str, int]:
    """Publish the soak's mix at a steady rate; returns counts per kind."""
    tag = uuid.uuid4().hex[:8]
    counts = {"submissions": 0, "starts": 0, "finishes": 0, "malformed": 0}
    start = time.time()
    i = 0
    rng = np.random.default_rng(1)
    while not stop.is_set() and (now := time.time()) - start < seconds:
        due = start + i / rate
        if due > now:
            time.sleep(min(due - now, 0.005))
            continue
        sub = tagged(w.submissions[i % len(w.submissions)], f"{tag}-{i}")
        sent[sub.attempt_id] = time.time()
        client.publish(sub)
        counts["submissions"] += 1
        if i % 2 == 0:
            k = (i // 2) % len(w.finishes)
            fin = w.finishes[k]
            shift = now - fin.event_time  # the attempt moved to now: newer than anything stored, so applied
            client.publish_start(replace(w.starts[k], event_id=f"{w.starts[k].event_id}-{tag}-{i}",
                                         event_time=w.starts[k].event_time + shift))
            client.publish_finish(replace(fin, event_id=f"{fin.event_id}-{tag}-{i}", event_time=fin.event_time + shift,
                                          start_time=fin.start_time + shift))
            counts["starts"] += 1
            counts["finishes"] += 1
        if rng.random() < bad_share:
            topic = (SUBMISSIONS, JOB_STARTS, JOB_FINISHES)[i % 3].name
            client.publish_raw(topic, f"soak-bad-{i}", b'{"schema_version": 1, "truncated')
            counts["malformed"] += 1
        i += 1
    client.flush()
    return counts


def _settled_lags(settings: Settings, roles: dict[str, tuple[str, ...]], wait: float = 10.0) -> dict[str, int]:
    """Each group's lag once its last commit landed (workers commit every second), or after ``wait`` s."""
    deadline = time.time() + wait
    while True:
        lags = {role: group_lag(settings, consumer_group(settings, role), topics) for role, topics in roles.items()}
        if not any(lags.values()) or time.time() > deadline:
            return lags
        time.sleep(1.0)


def _sample(workers: dict[str, WorkerProcess], samples: dict[str, list[tuple[float, float]]], t0: float) -> None:
    for name, proc in workers.items():
        if proc.alive():
            samples[name].append((time.time() - t0, rss_mb(proc.proc.pid)))


def _growth(points: list[tuple[float, float]], warmup: float, window: float) -> tuple[float, float, float]:
    """(mean RSS of the first ``window`` s after ``warmup``, of the last ``window`` s, their ratio - 1)."""
    end = points[-1][0]
    first = [mb for t, mb in points if warmup <= t < warmup + window] or [points[0][1]]
    last = [mb for t, mb in points if t >= end - window] or [points[-1][1]]
    a, b = float(np.mean(first)), float(np.mean(last))
    return a, b, b / a - 1.0


def _drive(settings: Settings, w: Workload, workers: dict[str, WorkerProcess], minutes: float, rate: float,
           bad_share: float, sample_s: float) -> tuple[dict[str, int], dict[str, float], set[str],
                                                     dict[str, list[tuple[float, float]]]]:
    """Publish for ``minutes`` while sampling RSS; (counts, sent times, answered ids, RSS samples).
    ``settings`` are the workers' (their key prefix): only their rankings are followed."""
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in workers}
    with SchedulerClient(settings, deployment=settings.key_prefix) as client:
        wait_until_ranking(client, workers["predictor"], w.submissions[0], 120.0)
        collector, stop = Collector(client), threading.Event()
        sent: dict[str, float] = {}
        collector.start()
        t0 = time.time()
        out: dict[str, int] = {}
        thread = threading.Thread(target=lambda: out.update(
            _publisher(client, w, rate, bad_share, minutes * 60, sent, stop)), daemon=True)
        thread.start()
        try:
            while thread.is_alive():
                _sample(workers, samples, t0)
                time.sleep(sample_s)
                say(f"{time.time() - t0:.0f} s: {len(sent)} sent, {len(collector.got)} rankings, RSS "
                    + ", ".join(f"{k} {v[-1][1]:.0f} MB" for k, v in samples.items() if v))
        finally:
            stop.set()
            thread.join(30)
        deadline = time.time() + 60
        while time.time() < deadline and any(a not in collector.got for a in sent):
            time.sleep(0.2)
        collector.stop()
        _sample(workers, samples, t0)
    return out, sent, {a for a in sent if a in collector.got}, samples


def bench_soak(settings: Settings, minutes: float = 30.0, rate: float = 500.0, bad_share: float = 0.005,
               sample_s: float = 5.0, warmup_s: float = 60.0, warm: int = 20000, seed: int = 0) -> dict[str, Any]:
    """Run the soak and return its JSON report (parameters: see the module docstring)."""
    began = time.perf_counter()
    prefix, home = scratch_prefix(), Path(tempfile.mkdtemp(prefix="leap-soak-home-"))
    w = make_workload(warm, 5000, seed, start_time=None)
    store = open_store(settings, load_catalogue(), prefix=prefix)
    scoped = replace(settings, home=home, key_prefix=prefix)
    workers: dict[str, WorkerProcess] = {}
    letters_before = sum(end_offsets_of(settings, DEAD_LETTER.name))
    # the feature workers read submissions too (the configuration aggregates)
    roles = {"features": (JOB_STARTS.name, JOB_FINISHES.name, SUBMISSIONS.name), "predictor": (SUBMISSIONS.name,)}
    try:
        seed_store(store, w)
        for role, topics in roles.items():
            skip_to_end(scoped, consumer_group(scoped, role), topics)  # a backlog of other runs is not this load
            workers[role] = WorkerProcess(scoped, role, home / f"{role}.log")
        out, _, answered, samples = _drive(scoped, w, workers, minutes, rate, bad_share, sample_s)
        lags = _settled_lags(scoped, roles)
        alive = {name: proc.alive() for name, proc in workers.items()}
    finally:
        for proc in workers.values():
            proc.stop()
        store.delete_all()
        store.client.close()
        shutil.rmtree(home, ignore_errors=True)
    figures: Figures = {
        "submissions": float(out.get("submissions", 0)), "finishes": float(out.get("finishes", 0)),
        "malformed": float(out.get("malformed", 0)), "rankings": float(len(answered)),
        "dead_letters": float(sum(end_offsets_of(settings, DEAD_LETTER.name)) - letters_before),
        "lag_features": float(lags["features"]), "lag_predictor": float(lags["predictor"]),
    }
    window = min(60.0, max(sample_s, (minutes * 60 - warmup_s) / 4))
    for name, points in samples.items():
        first, last, growth = _growth(points, min(warmup_s, minutes * 30), window)
        figures.update({f"{name}_rss_start_mb": first, f"{name}_rss_end_mb": last, f"{name}_rss_growth": growth})
    params = {"minutes": minutes, "rate": rate, "bad_share": bad_share, "sample_s": sample_s, "warmup_s": warmup_s,
              "warm_attempts": warm, "seed": seed, "key_prefix": prefix, "kafka": settings.kafka_bootstrap}
    rss = {k: [round(mb, 1) for _, mb in v] for k, v in samples.items()}
    return report("soak", params, [figures], extra={"workers_alive_at_end": alive, "rss_samples_mb": rss},
                  started=began)


def end_offsets_of(settings: Settings, topic: str) -> list[int]:
    """High watermarks of ``topic``'s partitions now."""
    consumer = Consumer(settings.confluent_config(**{"group.id": "leap-soak-unused"}))
    try:
        return list(end_offsets(consumer, (topic,)).values())
    finally:
        consumer.close()
