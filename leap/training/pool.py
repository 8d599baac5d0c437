"""Tasks that share one large read-only input, run here or in worker processes side by side
(``leap drivers``, ``leap backtest --jobs``).

A fit is mostly single-threaded Python and numpy around LightGBM, so on a small machine two
one-thread fits in two processes finish sooner than one fit with two threads. The data the
tasks share is pickled once into a private temporary file that each worker loads when it
starts: handed to every worker as its initializer's arguments instead, it is pickled again in
memory for each one, which for a large backtest's rows costs minutes and gigabytes a worker.
A task reads that data with :func:`shared`, wherever it runs.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

R = TypeVar("R")

#: The shared data of the tasks running in this process (:func:`shared`); None outside them.
_SHARED: tuple[Any, ...] | None = None


def shared() -> tuple[Any, ...]:
    """The ``shared`` tuple :func:`run_shared` was given, inside one of its tasks."""
    if _SHARED is None:
        raise RuntimeError("no shared data: call this from a task run by run_shared")
    return _SHARED


def run_shared(task: Callable[..., R], args: Sequence[tuple[Any, ...]], shared: tuple[Any, ...], jobs: int = 1,
               in_order: bool = True) -> Iterator[tuple[int, R]]:
    """``(i, task(*args[i]))`` for every ``i``, each task reading ``shared`` through :func:`shared`.

    With ``jobs`` <= 1 the tasks run here, one after the other; otherwise in ``jobs`` spawned
    worker processes (:func:`spawn_pool`), yielding in the order of ``args`` or, with
    ``in_order`` False, as they finish. ``task`` must then be picklable (a module-level function).
    """
    global _SHARED
    if not args:
        return
    if jobs <= 1:
        _SHARED = shared
        try:
            for i, a in enumerate(args):
                yield i, task(*a)
        finally:
            _SHARED = None
        return
    with spawn_pool(min(jobs, len(args)), *shared) as pool:
        futures: dict[Future[R], int] = {pool.submit(task, *a): i for i, a in enumerate(args)}
        for future in (futures if in_order else as_completed(futures)):
            yield futures[future], future.result()


@contextmanager
def spawn_pool(jobs: int, *shared: Any) -> Iterator[ProcessPoolExecutor]:
    """``jobs`` worker processes, in each of which :func:`shared` returns ``shared``.

    Spawned, not forked: a forked child can hang in OpenMP if the parent already ran LightGBM.
    Each worker ends itself once the process that started it is gone: a SIGTERM to ``leap
    drivers`` otherwise left both fitters running, orphaned, for over an hour (measured).
    ``shared`` is written to a folder only this user can read (``tempfile.mkdtemp``), removed
    when the pool is shut down.
    """
    with tempfile.TemporaryDirectory(prefix="leap-pool-") as folder:
        path = Path(folder) / "shared.pickle"
        with open(path, "wb") as f:
            pickle.dump(shared, f, protocol=pickle.HIGHEST_PROTOCOL)
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_start,
                                 initargs=(os.getpid(), str(path))) as pool:
            yield pool


def _start(parent: int, path: str) -> None:
    global _SHARED
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    with open(path, "rb") as f:
        _SHARED = pickle.load(f)


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(2.0)
    os._exit(1)
