"""The report of one measurement table: convert it to history, run every protocol, say what was done."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from leap.core.hardware import Catalogue, load_catalogue
from leap.training.measurements.estimators import (
    DEFAULT_MODELS,
    ModelFactory,
    resolve_models,
)
from leap.training.measurements.history import TableHistory, to_history
from leap.training.measurements.pairs import PROTOCOLS, job_ids
from leap.training.measurements.runner import PRIMARY, run_protocol
from leap.training.measurements.table import MeasurementError, Table, load_table
from predictor.boosting import LARGE_SIZE, SMALL_ROWS, SMALL_SIZE


def load_history(csv_path: Path | str, seed: int = 0, catalogue: Catalogue | None = None
                 ) -> tuple[Table, TableHistory]:
    """Read a measurement CSV and convert it (:func:`leap.training.measurements.history.to_history`).

    Raises
    ------
    MeasurementError
        If the file is missing or invalid, or no configuration was measured on two hardware
        types (nothing would test carrying a job's throughput across hardware).
    """
    path = Path(csv_path)
    t = load_table(path)
    cfg = job_ids(t)
    hardware_per_config: dict[int, set[str]] = {}
    for c, h in zip(cfg.tolist(), t.hardware, strict=True):
        hardware_per_config.setdefault(c, set()).add(h)
    if max(len(hs) for hs in hardware_per_config.values()) < 2:
        raise MeasurementError(f"{path}: no configuration is measured on two hardware types; nothing to pair")
    return t, to_history(t, catalogue or load_catalogue(), seed=seed, name=path.stem)


def evaluate(
    csv_path: Path | str,
    seed: int = 0,
    models: Sequence[str] | str = DEFAULT_MODELS,
    catalogue: Catalogue | None = None,
    factories: Mapping[str, ModelFactory] | None = None,
    protocols: Sequence[str] = PROTOCOLS,
    checkpoint: Path | None = None,
) -> dict[str, Any]:
    """Evaluate models on a measurement table under both protocols.

    Parameters
    ----------
    csv_path
        Measurement CSV (see :mod:`leap.training.measurements`).
    seed
        Seed of the configuration folds, of the attempts' order and of the models.
    models
        Registered model names (:data:`leap.training.measurements.estimators.REGISTRY`), a list or
        a comma-separated string; ``all`` for every one.
    catalogue
        Hardware catalogue (specs, canonical names, prices); default :func:`leap.core.hardware.load_catalogue`.
    factories
        ``name -> factory`` to run instead of ``models`` (models that are not registered).
    protocols, checkpoint
        Which protocols to run; a folder keeping each model's fold predictions as they end, so that
        a stopped run resumes (:func:`leap.training.measurements.runner.run_protocol`).

    Returns
    -------
    dict
        ``{"file", "rows", "jobs", "seed", "models", "primary", "served_params", "conversion",
        "protocols": {protocol: {"folds", "rows", "seconds", "models": {model: scores}}},
        "seconds"}``; the scores are :func:`leap.training.measurements.runner.score_model`'s.

    Raises
    ------
    MeasurementError
        If the file is missing or invalid, or no configuration was measured on two hardware types.
    ValueError
        An unknown model or protocol name.
    """
    t0 = time.perf_counter()
    unknown = [p for p in protocols if p not in PROTOCOLS]
    if unknown:
        raise ValueError(f"unknown protocol(s) {', '.join(unknown)}; known: {', '.join(PROTOCOLS)}")
    chosen = dict(factories) if factories is not None else resolve_models(models, seed)
    catalogue = catalogue or load_catalogue()
    t, th = load_history(csv_path, seed, catalogue)
    return {
        "file": str(csv_path), "rows": len(t), "jobs": th.notes["jobs"], "seed": seed, "models": list(chosen),
        "primary": f"rows of evidence {PRIMARY!r}: the job ran on other hardware before, not on this one",
        "served_params": {"below_training_rows": SMALL_ROWS, "small": SMALL_SIZE, "else": LARGE_SIZE,
                          "given": "a size knob set applies at any size"},
        "conversion": th.notes,
        "protocols": {p: run_protocol(th, t, p, chosen, catalogue, seed, checkpoint) for p in protocols},
        "seconds": round(time.perf_counter() - t0, 2),
    }
