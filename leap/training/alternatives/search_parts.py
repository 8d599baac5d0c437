"""A table search split into parts: run side by side in worker processes, each saved as it ends.

A tuned contest fits every draw of every family on every table under both protocols; where the
served model's draws are real fits, one table alone is hours of one core. Each model is made from
its setting and the seed alone and scored on folds that depend only on the table and the seed,
so a table's models split into parts give the figures of one run with the same threads per fit
(:func:`join_parts` puts them back together, model by model, in the order they were asked;
LightGBM's figures move with its thread count, which the caller fixes). Parts run in ``spawn`` processes
(a forked LightGBM or BLAS may hold a lock another thread took), and with ``parts_dir`` each part
is written as it ends, named by a digest of the table's bytes, the seed and the part's models and
settings, so that a run stopped halfway resumes where it stopped. A saved part is reused only by a
run of the same code: the digest does not cover the code.
"""

from __future__ import annotations

import copy
import hashlib
import math
import multiprocessing
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import orjson

#: One model of a search: its reported name, its family (None: a registered model without knobs,
#: made by :func:`leap.training.alternatives.tables.table_factories`) and its setting.
Spec = tuple[str, str | None, dict[str, Any]]
#: Makes a family's model from ``(family, setting, seed)``.
Maker = Callable[[str, dict[str, Any], int], Any]

#: Relative cost of one fit by family, from the fit times of a 20-draw search of the MLPerf table
#: (the served model's out-of-fold calibration fits dominate); other models count as cheap.
COST = {"lightgbm": 100.0, "lightgbm_plain": 5.0, "random_forest": 1.0, "pairwise_lightgbm": 1.0, "mlp": 0.5}
CHEAP = 0.05
#: A saved part costs about one fit of the served model at most, so that a stopped run loses
#: little; each part rebuilds the table's folds, which costs far less than such a fit.
PART_COST = COST["lightgbm"]


def cost(specs: Sequence[Spec]) -> float:
    """The relative cost of fitting ``specs`` (:data:`COST`)."""
    return sum(COST.get(family or "", CHEAP) for _, family, _ in specs)


def split(specs: Sequence[Spec], parts: int) -> list[list[Spec]]:
    """``specs`` in at most ``parts`` parts of about equal cost: costliest first, each to the
    lightest part so far (no empty part)."""
    if parts < 1:
        raise ValueError(f"parts must be at least 1, got {parts}")
    loads = [0.0] * parts
    out: list[list[Spec]] = [[] for _ in range(parts)]
    for spec in sorted(specs, key=lambda s: -COST.get(s[1] or "", CHEAP)):
        i = loads.index(min(loads))
        out[i].append(spec)
        loads[i] += COST.get(spec[1] or "", CHEAP)
    return [part for part in out if part]


def part_path(parts_dir: Path, table: Path, seed: int, specs: Sequence[Spec]) -> Path:
    """Where a part is saved: the table's stem and a digest of its bytes, the seed and the specs."""
    digest = hashlib.sha256(table.read_bytes())
    digest.update(orjson.dumps([seed, [list(s) for s in specs]], option=orjson.OPT_SORT_KEYS))
    return parts_dir / f"{table.stem}-{digest.hexdigest()[:16]}.json"


def evaluate_part(table: Path, seed: int, specs: Sequence[Spec], make: Maker, save: Path | None) -> dict[str, Any]:
    """:func:`leap.training.measurements.protocol.evaluate` of one part's models, written to
    ``save`` (through a temporary file, so a stopped run leaves no half part) when given."""
    from leap.training.alternatives.tables import table_factories
    from leap.training.measurements.protocol import evaluate

    registered = [name for name, family, _ in specs if family is None]
    fixed = table_factories(registered, seed) if registered else {}
    factories = {name: fixed[name] if family is None else _factory(make, family, setting, seed)
                 for name, family, setting in specs}
    return _saved(evaluate(table, seed=seed, factories=factories), save)


def _saved(result: dict[str, Any], save: Path | None) -> dict[str, Any]:
    """``result``, written to ``save`` through a temporary file (a stopped run leaves no half part)."""
    if save is not None:
        from leap.training.measurements.runner import save_whole

        save_whole(save, result)
    return result


