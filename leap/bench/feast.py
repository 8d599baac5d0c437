"""``bench feast``: LEAP's online-store reads against Feast's Redis online store, side by side.

Same redis-server, same entities, same run: the store is written with the finishes of ``events``
simulated attempts (under a scratch key prefix), ``entities`` later submissions are read from it
once, and eight of each job's features (attempt counters, the job's most-observed prior, the
model type's lookup median on the requested hardware) are written to Feast as one feature view
(:mod:`leap.bench.feast_driver`, run by ``--feast-python``: Feast may live in its own virtualenv).
Then, pass by pass, alternating: :meth:`FeatureStore.read` of 256 submissions at a time (all of
a job's features, both lookups and the paired ratios, as the predictor reads them) and Feast's
``get_online_features`` of the same job keys, 256 at a time. The other side waits while one
reads, so both see the same machine.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from features.pairs import most_informative
from features.snapshot import FeatureSnapshot
from features.store import FeatureStore, open_store
from leap.bench.common import Figures, freeze_heap, percentiles_ms, report, say, scratch_prefix, unfreeze_heap
from leap.bench.workload import batches, make_workload, seed_store
from leap.core.hardware import load_catalogue
from leap.core.settings import Settings, redact
from streams.events import Submission

READ_BATCH = 256
DRIVER = Path(__file__).with_name("feast_driver.py")
#: The eight features Feast serves per job, and their types.
FEAST_FEATURES = {"starts": "int", "completed": "int", "failed": "int", "preempted": "int",
                  "prior_n": "int", "prior_robust": "float", "prior_last": "float", "lookup_median": "float"}


class FeastMissing(RuntimeError):
    """The interpreter given for Feast cannot import it."""


def check_feast(python: str) -> str:
    """Feast's version under ``python``; :class:`FeastMissing` with what to do when it has none."""
    probe = subprocess.run([python, "-P", "-c", "import feast; print(feast.__version__)"], capture_output=True,
                           text=True, check=False)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        raise FeastMissing(f"Feast is not installed for {python} ({last}). Install the bench extra "
                           f"(pip install -e '.[feast]'), or pass --feast-python with an interpreter "
                           f"that has feast[redis], e.g. a separate virtualenv.")
    return probe.stdout.strip()


def feast_row(sub: Submission, snap: FeatureSnapshot) -> dict[str, Any]:
    """The eight features of a submission's job, from LEAP's own snapshot of it."""
    best = most_informative(snap.prior, "")
    n, robust, last = (best[1].n, best[1].robust, best[1].last) if best else (0, 0.0, 0.0)
    lookup = snap.lookup_model.get(sub.requested_hardware or sub.candidates[0])
    return {"job_key": sub.job_key, "starts": snap.starts, "completed": snap.completed, "failed": snap.failed,
            "preempted": snap.preempted, "prior_n": n, "prior_robust": robust, "prior_last": last,
            "lookup_median": lookup.median if lookup else 0.0}


def _redis_target(settings: Settings) -> dict[str, Any]:
    url = urlparse(settings.redis_url)
    if url.scheme != "redis":
        raise ValueError("bench feast drives Feast over plain redis:// only")
    db = int(url.path.strip("/") or 0)
    return {"host": url.hostname or "127.0.0.1", "port": url.port or 6379, "db": db, "password": url.password,
            "cluster": settings.redis_cluster}


class FeastSide:
    """The driver process: set up with the rows, then one pass per :meth:`read_pass`."""

    def __init__(self, python: str, setup: dict[str, Any]) -> None:
        self.proc = subprocess.Popen([python, "-P", str(DRIVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        self.ask(json.dumps(setup))
        if not self.answer().get("ready"):
            raise RuntimeError("the Feast driver did not get ready")

    def ask(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the Feast driver exited ({self.proc.wait()})")
        out: dict[str, Any] = json.loads(line)
        return out

    def read_pass(self) -> list[float]:
        self.ask("pass")
        times: list[float] = self.answer()["batch_s"]
        return times

    def close(self) -> None:
        """Ask the driver to tear its project down (its Redis keys too) and wait for it."""
        if self.proc.poll() is None:
            self.ask("quit")
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _leap_pass(store: FeatureStore, subs: list[Submission]) -> list[float]:
    times = []
    for b in batches(subs, READ_BATCH):
        t0 = time.perf_counter()
        store.read(b)
        times.append(time.perf_counter() - t0)
    return times


def _figures(leap: list[float], feast: list[float], entities: int) -> Figures:
    leap_rate, feast_rate = entities / sum(leap), entities / sum(feast)
    return {"leap_read_entities_per_s": leap_rate, "feast_read_entities_per_s": feast_rate,
            "ratio": leap_rate / feast_rate, **percentiles_ms(leap, "leap_batch"),
            **percentiles_ms(feast, "feast_batch")}


def bench_feast(settings: Settings, feast_python: str, events: int = 20000, entities: int = 4096,
                rounds: int = 3, repeat: int = 3, seed: int = 0) -> dict[str, Any]:
    """Run the side-by-side read benchmark; ``repeat`` runs of ``rounds`` alternating passes each.

    Raises
    ------
    FeastMissing
        When ``feast_python`` cannot import Feast (nothing was written yet).
    """
    began = time.perf_counter()
    version = check_feast(feast_python)
    say(f"feast {version}; simulating {events} attempts and {entities} later submissions")
    w = make_workload(events, entities, seed)
    prefix = scratch_prefix()
    store = open_store(settings, load_catalogue(), prefix=prefix)
    project = f"leap_bench_{uuid.uuid4().hex[:10]}"
    feast: FeastSide | None = None
    try:
        seed_store(store, w)
        rows = {s.job_key: feast_row(s, snap) for s, snap in zip(w.submissions, store.read(w.submissions),
                                                                   strict=True)}
        setup = {"redis": _redis_target(settings), "project": project, "rows": list(rows.values()),
                 "features": FEAST_FEATURES, "batch": READ_BATCH}
        feast = FeastSide(feast_python, setup)
        freeze_heap()
        runs = []
        for r in range(repeat):
            leap: list[float] = []
            theirs: list[float] = []
            for _ in range(rounds):
                leap += _leap_pass(store, w.submissions)
                theirs += feast.read_pass()
            runs.append(_figures(leap, theirs, len(w.submissions) * rounds))
            say(f"run {r + 1}/{repeat}: leap {runs[-1]['leap_read_entities_per_s']:.0f}/s, "
                f"feast {runs[-1]['feast_read_entities_per_s']:.0f}/s")
    finally:
        unfreeze_heap()
        if feast is not None:
            feast.close()
        store.delete_all()
        store.client.close()
    params = {"events": len(w.finishes), "entities": len(w.submissions), "distinct_jobs": len(rows),
              "read_batch": READ_BATCH, "rounds": rounds, "seed": seed, "key_prefix": prefix,
              "feast_project": project, "feast_version": version, "feast_features": len(FEAST_FEATURES),
              "redis": redact(settings.redis_url)}
    return report("feast", params, runs, started=began)
