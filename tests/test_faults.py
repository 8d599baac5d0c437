"""Faults against real workers (``leap worker ROLE`` processes): nothing is lost when things break.

Each test runs workers on a private broker (one per module, restarted by one test) and a
private redis-server (one per test), never the shared ones. Events go in two phases: job
starts and finishes (the feature agents), then submissions (the predictor), with the fault in
the middle of a phase. After each:

- the features in Redis equal one clean pass of the same events through the store;
- every submission has exactly one ranking for a ``read_committed`` reader (the predictors rank
  in transactions);
- the workers that were not killed on purpose are alive and logged no crash.

Timings (how long rankings stalled) are printed for the record, never asserted: figures are
measured and reported in docs/faults.md.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from leap.core.settings import Settings
from leap.services.workers import WorkerProcess
from predictor.reload import announce
from streams.topics import JOB_FINISHES, JOB_STARTS, SUBMISSIONS
from tests.faults_support import (
    CRASH_MARKERS,
    PrivateRedis,
    Workload,
    applied_count,
    check_rankings,
    clean_pass,
    dump,
    fresh_groups,
    private_kafka,
    publish,
    read_rankings,
    wait_until,
    workload,
)

pytestmark = [pytest.mark.faults, pytest.mark.integration]

#: Events per test: enough batches for a fault to land mid-stream, few enough for seconds.
N_FINISHES, N_SUBMISSIONS = 1200, 160
FINISH_RATE, SUBMISSION_RATE = 300.0, 40.0
#: Longest wait for a phase to settle after its fault (a restarted worker needs ~10 s to start).
SETTLE_S = 150.0


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, Callable[[float], None]]]:
    with private_kafka(tmp_path_factory.mktemp("broker")) as pair:
        yield pair


@dataclass
class Rig:
    """Private Redis, settings pointing at it and the private broker, and the test's workers."""

    settings: Settings
    redis: PrivateRedis
    tmp: Path
    restart_broker: Callable[[float], None]
    workers: list[WorkerProcess] = field(default_factory=list)
    killed: set[int] = field(default_factory=set)

    def start(self, role: str) -> WorkerProcess:
        proc = WorkerProcess(self.settings, role, self.tmp / f"{role}-{len(self.workers)}.log")
        self.workers.append(proc)
        return proc

    def kill(self, proc: WorkerProcess) -> None:
        proc.proc.send_signal(signal.SIGKILL)
        proc.proc.wait(10)
        self.killed.add(id(proc))

    def stacks(self) -> str:
        """Every live worker's threads as py-spy sees them (what a hung worker waits in), or why not."""
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        out = []
        for proc in self.workers:
            if id(proc) in self.killed or not proc.alive():
                continue
            try:
                dump = subprocess.run([spy, "dump", "--pid", str(proc.proc.pid)], capture_output=True, text=True,
                                      timeout=30)
                out.append(f"== {proc.log_path.name} (pid {proc.proc.pid})\n{dump.stdout}{dump.stderr}")
            except (OSError, subprocess.TimeoutExpired) as exc:
                out.append(f"== {proc.log_path.name}: no stacks ({exc})")
        return "\n".join(out)

    def check_no_crash(self) -> None:
        for proc in self.workers:
            if id(proc) in self.killed:
                continue
            assert proc.alive(), f"a worker exited:\n{proc.log_tail()}"
            text = proc.log_path.read_text(errors="replace")
            assert not any(m in text for m in CRASH_MARKERS), f"a worker crashed:\n{proc.log_tail()}"


@pytest.fixture
def make_rig(broker: tuple[Settings, Callable[[float], None]], tmp_path: Path,
             run_id: str) -> Iterator[Callable[..., Rig]]:
    rigs: list[Rig] = []

    def make(aof: bool = False) -> Rig:
        red = PrivateRedis(tmp_path / "redis", aof=aof)
        red.start()
        settings = replace(broker[0], redis_url=red.url, redis_from_env=True, home=tmp_path / "home",
                           key_prefix=f"f{run_id}")
        fresh_groups(settings)
        rigs.append(Rig(settings, red, tmp_path, broker[1]))
        return rigs[-1]

    yield make
    for rig in rigs:
        for proc in rig.workers:
            proc.stop(timeout=20)
            # pytest shows a teardown's output only when the test failed: the workers' side of it
            print(f"---- {proc.log_path.name} (exit {proc.proc.returncode}), last lines:\n{proc.log_tail(80)}")
        rig.redis.stop()


def _in_background(fn: Callable[[], None]) -> threading.Thread:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # re-raised by the caller through the assertion below
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.errors = errors  # type: ignore[attr-defined]
    thread.start()
    return thread


