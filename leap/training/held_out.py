"""Examples of held-out jobs: rows built against the history of every other job.

A measurement table's test rows (:mod:`leap.training.measurements.runner`) come from jobs whose
own history the model never saw: each held-out job is replayed alone on top of the state the
training jobs left, so its rows read the other jobs' aggregates and its own past only.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from features.offline import OfflineFeatureState
from features.rows import build_rows
from leap.core.hardware import Catalogue
from leap.training.dataset import ExampleColumns, Examples, History
from leap.training.events import FINISH, START, events, merge_order
from streams.events import JobFinish, JobStart, Submission


def _replay_order(finishes: list[JobFinish], starts: list[JobStart], subs: list[Submission],
                  until: float | None) -> list[tuple[int, int]]:
    """``(kind, index in its list)`` of every event before ``until``, merged by time
    (:func:`leap.training.events.merge_order`)."""
    kinds, index = merge_order([[f.event_time for f in finishes], [s.event_time for s in starts],
                                [s.event_time for s in subs]], until)
    return list(zip(kinds.tolist(), index.tolist(), strict=True))


def select_jobs(history: History, job_keys: Any, keep: bool = True) -> History:
    """The history of the jobs ``job_keys`` (``keep``) or of every other job (not ``keep``).

    Every table is filtered by ``job_key``, so a job's submissions, starts and finishes go
    together; the oracle is dropped (it describes all jobs).
    """
    keys = pa.array(sorted({str(k) for k in job_keys}), type=pa.string())

    def part(table: pa.Table) -> pa.Table:
        inside = pc.is_in(table.column("job_key"), value_set=keys)
        return table.filter(inside if keep else pc.invert(inside))

    digest = hashlib.sha256(f"{history.digest}|{keep}|".encode() + b"|".join(k.encode() for k in keys.to_pylist()))
    return History(part(history.submissions), part(history.starts), part(history.finishes), None,
                   digest.hexdigest()[:16])


def build_held_out_examples(train: History, held_out: History, catalogue: Catalogue, full: bool = True) -> Examples:
    """Examples of held-out jobs, each seeing only its own past and the training jobs' aggregates.

    Cross-validation over jobs (a public measurement table, one job per configuration) must not
    let a held-out job learn from another held-out job. So every held-out job is replayed alone
    through its own :class:`~features.offline.OfflineFeatureState`, and at each of its submissions
    its snapshot takes the cross-job aggregates (lookup medians, paired ratios, whatever else the
    store keeps across jobs) from one state into which every event of ``train`` was replayed
    (:meth:`~features.offline.OfflineFeatureState.snapshot` with ``job_source``). The aggregates
    are those of the whole training history (a model trained on it serves with them); the job's
    own features are point-in-time.

    Parameters
    ----------
    train
        History of the training jobs.
    held_out
        History of the held-out jobs (disjoint from ``train`` by ``job_key``).
    catalogue
        Specs for the rows.
    full
        Also build every candidate's rows for each submission with more than one candidate
        (``Examples.full``, for top-1 and regret).

    Returns
    -------
    Examples
        One example per measured held-out attempt, job by job, each job's in submission order.
    """
    train_state = OfflineFeatureState(catalogue.canonical)
    t_finishes: list[JobFinish] = events(train.finishes, JobFinish)
    t_starts: list[JobStart] = events(train.starts, JobStart)
    for kind, i in _replay_order(t_finishes, t_starts, [], None):
        if kind == FINISH:
            train_state.apply_finish(t_finishes[i])
        else:
            train_state.apply_start(t_starts[i])
    out = ExampleColumns(catalogue)
    for job in _by_job(held_out):
        _replay_held_out_job(job, train_state, catalogue, full, out)
    return out.examples()


def _by_job(history: History) -> list[tuple[list[JobFinish], list[JobStart], list[Submission]]]:
    """Each job's finishes, starts and submissions, jobs in order of their first submission."""
    finishes: list[JobFinish] = events(history.finishes, JobFinish)
    starts: list[JobStart] = events(history.starts, JobStart)
    subs: list[Submission] = events(history.submissions, Submission)
    jobs: dict[str, tuple[list[JobFinish], list[JobStart], list[Submission]]] = {}
    for s in sorted(subs, key=lambda s: (s.event_time, s.event_id)):
        jobs.setdefault(s.job_key, ([], [], []))[2].append(s)
    for f in finishes:
        if f.job_key in jobs:
            jobs[f.job_key][0].append(f)
    for b in starts:
        if b.job_key in jobs:
            jobs[b.job_key][1].append(b)
    return list(jobs.values())


def _replay_held_out_job(job: tuple[list[JobFinish], list[JobStart], list[Submission]],
                         train_state: OfflineFeatureState, catalogue: Catalogue, full: bool,
                         out: ExampleColumns) -> None:
    """Replay one held-out job alone and add an example per measured attempt to ``out``."""
    finishes, starts, subs = job
    measured = {f.attempt_id: f for f in finishes if f.throughput is not None}
    state = OfflineFeatureState(catalogue.canonical)
    for kind, i in _replay_order(finishes, starts, subs, None):
        if kind == FINISH:
            state.apply_finish(finishes[i])
        elif kind == START:
            state.apply_start(starts[i])
        elif (done := measured.get(subs[i].attempt_id)) is not None:
            sub = subs[i]
            # Own past from the job's state; cross-job aggregates from the training jobs only. The
            # training state computes them, as some (paired ratios) depend on the job's priors.
            snap = train_state.snapshot(sub, job_source=state)
            n = out.add(sub, done, snap)
            if full and len(sub.candidates) > 1:
                out.full[n] = (sub, build_rows(sub, snap, sub.candidates, catalogue))


def build_cross_fitted_examples(history: History, catalogue: Catalogue, folds: int = 5, seed: int = 0) -> Examples:
    """Training examples for a history without time (a measurement table), built as held-out ones.

    A measurement table's configurations were not measured one after another: replayed in an
    invented order, early jobs would see almost no cross-job aggregates and late ones nearly all,
    while a held-out job sees those of every training job. So the jobs are split in ``folds``
    groups and each group's examples come from :func:`build_held_out_examples` against the other
    groups: every training row sees the aggregates of most other jobs and never its own.
    """
    keys = np.unique(history.submissions.column("job_key").to_numpy(zero_copy_only=False).astype(str))
    group = np.random.default_rng(seed).permutation(len(keys)) % folds
    parts = [build_held_out_examples(select_jobs(history, keys[group == g], keep=False),
                                     select_jobs(history, keys[group == g]), catalogue, full=False)
             for g in range(folds) if (group == g).any()]
    return Examples.concat([p for p in parts if len(p)]) if any(len(p) for p in parts) else parts[0]
