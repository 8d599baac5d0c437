"""Hot reload: a promoted model reaches a running predictor without losing or duplicating rankings."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from leap.core.hardware import load_catalogue
from leap.core.settings import Settings
from leap.fleet.engine import Fleet
from leap.services.workers import WorkerProcess
from leap.training.dataset import build_examples, read_history
from leap.training.train import fit_model, split
from predictor.registry import Registry
from predictor.reload import announce
from streams.client import SchedulerClient
from streams.events import Ranking
from tests.factories import PLUMBING_PARAMS

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


def test_promotion_switches_a_running_predictor(
    settings: Settings, worker: WorkerProcess, small_history: Path, tmp_path: Path
) -> None:
    ex = build_examples(read_history(small_history), load_catalogue())
    last = float(np.floor(ex.submit_time.max() / 86400) * 86400)
    model = fit_model(split(ex, last + 86400, 30).train, PLUMBING_PARAMS)
    record = Registry(tmp_path).save(model, {"metrics": {}}, version=f"lgbm-test-{int(time.time())}")

    attempts = Fleet(seed=int(time.time()) % 100_000).sample_attempts(600)
    published: list[str] = []
    with SchedulerClient(settings) as client:
        def publish() -> None:
            for a in attempts:
                client.publish(a.submission)
                published.append(a.submission.attempt_id)
                time.sleep(0.01)  # ~100 submissions/s while the model changes
            client.flush()

        sender = threading.Thread(target=publish)
        sender.start()
        time.sleep(2.0)
        announce(settings, record)
        sender.join()
        wanted = {a.submission.attempt_id for a in attempts}
        seen: list[Ranking] = []
        deadline = time.monotonic() + 60
        while len({r.attempt_id for r in seen}) < len(wanted) and time.monotonic() < deadline:
            seen.extend(r for r, _ in client.rankings(timeout=1.0) if r.attempt_id in wanted)
        seen.extend(r for r, _ in client.rankings(timeout=2.0) if r.attempt_id in wanted)
    try:
        assert len(seen) == len(wanted), "a ranking was lost or duplicated across the swap"
        assert {r.attempt_id for r in seen} == wanted
        order = {aid: i for i, aid in enumerate(published)}
        versions = [r.model_version for r in sorted(seen, key=lambda r: order[r.attempt_id])]
        assert versions[-1] == record.version, worker.log_tail()
        assert versions[0] != record.version  # traffic flowed before the promotion too
        switched = [r for r in seen if r.model_version == record.version]
        assert all(r.fallback is None or "no_trained_model" not in r.fallback for r in switched)
    finally:
        announce(settings, None, "lookup")  # leave the shared worker on the baseline
