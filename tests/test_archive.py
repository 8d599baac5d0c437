"""The archiver: what is published on the topics lands in the day-partitioned Parquet archive, in the
format of ``leap fleet history``, and training code reads it."""

from __future__ import annotations

import time
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest

from leap.core.hardware import load_catalogue
from leap.core.settings import Settings
from leap.fleet.history import simulate, tables
from leap.services.workers import WorkerProcess
from leap.training.dataset import build_examples, read_history
from streams.archive import (
    ArchiveConfig,
    ArchiveWriter,
    arrow_schema,
    day_folder,
    day_of,
    drop_duplicate_events,
    split_by_day,
    to_table,
)
from streams.client import SchedulerClient
from streams.events import SCHEMA_VERSION, Event, JobFinish, JobStart, Ranking, Submission
from streams.topics import JOB_FINISHES, JOB_STARTS, RANKINGS, SUBMISSIONS, consumer_group, skip_to_end
from tests.factories import T0, finish, free_port, start, submission

DAY = 86400.0


def ranking(sub: Submission, t: float) -> Ranking:
    cands = [{"hardware": h, "predicted_throughput": 100.0 / (i + 1), "lower": 50.0, "upper": 150.0,
              "hourly_cost": 10.0 * (i + 1), "throughput_per_dollar": 36.0, "rank": i + 1, "reason": None}
             for i, h in enumerate(sub.candidates)]
    return Ranking.from_dict({
        "schema_version": SCHEMA_VERSION, "event_id": f"rank-{sub.attempt_id}", "event_time": t,
        "job_key": sub.job_key, "attempt_id": sub.attempt_id, "submission_event_id": sub.event_id,
        "submission_time": sub.event_time, "model_version": "lookup", "candidates": cands,
        "best_hardware": sub.candidates[0], "features_used": {"prior_n": 2, "note": "x"}, "latency_ms": 3.5,
    })


def events_of(run: str, n: int, offset: float = 0.0) -> list[Event]:
    """n jobs of one attempt each: submission, start, measured finish, ranking; across two UTC days."""
    out: list[Event] = []
    for i in range(n):
        job = f"{run}-j{i}"
        t = T0 + offset + i * (DAY / n) * 1.5  # spans two days, so one flush writes two day folders
        sub = submission(job, i, event_time=t, attempt_id=f"{job}-a0", event_id=f"sub-{job}")
        out += [sub, ranking(sub, t + 0.01),
                replace(start(job, "a0", t + 60, "A100-80GB"), event_id=f"start-{job}"),
                replace(finish(job, "a0", t + 3600, "A100-80GB", 800.0 + i), event_id=f"finish-{job}")]
    return out


def publish(settings: Settings, events: list[Event], junk: bool = False) -> None:
    topic = {Submission: SUBMISSIONS.name, JobStart: JOB_STARTS.name, JobFinish: JOB_FINISHES.name,
             Ranking: RANKINGS.name}
    with SchedulerClient(settings, follow_rankings=False) as client:
        for ev in events:
            client.publish_raw(topic[type(ev)], ev.job_key, ev.encode())  # type: ignore[attr-defined]
        if junk:  # invalid messages on every topic: skipped, never archived, archiver keeps going
            for name in topic.values():
                client.publish_raw(name, "junk", b"{not json")
                client.publish_raw(name, "junk", orjson.dumps({"schema_version": 1, "event_id": "x"}))
        client.flush()


def read_table(root: Path, name: str) -> pa.Table:
    folder = root / name
    if not any(folder.glob("day=*/*.parquet")):  # the folder appears before its first file
        return pa.table({"job_key": pa.array([], pa.string())})
    return ds.dataset(folder, format="parquet", partitioning="hive").to_table()


def rows_of(table: pa.Table, run: str) -> list[dict[str, Any]]:
    """This run's rows; rankings only those the test published (a live predictor may rank ours too)."""
    keep = pc.starts_with(table.column("job_key"), f"{run}-")
    rows = [{k: v for k, v in r.items() if k != "day"} for r in table.filter(keep).to_pylist()]
    return [r for r in rows if "submission_event_id" not in r or r["event_id"].startswith("rank-")]


def expected(ev: Event) -> dict[str, Any]:
    d = ev.to_dict()
    if isinstance(ev, Ranking):
        d["candidates"] = orjson.dumps(d["candidates"]).decode()
        d["features_used"] = orjson.dumps(d["features_used"]).decode()
    return d


