"""Small builders of valid events for tests (one place, so contract changes touch one file)."""

from __future__ import annotations

from typing import Any

from streams.events import SCHEMA_VERSION, JobFinish, JobStart, Submission

T0 = 1_790_000_000.0
CANDIDATES = ("H100-SXM", "A100-80GB", "MI300X", "TPU-v5p", "L4")


def submission_dict(job: str, i: int, **over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "event_id": f"sub-{job}-{i}",
        "event_time": T0 + i,
        "job_key": job,
        "attempt_id": f"{job}-att-{i}",
        "model_type": "llama-7b",
        "family": "dense_lm",
        "params": 7e9,
        "global_batch_size": 512,
        "seq_len": 2048,
        "precision": "bf16",
        "num_accelerators": 8,
        "data_parallel": 8,
        "tensor_parallel": 1,
        "pipeline_parallel": 1,
        "framework": "pytorch",
        "candidates": list(CANDIDATES),
        "requested_hardware": "A100-80GB",
    }
    d.update(over)
    return d


def submission(job: str, i: int, **over: Any) -> Submission:
    return Submission.from_dict(submission_dict(job, i, **over))


def finish_dict(job: str, event_id: str, t: float, hardware: str, throughput: float | None,
                model_type: str = "llama-7b", family: str = "dense_lm", outcome: str = "completed",
                num_accelerators: int = 8) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "event_id": event_id,
        "event_time": t,
        "job_key": job,
        "attempt_id": f"{job}-{event_id}",
        "model_type": model_type,
        "family": family,
        "hardware": hardware,
        "num_accelerators": num_accelerators,
        "throughput": throughput,
        "accelerator_hours": 1.5,
        "outcome": outcome,
        "start_time": t - 3600,
    }


def finish(job: str, event_id: str, t: float, hardware: str, throughput: float | None, **kw: Any) -> JobFinish:
    return JobFinish.from_dict(finish_dict(job, event_id, t, hardware, throughput, **kw))


def start(job: str, event_id: str, t: float, hardware: str) -> JobStart:
    return JobStart.from_dict({
        "schema_version": SCHEMA_VERSION, "event_id": event_id, "event_time": t, "job_key": job,
        "attempt_id": f"{job}-{event_id}", "model_type": "llama-7b", "family": "dense_lm",
        "hardware": hardware, "num_accelerators": 8,
    })
