"""Nightly training: train on an archive, promote and announce when not worse, keep the current model
when the candidate is worse on the same holdout."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from leap.core.settings import Settings
from leap.fleet.history import simulate, write_history
from leap.training.nightly import decide, last_archived_day, next_run, nightly_as_of, parse_schedule, run_nightly
from leap.training.train import parse_day
from predictor.registry import Registry
from predictor.reload import announce
from streams.events import ModelAnnouncement
from streams.topics import MODELS

DAY = 86400.0
START = "2025-03-01"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eight simulated days of 200 attempts, in the archive layout (the role's plumbing is under
    test, and its run fits the served model's defaults: time in proportion to the rows)."""
    out = tmp_path_factory.mktemp("archive")
    write_history(simulate(seed=7, days=8, attempts_per_day=200, start=parse_day(START)), out)
    return out


def latest_announcement(settings: Settings) -> ModelAnnouncement | None:
    consumer = Consumer(settings.confluent_config(**{"group.id": "leap-test-unused", "enable.auto.commit": False}))
    try:
        tp = TopicPartition(MODELS.name, 0)
        low, high = consumer.get_watermark_offsets(tp, timeout=10)
        if high <= low:
            return None
        consumer.assign([TopicPartition(MODELS.name, 0, high - 1)])
        for _ in range(20):
            msg = consumer.poll(1.0)
            if msg is not None and not msg.error():
                return ModelAnnouncement.decode(msg.value())
        return None
    finally:
        consumer.close()


def report(acc: float, current: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {"metrics": {"lightgbm": {"acc@10": acc}}, "holdout": {"day": "2025-03-08"}}
    if current is not None:
        out["current"] = {"version": "lgbm-old", "holdout": {"acc@10": current}}
    return out


def test_decision_rule() -> None:
    assert decide(report(0.4, None))[0]
    assert decide(report(0.5, 0.5))[0]  # equal is not worse
    promote, reason = decide(report(0.49, 0.5))
    assert not promote and "0.4900 < 0.5000" in reason and "lgbm-old" in reason


def test_schedule_and_as_of(archive: Path) -> None:
    at = parse_schedule("02:00")
    noon = dt.datetime(2025, 6, 1, 12, tzinfo=dt.UTC).timestamp()
    assert next_run(noon, at) == dt.datetime(2025, 6, 2, 2, tzinfo=dt.UTC).timestamp()
    assert next_run(noon - 11 * 3600, at) == dt.datetime(2025, 6, 1, 2, tzinfo=dt.UTC).timestamp()
    with pytest.raises(ValueError):
        parse_schedule("25:00")
    last = last_archived_day(archive)
    assert last == parse_day(START) + 7 * DAY
    # A live archive at 02:00 already holds today's first events: today is not the holdout.
    assert nightly_as_of(archive, last + 2 * 3600) == last
    # An archive that ended before today: train on all of it.
    assert nightly_as_of(archive, last + 5 * DAY) == last + DAY


@pytest.mark.integration
def test_trainer_promotes_then_keeps_the_current_model_over_a_worse_one(
    settings: Settings, topics: dict[str, str], archive: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    registry = Registry(home / "registry")
    try:
        # The role as cron runs it: one run over the archive into an empty registry.
        done = subprocess.run(
            [sys.executable, "-m", "leap.cli", "worker", "trainer", "--run-now", "--archive-dir", str(archive),
             "--metrics-port", "0"],
            cwd=ROOT, env={**os.environ, "LEAP_KAFKA_BOOTSTRAP": settings.kafka_bootstrap, "LEAP_HOME": str(home)},
            capture_output=True, text=True, timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        first = registry.current()
        assert first is not None and first.startswith("lgbm-")
        meta = registry.record(first).metadata
        assert meta["as_of"] == "2025-03-09" and meta["holdout"]["day"] == "2025-03-08"
        ann = latest_announcement(settings)
        assert ann is not None and ann.model_version == first
        assert registry.promotions()[-1]["reason"].startswith("nightly: no current model")

        # A deliberately weak candidate (one tree on the raw target, served everywhere: no gate to
        # fall back to the paired transfer), scored on the same holdout.
        time.sleep(1.0)  # registry versions are named to the second
        weak_params = {"n_estimators": 1, "target": "raw", "gate": False, "learned_roofline": False}
        weak = run_nightly(archive, registry, settings, window_days=30, params=weak_params)
        assert weak["promoted"] is False, weak["decision"]
        assert weak["holdout"] == meta["holdout"]
        assert weak["metrics"]["lightgbm"]["acc@10"] < weak["current"]["holdout"]["acc@10"]
        assert registry.current() == first
        assert {r.version for r in registry.versions()} == {first, weak["version"]}
        ann = latest_announcement(settings)
        assert ann is not None and ann.model_version == first  # nothing was announced for the weak one
    finally:
        announce(settings, None, "lookup")  # leave any shared predictor on the baseline