def _factory(make: Maker, family: str, setting: dict[str, Any], seed: int) -> Callable[[], Any]:
    return lambda: make(family, setting, seed)


def join_parts(parts: Sequence[dict[str, Any]], order: Sequence[str]) -> dict[str, Any]:
    """One table's result from its parts' :func:`evaluate_part` results, joined as
    ``leap alternatives-report`` joins results of other models on the same folds
    (:func:`leap.training.alternatives.report.merge_table`: the folds must agree; seconds are
    summed over the parts, not wall time), every model's scores in ``order``."""
    from leap.training.alternatives.report import merge_table

    out = copy.deepcopy(parts[0])
    for part in parts[1:]:
        merge_table(Path(out["file"]).stem, out, part)
    for protocol, block in out["protocols"].items():
        missing = [name for name in order if name not in block["models"]]
        if missing:
            raise ValueError(f"no part scored {', '.join(missing)} under {protocol}")
        block["models"] = {name: block["models"][name] for name in order}
    return {**out, "models": list(order)}


def evaluate_in_parts(jobs: Sequence[tuple[Path, Sequence[Spec]]], seed: int, make: Maker, workers: int = 1,
                      parts_dir: Path | None = None, progress: Any = None) -> dict[str, dict[str, Any]]:
    """Every table's models, ``{table stem: result}``, run by ``workers`` processes at once (1: in
    this process), in parts of at most about :data:`PART_COST` (one part per table in this process
    when nothing is saved); parts found saved in ``parts_dir`` are read, not run."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if parts_dir is not None:
        parts_dir.mkdir(parents=True, exist_ok=True)

    def parts_of(specs: Sequence[Spec]) -> int:  # one part in this process, else parts worth saving
        return 1 if workers == 1 and parts_dir is None else max(workers, math.ceil(cost(specs) / PART_COST))

    planned = [(table, part, None if parts_dir is None else part_path(parts_dir, table, seed, part))
               for table, specs in jobs for part in split(specs, parts_of(specs))]
    done: dict[int, dict[str, Any]] = {}
    for i, (table, part, save) in enumerate(planned):
        if save is not None and save.is_file():
            done[i] = orjson.loads(save.read_bytes())
            _say(progress, f"{table.name}: {len(part)} models read from {save}")
    todo = [i for i in range(len(planned)) if i not in done]
    if len(planned) > len(jobs):
        _say(progress, f"{len(planned)} parts, {len(todo)} to run by {workers} process(es) ...")
    t0 = time.perf_counter()
    if workers == 1:
        for i in todo:
            done[i] = evaluate_part(planned[i][0], seed, planned[i][1], make, planned[i][2])
    else:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures: dict[Future[dict[str, Any]], int] = {
                pool.submit(evaluate_part, planned[i][0], seed, planned[i][1], make, planned[i][2]): i for i in todo}
            for future in as_completed(futures):
                i = futures[future]
                done[i] = future.result()
                _say(progress, f"{planned[i][0].name}: part of {len(planned[i][1])} models done "
                               f"({len(done)} of {len(planned)} parts, {time.perf_counter() - t0:.0f} s)")
    return {table.stem: join_parts([done[i] for i, p in enumerate(planned) if p[0] == table],
                                   [name for name, _, _ in specs]) for table, specs in jobs}


def _say(progress: Any, line: str) -> None:
    if progress is not None:
        progress.print(line)


# The simulator's search: the same parts, each a backtest of the same nights (one set of rows,
# built once and handed to the parts in a file).

#: ``(days, window_days, pick_sample)`` of a simulator backtest.
Nights = tuple[int, int, int]


def night_part_path(parts_dir: Path, data_hash: str, nights: Nights, seed: int, specs: Sequence[Spec]) -> Path:
    """Where a simulator part is saved: a digest of the history's data hash, the nights, the seed
    and the specs."""
    key = orjson.dumps([data_hash, list(nights), seed, [list(s) for s in specs]], option=orjson.OPT_SORT_KEYS)
    return parts_dir / f"history-{hashlib.sha256(key).hexdigest()[:16]}.json"


def backtest_part(history_dir: Path, examples: Path | None, specs: Sequence[Spec], make: Maker, nights: Nights,
                  seed: int, save: Path | None) -> dict[str, Any]:
    """:func:`leap.training.alternatives.simulated.backtest_alternatives` of one part's models on
    the rows pickled in ``examples`` (None: built here), written to ``save`` when given."""
    import pickle

    from leap.training.alternatives.simulated import backtest_alternatives

    built = pickle.loads(examples.read_bytes()) if examples is not None else None
    factories = {name: _seeded(make, family or "", setting) for name, family, setting in specs}
    days, window_days, pick_sample = nights
    return _saved(backtest_alternatives(history_dir, factories, days=days, window_days=window_days, seed=seed,
                                        examples=built, pick_sample=pick_sample), save)


def _seeded(make: Maker, family: str, setting: dict[str, Any]) -> Callable[[int], Any]:
    def factory(seed: int = 0) -> Any:
        return make(family, setting, seed)

    return factory


def join_nights(parts: Sequence[dict[str, Any]], order: Sequence[str]) -> dict[str, Any]:
    """One backtest from its parts' results (the same nights: :func:`leap.training.alternatives.report.merge_simulator`
    checks), every model's figures in ``order``."""
    from leap.training.alternatives.report import merge_simulator

    out = copy.deepcopy(parts[0])
    for part in parts[1:]:
        merge_simulator(out, part)
    missing = [name for name in order if name not in out["mean"]]
    if missing:
        raise ValueError(f"no part scored {', '.join(missing)}")
    out["mean"] = {name: out["mean"][name] for name in order}
    return {**out, "models": list(order)}


