"""Every alternative on the public measurement tables, through the measurement fold runner.

:mod:`leap.training.measurements` converts a table to history and runs models given as ``name ->
factory`` on identical rows and folds under both protocols
(:func:`leap.training.measurements.protocol.evaluate`); its registry holds the models of
:data:`leap.training.alternatives.ALTERNATIVES` too, so ``leap evaluate-measurements --models all``
scores them as well, and both commands report the same ``lightgbm``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from leap.training.measurements.estimators import ModelFactory, resolve_models
from leap.training.measurements.protocol import evaluate

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
                    checkpoint: Path | None = None) -> dict[str, dict[str, Any]]:
    """Every model on every table under both protocols: ``{table stem: evaluate(...)}``; with
    ``checkpoint``, each model's predictions of each fold kept there as it ends (a stopped run
    resumes: :func:`leap.training.measurements.runner.run_protocol`).

    Raises
    ------
    leap.training.measurements.MeasurementError
        A missing or invalid table.
    """
    factories = table_factories(names, seed)
    out = {}
    for path in paths:
        if progress is not None:
            progress.print(f"{path.name}: {len(factories)} models under both protocols ...")
        out[path.stem] = evaluate(path, seed=seed, factories=factories, checkpoint=checkpoint)
    return out
