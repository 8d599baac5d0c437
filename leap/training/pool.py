"""Worker processes that fit models side by side (``leap drivers``, ``leap backtest --jobs``).

A fit is mostly single-threaded Python and numpy around LightGBM, so on a small machine two
one-thread fits in two processes finish sooner than one fit with two threads. Each worker
receives the shared data once (its initializer), not with every task.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any


def spawn_pool(jobs: int, initializer: Callable[..., None], *initargs: Any) -> ProcessPoolExecutor:
    """``jobs`` worker processes, each running ``initializer(*initargs)`` once before its first task.

    Spawned, not forked: a forked child can hang in OpenMP if the parent already ran LightGBM.
    Each worker ends itself once the process that started it is gone: a SIGTERM to ``leap
    drivers`` otherwise left both fitters running, orphaned, for over an hour (measured).
    ``initializer`` must be picklable (a module-level function).
    """
    return ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_start, initargs=(os.getpid(), initializer, initargs))


def _start(parent: int, initializer: Callable[..., None], initargs: tuple[Any, ...]) -> None:
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    initializer(*initargs)


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(2.0)
    os._exit(1)