def backtest_in_parts(history_dir: Path, specs: Sequence[Spec], make: Maker, nights: Nights, seed: int,
                      workers: int = 1, parts_dir: Path | None = None, progress: Any = None) -> dict[str, Any]:
    """Every model of ``specs`` on the same nights of a simulated history, as one backtest, run by
    ``workers`` processes in parts of at most about :data:`PART_COST`; parts found saved in
    ``parts_dir`` are read, not run, and the rows are built once, only if a part is left to run."""
    import pickle
    import tempfile

    from leap.core.hardware import load_catalogue
    from leap.training.backtest import history_examples
    from leap.training.dataset import read_history

    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if workers == 1 and parts_dir is None:
        return backtest_part(history_dir, None, specs, make, nights, seed, None)
    count = max(workers, math.ceil(cost(specs) / PART_COST))
    planned = split(specs, count)
    saves: list[Path | None] = [None] * len(planned)
    done: dict[int, dict[str, Any]] = {}
    if parts_dir is not None:
        parts_dir.mkdir(parents=True, exist_ok=True)
        data_hash = read_history(history_dir).digest
        saves = [night_part_path(parts_dir, data_hash, nights, seed, part) for part in planned]
        done = {i: orjson.loads(s.read_bytes()) for i, s in enumerate(saves) if s is not None and s.is_file()}
    todo = [i for i in range(len(planned)) if i not in done]
    _say(progress, f"{history_dir}: {len(planned)} parts, {len(done)} read, {len(todo)} to run by {workers} "
                   "process(es)")
    if todo:
        history, ex, _ = history_examples(history_dir, nights[0], load_catalogue(), progress, full_per_day=nights[2])
        with tempfile.TemporaryDirectory(dir=parts_dir) as tmp:
            rows = Path(tmp) / "examples.pickle"
            rows.write_bytes(pickle.dumps((history, ex), protocol=pickle.HIGHEST_PROTOCOL))
            del history, ex
            t0 = time.perf_counter()
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
                futures = {pool.submit(backtest_part, history_dir, rows, planned[i], make, nights, seed, saves[i]): i
                           for i in todo}
                for future in as_completed(futures):
                    done[futures[future]] = future.result()
                    _say(progress, f"{history_dir}: part of {len(planned[futures[future]])} models done "
                                   f"({len(done)} of {len(planned)} parts, {time.perf_counter() - t0:.0f} s)")
    return join_nights([done[i] for i in range(len(planned))], [name for name, _, _ in specs])
