"""``bench e2e``: submission-to-ranking latency and sustained rankings/s through a real worker.

A ``leap worker predictor`` (or ``all``) child process runs against the local broker and Redis
with a scratch key prefix (warmed with simulated history) and a scratch ``LEAP_HOME``. It serves
whatever model the shared ``leap.models`` topic announces (announcements carry the artifact's
path), else the lookup fallback; the report counts the model versions of the rankings it got.
The benchmark publishes
submissions with :class:`SchedulerClient` at a target rate — or as fast as the worker keeps up,
with at most ``window`` submissions unanswered — and a second thread follows the rankings topic.

Latency is measured in this process from just before ``produce`` to the ranking's arrival, so
it includes both Kafka hops and the client's own batching (``linger.ms``, ``fetch.wait.max.ms``).
It is split where the worker's clock (the same machine's) marks it: ``hop_in`` from ``produce``
to the worker's receipt of the batch (the ranking's ``event_time`` less its ``latency_ms``:
client linger, broker, the worker's fetch and batch window), ``worker_latency`` inside the
worker, ``hop_out`` from the ranking's ``event_time`` to its arrival here (the worker's send and
linger, broker, this client's fetch).

After each run the same submissions go through the ranking loop in this process (decode, rank
with the worker's model on the same store, encode): ``ratio_to_bare`` is the run's rankings/s
over that loop's. With ``--model DIR`` the worker is pinned to that saved model (``leap worker
--model``) and the loop uses it too; without, the loop uses the lookup fallback, like for like
only when the worker served the lookup as well (``model_versions``).

``--delivery exactly_once|at_least_once|both`` picks how the predictor commits (``LEAP_EXACTLY_ONCE``:
in Kafka transactions, committed every ``--transaction-interval`` at most, or at least once);
``both`` runs the two one after the other in one invocation (a worker of each, ``repeat`` runs
each), reports every figure prefixed with the mode (``exactly_once_rankings_per_s``...), the
unprefixed headline figures of the first one run (exactly_once, the default), and
``exactly_once_over_at_least_once``: the ratio of their rankings/s run by run. Each run also
reports the worker's transaction commits, read from its ``/metrics`` before and after the run
(``commits_per_s``, ``commit_mean_ms``, ``commit_p99_ms_at_most``: :mod:`leap.bench.worker_metrics`).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
from confluent_kafka.admin import AdminClient

from features.store import FeatureStore, open_store
from leap.bench.common import Figures, freeze_heap, percentiles_ms, report, say, scratch_prefix, unfreeze_heap
from leap.bench.private_services import free_port, private_services
from leap.bench.worker_metrics import Histogram, commit_figures, read_commits
from leap.bench.workload import Workload, make_workload, seed_store
from leap.core.hardware import load_catalogue
from leap.core.settings import Settings
from leap.services.processes import ROOT as SERVICES_ROOT
from leap.services.workers import WorkerProcess, worker_env
from predictor.lgbm import LightGBMThroughput
from predictor.registry import Registry
from predictor.service import ActiveModel, ModelHolder, RankingService, lookup_fallback
from streams.client import SchedulerClient
from streams.events import Submission
from streams.topics import consumer_group, create_topics

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Collector:
    """Follows the rankings topic on a thread; keeps arrival time, worker latency (ms) and the
    ranking's ``event_time`` per attempt."""

    client: SchedulerClient
    got: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    tag: str = ""
    answered: int = 0  # rankings of the current run (attempt ids carrying ``tag``)
    versions: dict[str, int] = field(default_factory=dict)  # model versions of those rankings
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="bench-rankings", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for ranking, at in self.client.rankings(timeout=0.2):
                self.got[ranking.attempt_id] = (at, ranking.latency_ms, ranking.event_time)
                if self.tag and self.tag in ranking.attempt_id:
                    self.answered += 1
                    self.versions[ranking.model_version] = self.versions.get(ranking.model_version, 0) + 1

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)


DELIVERIES = ("exactly_once", "at_least_once")  # ``both`` runs them in this order; the first is the default
#: Compiled trees of ``--model`` folders, kept between runs (a new model compiles for minutes; the
#: worker's scratch home gets a copy, so it starts from the cache as a long-lived worker would).
COMPILED_CACHE = Path(tempfile.gettempdir()) / "leap-bench-compiled"


class BenchWorker(WorkerProcess):
    """``leap worker ROLE`` with the benchmark's own options (``--model DIR``); otherwise a
    :class:`WorkerProcess` (settings through the environment, stopped with SIGTERM)."""

    def __init__(self, settings: Settings, role: str, log_path: Path, model_dir: Path | None) -> None:
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("ab")
        extra = ["--model", str(model_dir)] if model_dir is not None else []
        self.metrics_port = free_port()  # its commits are read there (leap.bench.worker_metrics)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "leap.cli", "worker", role, "--metrics-port", str(self.metrics_port), *extra],
            cwd=SERVICES_ROOT, env=worker_env(settings), stdout=self._log, stderr=subprocess.STDOUT,
        )


