"""``leap replay`` against the real broker and redis-server (and, where needed, the session worker).

Every test keeps to its own job keys and model types (``run_id``) and filters the replay with
``--job``, so traffic of other tests in the same time range cannot change its result.
"""

from __future__ import annotations

import random
import time
from typing import Any

import orjson
import pytest
import redis
from confluent_kafka import Consumer, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from typer.testing import CliRunner, Result

from features.keys import KeyLayout
from leap.core.settings import Settings
from leap.replay.cli import app
from leap.replay.timespec import parse_bound
from leap.services.workers import WorkerProcess
from streams.client import SchedulerClient
from streams.events import Ranking
from streams.topics import JOB_FINISHES, JOB_STARTS, Topic, create_topics
from tests.factories import CANDIDATES, T0, finish_dict, start, submission

pytestmark = pytest.mark.integration

#: Per-accelerator speed of each hardware, so lookups and transfers have something to learn.
SPEED = {"H100-SXM": 900.0, "A100-80GB": 500.0, "MI300X": 700.0, "TPU-v5p": 600.0, "L4": 100.0}


def invoke(settings: Settings, *args: str) -> Result:
    env = {"LEAP_KAFKA_BOOTSTRAP": settings.kafka_bootstrap, "LEAP_REDIS_URL": settings.redis_url,
           "LEAP_KEY_PREFIX": settings.key_prefix}
    return CliRunner().invoke(app, list(args), env=env)


def since(seconds_ago: float = 2.0) -> str:
    return str(round(time.time() - seconds_ago, 3))


def publish(settings: Settings, topic: str, events: list[dict[str, Any]]) -> None:
    with SchedulerClient(settings, follow_rankings=False) as client:
        for ev in events:
            client.publish_raw(topic, ev["job_key"], orjson.dumps(ev))
        client.flush()


def history(run: str, rng: random.Random, jobs: int, per_job: int) -> list[dict[str, Any]]:
    """Measured finishes of ``jobs`` jobs over three model types of the run."""
    out = []
    for j in range(jobs):
        for k in range(per_job):
            hw = rng.choice(list(SPEED))
            tput = SPEED[hw] * 8 * rng.uniform(0.8, 1.2) * (1 + j % 3) / 2
            out.append(finish_dict(f"{run}-job{j}", f"{run}-h{j}-{k}", T0 + 60 * k + j, hw, round(tput, 3),
                                   model_type=f"{run}-m{j % 3}", family=f"{run}-fam"))
    return out


def wait_applied(rds: redis.Redis, prefix: str, expected: dict[str, int], timeout: float = 60) -> None:
    """Until every job's hash counts ``expected[job]`` applied starts + finishes."""
    layout = KeyLayout(prefix)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pipe = rds.pipeline(transaction=False)
        for job in expected:
            pipe.hmget(layout.job(job), "_starts", "_completed", "_failed", "_preempted")
        counts = [sum(int(v or 0) for v in row) for row in pipe.execute()]
        if counts == list(expected.values()):
            return
        time.sleep(0.3)
    raise AssertionError(f"worker did not apply the events within {timeout}s")


def test_parse_bound_forms() -> None:
    now = 1_800_000_000.0
    assert parse_bound("now", now).value == 1_800_000_000_000
    assert parse_bound("-2h", now).value == (1_800_000_000 - 7200) * 1000
    assert parse_bound("-30m", now).value == (1_800_000_000 - 1800) * 1000
    assert parse_bound("1790000000.5", now).value == 1_790_000_000_500
    assert parse_bound("2026-12-01T00:00:00Z", now).value == parse_bound("2026-12-01T00:00:00", now).value
    assert parse_bound("offset:42", now).kind == "offset"
    assert parse_bound(None, now).kind == "open"
    for bad in ("yesterday", "offset:-1", "1790000000000"):
        with pytest.raises(ValueError):
            parse_bound(bad, now)


