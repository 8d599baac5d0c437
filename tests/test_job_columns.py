"""features.job_columns: a feature state pickled mid-replay keeps its jobs as columns, and the
replay goes on to read exactly what a state never pickled reads, with ids known unique or not."""

from __future__ import annotations

import pickle
import random

import pytest

from features.job_columns import JobColumns
from features.offline import OfflineFeatureState
from leap.core.hardware import load_catalogue
from streams.events import OUTCOMES, JobFinish, JobStart
from tests.factories import CANDIDATES, T0, finish, start, submission


def _events(rng: random.Random, n: int, repeats: bool) -> list[JobStart | JobFinish]:
    """Starts and finishes of 40 jobs on the candidates, a few without a throughput, some out of
    time order; with ``repeats``, some events arrive twice (their ids repeat)."""
    events: list[JobStart | JobFinish] = []
    for i in range(n):
        job, hw, t = f"job{rng.randrange(40)}", rng.choice(CANDIDATES), T0 + i * 60 - rng.uniform(0, 600)
        if rng.random() < 0.3:
            events.append(start(job, f"s{i}", t, hw))
        else:
            outcome = rng.choice(OUTCOMES)
            throughput = None if outcome != "completed" and rng.random() < 0.5 else rng.uniform(100, 2000)
            events.append(finish(job, f"f{i}", t, hw, throughput, outcome=outcome,
                                 model_type=rng.choice(["llama-7b", "bert-large"])))
        if repeats and rng.random() < 0.1:
            events.append(rng.choice(events))
    return events


def _apply(state: OfflineFeatureState, ev: JobStart | JobFinish) -> bool:
    return state.apply_start(ev) if isinstance(ev, JobStart) else state.apply_finish(ev)


@pytest.mark.parametrize("unique_ids", [True, False])
def test_a_state_pickled_mid_replay_reads_what_one_never_pickled_reads(unique_ids: bool) -> None:
    names = load_catalogue().canonical
    events = _events(random.Random(5), 900, repeats=not unique_ids)
    plain = OfflineFeatureState(names, unique_ids=unique_ids)
    resumed = OfflineFeatureState(names, unique_ids=unique_ids)
    for k, ev in enumerate(events):
        assert _apply(plain, ev) == _apply(resumed, ev)
        if k % 250 == 249:  # a checkpoint: the jobs touched since the last one join the columns
            resumed = pickle.loads(pickle.dumps(resumed)).resolve_with(names)
            columns = resumed._job_columns
            assert columns is not None and len(columns) == len(plain.jobs) and not resumed.jobs
        if k % 50 == 0:
            sub = submission(f"job{k % 41}", k)  # job40 never ran
            assert resumed.snapshot(sub) == plain.snapshot(sub)
    for j in range(41):
        assert resumed.snapshot(submission(f"job{j}", j)) == plain.snapshot(submission(f"job{j}", j))


def test_columns_hand_back_each_job_once_as_it_was_given() -> None:
    jobs = [("a", ({"starts": 2, "completed": 1}, None, [("H100", 3, [(1.0, "e1", 5.0), (2.0, "e2", 6.0)])])),
            ("b", ({"failed": 1}, None, [])),
            ("c", ({}, None, [("V100", 1, [(0.5, "é", 1.5)]), ("H100", 1, [(0.7, "e3", 2.5)])]))]
    columns = JobColumns.of(jobs)
    assert columns.take("b") == jobs[1][1] and columns.take("b") is None and len(columns) == 2
    # taken jobs come back changed after the ones still held; a new counter name and hardware join
    later = JobColumns.of([("b", ({"failed": 1, "preempted": 1}, ("x",), [("MI300X", 1, [(9.0, "e9", 3.0)])]))],
                          pickle.loads(pickle.dumps(columns)))
    assert later.keys == ["a", "c", "b"]
    assert [later.take(k) for k in ("c", "a", "b")] == [
        jobs[2][1], jobs[0][1], ({"failed": 1, "preempted": 1}, ("x",), [("MI300X", 1, [(9.0, "e9", 3.0)])])]
    assert later.take("nobody") is None
