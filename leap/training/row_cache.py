"""Point-in-time rows kept from one training run to the next, so a nightly retrain replays one day.

Building a training run's rows replays the whole archive through the offline feature state
(:func:`leap.training.dataset.build_examples`), most of ``leap train``'s time. Yesterday's run
replayed the same events up to a day earlier. So a run given a cache folder leaves a
*checkpoint* there: the feature state after every event before a time ``C``, the rows it built
for the submissions before ``C``, and a digest of those events. The next run checks that its
archive holds the same events before ``C`` (no late event changed that past), loads the state,
and replays only the events from ``C`` on.

``C`` is the checkpoint run's ``until``, moved back to the earliest submission still without any
finish then (within :data:`OPEN_DAYS`): a row is built when its submission is replayed, but only
for an attempt measured by then, so a later run could build a row before ``until`` that this one
did not. A resumed run is exact: it returns what a cold build returns (``tests/test_row_cache.py``).
Whatever would break that falls back to the cold build, with the reason logged:

- another row-building code, catalogue or archive-wide id uniqueness (the state's de-duplication);
- events before ``C`` added, removed or changed, or a window starting before the checkpoint's;
- a submission before ``C`` measured since (an attempt open longer than :data:`OPEN_DAYS`);
- the configuration aggregates already applied (a partial submission read them): a cold build
  feeds them only the window's submissions (:func:`leap.training.train.load_examples`), and
  applied windows cannot drop the older ones again. Queued entries can, and are.

The checkpoint is two pickles, the state (its jobs as columns: :mod:`features.job_columns`) and
the rows, read back only once the state is let go (the two are a night's largest objects), beside
a JSON of what it was made from; each is written under a temporary name and renamed, the JSON
last. A pickle runs code when loaded, so the folder must be private to the trainer's user
(:func:`predictor.compiled.private_dir`: created 0700, refused when another user owns it or
others can write to it).

A backtest or a drivers report run again on the same history builds the same rows: with a
folder, :func:`built_examples` keeps them, keyed by the events, the row code, the catalogue and
the build's options, and a later run reads them back (same rules for the folder).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import pickle
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from features.offline import OfflineFeatureState
from leap.core.hardware import Catalogue
from leap.training.dataset import (
    DAY,
    Examples,
    History,
    build_examples,
    build_examples_with_progress,
    new_state,
    paused_gc,
)
from leap.training.events import ids_unique, measured_finish
from predictor.compiled import private_dir

log = logging.getLogger("leap.row_cache")

#: An attempt without a finish this long before a run's ``until`` is not waited for: the
#: checkpoint does not move back past it (if it is measured later, the next run builds cold).
OPEN_DAYS = 2.0
STATE = "checkpoint-state.pickle"
ROWS = "checkpoint-rows.pickle"
#: How the checkpoint is laid out in files: a checkpoint of another layout is not read.
LAYOUT = 2
#: Sets of built rows :func:`built_examples` keeps in its folder, the most recently used.
EXAMPLES_KEPT = 3
META = "checkpoint.json"
#: Modules whose code decides the rows: a change to any of them makes a checkpoint stale.
ROW_CODE = ("features", "leap/training/dataset.py", "leap/training/events.py", "leap/core/hardware.py",
            "streams/events.py")
_ROOT = Path(__file__).resolve().parents[2]


def code_digest() -> str:
    """A digest of the source that builds rows (:data:`ROW_CODE`)."""
    h = hashlib.sha256()
    for name in ROW_CODE:
        path = _ROOT / name
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            h.update(str(file.relative_to(_ROOT)).encode() + b"\0" + file.read_bytes())
    return h.hexdigest()[:16]


class _Hashing:
    """A write-only file that hashes what is written to it instead of keeping it."""

    def __init__(self) -> None:
        self.hash = hashlib.sha256()
        self.closed = False

    def write(self, data: Any) -> int:
        self.hash.update(data)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def _table_digest(table: pa.Table) -> bytes:
    """A digest of a table's rows: the Arrow IPC stream of the table made one chunk, hashed as it
    is written (never held whole), the columns made contiguous one at a time (the peak is one
    copy of the table, not the three a buffered stream took)."""
    part = pa.table([table.column(i).combine_chunks() for i in range(table.num_columns)], schema=table.schema)
    sink = _Hashing()
    with pa.ipc.new_stream(pa.PythonFile(sink, mode="w"), part.schema) as writer:
        writer.write_table(part)
    return sink.hash.digest()


def events_digest(history: History, before: float) -> str:
    """A digest of the archive's starts and finishes before ``before``."""
    h = hashlib.sha256()
    for table in (history.finishes, history.starts):
        h.update(_table_digest(table.filter(pc.less(table.column("event_time"), before))))
    return h.hexdigest()[:16]


