"""A part added through the operator file while a predictor runs is ranked by its next rankings."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from leap.core.settings import Settings
from leap.services.workers import WorkerProcess
from predictor.ranking import COLD_START, UNKNOWN_HARDWARE
from streams.client import SchedulerClient
from streams.topics import SUBMISSIONS, consumer_group, skip_to_end
from tests.conftest import wait_until_ranking
from tests.factories import CANDIDATES, submission
from tests.test_operator_hardware import PART

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

#: How often the predictor looks at its files here (30 s by default).
RELOAD_S = 2.0
#: The scheduler's name for the new part, as its drivers report it.
NEW = "NVIDIA H20 96GB"


@pytest.fixture
def predictor(settings: Settings, topics: dict[str, str], tmp_path: Path) -> Iterator[tuple[WorkerProcess, Path]]:
    """A predictor (its home's empty registry: the lookup fallback) reading an operator file
    that starts with nothing in it, under a key prefix (so a consumer group) of its own: the
    session's worker, if running, ranks the same submissions from the shipped catalogue alone."""
    hardware = tmp_path / "fleet-hardware.toml"
    hardware.write_text("# the fleet's parts\n")
    ours = replace(settings, home=tmp_path, hardware_file=hardware, key_prefix=f"opfile-{uuid.uuid4().hex[:8]}",
                   catalogue_reload_interval=RELOAD_S)
    skip_to_end(ours, consumer_group(ours, "predictor"), (SUBMISSIONS.name,))
    proc = WorkerProcess(ours, "predictor", tmp_path / "predictor.log")
    try:
        wait_until_ranking(settings, proc)
        yield proc, hardware
    finally:
        proc.stop()


def rank_new_part(settings: Settings, job: str, i: int) -> dict[str, object]:
    """The new part's candidate entry: ranked if any ranking of the submission ranks it (the
    session's worker, without the operator file, never does), else the first one's."""
    sub = submission(job, i, candidates=[*CANDIDATES, NEW])
    entries: list[dict[str, object]] = []
    with SchedulerClient(settings) as client:
        client.publish(sub)
        client.flush()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(e["rank"] is not None for e in entries):
            for ranking, _ in client.rankings(timeout=0.5):
                if ranking.attempt_id == sub.attempt_id:
                    entries.append(next(c for c in ranking.candidates if c["hardware"] == NEW))
            if entries and time.monotonic() > deadline - 15:  # the first ranking came 5 s ago
                break
    assert entries, f"no ranking of {sub.attempt_id}"
    return next((e for e in entries if e["rank"] is not None), entries[0])


def test_a_part_added_while_the_predictor_runs_is_ranked_next(
        settings: Settings, predictor: tuple[WorkerProcess, Path]) -> None:
    proc, hardware = predictor
    job = f"opfile-{uuid.uuid4().hex[:8]}"
    before = rank_new_part(settings, job, 0)
    assert before["rank"] is None and before["reason"] == UNKNOWN_HARDWARE
    hardware.write_text(PART.replace('name = "H20"', 'name = "H20"\naliases = ["NVIDIA H20 96GB"]'))
    deadline = time.monotonic() + 30 + 2 * RELOAD_S
    i = 1
    after = rank_new_part(settings, job, i)
    while after["rank"] is None and time.monotonic() < deadline:
        time.sleep(3)
        i += 1
        after = rank_new_part(settings, job, i)
    assert after["rank"] is not None, proc.log_tail()
    # no history and no trained model: its estimate is the roofline of its catalogue specs
    assert after["reason"] == COLD_START and after["hourly_cost"] == pytest.approx(3.10 * 8)
    assert "catalogue reloaded" in proc.log_tail()
