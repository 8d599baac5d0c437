"""The figures of docs/faults.md, measured on a private broker and redis-server (never the shared ones).

    .venv/bin/python scripts/fault_figures.py failover [--session-timeout 6] [--static] [--assignor A] [--rate R]
    .venv/bin/python scripts/fault_figures.py redis-outage [--seconds 60]
    .venv/bin/python scripts/fault_figures.py broker-outage [--seconds 60]

failover: two predictors (transactional, as ``leap worker predictor`` runs them, with the group
options given: static membership, a partition assignor, the session timeout) rank ``--rate``
submissions/s; one is killed (SIGKILL) 5 s in. Prints the longest wait of a submission published
after the kill (``since_submit_ms`` of its ranking, read committed: how long rankings stopped for
the dead predictor's partitions, its open transaction included) and the duplicates.

redis-outage / broker-outage: one ``leap worker all`` takes starts (at once), finishes (100/s) and submissions
(10/s) for the outage plus 30 s; the dependency goes down 10 s in for ``--seconds``. Prints the
finishes missing from the features (against a clean pass) and the submissions without a ranking.
Each prints one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from leap.core.settings import Settings
from leap.services.workers import WorkerProcess, worker_env
from streams.topics import JOB_FINISHES, JOB_STARTS, SUBMISSIONS
from tests.faults_support import (
    PrivateRedis,
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


@contextlib.contextmanager
def rig(tmp: Path, prefix: str, **over: Any) -> Iterator[tuple[Settings, PrivateRedis, Any, list[WorkerProcess]]]:
    """A private redis-server and broker, settings for them, and a list for workers; all stopped
    at the end, whatever happens."""
    red = PrivateRedis(tmp / "redis")
    red.start()
    workers: list[WorkerProcess] = []
    try:
        with private_kafka(tmp) as (base, restart_broker):
            settings = replace(base, redis_url=red.url, redis_from_env=True, home=tmp / "home", key_prefix=prefix,
                               **over)
            fresh_groups(settings)
            try:
                yield settings, red, restart_broker, workers
            finally:
                for w in workers:
                    w.stop(20)
    finally:
        red.stop()


def failover(tmp: Path, session_timeout: float, static: bool, assignor: str | None, rate: float,
             count: int) -> dict[str, object]:
    with rig(tmp, "fo", kafka_session_timeout=session_timeout) as (settings, _, _, workers):
        for i in range(2):
            overrides = {"group.instance.id": f"fo-member-{i}"} if static else {}
            if assignor:
                overrides["partition.assignment.strategy"] = assignor
            workers.append(Member(settings, overrides, tmp / f"p{i}.log"))
        warm = workload("warm", 0, 60)
        publish(settings, SUBMISSIONS.name, warm.submissions)
        read_rankings(settings, {s["attempt_id"] for s in warm.submissions}, 120)
        time.sleep(3)  # both members hold partitions
        work = workload("fo", 0, count)
        feed = threading.Thread(target=publish, args=(settings, SUBMISSIONS.name, work.submissions, rate))
        feed.start()
        time.sleep(5)
        killed_at = time.time()
        workers[0].proc.send_signal(signal.SIGKILL)
        feed.join()
        ids = {s["attempt_id"] for s in work.submissions}
        found = read_rankings(settings, ids, 180)
        duplicates = check_rankings(found, ids)
        firsts = [min(rs, key=lambda r: r.event_time) for rs in found.values()]
        after = [r.since_submit_ms or 0.0 for r in firsts if r.submission_time >= killed_at]
    return {"fault": "predictor kill -9", "session_timeout_s": session_timeout, "static_membership": static,
            "assignor": assignor or "range,roundrobin (librdkafka's default)", "rate": rate,
            "submissions": len(ids), "ranked": len(found), "duplicates": duplicates,
            "longest_wait_after_kill_s": round(max(after) / 1000, 2)}


class Member(WorkerProcess):
    """``leap worker predictor``'s loop with extra consumer settings (the group options measured)."""

    def __init__(self, settings: Settings, overrides: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen([sys.executable, __file__, "member", json.dumps(overrides)],
                                     env=worker_env(settings), stdout=self._log, stderr=subprocess.STDOUT)


def member(overrides: dict[str, str]) -> None:
    """The body of a :class:`Member` process: a predictor until SIGTERM."""
    from features.store import open_store
    from leap.core.hardware import load_catalogue
    from leap.worker import predictor_service
    from predictor.loop import ConfluentPredictor, run_or_exit

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] [%(levelname)s] %(message)s")
    settings = Settings.from_env()
    catalogue = load_catalogue()
    service, _ = predictor_service(settings, open_store(settings, catalogue), catalogue)
    loop = ConfluentPredictor(settings, service, consumer_overrides=overrides)
    signal.signal(signal.SIGTERM, lambda *_: setattr(loop, "stopping", True))
    run_or_exit(loop)