def submission_digests(history: History, since: float, before: float) -> dict[str, str]:
    """A digest per day of the submissions in ``[since, before)``, by day number: a later run,
    whose window starts a day or more later, compares the days it still holds."""
    subs = history.submissions
    t = subs.column("event_time")
    subs = subs.filter(pc.and_(pc.greater_equal(t, since), pc.less(t, before)))
    day = pc.floor(pc.divide(subs.column("event_time"), DAY)).to_numpy(zero_copy_only=False).astype(np.int64)
    return {str(d): _table_digest(subs.filter(pa.array(day == d))).hex()[:16] for d in np.unique(day).tolist()}


def checkpoint_time(history: History, until: float) -> float:
    """``until``, or the earliest submission of :data:`OPEN_DAYS` before it still without a finish."""
    subs, finishes = history.submissions, history.finishes
    finished = finishes.filter(pc.less(finishes.column("event_time"), until)).column("attempt_id")
    t = subs.column("event_time")
    recent = subs.filter(pc.and_(pc.less(t, until), pc.greater_equal(t, until - OPEN_DAYS * DAY)))
    open_ = recent.filter(pc.invert(pc.is_in(recent.column("attempt_id"), value_set=finished.unique())))
    return min(until, float(pc.min(open_.column("event_time")).as_py())) if open_.num_rows else until


def catalogue_digest(catalogue: Catalogue) -> str:
    """A digest of the catalogue's specs and names (prices, which change daily, build no row)."""
    specs = sorted(repr(dataclasses.replace(t, price_per_hour=0.0, price_source="")) for t in catalogue.types.values())
    return hashlib.sha256("\n".join(specs).encode()).hexdigest()[:16]


def _meta(history: History, catalogue: Catalogue, rows_from: float) -> dict[str, Any]:
    return {"layout": LAYOUT, "code": code_digest(), "catalogue": catalogue_digest(catalogue), "rows_from": rows_from,
            "unique_ids": ids_unique(history.starts, history.finishes)}