def tagged(sub: Submission, tag: str) -> Submission:
    """The same submission under new ids (same job, so the same features)."""
    return replace(sub, attempt_id=f"{sub.attempt_id}-{tag}", event_id=f"{sub.event_id}-{tag}")


def wait_until_ranking(client: SchedulerClient, worker: WorkerProcess, probe: Submission, timeout: float) -> float:
    """Publish canaries until the worker answers one; returns seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if not worker.alive():
            raise RuntimeError(f"worker exited early:\n{worker.log_tail()}")
        canary = tagged(probe, f"canary-{uuid.uuid4().hex[:8]}")
        client.publish(canary)
        client.flush()
        if client.wait_for([canary.attempt_id], timeout=5):
            return time.monotonic() - t0
    raise RuntimeError(f"worker gave no ranking within {timeout:.0f} s:\n{worker.log_tail()}")


def group_members(settings: Settings, group: str) -> int:
    """Members of the worker's consumer group: more than 1 means another worker shares the load."""
    admin = AdminClient(settings.confluent_config())
    try:
        desc = admin.describe_consumer_groups([group])[group].result(timeout=10)
        return len(desc.members)
    except Exception:  # an informational figure: never fail the benchmark over it
        return -1


def run_once(client: SchedulerClient, collector: Collector, pool: list[Submission], rate: float, duration: float,
             window: int, drain: float) -> Figures:
    """Publish for ``duration`` seconds, then wait up to ``drain`` seconds for the last rankings."""
    tag = uuid.uuid4().hex[:8]
    collector.tag, collector.answered = tag, 0
    sent: dict[str, float] = {}
    start = time.time()
    i = 0
    while (now := time.time()) - start < duration:
        if rate > 0:
            due = start + i / rate
            if due > now:
                time.sleep(min(due - now, 0.01))
                continue
        elif i - collector.answered >= window:
            time.sleep(0.002)  # closed loop: let the worker catch up before publishing more
            continue
        sub = tagged(pool[i % len(pool)], f"{tag}-{i}")
        sent[sub.attempt_id] = time.time()
        client.publish(sub)
        i += 1
    published_s = time.time() - start
    client.flush()
    deadline = time.time() + drain
    while time.time() < deadline and any(a not in collector.got for a in sent):
        time.sleep(0.05)
    got = {a: collector.got[a] for a in sent if a in collector.got}
    lat = [got[a][0] - t for a, t in sent.items() if a in got]
    last = max((v[0] for v in got.values()), default=start)
    return {
        "published": float(len(sent)),
        "rate_achieved_per_s": len(sent) / published_s,
        "received": float(len(got)),
        "unanswered": float(len(sent) - len(got)),
        "rankings_per_s": len(got) / max(1e-9, last - start),
        **percentiles_ms(lat, "latency"),
        **percentiles_ms([v[1] / 1000.0 for v in got.values()], "worker_latency"),
        **percentiles_ms([got[a][2] - got[a][1] / 1000.0 - t for a, t in sent.items() if a in got], "hop_in"),
        **percentiles_ms([v[0] - v[2] for v in got.values()], "hop_out"),
    }


def worker_ready(client: SchedulerClient, worker: WorkerProcess, probe: Submission, settings: Settings, role: str,
                 timeout: float) -> tuple[float, int]:
    """Wait for the worker's first ranking; seconds waited and members of its predictor consumer
    group (``settings`` are the worker's: the group is named after its key prefix, whatever its role)."""
    ready_s = wait_until_ranking(client, worker, probe, timeout)
    group = consumer_group(settings, "predictor")
    members = group_members(settings, group)
    say(f"worker ({role}) answered after {ready_s:.1f} s; consumer group {group} has {members} member(s)")
    return ready_s, members


def bare_loop(store: FeatureStore, pool: list[Submission], model: ActiveModel, batch: int = 500) -> float:
    """Submissions/s of the ranking loop in this process (decode, ``RankingService.rank`` with
    ``model`` on the same store, encode): what end to end is compared with (``ratio_to_bare``)."""
    service = RankingService(store, load_catalogue(), ModelHolder(model))
    raw = [[s.encode() for s in pool[i:i + batch]] for i in range(0, len(pool), batch)]
    t0 = time.perf_counter()
    for part in raw:
        for ranking in service.rank([Submission.decode(b) for b in part]):
            ranking.encode()
    return len(pool) / (time.perf_counter() - t0)


