"""What-if ranking against a running worker and its store: the served model, today's features,
and nothing published or written."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
import redis

from leap.core.settings import Settings
from leap.services.processes import ROOT
from leap.services.workers import WorkerProcess, worker_env
from predictor.whatif import WhatIf
from streams.client import SchedulerClient
from streams.events import Ranking
from streams.topics import JOB_FINISHES, JOB_STARTS, RANKINGS, SUBMISSIONS, end_offsets
from tests.factories import finish, start, submission, submission_dict

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


def worker_settings(settings: Settings, worker: WorkerProcess) -> Settings:
    """The settings the session's worker runs with (its own home, so its own registry)."""
    return replace(settings, home=worker.log_path.parent)


def ends(client: SchedulerClient) -> dict[tuple[str, int], int]:
    assert client.consumer is not None
    return end_offsets(client.consumer, (SUBMISSIONS.name, RANKINGS.name, JOB_STARTS.name, JOB_FINISHES.name))


def job_with_history(settings: Settings, job: str) -> Ranking:
    """Publish a finished attempt of ``job`` on H100-SXM and return a real ranking that shows it."""
    with SchedulerClient(settings) as client:
        client.publish_start(start(job, "s0", 1_790_000_000.0, "H100-SXM"))
        client.publish_finish(finish(job, "f0", 1_790_003_600.0, "H100-SXM", 1234.0))
        client.flush()
        deadline = time.monotonic() + 60
        i = 1
        while time.monotonic() < deadline:
            sub = submission(job, i)
            client.publish(sub)
            client.flush()
            got = client.wait_for([sub.attempt_id], timeout=10)
            if sub.attempt_id in got and "H100-SXM" in got[sub.attempt_id][0].features_used["prior"]:
                return got[sub.attempt_id][0]
            i += 1
    raise AssertionError("the worker never showed the job's history")


def test_what_if_ranks_with_the_served_model_and_todays_features_and_publishes_nothing(
        settings: Settings, worker: WorkerProcess, rds: redis.Redis, tmp_path: Path) -> None:
    job = f"whatif-{uuid.uuid4().hex[:8]}"
    real = job_with_history(settings, job)
    ours = worker_settings(settings, worker)
    job_keys = sorted(k for k in rds.scan_iter(f"{settings.key_prefix}*{job}*"))
    stored = {k: rds.dump(k) for k in job_keys}
    with SchedulerClient(settings) as client:
        before = ends(client)
        moved = submission(job, 99, num_accelerators=16, data_parallel=16)
        ranking = WhatIf(ours).rank([moved])[0]
        lines = tmp_path / "what-if.jsonl"
        lines.write_text(json.dumps({k: v for k, v in submission_dict(job, 98, num_accelerators=16,
                                                                        data_parallel=16).items()
                                     if k not in ("schema_version", "event_id", "event_time")}) + "\n")
        cli = subprocess.run([sys.executable, "-m", "leap.cli", "what-if", str(lines)], cwd=ROOT,
                             env=worker_env(ours), capture_output=True, text=True, timeout=120)
        time.sleep(1.0)  # anything published would have reached the broker by now
        after = ends(client)
    assert cli.returncode == 0, cli.stderr
    printed = Ranking.decode(cli.stdout.strip().encode())
    assert ranking.model_version == real.model_version == printed.model_version  # the served model
    assert ranking.features_used["prior"] == real.features_used["prior"]  # today's features
    assert ranking.best_hardware is not None and printed.best_hardware is not None
    assert all(c["predicted_throughput"] is None or c["hourly_cost"] == pytest.approx(
        2 * next(r["hourly_cost"] for r in real.candidates if r["hardware"] == c["hardware"]))
        for c in ranking.candidates)  # 16 accelerators instead of 8
    assert after == before  # nothing published to any topic
    assert {k: rds.dump(k) for k in job_keys} == stored and job_keys  # the job's history untouched
    assert "nothing published" in cli.stderr
