"""``bench trees``: the served model's boosters evaluated by each tree compiler, side by side.

Each booster of the model (base, main, selectors) is scored on the very matrices the model hands
it when it predicts rows of a simulated history it was not fitted on (recorded by wrapping the
boosters), by:

- ``lightgbm``: ``Booster.predict`` itself, the reference;
- ``leap_c``: :mod:`predictor.compiled` (C generated from ``dump_model()``, the system compiler);
- ``lleaves``: LLVM through llvmlite (the ``trees`` extra pins the llvmlite it runs with);
- ``tl2cgen``: a treelite model compiled to C by tl2cgen and the system compiler.

Per booster and compiler: compile time from an empty cache, the largest absolute difference from
``Booster.predict`` over all rows, µs per row in one bulk call and µs per call of 24 rows (DESIGN
§9's unit), one thread each. A compiler that refuses a booster (treelite: linear leaves) reports
its error; one that accepts a booster it cannot evaluate shows it in ``max_abs_diff``.
Then the whole model's predict (µs per row, bulk and per 24 rows) with each compiler serving every
booster it evaluates exactly and LightGBM the others.
"""

from __future__ import annotations

import contextlib
import copy
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightgbm as lgb
import numpy as np

from features.rows import Rows
from leap.bench.common import median_call_us, report, say
from leap.bench.model import HISTORY_START
from leap.bench.predict import served_model
from leap.core.hardware import Catalogue, load_catalogue
from leap.fleet.history import simulate, write_history
from leap.training.train import load_examples
from predictor.compiled import CompiledTrees, TreePredictor, trees_for
from predictor.lgbm import LightGBMThroughput

COMPILERS = ("leap_c", "lleaves", "tl2cgen")
#: Rows of one call in serving: DESIGN §9's 24 candidates.
CALL_ROWS = 24
#: Largest difference from ``Booster.predict`` that counts as the same prediction.
EXACT = 1e-9


class _Recorder:
    """Stands in for a booster and keeps every matrix the model hands it."""

    def __init__(self, booster: lgb.Booster) -> None:
        self.booster = booster
        self.seen: list[np.ndarray] = []

    def predict(self, data: np.ndarray, *, num_threads: int = 1) -> Any:
        self.seen.append(np.array(data, dtype=np.float64))
        return self.booster.predict(data, num_threads=num_threads)


def booster_inputs(model: LightGBMThroughput, rows: Rows) -> dict[str, np.ndarray]:
    """Every matrix each of the model's boosters is handed when the model predicts ``rows``."""
    recording = copy.copy(model)
    recorders = {name: _Recorder(b) for name, b in model._boosters().items() if b is not None}
    recording.trees_ = dict(recorders)
    recording.predict(rows)
    return {name: np.concatenate(r.seen) for name, r in recorders.items() if r.seen}


class _Lleaves:
    """An lleaves model behind :class:`TreePredictor`'s signature (one thread)."""

    def __init__(self, booster: lgb.Booster, folder: Path) -> None:
        import lleaves

        text = folder / "model.txt"
        booster.save_model(str(text))
        self.model = lleaves.Model(model_file=str(text))
        self.model.compile(cache=str(folder / "model.o"))

    def predict(self, data: np.ndarray, *, num_threads: int = 1) -> np.ndarray:
        return np.asarray(self.model.predict(data, n_jobs=1))


class _Tl2cgen:
    """A treelite model compiled by tl2cgen behind :class:`TreePredictor`'s signature (one thread)."""

    def __init__(self, booster: lgb.Booster, folder: Path) -> None:
        import tl2cgen
        import treelite

        self.tl2cgen = tl2cgen
        model = treelite.frontend.from_lightgbm(booster)
        library = folder / "model.so"
        tl2cgen.export_lib(model, toolchain="gcc", libpath=str(library), params={"parallel_comp": 2})
        self.predictor = tl2cgen.Predictor(str(library), nthread=1)

    def predict(self, data: np.ndarray, *, num_threads: int = 1) -> np.ndarray:
        matrix = self.tl2cgen.DMatrix(np.ascontiguousarray(data, dtype=np.float64), dtype="float64")
        return np.asarray(self.predictor.predict(matrix)).reshape(len(data))


def _leap_c(booster: lgb.Booster, folder: Path) -> TreePredictor:
    trees = trees_for(booster, folder)
    if not isinstance(trees, CompiledTrees):
        raise RuntimeError("predictor.compiled fell back to the booster")
    return trees


BUILDERS: dict[str, Callable[[lgb.Booster, Path], TreePredictor]] = {
    "leap_c": _leap_c, "lleaves": _Lleaves, "tl2cgen": _Tl2cgen}


def speed(trees: TreePredictor, x: np.ndarray, repeat: int, calls: int) -> dict[str, float]:
    """µs per row in one bulk call (median of ``repeat``) and per call of :data:`CALL_ROWS` rows."""
    small = np.ascontiguousarray(x[:CALL_ROWS])
    bulk = median_call_us(lambda: trees.predict(x, num_threads=1), repeat)
    return {"bulk_us_per_row": bulk / len(x),
            "call_24_rows_us": median_call_us(lambda: trees.predict(small, num_threads=1), calls)}


