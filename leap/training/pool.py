"""Worker processes that fit models side by side (``leap drivers``, ``leap backtest --jobs``).

A fit is mostly single-threaded Python and numpy around LightGBM, so on a small machine two
one-thread fits in two processes finish sooner than one fit with two threads. The data the
workers share is pickled once into a private temporary file that each worker loads when it
starts: handed to every worker as its initializer's arguments instead, it is pickled again in
memory for each one, which for a large backtest's rows costs minutes and gigabytes a worker.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def spawn_pool(jobs: int, initializer: Callable[..., None], *shared: Any) -> Iterator[ProcessPoolExecutor]:
    """``jobs`` worker processes, each running ``initializer(*shared)`` once before its first task.

    Spawned, not forked: a forked child can hang in OpenMP if the parent already ran LightGBM.
    Each worker ends itself once the process that started it is gone: a SIGTERM to ``leap
    drivers`` otherwise left both fitters running, orphaned, for over an hour (measured).
    ``initializer`` must be picklable (a module-level function); ``shared`` is written to a
    folder only this user can read (``tempfile.mkdtemp``), removed when the pool is shut down.
    """
    with tempfile.TemporaryDirectory(prefix="leap-pool-") as folder:
        path = Path(folder) / "shared.pickle"
        with open(path, "wb") as f:
            pickle.dump(shared, f, protocol=pickle.HIGHEST_PROTOCOL)
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_start,
                                 initargs=(os.getpid(), initializer, str(path))) as pool:
            yield pool


def _start(parent: int, initializer: Callable[..., None], path: str) -> None:
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    with open(path, "rb") as f:
        initializer(*pickle.load(f))


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(2.0)
    os._exit(1)
