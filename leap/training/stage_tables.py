"""The drivers report's stage ablation on measurement tables.

:mod:`leap.training.drivers` scores each remove-one variant of the served model by nightly retrains on a
simulated history; this module scores the same variants on real measurement tables under both
protocols of :mod:`leap.training.measurements` (``config_fold`` and ``leave_one_workload_out``), on the
primary figure (acc@10 of rows whose job ran elsewhere before).

A design choice is made on the tuning data only: simulator seeds and, for the tables, a rotation —
a choice is made on two tables and checked on the third (:func:`rotation`). ``leave_one_workload_out``
folds hold one workload out each and do not move with the fold seed, so several seeds only repeat
the model's own randomness there; the seeds vary ``config_fold``'s folds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from leap.core.hardware import Catalogue, load_catalogue
from leap.training.drivers import VARIANTS, Variant
from leap.training.measurements.estimators import ModelFactory
from leap.training.measurements.pairs import PROTOCOLS
from leap.training.measurements.protocol import evaluate
from predictor.lgbm import LightGBMThroughput
from predictor.models import BASELINES

#: Variant groups that change the model on a table (a table has no days, so no window or cadence).
TABLE_GROUPS = ("default", "features", "size", "stage", "baseline")


def table_variants(keys: Sequence[str] | None = None) -> list[Variant]:
    """The :data:`leap.training.drivers.VARIANTS` that apply to a table, ``default`` first."""
    chosen = [v for v in VARIANTS if v.group in TABLE_GROUPS and (keys is None or v.key in keys or v.key == "default")]
    unknown = set(keys or ()) - {v.key for v in chosen}
    if unknown:
        raise ValueError(f"variants that do not apply to a table or are unknown: {sorted(unknown)}")
    return chosen


def _factory(v: Variant, seed: int) -> ModelFactory:
    if v.baseline is not None:
        return BASELINES[v.baseline]
    # One LightGBM thread: on a shared machine OpenMP threads that wait for each other cost more than
    # they gain (leap/training/drivers.py), and LightGBM trains the same model with any thread count.
    params = {"seed": seed, "num_threads": 1, **dict(v.params)}
    return lambda: LightGBMThroughput(**params)


def table_drivers(
    tables: Sequence[Path],
    variants: Sequence[str] | None = None,
    seeds: Sequence[int] = (0, 2),
    catalogue: Catalogue | None = None,
    progress: Any = None,
) -> dict[str, Any]:
    """acc@10 (primary rows) of every variant on every table, protocol and seed.

    Returns
    -------
    dict
        ``{"seeds", "variants": [key...], "cells": [{"table", "protocol", "seed", "rows",
        "acc": {variant: acc@10}}], "seconds"}``.
    """
    t0 = time.perf_counter()
    catalogue = catalogue or load_catalogue()
    chosen = table_variants(variants)
    cells = []
    for path in tables:
        for seed in seeds:
            factories = {v.key: _factory(v, seed) for v in chosen}
            result = evaluate(path, seed=seed, factories=factories, catalogue=catalogue)
            for protocol in PROTOCOLS:
                scores = result["protocols"][protocol]["models"]
                cells.append({"table": Path(path).stem, "protocol": protocol, "seed": seed,
                              "rows": result["protocols"][protocol]["rows"],
                              "acc": {k: float(s["acc@10"]) for k, s in scores.items()}})
                if progress is not None:
                    progress.print(f"{Path(path).stem} {protocol} seed {seed}: " + " ".join(
                        f"{k}={s['acc@10']:.3f}" for k, s in scores.items()))
    return {"seeds": list(seeds), "variants": [v.key for v in chosen], "cells": cells,
            "seconds": round(time.perf_counter() - t0, 1)}


def cell_deltas(result: dict[str, Any]) -> dict[tuple[str, str], dict[str, float]]:
    """Per (table, protocol): each variant's acc@10 minus the default's, averaged over seeds."""
    out: dict[tuple[str, str], dict[str, list[float]]] = {}
    for cell in result["cells"]:
        base = cell["acc"]["default"]
        bucket = out.setdefault((cell["table"], cell["protocol"]), {})
        for key, acc in cell["acc"].items():
            bucket.setdefault(key, []).append(acc - base)
    return {cell: {k: float(np.mean(v)) for k, v in d.items()} for cell, d in out.items()}


def rotation(result: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """For each table held out: ``key``'s mean change on the other tables' cells (where the choice
    is made) and on the held-out table's cells (where it is checked)."""
    deltas = cell_deltas(result)
    names = sorted({t for t, _ in deltas})
    out = []
    for held in names:
        chose = [d[key] for (t, _), d in deltas.items() if t != held and key in d]
        check = [d[key] for (t, _), d in deltas.items() if t == held and key in d]
        out.append({"held_out": held, "choose_delta": float(np.mean(chose)) if chose else float("nan"),
                    "check_delta": float(np.mean(check)) if check else float("nan")})
    return out
