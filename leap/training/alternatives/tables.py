"""Every alternative on the public measurement tables, through the measurement fold runner.

:mod:`leap.training.measurements` converts a table to history and runs models given as ``name ->
factory`` on identical rows and folds under both protocols
(:func:`leap.training.measurements.protocol.evaluate`); its registry holds the models of
:data:`leap.training.alternatives.ALTERNATIVES` too, so ``leap evaluate-measurements --models all``
scores them as well, and both commands report the same ``lightgbm``.
"""

from __future__ import annotations

import multiprocessing
import tempfile
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from leap.training.measurements.estimators import ModelFactory, resolve_models
from leap.training.measurements.pairs import PROTOCOLS
from leap.training.measurements.protocol import evaluate, load_history

#: The public tables, in report order (a table not there yet is skipped by :func:`default_tables`).
TABLE_NAMES = ("gavel.csv", "lambda.csv", "mlperf.csv")
TABLE_DIR = Path(__file__).resolve().parents[3] / "data" / "measurements"


def default_tables() -> list[Path]:
    """The public tables of ``data/measurements`` that exist."""
    return [TABLE_DIR / name for name in TABLE_NAMES if (TABLE_DIR / name).is_file()]


def table_factories(names: Sequence[str], seed: int) -> dict[str, ModelFactory]:
    """``name -> factory`` for the fold runner, from its registry (which holds the alternatives)."""
    return dict(resolve_models(list(names), seed))


def evaluate_tables(paths: Sequence[Path], names: Sequence[str], seed: int = 0, progress: Any = None,
                    checkpoint: Path | None = None, workers: int = 1) -> dict[str, dict[str, Any]]:
    """Every model on every table under both protocols: ``{table stem: evaluate(...)}``; with
    ``checkpoint``, each model's predictions of each fold kept there as it ends (a stopped run
    resumes: :func:`leap.training.measurements.runner.run_protocol`). With ``workers`` above 1 the
    folds are fitted first by that many processes (:func:`fill_checkpoint`), into ``checkpoint`` or,
    without one, a temporary folder.

    Raises
    ------
    leap.training.measurements.MeasurementError
        A missing or invalid table.
    """
    if workers > 1 and checkpoint is None:
        with tempfile.TemporaryDirectory(prefix="leap-folds-") as scratch:
            return evaluate_tables(paths, names, seed, progress, Path(scratch), workers)
    factories = table_factories(names, seed)
    if workers > 1 and checkpoint is not None:
        fill_checkpoint(paths, names, seed, checkpoint, workers, progress)
    out = {}
    for path in paths:
        if progress is not None:
            progress.print(f"{path.name}: {len(factories)} models under both protocols ...")
        out[path.stem] = evaluate(path, seed=seed, factories=factories, checkpoint=checkpoint)
    return out


def fill_checkpoint(paths: Sequence[Path], names: Sequence[str], seed: int, checkpoint: Path, workers: int,
                    progress: Any = None) -> None:
    """Fit every fold of every (table, model, protocol) into ``checkpoint``, ``workers`` at a time.

    A job is one model under one protocol on one table, run in a ``spawn`` process (a forked
    LightGBM or BLAS may hold a lock another thread took) through the same fold runner and
    factories as the run that reads the folds back, so the folds it keeps are the ones that run
    would have fitted. Jobs start in the order of ``names``: list the costliest model first (a
    language model's fine-tune is hours of a table of thousands of rows; each protocol is a job of
    its own, so two processes share one model's folds). Fits take their usual threads: run with
    ``OMP_NUM_THREADS=1`` so that two LightGBM processes do not spin on two cores.
    """
    for path in paths:  # a bad table is said now, not after hours of the good ones' fits
        load_history(path, seed)
    jobs = [(path, name, protocol) for path in paths for name in names for protocol in PROTOCOLS]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_fill, path, name, protocol, seed, checkpoint): (path, name, protocol)
                   for path, name, protocol in jobs}
        try:
            for future in as_completed(futures):
                future.result()
                path, name, protocol = futures[future]
                if progress is not None:
                    progress.print(f"{path.name}: {name} under {protocol}: every fold kept in {checkpoint}")
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)  # the jobs not started yet never start
            raise


def _fill(path: Path, name: str, protocol: str, seed: int, checkpoint: Path) -> None:
    evaluate(path, seed=seed, factories=table_factories([name], seed), protocols=(protocol,), checkpoint=checkpoint)