def _join(thread: threading.Thread) -> None:
    thread.join(SETTLE_S)
    assert not thread.is_alive(), "publishing did not finish"
    errors = thread.errors  # type: ignore[attr-defined]
    if errors:
        raise errors[0]


def _features_settle(rig: Rig, work: Workload, submitted: list[dict[str, Any]]) -> None:
    """Wait until the workers' features equal a clean pass of ``work``'s starts and finishes and the
    ``submitted`` submissions (those published so far: they feed the configuration aggregates);
    assert with the difference if not."""
    client, prefix = rig.redis.client(), rig.settings.key_prefix
    clean = f"{prefix}-clean-{len(submitted)}"
    if not dump(client, clean):
        clean_pass(client, clean, replace(work, submissions=submitted), with_submissions=True)
    want = dump(client, clean)

    def equal() -> bool:
        return dump(client, prefix) == want

    try:
        wait_until(equal, SETTLE_S, "features equal to a clean pass", poll=0.5)
    except AssertionError:
        got = dump(client, prefix)
        differing = sorted(k for k in want.keys() | got.keys() if got.get(k) != want.get(k))
        first = differing[0]
        raise AssertionError(f"{len(differing)} of {len(want)} keys differ from a clean pass, e.g. {differing[:3]}; "
                             f"{first}: got {got.get(first)!r}, clean pass {want.get(first)!r}") from None


def run_phases(rig: Rig, work: Workload, during_features: Callable[[], None] | None = None,
               during_submissions: Callable[[], None] | None = None, published: Workload | None = None) -> None:
    """Starts and finishes with ``during_features`` mid-stream, features checked; then submissions
    with ``during_submissions`` mid-stream, rankings checked: each ranked once. ``published``: the
    workload whose submissions were all published, when a test published some of them itself
    during the features phase (they feed the configuration aggregates that both checks compare)."""
    s = rig.settings
    every = (published or work).submissions
    phase = {sub["attempt_id"] for sub in work.submissions}
    publish(s, JOB_STARTS.name, work.starts)
    feed = _in_background(lambda: publish(s, JOB_FINISHES.name, work.finishes, FINISH_RATE))
    if during_features:
        during_features()
    _join(feed)
    # before submissions: duplicates then see the same features
    _features_settle(rig, work, [sub for sub in every if sub["attempt_id"] not in phase])
    feed = _in_background(lambda: publish(s, SUBMISSIONS.name, work.submissions, SUBMISSION_RATE))
    if during_submissions:
        during_submissions()
    _join(feed)
    ids = {sub["attempt_id"] for sub in work.submissions}
    found = read_rankings(s, ids, SETTLE_S)
    if ids - found.keys():  # say where the workers wait before the assertion fails
        print(f"{len(ids - found.keys())} submissions unranked; worker stacks:\n{rig.stacks()}")
    duplicates = check_rankings(found, ids)
    worst = max(min(r.since_submit_ms or 0.0 for r in rs) for rs in found.values()) / 1000
    print(f"{work.run}: {len(ids)} submissions ranked, {duplicates} duplicate rankings, "
          f"longest wait {worst:.1f} s")
    assert duplicates == 0, f"{duplicates} duplicate rankings for a read_committed reader"
    _features_settle(rig, work, every)  # nothing else moved meanwhile
    rig.check_no_crash()


def then(*steps: Callable[[], object]) -> Callable[[], None]:
    """One fault: ``steps`` in order."""
    def run() -> None:
        for step in steps:
            step()
    return run


def _after_progress(rig: Rig, work: Workload, share: float) -> None:
    """Block until the workers have applied about ``share`` of the finishes (mid-stream)."""
    client, prefix = rig.redis.client(), rig.settings.key_prefix
    wait_until(lambda: applied_count(client, prefix, work) >= share * len(work.finishes), SETTLE_S,
               "feature progress")


def _after_rankings(rig: Rig, work: Workload, count: int) -> None:
    ids = {sub["attempt_id"] for sub in work.submissions}
    wait_until(lambda: len(read_rankings(rig.settings, ids, 0.5)) >= count, SETTLE_S, "ranking progress", poll=0)


