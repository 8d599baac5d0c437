"""A measurement table as LEAP history: one job per configuration and suite, one finished attempt per row.

Rules (``docs/evaluation.md`` explains them):

- a **job** is a configuration within one suite (:func:`leap.training.measurements.pairs.job_ids`); its ``job_key``
  is ``<name>-c<config id>``, its ``model_type`` the table's ``workload``;
- each **row** (measurement) is one attempt that completed on the row's hardware: a submission,
  a start and a finish; the attempts of a job come in a seeded random order, spaced in time;
- every submission of a job lists as **candidates** every hardware type the configuration was
  measured on, by canonical catalogue name; a name the catalogue does not know is kept as the
  table spells it (as the row builder does: vendor ``unknown``, NaN specs);
- the finish's **throughput** is the row's (summed over its accelerators, as the contract says);
- what the table does not state stays missing (``None`` in the events, NaN / ``unknown`` in the
  rows): family, parameter count, sequence length, precision, parallelism and framework are
  filled only from the table's own optional columns, never guessed. A precision outside the
  contract's choices is left missing and counted in :attr:`TableHistory.notes`.

The times are synthetic (the tables have none): jobs start uniformly over :data:`SPAN_DAYS` days
from :data:`START`, so that ``leap train`` (30-day window, last day as holdout) runs on the
folder :func:`write_history` writes; an attempt queues :data:`QUEUE_S`, runs :data:`RUN_S` (its
accelerator-hours follow) and the next is submitted :data:`GAP_S` after it finished.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from leap.core.hardware import Catalogue
from leap.training.dataset import DAY, History
from leap.training.measurements.pairs import job_ids
from leap.training.measurements.table import MeasurementError, Table
from streams.archive import to_table, write_by_day
from streams.events import PRECISIONS, EventError, JobFinish, JobStart, Submission

#: 2024-01-01 00:00 UTC: a fixed origin, so that a conversion is reproducible.
START = 1_704_067_200.0
#: Days over which the jobs' first submissions are spread (inside `leap train`'s 30-day window).
SPAN_DAYS = 28
QUEUE_S = 60.0
RUN_S = 3600.0
GAP_S = 3600.0


@dataclass(frozen=True)
class TableHistory:
    """A converted table: the history and, per table row, the job and attempt it became.

    Attributes
    ----------
    history
        Submissions, starts and finishes (no oracle), as :func:`leap.training.dataset.read_history`
        would return them from the folder :func:`write_history` writes.
    job_key, attempt_id, hardware
        Per table row: its job, its attempt and its hardware's canonical name.
    notes
        What the conversion kept missing or as written (for the report).
    """

    history: History
    job_key: np.ndarray
    attempt_id: np.ndarray
    hardware: list[str]
    notes: dict[str, Any] = field(default_factory=dict)


def _whole(x: float, column: str, row: int) -> int:
    """``x`` as an int; the contract counts accelerators and samples in whole numbers."""
    if not float(x).is_integer():
        raise MeasurementError(f"row {row + 2}: {column} must be a whole number for a history, got {x}")
    return int(x)


def _text(value: str) -> str | None:
    return value or None


def _precision(value: str) -> str | None:
    """The table's precision if the contract knows it, else missing (never mapped to a guess)."""
    return value if value in PRECISIONS else None


def _config_of_row(t: Table, i: int) -> dict[str, Any]:
    """The submission fields of row ``i``'s configuration that the table states; the rest None."""
    return {
        "model_type": t.workload[i],
        "family": _text(t.family[i]),
        "params": float(t.params[i]) if math.isfinite(t.params[i]) else None,
        "global_batch_size": _whole(t.batch[i], "global_batch_size", i),
        "seq_len": _whole(t.seq_len[i], "seq_len", i) if math.isfinite(t.seq_len[i]) else None,
        "precision": _precision(t.precision[i]),
        "num_accelerators": _whole(t.num_accelerators[i], "num_accelerators", i),
        "data_parallel": None,
        "tensor_parallel": None,
        "pipeline_parallel": None,
        "framework": _text(t.framework[i]),
    }


def _attempt_events(
    job_key: str, k: int, when: float, config: dict[str, Any], candidates: tuple[str, ...], hw: str, tput: float
) -> tuple[Submission, JobStart, JobFinish]:
    """Attempt ``k`` of a job, submitted at ``when``, completed on ``hw`` at ``tput`` samples/s.

    Built through ``from_dict`` so that every event passes the same validation as a live one.
    """
    attempt = f"{job_key}-a{k}"
    common = {"schema_version": 1, "job_key": job_key, "attempt_id": attempt}
    placed = {"model_type": config["model_type"], "family": config["family"], "hardware": hw,
              "num_accelerators": config["num_accelerators"]}
    started, finished = when + QUEUE_S, when + QUEUE_S + RUN_S
    sub = Submission.from_dict({**common, **config, "event_id": f"{attempt}-s", "event_time": when,
                                "candidates": list(candidates)})
    start = JobStart.from_dict({**common, **placed, "event_id": f"{attempt}-b", "event_time": started})
    finish = JobFinish.from_dict({
        **common, **placed, "event_id": f"{attempt}-f", "event_time": finished, "throughput": tput,
        "accelerator_hours": RUN_S / 3600.0 * config["num_accelerators"], "outcome": "completed",
        "start_time": started, "global_batch_size": config["global_batch_size"], "precision": config["precision"],
    })
    return sub, start, finish


