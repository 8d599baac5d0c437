"""Private services and checks for the fault suite (``tests/test_faults.py``).

Faults are injected into a PRIVATE redis-server and a PRIVATE single-node broker on free ports,
never into the shared ones of ``leap services up`` that other test sessions use at the same
time. The checks are the suite's definition of "nothing lost":

- features in Redis equal one clean pass of the same events through the store (by value, key
  by key, under another prefix of the same server);
- every submission has a ranking, read as the scheduler reads them (``read_committed``); the
  predictors rank in transactions, so there is exactly one (:func:`check_rankings` counts any
  other; with ``LEAP_EXACTLY_ONCE=0`` duplicates are identical in content and share ``event_id``).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson
import redis
from confluent_kafka import Consumer, Producer, TopicPartition

from features.keys import KeyLayout
from features.layout import packable_id
from features.store import FeatureStore
from leap.core.hardware import load_catalogue
from leap.core.settings import Settings
from leap.services.kafka import KafkaNode, local_kafka_pid, start_local_kafka, stop_local_kafka, wait_for_kafka
from leap.services.redis_server import redis_server_binary
from streams.events import JobFinish, JobStart, Ranking, Submission
from streams.topics import JOB_FINISHES, JOB_STARTS, RANKINGS, SUBMISSIONS, consumer_group, create_topics, skip_to_end
from tests.factories import T0, finish_dict, free_port, submission_dict

HARDWARE = ("H100-SXM", "A100-80GB", "MI300X", "L4")
#: librdkafka reports every refused connection while the private broker restarts: expected here.
QUIET = logging.getLogger("tests.faults.librdkafka")
QUIET.addHandler(logging.NullHandler())
QUIET.propagate = False
#: Ranking fields that legitimately differ between two rankings of one submission.
TIMING_FIELDS = ("event_time", "latency_ms", "since_submit_ms")
#: Worker log lines that mean a crash or a lost batch (a worker that dies is noticed by ``alive``).
CRASH_MARKERS = ("Crashed reason", "stays uncommitted; exiting")


def wait_until(cond: Callable[[], bool], timeout: float, what: str, poll: float = 0.2) -> float:
    """Poll ``cond`` until true; the seconds it took. Raises ``AssertionError`` naming ``what``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return time.monotonic() - t0
        time.sleep(poll)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")


# ---------------------------------------------------------------- a private redis-server


@dataclass
class PrivateRedis:
    """A throw-away ``redis-server`` on a free port, in its own folder; stopped, killed or
    paused at will. ``save`` keeps an RDB snapshot on a clean stop; ``aof`` turns on the
    append-only file (``appendfsync everysec``)."""

    workdir: Path
    aof: bool = False
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = redis_server_binary()
        assert binary, "redis-server not found (leap/services/redis_server.py)"
        self.workdir.mkdir(parents=True, exist_ok=True)
        cmd = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
               "--save", "3600 1", "--appendonly", "yes" if self.aof else "no", "--appendfsync", "everysec"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(self._answers, 20, f"private redis on {self.port}", poll=0.05)

    def _answers(self) -> bool:
        try:
            return bool(self.client().ping())
        except redis.RedisError:
            return False

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=30)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """SIGTERM: a clean stop (the server writes its snapshot); SIGKILL: a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)
        self.proc = None


# ---------------------------------------------------------------- a private broker


@contextmanager
def private_kafka(home: Path) -> Iterator[tuple[Settings, Callable[[float], None]]]:
    """A single-node KRaft broker on free ports in ``home`` (jars from the shared cache), with
    LEAP's topics. Yields settings that point at it and ``restart(down_s)``: stop it cleanly,
    wait ``down_s`` seconds, start it again on the same data."""
    base = Settings.from_env()
    node = KafkaNode(port=free_port(), controller_port=free_port(), home=home / "kafka")
    settings = replace(base, kafka_bootstrap=f"127.0.0.1:{node.port}", kafka_from_env=True)

    def up() -> None:
        _, pid = start_local_kafka(base, lambda msg: None, node)
        wait_for_kafka(settings, 120, pid, node.home)

    def restart(down_s: float) -> None:
        stop_local_kafka(base, node)
        time.sleep(down_s)
        up()

    up()
    try:
        create_topics(settings)
        yield settings, restart
    finally:
        if local_kafka_pid(base, node) is not None:
            stop_local_kafka(base, node)


def fresh_groups(settings: Settings, roles: Sequence[str] = ("features", "predictor", "all")) -> None:
    """Let every role's group start at the current end: a test's workers read only its events."""
    from confluent_kafka import KafkaException

    for role in roles:
        for attempt in range(60):  # topics just created have no leader for a moment
            try:
                skip_to_end(settings, consumer_group(settings, role),
                            (SUBMISSIONS.name, JOB_STARTS.name, JOB_FINISHES.name))
                break
            except KafkaException:
                if attempt == 59:
                    raise
                time.sleep(0.5)


# ---------------------------------------------------------------- events in, rankings out


@dataclass(frozen=True)
class Workload:
    """A run's events: starts and finishes of ``jobs`` jobs, then submissions of the same jobs."""

    run: str
    starts: list[dict[str, Any]]
    finishes: list[dict[str, Any]]
    submissions: list[dict[str, Any]]


