"""Partial submissions, sent raw to a running ``leap worker all`` with a trained model.

A scheduler may leave out ``params``, ``framework`` and the parallel layout. Sent as a foreign
client would (a plain confluent-kafka producer, JSON bytes), after the same jobs' complete
submissions, they must get rankings whose spread across the parts follows the complete ones',
never above a part's peak, and say what stood in for the missing fields.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import redis
from confluent_kafka import Producer

from features.keys import KeyLayout
from leap.core.hardware import load_catalogue
from leap.core.settings import Settings
from leap.services.workers import WorkerProcess
from leap.training.dataset import build_examples, read_history
from leap.training.train import fit_model, split
from predictor.ranking import PARTIAL_SUBMISSION
from predictor.registry import Registry
from predictor.reload import announce
from streams.client import SchedulerClient
from streams.events import SCHEMA_VERSION, Ranking
from streams.topics import SUBMISSIONS

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

PARTS = ("T4", "V100-32GB", "L4", "A100-80GB", "H100-SXM", "MI300X", "TPU-v5p", "Gaudi3")
LAYOUT = ("data_parallel", "tensor_parallel", "pipeline_parallel")
#: The issue's four submissions: (name, complete fields, fields the partial one leaves out).
CASES: tuple[tuple[str, dict[str, Any], tuple[str, ...]], ...] = (
    ("bert", {"model_type": "bert-large", "family": "dense_lm", "params": 3.4e8, "global_batch_size": 256,
              "seq_len": 384, "precision": "fp16", "num_accelerators": 8, "data_parallel": 8, "tensor_parallel": 1,
              "pipeline_parallel": 1, "framework": "pytorch"}, ("params", "framework", *LAYOUT)),
    ("llama", {"model_type": "llama31-8b", "family": "dense_lm", "params": 8.0e9, "global_batch_size": 512,
               "seq_len": 8192, "precision": "bf16", "num_accelerators": 64, "data_parallel": 8,
               "tensor_parallel": 8, "pipeline_parallel": 1, "framework": "pytorch"}, LAYOUT),
)


def _message(run: str, name: str, i: int, fields: dict[str, Any], leave_out: tuple[str, ...]) -> dict[str, Any]:
    body = {"schema_version": SCHEMA_VERSION, "event_id": f"{run}-{name}-{i}", "event_time": time.time(),
            "job_key": f"{run}-{name}-{i}", "attempt_id": f"{run}-{name}-a{i}", "candidates": list(PARTS), **fields}
    return {k: v for k, v in body.items() if k not in leave_out}


def _send_raw(settings: Settings, messages: list[dict[str, Any]]) -> None:
    """JSON bytes through a plain producer, as a scheduler in another language would send them."""
    producer = Producer(settings.confluent_config())
    for m in messages:
        producer.produce(SUBMISSIONS.name, key=m["job_key"].encode(), value=orjson.dumps(m))
    assert producer.flush(30) == 0


def _rankings(client: SchedulerClient, attempts: set[str], timeout: float = 60) -> dict[str, Ranking]:
    got = client.wait_for(attempts, timeout=timeout)
    assert set(got) == attempts, f"rankings missing for {attempts - set(got)}"
    return {a: r for a, (r, _) in got.items()}


def _per_part(ranking: Ranking) -> np.ndarray:
    by_part = {c["hardware"]: c["predicted_throughput"] for c in ranking.candidates}
    return np.array([by_part[p] if by_part[p] is not None else np.nan for p in PARTS], dtype=np.float64)


def _rank_correlation(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def _serve_trained_model(settings: Settings, small_history: Path, tmp_path: Path, client: SchedulerClient,
                         run: str) -> str:
    ex = build_examples(read_history(small_history), load_catalogue())
    last = float(np.floor(ex.submit_time.max() / 86400) * 86400)
    # small and without the learned roofline: the test is about the stand-ins, not the model's stages
    model = fit_model(split(ex, last + 86400, 30).train,
                      {"n_estimators": 60, "num_leaves": 15, "learned_roofline": False})
    record = Registry(tmp_path).save(model, {"metrics": {}}, version=f"lgbm-partial-{run}")
    announce(settings, record)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until a canary comes back ranked by the new model
        canary = _message(run, "canary", int(time.monotonic() * 1000), CASES[0][1], ())
        _send_raw(settings, [canary])
        got = client.wait_for([canary["attempt_id"]], timeout=5)
        if got and got[canary["attempt_id"]][0].model_version == record.version:
            return record.version
    raise AssertionError("the worker did not switch to the trained model")


def test_partial_submissions_rank_like_complete_ones(settings: Settings, worker: WorkerProcess, rds: redis.Redis,
                                                     small_history: Path, tmp_path: Path, run_id: str) -> None:
    layout = KeyLayout(settings.key_prefix)
    with SchedulerClient(settings) as client:
        version = _serve_trained_model(settings, small_history, tmp_path, client, run_id)
        try:
            complete = [_message(run_id, name, 0, fields, ()) for name, fields, _ in CASES]
            _send_raw(settings, complete)
            whole = _rankings(client, {m["attempt_id"] for m in complete})
            deadline = time.monotonic() + 30  # the feature agent has fed the configuration aggregates
            while time.monotonic() < deadline and not all(
                    rds.hget(layout.config_model(fields["model_type"]), "params") for _, fields, _ in CASES):
                time.sleep(0.2)
            partial = [_message(run_id, name, 1, fields, leave_out) for name, fields, leave_out in CASES]
            _send_raw(settings, partial)
            parts = _rankings(client, {m["attempt_id"] for m in partial})
        finally:
            announce(settings, None, "lookup")  # leave the shared worker on the baseline
    t4 = load_catalogue().resolve("T4")
    assert t4 is not None
    for (name, fields, leave_out), full_msg, part_msg in zip(CASES, complete, partial, strict=True):
        full, part = whole[full_msg["attempt_id"]], parts[part_msg["attempt_id"]]
        assert full.model_version == part.model_version == version
        assert part.fallback is not None and PARTIAL_SUBMISSION in part.fallback.split(","), name
        stand_ins = part.features_used["stand_ins"]
        assert set(stand_ins) == set(leave_out), name
        full_tput, part_tput = _per_part(full), _per_part(part)
        assert np.isfinite(part_tput).all(), name
        # the spread across parts follows the complete submission's: same order, same breadth
        assert _rank_correlation(full_tput, part_tput) >= 0.9, (name, full_tput, part_tput, stand_ins)
        spread_full, spread_part = full_tput.max() / full_tput.min(), part_tput.max() / part_tput.min()
        assert spread_part >= 0.5 * spread_full, (name, spread_full, spread_part)
        # never above what the T4s can deliver at their peak
        t4_peak = fields["num_accelerators"] * t4.peak_tflops * 1e12 / (6 * fields["params"] * fields["seq_len"])
        assert part_tput[PARTS.index("T4")] <= t4_peak * (1 + 1e-9), (name, part_tput, t4_peak)