def test_rebuild_matches_live_state(settings: Settings, worker: WorkerProcess, rds: redis.Redis, run_id: str) -> None:
    rng = random.Random(1)
    finishes = history(run_id, rng, jobs=20, per_job=15)
    finishes += [finish_dict(f"{run_id}-job{j}", f"{run_id}-fail{j}", T0 + 5000 + j, "L4", None,
                             model_type=f"{run_id}-m0", family=f"{run_id}-fam", outcome="failed") for j in range(5)]
    starts = [start(f"{run_id}-job{j}", f"{run_id}-st{j}-{k}", T0 + 30 * k, "H100-SXM").to_dict()
              for j in range(20) for k in range(3)]
    frm = since()
    # out of order and duplicated, like the end-to-end test: the state must not depend on it
    order = finishes + rng.sample(finishes, 30)
    rng.shuffle(order)
    publish(settings, JOB_FINISHES.name, order)
    publish(settings, JOB_STARTS.name, starts)
    with SchedulerClient(settings, follow_rankings=False) as client:
        client.publish_raw(JOB_FINISHES.name, f"{run_id}-job0", b"{not json")
        client.flush()
    expected = {f"{run_id}-job{j}": 15 + 3 + (1 if j < 5 else 0) for j in range(20)}
    wait_applied(rds, settings.key_prefix, expected)

    result = invoke(settings, "rebuild-features", "--from", frm, "--job", f"{run_id}-*", "--json")
    assert result.exit_code == 0, result.output
    out = orjson.loads(result.stdout)
    assert out["events"] == len(order) + len(starts)
    assert out["duplicates"] == 30
    assert out["mismatches"] == 0, out["details"]
    assert out["keys"] == 20 + 3 + 1  # jobs, model types, family
    assert out["read"]["bad_events"] >= 1
    assert not list(rds.scan_iter(match=f"{out['prefix']}:*")), "scratch prefix was not deleted"


def test_rebuild_finds_a_corrupted_key(settings: Settings, rds: redis.Redis, run_id: str) -> None:
    frm = since()
    publish(settings, JOB_FINISHES.name, history(run_id, random.Random(2), jobs=4, per_job=5))
    reference = f"replaytest-{run_id}"
    layout = KeyLayout(reference)
    try:
        built = invoke(settings, "rebuild-features", "--from", frm, "--job", f"{run_id}-*", "--live",
                       "--live-prefix", reference, "--json")
        assert built.exit_code == 0, built.output
        assert orjson.loads(built.stdout)["mismatches"] is None  # --live writes, it does not compare
        job = layout.job(f"{run_id}-job1")
        names = [f.decode() if isinstance(f, bytes) else f for f in rds.hkeys(job)]
        field = next(name for name in names if not name.startswith("_"))
        rds.hset(job, field, "99,1.0,1.0,1.0")

        result = invoke(settings, "rebuild-features", "--from", frm, "--job", f"{run_id}-*",
                        "--live-prefix", reference, "--json")
        assert result.exit_code == 1, result.output
        out = orjson.loads(result.stdout)
        assert out["mismatches"] == 1
        assert out["details"][0] | {"replay": None} == {
            "kind": "job", "name": f"{run_id}-job1", "field": field, "live": "99,1.0,1.0,1.0", "replay": None}
    finally:
        for key in rds.scan_iter(match=layout.pattern()):
            rds.unlink(key)


def test_empty_range_and_deleted_records_are_reported(settings: Settings, topics: dict[str, str], run_id: str) -> None:
    # a range before any retained record (not "--from now": other traffic may arrive meanwhile)
    empty = invoke(settings, "rebuild-features", "--from", "2001-01-01", "--to", "2001-01-02T00:00Z", "--json")
    assert empty.exit_code == 0, empty.output
    out = orjson.loads(empty.stdout)
    assert out["events"] == 0 and "no data in the requested range" in out["read"]["notes"]

    name = f"leap-test-replay-{run_id}-trimmed"
    admin = AdminClient(settings.confluent_config())
    admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=-1)])[name].result(30)
    try:
        producer = Producer(settings.confluent_config())
        for i in range(10):
            producer.produce(name, key=b"k", value=orjson.dumps({"i": i}), partition=0)
        assert producer.flush(30) == 0
        admin.delete_records([TopicPartition(name, 0, 4)])[TopicPartition(name, 0, 4)].result(30)
        result = invoke(settings, "inspect", "--extra-topic", name, "--from", "offset:0")
        assert result.exit_code == 0, result.output
        lines = [orjson.loads(line) for line in result.stdout.splitlines()]
        assert [line["offset"] for line in lines] == list(range(4, 10))
        assert all(line["type"] is None and "not any LEAP event" in line["error"] for line in lines)
        assert "offsets 0..4: deleted before the log start" in result.stderr
        assert "bad events: 6" in result.stderr
    finally:
        admin.delete_topics([name])