def skip_archiver_backlog(settings: Settings) -> None:
    """Start the archiver group at the topics' ends: on a long-lived broker, whatever other runs
    published since the group's last commit (tens of thousands of rankings after a soak) would
    otherwise be read first and outlast the waits below."""
    skip_to_end(settings, consumer_group(settings, "archiver"), (SUBMISSIONS.name, JOB_STARTS.name, JOB_FINISHES.name,
                                                       RANKINGS.name))


def wait_for(root: Path, run: str, counts: dict[str, int], proc: WorkerProcess, timeout: float = 45) -> None:
    deadline = time.monotonic() + timeout
    got: dict[str, int] = {}
    while time.monotonic() < deadline:
        got = {name: len(rows_of(read_table(root, name), run)) for name in counts}
        if all(got[k] >= v for k, v in counts.items()):
            return
        assert proc.proc.poll() is None, proc.log_tail()
        time.sleep(0.5)
    raise AssertionError(f"archive has {got}, expected {counts}:\n{proc.log_tail()}")


def wait_read(port: int, counts: dict[str, int], proc: WorkerProcess, timeout: float = 45) -> None:
    """Until the worker serving metrics on ``port`` has read ``counts`` events per topic."""
    deadline = time.monotonic() + timeout
    got: dict[str, float] = {}
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as page:
                text = page.read().decode()
        except OSError:  # not serving yet
            text = ""
        got = {topic: sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                          if line.startswith(f'leap_events_in_total{{topic="{topic}"}}')) for topic in counts}
        if all(got[k] >= v for k, v in counts.items()):
            return
        assert proc.proc.poll() is None, proc.log_tail()
        time.sleep(0.2)
    raise AssertionError(f"events read {got}, expected {counts}:\n{proc.log_tail()}")


# ------------------------------------------------------------------------------ format


def test_schema_is_the_simulated_history_schema(tmp_path: Path) -> None:
    sim = tables(simulate(seed=1, days=1, attempts_per_day=50))
    for name, cls in (("submissions", Submission), ("starts", JobStart), ("finishes", JobFinish)):
        assert arrow_schema(cls) == sim[name].schema, name
    ranks = arrow_schema(Ranking)
    assert ranks.field("candidates").type == pa.string() and ranks.field("features_used").type == pa.string()


def test_config_comes_from_settings(tmp_path: Path) -> None:
    settings = Settings.from_env({"LEAP_HOME": str(tmp_path), "LEAP_ARCHIVE_FLUSH_EVENTS": "7",
                                  "LEAP_ARCHIVE_FLUSH_SECONDS": "1.5"})
    assert ArchiveConfig.from_settings(settings) == ArchiveConfig(tmp_path / "archive", 7, 1.5)
    assert ArchiveConfig.from_settings(Settings.from_env({"LEAP_ARCHIVE_DIR": str(tmp_path / "a")})) == \
        ArchiveConfig(tmp_path / "a")


def test_whole_tables_split_into_the_writers_day_folders(tmp_path: Path) -> None:
    subs = [e for e in events_of("d", 6) if isinstance(e, Submission)]
    parts = list(split_by_day(to_table(Submission, subs[::-1])))
    assert [day for day, _ in parts] == sorted({day_of(s.event_time) for s in subs})
    for day, part in parts:
        times = part.column("event_time").to_pylist()
        assert {day_of(t) for t in times} == {day} and times == sorted(times, reverse=True)  # order kept
    assert sum(part.num_rows for _, part in parts) == len(subs)
    written = ArchiveWriter(tmp_path).write(Submission, subs)
    assert {p.parent for p in written} == {day_folder(tmp_path, "submissions", day) for day, _ in parts}


def test_writer_files_by_day_atomically_and_duplicates_drop_on_read(tmp_path: Path) -> None:
    evs = events_of("w", 4)
    subs = [e for e in evs if isinstance(e, Submission)]
    writer = ArchiveWriter(tmp_path)
    first = writer.write(Submission, subs)
    again = writer.write(Submission, subs[:1])  # a replay after a crash: same event, new part file
    assert {p.parent.name for p in first} == {f"day={day_of(s.event_time)}" for s in subs}
    assert len({p.parent.name for p in first}) == 2
    assert again[0] not in first and all(p.name.startswith("part-") for p in first + again)
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".")], "temporary files left behind"
    table = read_table(tmp_path, "submissions")
    assert table.num_rows == 5
    deduped = drop_duplicate_events(table)
    assert sorted(deduped.column("event_id").to_pylist()) == sorted(s.event_id for s in subs)