def repeat_runs(client: SchedulerClient, pool: list[Submission], rate: float, duration: float, window: int,
                drain: float, repeat: int, store: FeatureStore, model: ActiveModel, warmup: float = 0.0,
                commits: Callable[[], Histogram] | None = None) -> tuple[list[Figures], dict[str, int]]:
    """``repeat`` runs of :func:`run_once` with one rankings follower, each followed by the bare
    loop (:func:`bare_loop`); the runs and the model versions of the rankings they got.

    First, ``warmup`` seconds of publishing at the same rate that are not recorded: a fresh broker's
    JVM and a fresh worker answer their first thousand requests slower than the rest, which put the
    first run (and, with ``--delivery both``, the first mode) at a disadvantage. ``commits`` reads
    the worker's commit histogram: each run then reports its commits (:func:`commit_figures`)."""
    collector = Collector(client)
    collector.start()
    runs: list[Figures] = []
    try:
        if warmup > 0:
            warm = run_once(client, collector, pool, rate, warmup, window, drain)
            say(f"warm-up ({warmup:.0f} s, not recorded): p50 {warm['latency_p50_ms']:.1f} ms, "
                f"p99 {warm['latency_p99_ms']:.1f} ms")
            collector.versions.clear()  # the report counts the recorded runs' rankings
        for r in range(repeat):
            before, t0 = commits() if commits else None, time.monotonic()
            runs.append(run_once(client, collector, pool, rate, duration, window, drain))
            if commits is not None and before is not None:
                runs[-1].update(commit_figures(before, commits(), time.monotonic() - t0))
            runs[-1]["bare_rankings_per_s"] = bare_loop(store, pool, model)
            runs[-1]["ratio_to_bare"] = runs[-1]["rankings_per_s"] / runs[-1]["bare_rankings_per_s"]
            say(f"run {r + 1}/{repeat}: {runs[-1]['rate_achieved_per_s']:.0f}/s published, "
                f"p50 {runs[-1]['latency_p50_ms']:.1f} ms, p99 {runs[-1]['latency_p99_ms']:.1f} ms")
    finally:
        collector.stop()
    return runs, collector.versions


@dataclass(frozen=True)
class Load:
    """What each run publishes (see :func:`run_once`)."""

    rate: float
    duration: float
    window: int
    drain: float
    repeat: int
    warmup: float = 0.0


def delivery_runs(settings: Settings, delivery: str, role: str, model_dir: Path | None, pool: list[Submission],
                  store: FeatureStore, load: Load, startup_timeout: float) -> tuple[list[Figures], dict[str, Any]]:
    """Start a worker committing as ``delivery`` says, measure ``load.repeat`` runs, stop it; the runs and facts."""
    home = Path(tempfile.mkdtemp(prefix="leap-bench-home-"))
    worker_settings = replace(settings, home=home, key_prefix=store.layout.prefix,
                              exactly_once=delivery == "exactly_once")
    worker: WorkerProcess | None = None
    model = load_model(model_dir)
    seed_compiled(home)
    freeze_heap()  # as the worker does: the bare loop must not pay for collections of the set-up objects
    try:
        say(f"starting a {role} worker ({delivery}), model {model.version if model_dir else 'announced'}")
        worker = BenchWorker(worker_settings, role, home / "worker.log", model_dir)
        with SchedulerClient(settings, deployment=store.layout.prefix) as client:
            ready_s, members = worker_ready(client, worker, pool[0], worker_settings, role, startup_timeout)
            runs, versions = repeat_runs(client, pool, load.rate, load.duration, load.window, load.drain,
                                         load.repeat, store, model, load.warmup,
                                         lambda: read_commits(worker.metrics_port))
    finally:
        unfreeze_heap()
        if worker is not None:
            worker.stop()
        shutil.rmtree(home, ignore_errors=True)
    return runs, {"worker_ready_s": round(ready_s, 1), "consumer_group_members": members,
                  "model_versions": versions}


def load_model(model_dir: Path | None) -> ActiveModel:
    """The model the bare loop ranks with: the worker's pinned model (trees compiled, as the worker
    serves it), else the lookup fallback."""
    if model_dir is None:
        return lookup_fallback()
    model = Registry(model_dir.parent).load(model_dir.name, model_dir)
    if isinstance(model, LightGBMThroughput):
        say(f"compiling the model's trees (cache {COMPILED_CACHE})")
        model.compile_trees(COMPILED_CACHE)
    return ActiveModel(model, model_dir.name)


def seed_compiled(home: Path) -> None:
    """Copy the compiled trees of :data:`COMPILED_CACHE` into a worker's home (a private folder)."""
    if COMPILED_CACHE.is_dir():
        target = home / "compiled"
        target.mkdir(mode=0o700, parents=True, exist_ok=True)
        for lib in COMPILED_CACHE.glob("trees-*.so"):
            shutil.copy2(lib, target / lib.name)