def test_copy_keeps_keys_headers_and_timestamps(settings: Settings, topics: dict[str, str], run_id: str) -> None:
    src, dst = f"leap-test-replay-{run_id}-src", f"leap-test-replay-{run_id}-dst"
    admin = AdminClient(settings.confluent_config())
    create_topics(settings, (Topic(src, 3),))  # waits for the partitions' leaders
    try:
        producer = Producer(settings.confluent_config())
        failed: list[str] = []
        sent: list[tuple[int, bytes, bytes, list[tuple[str, str | bytes | None]], int]] = []
        for i in range(12):
            value = orjson.dumps(finish_dict(f"{run_id}-job{i % 4}", f"{run_id}-c{i}", T0 + i, "MI300X", 100.0 + i))
            if i == 5:
                value = b"not an event"
            headers: list[tuple[str, str | bytes | None]] = [("trace", f"t{i}".encode()), ("src", b"x")]
            msg = (i % 3, f"{run_id}-job{i % 4}".encode(), value, headers, 1_700_000_000_000 + i)
            producer.produce(src, partition=msg[0], key=msg[1], value=msg[2], headers=msg[3], timestamp=msg[4],
                             on_delivery=lambda err, _m: failed.append(err.str()) if err is not None else None)
            sent.append(msg)
        # flush() counts a failed delivery as done: the callbacks say whether all 12 arrived
        assert (producer.flush(30), failed) == (0, [])

        refused = invoke(settings, "copy", "--extra-topic", src, "--to-topic", JOB_FINISHES.name)
        assert refused.exit_code == 2 and "--live" in refused.output

        result = invoke(settings, "copy", "--extra-topic", src, "--to-topic", dst, "--json")
        assert result.exit_code == 0, result.output
        out = orjson.loads(result.stdout)
        assert (out["copied"], out["created_topic"], out["read"]["bad_events"]) == (12, True, 1), out

        consumer = Consumer(settings.confluent_config(**{"group.id": f"t-{run_id}", "enable.auto.commit": "false"}))
        consumer.assign([TopicPartition(dst, p, 0) for p in range(3)])
        got: list[Message] = []
        deadline = time.monotonic() + 20
        while len(got) < 12 and time.monotonic() < deadline:
            got += [m for m in consumer.consume(100, timeout=0.5) if m.error() is None]
        consumer.close()
        copied = sorted((m.partition(), m.key(), m.value(), m.headers(), m.timestamp()[1]) for m in got)
        assert copied == sorted(sent)
    finally:
        admin.delete_topics([src, dst])


def test_inspect_filters(settings: Settings, topics: dict[str, str], run_id: str) -> None:
    frm = since()
    finishes = [finish_dict(f"{run_id}-job{i % 2}", f"{run_id}-i{i}", T0 + i, hw, 800.0)
                for i, hw in enumerate(["H100-SXM", "A100-80GB", "H100-SXM", "MI300X", "h100 sxm", "H100-SXM"])]
    publish(settings, JOB_FINISHES.name, finishes)
    publish(settings, JOB_STARTS.name, [start(f"{run_id}-job0", f"{run_id}-s0", T0, "H100-SXM").to_dict()])

    result = invoke(settings, "inspect", "--from", frm, "--job", f"{run_id}-job0", "--type", "job_finish",
                    "--hardware", "H100-SXM")
    assert result.exit_code == 0, result.output
    lines = [orjson.loads(line) for line in result.stdout.splitlines()]
    # job0 is every even event: H100-SXM, H100-SXM and the alias "h100 sxm"; its start is filtered by type
    assert [line["event"]["event_id"] for line in lines] == [f"{run_id}-i{i}" for i in (0, 2, 4)]
    assert all(line["topic"] == JOB_FINISHES.name and line["type"] == "job_finish" for line in lines)
    assert all(isinstance(line["partition"], int) and isinstance(line["offset"], int) for line in lines)

    counted = invoke(settings, "inspect", "--from", frm, "--job", f"{run_id}-*", "--dry-run")
    assert counted.exit_code == 0 and counted.stdout == ""
    assert "7 matching event(s)" in counted.stderr