def outage(tmp: Path, what: str, seconds: float, settle: float) -> dict[str, object]:
    with rig(tmp, "out") as (settings, red, restart_broker, workers):
        worker = WorkerProcess(settings, "all", tmp / "all.log")
        workers.append(worker)
        span = seconds + 30
        work = workload("out", int(span * 100), int(span * 10), jobs=max(120, int(span * 10)),
                        models=max(40, int(span * 4)), families=max(20, int(span * 2)),
                        pair_every=max(20, int(span * 10) // 6))
        publish(settings, JOB_STARTS.name, work.starts)
        feeds = [threading.Thread(target=publish, args=(settings, JOB_FINISHES.name, work.finishes, 100.0)),
                 threading.Thread(target=publish, args=(settings, SUBMISSIONS.name, work.submissions, 10.0))]
        for feed in feeds:
            feed.start()
        time.sleep(10)
        down_at = time.monotonic()
        if what == "redis":
            red.stop(signal.SIGTERM)
            time.sleep(seconds)
            red.start()
        else:
            restart_broker(seconds)
        down_for = time.monotonic() - down_at
        for feed in feeds:
            feed.join()
        ids = {s["attempt_id"] for s in work.submissions}
        found = read_rankings(settings, ids, settle)
        client = red.client()
        with contextlib.suppress(AssertionError):  # what is still missing then is reported below
            wait_until(lambda: applied_count(client, "out", work) >= len(work.finishes), settle, "finishes applied")
        missing = len(work.finishes) - applied_count(client, "out", work)
        clean_pass(client, "clean", work, with_submissions=True)  # the published submissions, as sent
        got, want = dump(client, "out"), dump(client, "clean")
        alive = worker.alive()
    return {"fault": f"{what} outage", "down_s": round(down_for, 1), "finishes": len(work.finishes),
            "finishes_missing": missing,
            "feature_keys_differing": sum(1 for k in want.keys() | got.keys() if got.get(k) != want.get(k)),
            "submissions": len(ids), "submissions_without_ranking": len(ids - found.keys()),
            "worker_alive": alive}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("failover", "redis-outage", "broker-outage", "member"))
    parser.add_argument("overrides", nargs="?", default="{}", help="member: consumer settings (JSON)")
    parser.add_argument("--session-timeout", type=float, default=6.0)
    parser.add_argument("--static", action="store_true", help="failover: static membership (group.instance.id)")
    parser.add_argument("--assignor", help="failover: partition.assignment.strategy, e.g. cooperative-sticky")
    parser.add_argument("--rate", type=float, default=100.0, help="failover: submissions/s")
    parser.add_argument("--count", type=int, default=1500, help="failover: submissions")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--settle", type=float, default=300.0, help="longest wait for the last events afterwards")
    args = parser.parse_args()
    if args.what == "member":
        member(json.loads(args.overrides))
        return
    tmp = Path(tempfile.mkdtemp(prefix="leap-faults-"))
    if args.what == "failover":
        result = failover(tmp, args.session_timeout, args.static, args.assignor, args.rate, args.count)
    else:
        result = outage(tmp, args.what.split("-")[0], args.seconds, args.settle)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