def side_by_side(per_mode: dict[str, list[Figures]]) -> list[Figures]:
    """One figure set per run: each mode's figures prefixed with its name, the first mode's also
    unprefixed, and ``exactly_once_over_at_least_once`` (rankings/s) when both ran."""
    names = list(per_mode)
    if len(names) == 1:
        return per_mode[names[0]]
    out: list[Figures] = []
    for r in range(min(len(v) for v in per_mode.values())):
        fig: Figures = dict(per_mode[names[0]][r])
        for name in names:
            fig.update({f"{name}_{k}": v for k, v in per_mode[name][r].items()})
        if set(DELIVERIES) <= set(names):
            fig["exactly_once_over_at_least_once"] = (per_mode["exactly_once"][r]["rankings_per_s"]
                                                      / per_mode["at_least_once"][r]["rankings_per_s"])
        out.append(fig)
    return out


def bench_e2e(
    settings: Settings,
    load: Load,
    role: str = "predictor",
    warm: int = 20000,
    startup_timeout: float = 90.0,
    seed: int = 0,
    delivery: Literal["exactly_once", "at_least_once", "both"] = "exactly_once",
    model_dir: Path | None = None,
    private: bool = False,
) -> dict[str, Any]:
    """Run the end-to-end benchmark and return its JSON report.

    Parameters
    ----------
    settings
        Broker and Redis (loopback by default); key prefix and home are replaced by scratch ones.
    load
        Rate (submissions/s; 0 = as fast as the worker answers, with at most ``window``
        unanswered), seconds of publishing per run, seconds of drain after it, runs per mode,
        seconds of unrecorded warm-up before a mode's runs.
    role
        ``predictor`` or ``all``.
    warm
        Earlier attempts whose finishes are written to the scratch prefix first.
    startup_timeout
        Seconds the worker may take to answer its first submission.
    delivery
        How the predictor commits (``settings.transaction_interval`` for transactions), or ``both``
        one after the other.
    model_dir
        A saved model folder the worker is pinned to (and the bare loop uses); None: the announced model.
    private
        Run against a broker and redis-server of the benchmark's own (:mod:`leap.bench.private_services`).
    """
    began = time.perf_counter()
    with private_services(settings, say) if private else nullcontext(settings) as used:
        if not private:
            # On services whose topics were never created (`leap services up` alone) a run got no
            # ranking within its start-up timeout and failed; with the topics created it ran.
            # Creating them is a no-op where they exist.
            create_topics(used)
        per_mode, extra, prefix, w = _measure(used, load, role, warm, startup_timeout, seed, delivery,
                                              model_dir)
    params = {"rate": load.rate, "duration_s": load.duration, "warmup_s": load.warmup,
              "window": load.window if load.rate <= 0 else None,
              "drain_s": load.drain, "role": role, "delivery": delivery,
              "transaction_interval_s": settings.transaction_interval,
              "model_dir": str(model_dir) if model_dir else None,
              "warm_attempts": warm, "seed": seed, "key_prefix": prefix, "private_services": private,
              "mean_candidates": round(float(np.mean([len(s.candidates) for s in w.submissions])), 2),
              "kafka": "private" if private else settings.kafka_bootstrap}
    return report("e2e", params, side_by_side(per_mode), extra=extra, started=began)


def _measure(settings: Settings, load: Load, role: str, warm: int, startup_timeout: float, seed: int,
             delivery: str, model_dir: Path | None) -> tuple[dict[str, list[Figures]], dict[str, Any], str, Workload]:
    """Seed a scratch prefix, run each mode's worker and runs; the runs, facts, prefix and workload."""
    prefix = scratch_prefix()
    say(f"simulating {warm} attempts of history into Redis prefix {prefix}")
    w = make_workload(warm, 2000, seed, start_time=None)
    store = open_store(settings, load_catalogue(), prefix=prefix)
    modes = list(DELIVERIES) if delivery == "both" else [delivery]
    per_mode: dict[str, list[Figures]] = {}
    extra: dict[str, Any] = {}
    try:
        seed_store(store, w)
        for name in modes:
            per_mode[name], facts = delivery_runs(settings, name, role, model_dir, w.submissions, store, load,
                                                    startup_timeout)
            extra.update(facts if len(modes) == 1 else {f"{name}_{k}": v for k, v in facts.items()})
    finally:
        store.delete_all()
        store.client.close()
    if len(modes) > 1:  # the headline facts are the first mode's, as its figures
        extra.update({k: extra[f"{modes[0]}_{k}"] for k in ("worker_ready_s", "consumer_group_members",
                                                               "model_versions")})
    return per_mode, extra, prefix, w