def test_rerank_shadow_report(settings: Settings, worker: WorkerProcess, rds: redis.Redis, run_id: str,
                              tmp_path: Any) -> None:
    rng = random.Random(3)
    past = history(run_id, rng, jobs=12, per_job=6)
    publish(settings, JOB_FINISHES.name, past)
    wait_applied(rds, settings.key_prefix, {f"{run_id}-job{j}": 6 for j in range(12)})

    frm = since()
    subs = [submission(f"{run_id}-job{j}", j, event_id=f"{run_id}-sub{j}", attempt_id=f"{run_id}-att{j}",
                       model_type=f"{run_id}-m{j % 3}", family=f"{run_id}-fam", event_time=T0 + 10_000 + j)
            for j in range(12)]
    with SchedulerClient(settings) as client:
        for sub in subs:
            client.publish(sub)
        client.flush()
        got: dict[str, tuple[Ranking, float]] = client.wait_for([s.attempt_id for s in subs], timeout=60)
    assert len(got) == 12
    outcomes = []
    for j, sub in enumerate(subs):
        hw = CANDIDATES[j % 4]
        done = finish_dict(sub.job_key, f"{run_id}-done{j}", T0 + 20_000 + j, hw, SPEED[hw] * 8 * (1 + j % 3) / 2,
                           model_type=sub.model_type, family=sub.family or "dense_lm")
        outcomes.append(done | {"attempt_id": sub.attempt_id})
    publish(settings, JOB_FINISHES.name, outcomes)

    path = tmp_path / "shadow.json"
    result = invoke(settings, "rerank", "--model", "lookup", "--model", "transfer", "--from", frm,
                    "--job", f"{run_id}-*", "--json", str(path))
    assert result.exit_code == 0, result.output
    report = orjson.loads(path.read_bytes())
    assert (report["submissions"], report["ranked"], report["finished"]) == (12, 12, 12)
    assert set(report["models"]) == {"lookup", "transfer"}
    for block in [report["old"]["accuracy"], *(m["accuracy"] for m in report["models"].values())]:
        assert set(block) == {"acc@10", "acc@20", "mape", "n", "n_missing"} and block["n"] == 12
    for m in report["models"].values():
        assert 0.0 <= m["top1_agreement"] <= 1.0
    if set(report["old"]["model_versions"]) == {"lookup-0"}:
        # the worker ran the lookup table: re-ranking with it on the recorded features reproduces it
        assert report["models"]["lookup"]["top1_agreement"] == 1.0
        assert report["models"]["lookup"]["accuracy"] == report["old"]["accuracy"]
        assert report["models"]["lookup"]["basis"] == report["old"]["basis"]
    for block in [report["old"]["basis"], *(m["basis"] for m in report["models"].values())]:
        assert sum(block["evidence"].values()) == sum(block["estimate"].values()) == 12 * len(subs[0].candidates)
    # the evidence is the job's history, whichever model predicts; every job here has some
    assert report["models"]["transfer"]["basis"]["evidence"] == report["models"]["lookup"]["basis"]["evidence"]
    assert "none" not in report["models"]["lookup"]["basis"]["evidence"]
    assert "acc@10" in result.stdout and "transfer" in result.stdout and "basis: share of candidates" in result.stdout

    unknown = invoke(settings, "rerank", "--model", "v-does-not-exist", "--from", frm)
    assert unknown.exit_code == 2 and "v-does-not-exist" in unknown.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["inspect", "--from", "yesterday"], "Invalid value for '--from'"),
        (["inspect", "--to", "offset:x"], "offset:N needs a non-negative integer"),
        (["inspect", "--from", "-1h", "--to", "-2h"], "is after --to"),
        (["inspect", "--type", "nope"], "choose from"),
        (["inspect", "--topic", "leap.nope"], "Invalid value for '--topic'"),
        (["inspect", "--extra-topic", "leap-no-such-topic-xyz"], "does not exist"),
        (["inspect", "--rate-limit", "0"], "--rate-limit"),
        (["rebuild-features", "--topic", "leap.rankings"], "reads only"),
        (["rebuild-features", "--prefix", "leap:job"], "letters, digits"),
        (["rebuild-features", "--prefix", "leap"], "is the live prefix"),
        (["copy", "--topic", "leap.job-finishes"], "--to-topic"),
        (["copy", "--to-topic", "somewhere"], "at least one source"),
        (["rerank"], "--model"),
    ],
)
def test_bad_arguments_exit_non_zero(settings: Settings, args: list[str], message: str) -> None:
    result = invoke(settings, *args)
    assert result.exit_code != 0
    assert message in result.output, result.output