def test_an_event_parquet_cannot_hold_is_skipped_not_blocking(tmp_path: Path) -> None:
    subs = [e for e in events_of("big", 3) if isinstance(e, Submission)]
    huge = replace(subs[1], global_batch_size=2**63)  # valid by the contract, beyond int64
    ArchiveWriter(tmp_path).write(Submission, [subs[0], huge, subs[2]])
    ids = read_table(tmp_path, "submissions").column("event_id").to_pylist()
    assert sorted(ids) == sorted([subs[0].event_id, subs[2].event_id])


# ------------------------------------------------------------------------------ live


@pytest.mark.integration
def test_archiver_writes_what_was_published(
    settings: Settings, topics: dict[str, str], run_id: str, tmp_path: Path
) -> None:
    root = tmp_path / "archive"
    skip_archiver_backlog(settings)
    evs = events_of(run_id, 6)
    duplicate = evs[0]
    publish(settings, [*evs, duplicate], junk=True)
    proc = WorkerProcess(settings, "archiver", tmp_path / "archiver.log", LEAP_ARCHIVE_DIR=str(root),
                         LEAP_ARCHIVE_FLUSH_SECONDS="1")
    try:
        wait_for(root, run_id, {"submissions": 7, "starts": 6, "finishes": 6, "rankings": 6}, proc)
    finally:
        assert proc.stop() == 0, proc.log_tail()

    for name, cls in (("submissions", Submission), ("starts", JobStart), ("finishes", JobFinish),
                      ("rankings", Ranking)):
        want = {e.event_id: expected(e) for e in evs if isinstance(e, cls)}
        rows = rows_of(read_table(root, name), run_id)
        assert {r["event_id"]: r for r in rows} == want, name
        schema = read_table(root, name).schema
        assert schema.remove(schema.get_field_index("day")) == arrow_schema(cls), name
    # at-least-once: the replayed submission is stored twice and dropped on read
    assert len(rows_of(drop_duplicate_events(read_table(root, "submissions")), run_id)) == 6
    for path in root.glob("*/day=*/*"):
        assert path.name.startswith("part-") and path.suffix == ".parquet", path

    # The whole archive (with whatever else was on the topics) is training input.
    ex = build_examples(read_history(root), load_catalogue())
    mine = {a: y for a, y in zip(ex.attempt_id, ex.y, strict=True) if a.startswith(f"{run_id}-")}
    finishes = {e.attempt_id: e for e in evs if isinstance(e, JobFinish)}
    assert set(mine) == set(finishes)
    for attempt, y in mine.items():
        f = finishes[attempt]
        assert f.throughput is not None and y == pytest.approx(f.throughput / f.num_accelerators)


@pytest.mark.integration
def test_buffered_events_are_written_on_shutdown(
    settings: Settings, topics: dict[str, str], run_id: str, tmp_path: Path
) -> None:
    root = tmp_path / "archive"
    skip_archiver_backlog(settings)
    # Catch up with the topics first, so the second worker has only a few events to read.
    publish(settings, events_of(f"{run_id}-a", 1))
    proc = WorkerProcess(settings, "archiver", tmp_path / "first.log", LEAP_ARCHIVE_DIR=str(root),
                         LEAP_ARCHIVE_FLUSH_SECONDS="1")
    try:
        wait_for(root, f"{run_id}-a", {"finishes": 1}, proc)
    finally:
        assert proc.stop() == 0, proc.log_tail()

    evs = events_of(f"{run_id}-b", 3)
    publish(settings, evs)
    # Nothing would be flushed for ten minutes: only the shutdown flush can write these.
    port = free_port()
    proc = WorkerProcess(settings, "archiver", tmp_path / "second.log", port, LEAP_ARCHIVE_DIR=str(root),
                         LEAP_ARCHIVE_FLUSH_SECONDS="600")
    # the few events published since the first worker stopped are read (buffered, not written)
    wait_read(port, {name: 3 for name in (SUBMISSIONS.name, JOB_STARTS.name, JOB_FINISHES.name, RANKINGS.name)},
              proc)
    assert not rows_of(read_table(root, "submissions"), f"{run_id}-b")
    assert proc.stop() == 0, proc.log_tail()
    for name in ("submissions", "starts", "finishes", "rankings"):
        assert len(rows_of(read_table(root, name), f"{run_id}-b")) == 3, (name, proc.log_tail())