@paused_gc()  # the checkpoint's loads and saves make and walk millions of objects too
def examples_as_of(window: History, catalogue: Catalogue, rows_from: float, until: float,
                   folder: Path | None) -> tuple[Examples, dict[str, Any]]:
    """The rows a training run builds (the events before ``until``; rows for the measured
    submissions from ``rows_from`` on), resumed from the checkpoint in ``folder`` when it holds
    one this run can use, and a new checkpoint left there. ``window`` holds the submissions from
    ``rows_from`` on (:func:`window_history`). Returns the examples and what the cache did."""
    if folder is None:
        return build_examples(window, catalogue, rows_from=rows_from, until=until), \
            {"used": False, "reason": "no cache folder"}
    folder = private_dir(folder)
    meta = _meta(window, catalogue, rows_from)
    found, reason = _resume(folder, window, catalogue, meta, rows_from, until)
    state, since = found if found is not None else (new_state(window, catalogue), None)
    del found
    checkpoint = max(checkpoint_time(window, until), since or -np.inf)
    # Up to the new checkpoint, its state saved; then on to until.
    head = build_examples(window, catalogue, rows_from=rows_from, until=checkpoint, state=state, since=since)
    _begin_checkpoint(folder)
    saved = _saved(folder / STATE, _pickled(state))
    tail = build_examples(window, catalogue, rows_from=rows_from, until=until, state=state, since=checkpoint)
    del state  # the larger part: the rows kept are read back only now, so the two are never held at once
    if since is not None:
        try:
            head = Examples.concat([_kept_rows(folder, rows_from), head])
        except (OSError, EOFError, pickle.UnpicklingError) as exc:
            log.warning("the checkpoint's rows could not be read back (%s): building cold", exc)
            (folder / STATE).unlink(missing_ok=True)
            return build_examples(window, catalogue, rows_from=rows_from, until=until), \
                {"used": False, "reason": f"built cold: the checkpoint's rows could not be read back ({exc})",
                 "saved": False}
    meta.update(checkpoint=checkpoint, events=events_digest(window, checkpoint),
                submissions=submission_digests(window, rows_from, checkpoint))
    saved = saved and _saved(folder / ROWS, _pickled(head)) and \
        _saved(folder / META, lambda f: f.write(json.dumps(meta).encode()))
    log.info("training rows: %s", reason)
    return Examples.concat([head, tail]), {"used": since is not None, "reason": reason,
                                           "resumed_from": since, "checkpoint": checkpoint, "saved": saved}


def window_history(history: History, rows_from: float) -> History:
    """The history a run replays: submissions before its window feed nothing its rows read (but
    the configuration aggregates, which only a partial submission reads), so they are left out."""
    subs = history.submissions
    return dataclasses.replace(history, submissions=subs.filter(pc.greater_equal(subs["event_time"], rows_from)))


def _resume(folder: Path, history: History, catalogue: Catalogue, meta: dict[str, Any], rows_from: float,
            until: float) -> tuple[tuple[OfflineFeatureState, float] | None, str]:
    """The checkpoint's state and its time; or None and why not. Its rows are checked here and
    let go (:func:`_kept_rows` reads them back once the state is done with)."""
    try:
        saved = json.loads((folder / META).read_text())
    except (OSError, ValueError):
        return None, "built cold: no checkpoint"
    for key in ("layout", "code", "catalogue", "unique_ids"):
        if saved.get(key) != meta[key]:
            return None, f"built cold: the checkpoint's {key} differs"
    since = float(saved["checkpoint"])
    if not saved["rows_from"] <= rows_from <= since <= until:
        return None, "built cold: the checkpoint's window does not lead into this one"
    days = submission_digests(history, rows_from, since)
    if events_digest(history, since) != saved["events"] or \
            any(saved["submissions"].get(day) != digest for day, digest in days.items()) or \
            any(int(day) * DAY >= rows_from and day not in days for day in saved["submissions"]):
        return None, "built cold: the archive's events before the checkpoint changed"
    try:
        done = _kept_rows(folder, rows_from)
        if not _same_labels(done, history, rows_from, since):
            return None, "built cold: a submission before the checkpoint was measured since"
        kept = len(done)
        del done
        with open(folder / STATE, "rb") as f:
            state: OfflineFeatureState = pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError) as exc:
        return None, f"built cold: the checkpoint could not be read ({exc})"
    state.resolve_with(catalogue.canonical)
    if rows_from > saved["rows_from"] and not state.drop_config_before(rows_from):
        return None, "built cold: partial submissions read the configuration aggregates"
    return (state, since), f"resumed at the checkpoint, {kept} rows kept"


def _kept_rows(folder: Path, rows_from: float) -> Examples:
    """The checkpoint's rows for the submissions from ``rows_from`` on."""
    with open(folder / ROWS, "rb") as f:
        done: Examples = pickle.load(f)
    return done.select(done.submit_time >= rows_from)