def to_history(t: Table, catalogue: Catalogue, seed: int = 0, name: str = "m") -> TableHistory:
    """Convert a measurement table to history (the rules are in the module docstring).

    Parameters
    ----------
    t
        A validated table (:func:`leap.training.measurements.table.load_table`).
    catalogue
        Canonical hardware names.
    seed
        Seed of the attempt order and of the jobs' start times.
    name
        Prefix of the job keys (e.g. the file's stem).

    Returns
    -------
    TableHistory

    Raises
    ------
    MeasurementError
        A value the event contracts refuse (a fractional accelerator count or batch, a
        hardware name longer than 64 characters, more than 64 hardware types in one
        configuration), naming the row.
    """
    cfg = job_ids(t)
    hardware = [catalogue.canonical(h) for h in t.hardware]
    rng = np.random.default_rng(seed)
    job_key = np.array([f"{name}-c{c:05d}" for c in cfg.tolist()], dtype=object)
    attempt_id = np.empty(len(t), dtype=object)
    events: tuple[list[Submission], list[JobStart], list[JobFinish]] = ([], [], [])
    for c in range(int(cfg.max()) + 1 if len(t) else 0):
        rows = np.flatnonzero(cfg == c)
        candidates = tuple(sorted({hardware[i] for i in rows.tolist()}))
        config = _config_of_row(t, int(rows[0]))
        when = START + float(rng.uniform(0.0, SPAN_DAYS * DAY))
        for k, i in enumerate(rng.permutation(rows).tolist()):
            try:
                made = _attempt_events(str(job_key[i]), k, when, config, candidates, hardware[i],
                                       float(t.throughput[i]))
            except EventError as exc:
                raise MeasurementError(f"row {i + 2}: not a valid event: {exc}") from None
            events[0].append(made[0])
            events[1].append(made[1])
            events[2].append(made[2])
            attempt_id[i] = made[0].attempt_id
            when += QUEUE_S + RUN_S + GAP_S
    history = History(to_table(Submission, events[0]), to_table(JobStart, events[1]),
                      to_table(JobFinish, events[2]), None, _digest(t, seed, name))
    return TableHistory(history, job_key, attempt_id, hardware, _notes(t, hardware, catalogue))


def _digest(t: Table, seed: int, name: str) -> str:
    """A fingerprint of what the history was made from (the archive's own digest is of files)."""
    h = hashlib.sha256(f"{name}|{seed}".encode())
    for row in zip(t.workload, t.hardware, t.num_accelerators.tolist(), t.batch.tolist(), t.throughput.tolist(),
                   t.precision, t.suite, t.family, t.framework, strict=True):
        h.update(repr(row).encode())
    return h.hexdigest()[:16]


def _notes(t: Table, hardware: Sequence[str], catalogue: Catalogue) -> dict[str, Any]:
    """What stayed missing or as written, so that the report can say it."""
    stated = {"family": "family" in t.optional, "params": "params" in t.optional,
              "seq_len": "seq_len" in t.optional, "precision": "precision" in t.optional,
              "framework": "framework" in t.optional}
    return {
        "jobs": int(job_ids(t).max()) + 1 if len(t) else 0,
        "attempts": len(t),
        "fields_from_table": sorted(k for k, v in stated.items() if v),
        "fields_missing": sorted([k for k, v in stated.items() if not v]
                                 + ["data_parallel", "tensor_parallel", "pipeline_parallel"]),
        "precision_not_in_contract": sorted({p for p in t.precision if p and p not in PRECISIONS}),
        "hardware_not_in_catalogue": sorted({h for h in hardware if catalogue.resolve(h) is None}),
        "hardware_merged": _merged(t.hardware, hardware),
    }


def _merged(written: Sequence[str], canonical: Sequence[str]) -> dict[str, list[str]]:
    """Canonical names that several of the table's spellings resolve to (one candidate each)."""
    spellings: dict[str, set[str]] = {}
    for w, c in zip(written, canonical, strict=True):
        spellings.setdefault(c, set()).add(w)
    return {c: sorted(s) for c, s in sorted(spellings.items()) if len(s) > 1}


def write_history(h: History, out: Path) -> dict[str, int]:
    """Write a history as the archive does: ``out/<table>/day=YYYY-MM-DD/part-0.parquet``.

    Returns the rows written per table. ``out`` must not hold an archive already: part files
    of another history would be read as part of this one.
    """
    if any((out / name).exists() for name in ("submissions", "starts", "finishes")):
        raise MeasurementError(f"{out}: already holds an archive; choose an empty folder")
    return write_by_day(out, {"submissions": h.submissions, "starts": h.starts, "finishes": h.finishes})