def test_the_comparison_does_not_depend_on_how_partitions_interleave(tmp_path: Path, run_id: str) -> None:
    # The workers read partitions in any interleaving; a clean pass reads in publication order.
    # Their features can be compared only if the interleaving cannot matter: check that it does
    # not, with the most extreme one (job after job, last job first), and that a batch applied
    # again (a worker stopped before its commit, its successor reading the batch again) changes
    # nothing, the configuration aggregates' windows and sorted views included.
    red = PrivateRedis(tmp_path / "redis")
    red.start()
    try:
        work = workload(f"or{run_id}", N_FINISHES, N_SUBMISSIONS)
        by_job: dict[str, list[dict[str, object]]] = {}
        for f in work.finishes:
            by_job.setdefault(str(f["job_key"]), []).append(f)
        subs_by_job: dict[str, list[dict[str, Any]]] = {}
        for sub in work.submissions:
            subs_by_job.setdefault(str(sub["job_key"]), []).append(sub)
        client = red.client()
        clean_pass(client, "in-order", work, with_submissions=True)
        subs = [sub for q in reversed(subs_by_job.values()) for sub in q]
        clean_pass(client, "job-by-job", replace(work, finishes=[f for q in reversed(by_job.values()) for f in q],
                                                 submissions=subs[:100] + subs[40:] + subs[:40]), with_submissions=True)
        in_order = dump(client, "in-order")
        assert any(":pairs:" in k for k in in_order)  # paired ratios are part of the comparison
        for view in ("", ":win", ":sorted"):  # so are the configuration aggregates
            assert any(k.startswith(":config:") and k.endswith("}" + view) for k in in_order), view
        assert dump(client, "job-by-job") == in_order
    finally:
        red.stop()


def test_kill_9_of_a_feature_worker(make_rig: Callable[..., Rig], run_id: str) -> None:
    rig = make_rig()
    worker = rig.start("features")
    rig.start("predictor")
    work = workload(f"kf{run_id}", N_FINISHES, N_SUBMISSIONS)

    def kill_and_restart() -> None:
        _after_progress(rig, work, 0.3)
        rig.kill(worker)
        rig.start("features")

    run_phases(rig, work, during_features=kill_and_restart)