def _same_labels(done: Examples, history: History, rows_from: float, since: float) -> bool:
    """Whether the measured submissions in ``[rows_from, since)`` and their outcomes are still
    the checkpoint's (a late finish would give one a row, or another hardware)."""
    subs = history.submissions
    t = subs.column("event_time")
    subs = subs.filter(pc.and_(pc.greater_equal(t, rows_from), pc.less(t, since)))
    finish_of = measured_finish(history.finishes, subs.column("attempt_id"))
    measured = finish_of >= 0
    ids = np.asarray(subs.column("attempt_id").to_numpy(zero_copy_only=False), dtype=object)[measured]
    if len(ids) != len(done):
        return False
    rows = pa.array(finish_of[measured])
    finishes = history.finishes
    now = {a: (float(ft), str(hw)) for a, ft, hw in zip(
        ids.tolist(), finishes.column("event_time").take(rows).to_pylist(),
        finishes.column("hardware").take(rows).to_pylist(), strict=True)}
    return all(now.get(a) == (float(ft), str(hw))
               for a, ft, hw in zip(done.attempt_id.tolist(), done.finish_time.tolist(), done.hardware.tolist(),
                                    strict=True))


def _begin_checkpoint(folder: Path) -> None:
    """Unname the checkpoint before its files are replaced: the JSON, written last, names only
    complete ones. A temporary file a crashed run left, or a file of an older layout, goes too."""
    (folder / META).unlink(missing_ok=True)
    for stale in [*folder.glob(".checkpoint*"), folder / "checkpoint.pickle"]:
        stale.unlink(missing_ok=True)


def _pickled(obj: Any) -> Callable[[BinaryIO], None]:
    return lambda f: pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)


def _saved(path: Path, write: Callable[[BinaryIO], Any]) -> bool:
    """:func:`_write`; False when it failed (a full disk costs the next night its head start, not
    this night its model)."""
    try:
        _write(path, write)
    except OSError as exc:
        log.warning("the rows' checkpoint was not saved in %s: %s", path.parent, exc)
        return False
    return True


def _write(path: Path, write: Callable[[BinaryIO], Any]) -> None:
    """``write`` into a temporary file beside ``path``, then renamed to it: never half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        write(f)
    os.replace(tmp, path)


def built_examples(history: History, catalogue: Catalogue, progress: Any, folder: Path | None,
                   **options: Any) -> Examples:
    """:func:`leap.training.dataset.build_examples_with_progress`, or the rows an earlier run built
    from the same events, row code, catalogue and options, kept in ``folder`` (None: always built).

    For a backtest or a drivers report run again on one history after a change to the model: its
    rows do not change, and building them is minutes of each run. The key digests the events'
    contents (not the archive's file sizes); the newest :data:`EXAMPLES_KEPT` sets are kept.
    """
    if folder is None:
        return build_examples_with_progress(history, catalogue, progress, **options)
    folder = private_dir(folder)
    events = hashlib.sha256(b"".join(_table_digest(t) for t in (history.submissions, history.starts,
                                                                 history.finishes)))
    key = json.dumps({"code": code_digest(), "catalogue": catalogue_digest(catalogue), "events": events.hexdigest(),
                      "options": options}, sort_keys=True, default=repr)
    path = folder / f"examples-{hashlib.sha256(key.encode()).hexdigest()[:16]}.pickle"
    if path.exists():
        if progress is not None:
            progress.print(f"point-in-time rows from {path}")
        os.utime(path)  # the newest used is the last evicted
        with open(path, "rb") as f:
            examples: Examples = pickle.load(f)
        return examples
    examples = build_examples_with_progress(history, catalogue, progress, **options)
    _write(path, _pickled(examples))
    for stale in sorted(folder.glob("examples-*.pickle"), key=lambda p: p.stat().st_mtime)[:-EXAMPLES_KEPT]:
        stale.unlink(missing_ok=True)
    return examples