def workload(run: str, n_finishes: int, n_subs: int, jobs: int = 120, models: int = 40, families: int = 20,
             pair_every: int = 20) -> Workload:
    """Events whose features do not depend on how partitions interleave.

    Aggregates keep windows of the newest observations (64 per lookup, 32 per pair field); once
    one overflows, which observation it keeps depends on the order the partitions were read in,
    with or without a fault, and two correct runs can differ. So here no lookup or pair window
    overflows: ~10 finishes per job, a few per model and family, and every 20th job alternates
    between two hardware types (paired ratios) with pairs spread over three hardware pairs
    (``pair_every``: keep ``jobs / pair_every`` at about 6, or the pair windows overflow).
    """
    finishes, starts = [], []
    for i in range(n_finishes):
        j = i % jobs
        job, model = f"{run}-job{j}", j % models
        hw = HARDWARE[j % len(HARDWARE)]
        if j % pair_every == 0 and (i // jobs) % 2:
            hw = HARDWARE[(j // pair_every) % (len(HARDWARE) - 1) + 1]
        outcome = "failed" if i % 17 == 0 else "completed"
        tput = None if outcome == "failed" else 100.0 + (i * 37) % 900
        finishes.append(finish_dict(job, f"{run}-f{i}", T0 + i, hw, tput, model_type=f"{run}-m{model}",
                                    family=f"{run}-fam{model % families}", outcome=outcome))
        if i % 4 == 0:
            f = finishes[-1]
            starts.append({k: f[k] for k in ("schema_version", "job_key", "attempt_id", "model_type", "family",
                                              "hardware", "num_accelerators")}
                          | {"event_id": f"{run}-s{i}", "event_time": f["start_time"]})
    subs = [submission_dict(f"{run}-job{i % jobs}", i, event_id=f"{run}-sub{i}", attempt_id=f"{run}-a{i}",
                            model_type=f"{run}-m{i % jobs % models}", family=f"{run}-fam{i % jobs % models % families}",
                            event_time=time.time())
            for i in range(n_subs)]
    return Workload(run, starts, finishes, subs)


def publish(settings: Settings, topic: str, events: Sequence[dict[str, Any]], rate: float = 0.0) -> None:
    """Produce ``events`` (keyed by job) to ``topic``, at ``rate`` per second (0: at once). A
    submission's ``event_time`` is set to when it is sent, in ``events`` themselves."""
    producer = Producer(settings.confluent_config(**{"linger.ms": 5, "enable.idempotence": True}), logger=QUIET)
    t0 = time.monotonic()
    for i, ev in enumerate(events):
        if topic == SUBMISSIONS.name:
            # since_submit_ms is measured from here; stamped on the caller's event, so that a clean
            # pass feeds the configuration aggregates the times the workers read
            ev["event_time"] = time.time()
        producer.produce(topic, key=ev["job_key"].encode(), value=orjson.dumps(ev))
        producer.poll(0)
        if rate:
            time.sleep(max(0.0, t0 + (i + 1) / rate - time.monotonic()))
    # a broker restarted meanwhile may take a minute and more to answer on a busy machine
    assert producer.flush(240) == 0, "events not delivered"


def read_rankings(settings: Settings, attempt_ids: set[str], timeout: float) -> dict[str, list[Ranking]]:
    """Every ranking (duplicates included) of ``attempt_ids`` on the rankings topic, reading until
    each has one or ``timeout`` passes (then a second more, for late duplicates)."""
    consumer = Consumer(settings.confluent_config(**{"group.id": f"faults-reader-{os.getpid()}",
                                                    "enable.auto.commit": False,
                                                    "isolation.level": "read_committed"}), logger=QUIET)
    parts = consumer.list_topics(RANKINGS.name, timeout=10).topics[RANKINGS.name].partitions
    consumer.assign([TopicPartition(RANKINGS.name, p, 0) for p in parts])  # from the beginning
    found: dict[str, list[Ranking]] = {}
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=0.5):
                if not msg.error():
                    ranking = Ranking.decode(msg.value())
                    if ranking.attempt_id in attempt_ids:
                        found.setdefault(ranking.attempt_id, []).append(ranking)
            if found.keys() >= attempt_ids:
                deadline = min(deadline, time.monotonic() + 1.0)
    finally:
        consumer.close()
    return found


def check_rankings(found: dict[str, list[Ranking]], attempt_ids: set[str]) -> int:
    """Every submission ranked; duplicates identical but for timing, with one ``event_id``.
    Returns the number of duplicate rankings."""
    missing = attempt_ids - found.keys()
    assert not missing, f"{len(missing)} submission(s) without a ranking, e.g. {sorted(missing)[:3]}"
    duplicates = 0
    for attempt, rankings in found.items():
        first = {k: v for k, v in rankings[0].to_dict().items() if k not in TIMING_FIELDS}
        for other in rankings[1:]:
            duplicates += 1
            again = {k: v for k, v in other.to_dict().items() if k not in TIMING_FIELDS}
            assert again == first, f"{attempt}: a duplicate ranking differs in content"
    return duplicates


# ---------------------------------------------------------------- features against a clean pass


def clean_pass(client: redis.Redis, prefix: str, work: Workload, with_submissions: bool = False) -> None:
    """The run's events applied once, in order, straight through the store under ``prefix``; with
    ``with_submissions``, its submissions too (the configuration aggregates they feed: with the
    ``event_time`` :func:`publish` sent them with, which their windows keep)."""
    store = FeatureStore(client, KeyLayout(prefix), canonicalize=load_catalogue().canonical)
    if with_submissions:
        subs = [Submission.from_dict(s) for s in work.submissions]
        for i in range(0, len(subs), 500):
            store.apply_submissions(subs[i:i + 500])
    starts = [JobStart.from_dict(s) for s in work.starts]
    finishes = [JobFinish.from_dict(f) for f in work.finishes]
    for i in range(0, len(starts), 500):
        store.apply_starts(starts[i:i + 500])
    for i in range(0, len(finishes), 500):
        store.apply_finishes(finishes[i:i + 500])


def dump(client: redis.Redis, prefix: str) -> dict[str, Any]:
    """Every key under ``prefix`` (the prefix cut off) with its value, whatever its type."""
    out: dict[str, Any] = {}
    for raw in client.scan_iter(match=f"{prefix}:*", count=1000):
        key = raw.decode()
        kind = client.type(key)
        kind = kind.decode() if isinstance(kind, bytes) else kind
        if kind == "hash":
            value: Any = client.hgetall(key)
        elif kind == "set":
            value = client.smembers(key)
        elif kind == "zset":
            value = client.zrange(key, 0, -1, withscores=True)
        elif kind == "list":
            value = client.lrange(key, 0, -1)
        else:
            value = client.get(key)
        out[key[len(prefix):]] = value
    return out


def features_match_clean_pass(client: redis.Redis, prefix: str, work: Workload) -> None:
    """Assert the workers' keys under ``prefix`` equal one clean pass of ``work``."""
    clean = f"{prefix}-clean"
    clean_pass(client, clean, work)
    got, want = dump(client, prefix), dump(client, clean)
    assert got.keys() == want.keys(), f"keys differ: {sorted(got.keys() ^ want.keys())[:5]}"
    differing = [k for k in want if got[k] != want[k]]
    assert not differing, f"{len(differing)} of {len(want)} keys differ from a clean pass, e.g. {differing[:3]}"


def applied_count(client: redis.Redis, prefix: str, work: Workload) -> int:
    """How many of the run's finishes the workers have applied (their ids in the jobs' seen sets)."""
    layout = KeyLayout(prefix)
    jobs = {f["job_key"] for f in work.finishes}
    pipe = client.pipeline(transaction=False)
    for job in jobs:
        pipe.smembers(layout.job_seen(job))
    seen = set().union(*pipe.execute())
    return sum(1 for f in work.finishes if packable_id(f["event_id"]).encode() in seen)