def test_kill_9_of_a_predictor_with_a_second_one_running(make_rig: Callable[..., Rig], run_id: str) -> None:
    rig = make_rig()
    rig.start("features")
    first = rig.start("predictor")
    rig.start("predictor")
    work = workload(f"kp{run_id}", N_FINISHES // 4, N_SUBMISSIONS * 2)
    run_phases(rig, work, during_submissions=then(lambda: _after_rankings(rig, work, 60), lambda: rig.kill(first)))


def test_kill_9_of_the_worker_running_both(make_rig: Callable[..., Rig], run_id: str) -> None:
    rig = make_rig()
    rig.start("all")
    work = workload(f"ka{run_id}", N_FINISHES, N_SUBMISSIONS)

    def kill_latest_and_restart() -> None:
        rig.kill(rig.workers[-1])
        rig.start("all")

    run_phases(rig, work, during_features=then(lambda: _after_progress(rig, work, 0.3), kill_latest_and_restart),
               during_submissions=then(lambda: _after_rankings(rig, work, 40), kill_latest_and_restart))


#: Least time Redis stays down: past the store's 10 s socket timeout and the 10 s transaction
#: timeout, so that no batch or transaction outlives the outage by having timed out inside it.
REDIS_DOWN_S = 15.0


def test_redis_stopped_for_15_s_and_restarted(make_rig: Callable[..., Rig], run_id: str) -> None:
    rig = make_rig()
    worker = rig.start("all")
    work = workload(f"rs{run_id}", N_FINISHES, N_SUBMISSIONS)
    early, late = work.submissions[:40], work.submissions[40:]

    def outage() -> None:
        _after_progress(rig, work, 0.2)
        down_at = time.monotonic()
        rig.redis.stop(signal.SIGTERM)  # a clean stop: the server writes its snapshot
        publish(rig.settings, SUBMISSIONS.name, early)  # submissions arrive during the outage too
        # A worker stopped during the outage gives its waiting batch up at once (exit 75, nothing
        # committed) instead of holding the stop; its successor starts while Redis is still down.
        wait_until(lambda: "redis is unavailable" in worker.log_path.read_text(errors="replace"), 30,
                   "the worker noticing the outage")
        stopped_at = time.monotonic()
        assert worker.stop(timeout=30) == 75 and time.monotonic() - stopped_at < 15
        rig.killed.add(id(worker))
        successor = rig.start("all")
        # the successor must meet the outage itself (its log is checked below), however slowly it starts
        wait_until(lambda: "redis is unavailable" in successor.log_path.read_text(errors="replace"), SETTLE_S,
                   "the successor noticing the outage")
        time.sleep(max(0.0, REDIS_DOWN_S - (time.monotonic() - down_at)))
        print(f"redis down for {time.monotonic() - down_at:.1f} s")
        rig.redis.start()

    run_phases(rig, replace(work, submissions=late), during_features=outage, published=work)
    ids = {sub["attempt_id"] for sub in early}
    check_rankings(read_rankings(rig.settings, ids, SETTLE_S), ids)
    log = rig.workers[-1].log_path.read_text(errors="replace")
    assert "redis is unavailable" in log and "redis is back" in log  # on-call saw it, once each way


def test_redis_killed_and_restarted_with_aof(make_rig: Callable[..., Rig], run_id: str) -> None:
    rig = make_rig(aof=True)
    rig.start("all")
    work = workload(f"ra{run_id}", N_FINISHES, N_SUBMISSIONS)

    def crash() -> None:
        _after_progress(rig, work, 0.3)
        rig.redis.stop(signal.SIGKILL)  # what was acknowledged is in the append-only file
        time.sleep(3)
        rig.redis.start()

    run_phases(rig, work, during_features=crash)


def test_slow_redis(make_rig: Callable[..., Rig], run_id: str) -> None:
    rig = make_rig()
    rig.start("all")
    work = workload(f"sl{run_id}", N_FINISHES, N_SUBMISSIONS)

    def pause(ms: int) -> Callable[[], object]:
        return lambda: rig.redis.client().execute_command("CLIENT", "PAUSE", ms, "ALL")

    # 12 s is longer than the store's 10 s socket timeout: calls time out, and the server then
    # runs the commands they sent, so the retry must find them applied, not apply them twice.
    run_phases(rig, work, during_features=then(lambda: _after_progress(rig, work, 0.3), pause(12_000)),
               during_submissions=then(lambda: _after_rankings(rig, work, 40), pause(3_000)))


def test_broker_restarted(make_rig: Callable[..., Rig], run_id: str) -> None:
    rig = make_rig()
    rig.start("all")
    work = workload(f"br{run_id}", N_FINISHES, N_SUBMISSIONS)
    early, late = work.submissions[:40], work.submissions[40:]

    def restart() -> None:
        _after_progress(rig, work, 0.3)
        publish(rig.settings, SUBMISSIONS.name, early)  # rankings to send while the broker is down
        rig.restart_broker(5.0)

    run_phases(rig, replace(work, submissions=late), during_features=restart, published=work)
    ids = {sub["attempt_id"] for sub in early}
    assert check_rankings(read_rankings(rig.settings, ids, SETTLE_S), ids) == 0


def test_broker_restarted_while_a_transactional_predictor_ranks(make_rig: Callable[..., Rig], run_id: str) -> None:
    rig = make_rig()
    rig.start("features")
    rig.start("predictor")
    predictor = rig.workers[-1]
    work = workload(f"bp{run_id}", N_FINISHES // 4, N_SUBMISSIONS)
    run_phases(rig, work, during_submissions=then(lambda: _after_rankings(rig, work, 40),
                                                  lambda: rig.restart_broker(5.0)))
    log = predictor.log_path.read_text(errors="replace")
    # on-call reads the outage in a pair of lines, not librdkafka's line per reconnect attempt
    assert "kafka is unavailable" in log and "kafka is back after" in log, predictor.log_tail()
    assert log.count("kafka is unavailable") <= 3, predictor.log_tail()
    # the unavailable line says the first error seen (a refused connection, often); no other does
    refused = [line for line in log.splitlines() if "Connection refused" in line and "kafka is unavailable" not in line]
    assert not refused, predictor.log_tail()


def test_a_running_predictor_takes_a_rollback_to_the_lookup_baseline(make_rig: Callable[..., Rig],
                                                                    run_id: str) -> None:
    rig = make_rig()
    rig.start("predictor")
    fresh = iter(workload(f"rb{run_id}", 0, 400).submissions)

    def served() -> str:
        """The model version of a new submission's ranking."""
        sub = next(fresh)
        publish(rig.settings, SUBMISSIONS.name, [sub])
        return read_rankings(rig.settings, {sub["attempt_id"]}, SETTLE_S)[sub["attempt_id"]][0].model_version

    wait_until(lambda: "predictor starts with model" in rig.workers[0].log_path.read_text(errors="replace"),
               SETTLE_S, "the predictor starting")
    announce(rig.settings, None, "transfer")  # promote another baseline
    wait_until(lambda: served() == "transfer", SETTLE_S, "the promotion")
    announce(rig.settings, None, "lookup")  # the rollback: "metrics": null, which predictors once refused
    wait_until(lambda: served() == "lookup", SETTLE_S, "the rollback")
    log = rig.workers[0].log_path.read_text(errors="replace")
    assert "bad model announcement" not in log and "model transfer -> lookup" in log
    rig.check_no_crash()