def measure_booster(name: str, booster: lgb.Booster, x: np.ndarray, folder: Path, repeat: int, calls: int
                    ) -> tuple[dict[str, Any], dict[str, TreePredictor]]:
    """Each compiler's figures on one booster, and the compiled boosters that predict it exactly."""
    reference = booster.predict(x, num_threads=1)
    out: dict[str, Any] = {"rows": len(x), "trees": booster.num_trees(),
                           "linear_leaves": "is_linear=1" in booster.model_to_string(num_iteration=1),
                           "lightgbm": speed(booster, x, repeat, calls)}
    exact: dict[str, TreePredictor] = {}
    for compiler in COMPILERS:
        say(f"{name}: compiling with {compiler}")
        where = folder / f"{name}-{compiler}"
        where.mkdir(mode=0o700)
        try:
            t0 = time.perf_counter()
            trees = BUILDERS[compiler](booster, where)
            compile_s = time.perf_counter() - t0
        except Exception as exc:  # a refusal is a finding to report, whatever its type
            out[compiler] = {"error": f"{type(exc).__name__}: {str(exc)[-160:]}"}
            continue
        diff = float(np.max(np.abs(np.asarray(trees.predict(x, num_threads=1)) - reference), initial=0.0))
        out[compiler] = {"compile_s": compile_s, "max_abs_diff": diff, **speed(trees, x, repeat, calls)}
        if diff <= EXACT:
            exact[compiler] = trees
    return out, exact


def measure_model(model: LightGBMThroughput, rows: Rows, exact: dict[str, dict[str, TreePredictor]],
                  repeat: int, calls: int) -> dict[str, Any]:
    """The whole model's predict with each compiler on the boosters it evaluates exactly."""
    small = {c: v[:CALL_ROWS] for c, v in rows.items()}
    n = len(rows["hardware"])
    out: dict[str, Any] = {}
    for compiler in ("lightgbm", *COMPILERS):
        served = copy.copy(model)
        served.trees_ = {b: trees[compiler] for b, trees in exact.items() if compiler in trees}
        bulk = median_call_us(lambda m=served: m.predict(rows), repeat)  # type: ignore[misc]
        out[compiler] = {"compiled_boosters": sorted(served.trees_), "bulk_us_per_row": bulk / n,
                         "call_24_rows_us": median_call_us(lambda m=served: m.predict(small), calls)}  # type: ignore[misc]
    return out


def fresh_rows(catalogue: Catalogue, days: int, per_day: int, seed: int) -> Rows:
    """Rows of a simulated history the model was not fitted on: the attempts' own rows and every
    candidate's rows of the sampled submissions (what a predictor scores)."""
    with tempfile.TemporaryDirectory(prefix="leap-bench-trees-") as tmp:
        write_history(simulate(seed, days, per_day, start=HISTORY_START), Path(tmp))
        _, ex, _, _ = load_examples(Path(tmp), catalogue, None, window_days=days)
    parts = [ex.rows, *(r for _, r in ex.full.values())]
    return {c: np.concatenate([p[c] for p in parts]) for c in ex.rows}


def bench_trees(history: tuple[int, int], seed: int = 0, model_dir: Path | None = None, rows_days: int = 2,
                repeat: int = 5, calls: int = 300) -> dict[str, Any]:
    """Run the tree-compiler benchmark and return its JSON report.

    Parameters
    ----------
    history, seed, model_dir
        The served model as ``bench predict`` fits it (days x attempts per day, simulator seed),
        or loaded from a saved artifact folder.
    rows_days
        Days of a history of seed ``seed + 1`` whose rows are scored.
    repeat, calls
        Bulk calls per figure (median), 24-row calls per figure (median).
    """
    began = time.perf_counter()
    catalogue = load_catalogue()
    model, model_info = served_model(catalogue, *history, seed, None, model_dir, None)
    rows = fresh_rows(catalogue, rows_days, history[1], seed + 1)
    inputs = booster_inputs(model, rows)
    boosters = {name: b for name, b in model._boosters().items() if b is not None and name in inputs}
    figures: dict[str, Any] = {}
    exact: dict[str, dict[str, TreePredictor]] = {}
    with tempfile.TemporaryDirectory(prefix="leap-bench-trees-cache-") as tmp:
        for name, booster in boosters.items():
            figures[name], exact[name] = measure_booster(name, booster, inputs[name], Path(tmp), repeat, calls)
        figures["model"] = measure_model(model, rows, exact, repeat, calls)
    flat = {f"{b}_{c}_{k}": v for b, per in figures.items() for c, f in per.items() if isinstance(f, dict)
            for k, v in f.items() if isinstance(v, float)}
    params = {"model": model_info, "rows": len(rows["hardware"]), "rows_days": rows_days, "seed": seed,
              "versions": versions()}
    return report("trees", params, [flat], extra={"by_booster": figures}, started=began)


def versions() -> dict[str, str]:
    """Versions of the compilers' packages (absent: not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for package in ("lightgbm", "lleaves", "llvmlite", "treelite", "tl2cgen"):
        with contextlib.suppress(PackageNotFoundError):
            out[package] = version(package)
    return out
