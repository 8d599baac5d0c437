"""One search routine for every model family: the same number of settings, chosen on tuning data.

Every family that has knobs, the served model included, gets the same budget: ``draws`` settings
(:func:`settings_of`), the first its defaults and the others drawn at random (seeded, without
repeats) from its space in :data:`SPACES`. The spaces hold each family's own knobs and its
**target** where it has a choice (the log correction to the anchor, as the served model learns,
or the log throughput with the anchor as an input): which target a model uses is a setting
chosen like the others.

On the public tables the choice is by **rotation** (:func:`choose_by_rotation`): the setting
reported on a table is the one with the best mean acc@10 (attempts with a prior elsewhere,
:data:`leap.training.measurements.runner.PRIMARY`) over the *other* tables under both protocols. A
table's own figures never choose its settings, and the leave-one-workload-out folds, which do
not move with the fold seed, are never chosen on and reported on at once. Every draw is scored
on every table once (:func:`search_tables`); the report's figures for a table are its chosen
draw's, read from that same run.

The baselines (``lookup``, ``transfer``, ``transfer_paired``) have no knobs and are run once.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from leap.training.alternatives.pairwise import PairwiseLightGBM
from leap.training.alternatives.plain import PlainLightGBM
from leap.training.alternatives.sklearn_models import ForestThroughput, KNNThroughput, MLPThroughput, RidgeThroughput
from predictor.lgbm import LightGBMThroughput
from predictor.models import ThroughputModel

#: Settings per family (the defaults are one of them).
DRAWS = 20
#: family -> knob -> values. Knobs a family's constructor does not take are skipped
#: (:func:`space_of`), so the served model's space follows its own signature.
SPACES: dict[str, dict[str, tuple[Any, ...]]] = {
    "lightgbm": {"num_leaves": (7, 15, 31, 63, 127), "n_estimators": (150, 300, 400, 600, 900),
                 "learning_rate": (0.02, 0.03, 0.05, 0.08, 0.12), "min_child_samples": (3, 5, 10, 20, 30, 50)},
    "ridge": {"alpha": (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0), "by_source": (True, False),
              "trust": (True, False), "target": ("residual", "log")},
    "knn": {"n_neighbors": (2, 3, 5, 10, 20, 40), "by_source": (True, False), "trust": (True, False),
            "target": ("residual", "log")},
    "random_forest": {"n_estimators": (60, 120, 250), "min_samples_leaf": (1, 2, 3, 5, 10),
                      "max_features": (0.2, 0.3, 0.5, 0.7, 1.0), "trust": (True, False),
                      "target": ("residual", "log")},
    "mlp": {"hidden": ((32, 16), (64, 32), (128, 64), (256, 128), (64,), (128, 64, 32)),
            "alpha": (1e-5, 1e-4, 1e-3, 1e-2, 1e-1), "trust": (True, False), "target": ("residual", "log")},
    "lightgbm_plain": {"num_leaves": (7, 15, 31, 63), "n_estimators": (100, 200, 300, 600, 900),
                       "learning_rate": (0.02, 0.05, 0.1), "min_child_samples": (3, 5, 10, 20),
                       "target": ("residual", "anchor", "log")},
    "pairwise_lightgbm": {"num_leaves": (7, 15, 31, 63), "n_estimators": (100, 200, 400, 800),
                          "learning_rate": (0.02, 0.05, 0.1), "min_data_in_leaf": (2, 3, 5, 10, 20),
                          "reference": ("prior", "anchor")},
}
#: family -> its class (called with one setting's knobs and the seed).
CLASSES: dict[str, Callable[..., Any]] = {
    "lightgbm": LightGBMThroughput, "ridge": RidgeThroughput, "knn": KNNThroughput,
    "random_forest": ForestThroughput, "mlp": MLPThroughput, "lightgbm_plain": PlainLightGBM,
    "pairwise_lightgbm": PairwiseLightGBM,
}


def space_of(family: str) -> dict[str, tuple[Any, ...]]:
    """A family's knobs that its constructor takes (a knob it dropped is not searched)."""
    taken = inspect.signature(CLASSES[family]).parameters
    return {k: v for k, v in SPACES[family].items() if k in taken}


def settings_of(family: str, draws: int = DRAWS, seed: int = 0) -> list[dict[str, Any]]:
    """``draws`` settings of a family: ``{}`` (its defaults) first, then seeded random draws.

    Draws repeat neither each other nor the defaults, as long as the space has that many
    settings (a smaller space gives every one of its settings).
    """
    space = space_of(family)
    if draws < 1:
        raise ValueError(f"draws must be at least 1, got {draws}")
    rng = np.random.default_rng(seed)
    params = inspect.signature(CLASSES[family]).parameters
    defaults = {k: params[k].default for k in space}
    seen = {_key(defaults)}
    out: list[dict[str, Any]] = [{}]
    # A space smaller than the budget runs out of new settings: stop after enough misses.
    for _ in range(1000 * draws):
        if len(out) >= draws:
            break
        draw = {k: v[int(rng.integers(len(v)))] for k, v in space.items()}
        if _key(draw) not in seen:
            seen.add(_key(draw))
            out.append(draw)
    return out


def _key(setting: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, repr(v)) for k, v in setting.items()))


def make(family: str, setting: dict[str, Any], seed: int) -> ThroughputModel:
    """A fresh, unfitted model of ``family`` with ``setting`` (its defaults for the rest)."""
    model: ThroughputModel = CLASSES[family](**setting, seed=seed)
    return model


def draw_name(family: str, k: int) -> str:
    """The name of a family's ``k``-th draw in a search run."""
    return f"{family}#{k}"


def search_tables(paths: Sequence[Path], families: Sequence[str], draws: int = DRAWS, seed: int = 0,
                  progress: Any = None, fixed: Sequence[str] = (), workers: int = 1,
                  parts_dir: Path | None = None) -> dict[str, Any]:
    """Every draw of every family on every table under both protocols, with fold seed ``seed``.

    Parameters
    ----------
    paths
        Measurement tables.
    families
        Families of :data:`CLASSES` to search.
    draws
        Settings per family (:func:`settings_of`).
    seed
        Fold seed, and the seed of the draws and of every model.
    progress
        Anything with ``print``, for a line per table and part.
    fixed
        Registered models without knobs, run once on the same folds.
    workers
        Processes to run the tables' models in, in parts
        (:mod:`leap.training.alternatives.search_parts`); with more than one, every model that
        takes ``num_threads`` fits on one thread.
    parts_dir
        Where each part is saved as it ends, and read from by a rerun of the same search.

    Returns
    -------
    dict
        ``{"draws", "seed", "settings": {family: [setting, ...]}, "results": {table stem:
        evaluate(...)}, "threads_per_fit"}`` with the draws named by :func:`draw_name`.
    """
    from leap.training.alternatives.search_parts import evaluate_in_parts

    unknown = [f for f in families if f not in CLASSES]
    if unknown:
        raise ValueError(f"no search space for {', '.join(unknown)}; families: {', '.join(CLASSES)}")
    settings = {f: settings_of(f, draws, seed) for f in families}
    threads = _threads(families, workers)
    jobs = [(path, [*((draw_name(f, k), f, {**s, **threads[f]}) for f in families for k, s in enumerate(settings[f])),
                    *((name, None, {}) for name in fixed)])
            for path in paths]
    for path, specs in jobs:
        if progress is not None:
            progress.print(f"{path.name}: {len(specs)} settings under both protocols ...")
    results = evaluate_in_parts(jobs, seed, make, workers, parts_dir, progress)
    return {"draws": draws, "seed": seed, "settings": settings, "results": results,
            "threads_per_fit": 1 if workers > 1 else "the models' own"}


def table_scores(search: dict[str, Any], family: str) -> np.ndarray:
    """acc@10 (primary rows) of each draw on each table and protocol: ``(draws, tables, protocols)``."""
    stems = list(search["results"])
    protocols = list(search["results"][stems[0]]["protocols"])
    out = np.full((len(search["settings"][family]), len(stems), len(protocols)), np.nan)
    for k in range(out.shape[0]):
        for i, stem in enumerate(stems):
            for j, p in enumerate(protocols):
                out[k, i, j] = search["results"][stem]["protocols"][p]["models"][draw_name(family, k)]["acc@10"]
    return out


def choose_by_rotation(scores: np.ndarray) -> list[int]:
    """For each table, the draw with the best mean score over the other tables (ties: the earlier).

    Parameters
    ----------
    scores
        ``(draws, tables, protocols)``, as :func:`table_scores` returns; NaN counts as 0 (no
        estimate is no hit).

    Raises
    ------
    ValueError
        Fewer than two tables: there is nothing to choose on.
    """
    if scores.shape[1] < 2:
        raise ValueError("choosing by rotation needs at least two tables")
    filled = np.nan_to_num(scores, nan=0.0)
    chosen = []
    for i in range(scores.shape[1]):
        others = np.delete(filled, i, axis=1).mean(axis=(1, 2))
        chosen.append(int(np.argmax(others)))
    return chosen


def rotation_report(search: dict[str, Any], families: Sequence[str]) -> dict[str, Any]:
    """The chosen draw per table and family, its settings and what it was chosen on.

    Returns
    -------
    dict
        ``{table stem: {family: {"draw", "settings", "chosen_on", "defaults_on"}}}``: the mean
        acc@10 over the other tables of the chosen draw and of the defaults (draw 0).
    """
    stems = list(search["results"])
    out: dict[str, Any] = {stem: {} for stem in stems}
    for family in families:
        scores = table_scores(search, family)
        for i, k in enumerate(choose_by_rotation(scores)):
            others = np.nan_to_num(np.delete(scores, i, axis=1), nan=0.0).mean(axis=(1, 2))
            out[stems[i]][family] = {"draw": k, "settings": _plain(search["settings"][family][k]),
                                     "chosen_on": [s for s in stems if s != stems[i]],
                                     "chosen_on_acc10": round(float(others[k]), 4),
                                     "defaults_on_acc10": round(float(others[0]), 4)}
    return out


def _plain(setting: dict[str, Any]) -> dict[str, Any]:
    """A setting as JSON takes it (tuples as lists); ``{}`` means the defaults."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in setting.items()}


#: The name under which the served model's defaults (draw 0) are reported beside its chosen draw.
SERVED_DEFAULTS = "lightgbm_defaults"


def tuned_tables(paths: Sequence[Path], names: Sequence[str], draws: int = DRAWS, seed: int = 0,
                 progress: Any = None, workers: int = 1, parts_dir: Path | None = None
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every named model on every table, the families with knobs at their rotation-chosen draw
    (``workers`` and ``parts_dir`` as :func:`search_tables` takes them).

    Returns
    -------
    (tables, tuning)
        ``tables``: ``{table stem: evaluate(...)}`` as :func:`leap.training.alternatives.tables.evaluate_tables`
        returns it, each family's scores those of its chosen draw with its ``"settings"`` beside
        them, plus :data:`SERVED_DEFAULTS` (the served model as shipped) when ``lightgbm`` is
        searched. ``tuning``: ``{"draws", "seed", "rotation"`` (:func:`rotation_report`),
        ``"acc10": {family: (draws, tables, protocols) nested lists}, "tables", "protocols",
        "settings"}``.

    Raises
    ------
    ValueError
        Fewer than two tables.
    """
    if len(paths) < 2:
        raise ValueError("tuning by rotation needs at least two tables (choose on the others, report on each)")
    families = [n for n in names if n in CLASSES]
    fixed = [n for n in names if n not in CLASSES]
    return chosen_tables(search_tables(paths, families, draws, seed, progress, fixed, workers, parts_dir), names)


def chosen_tables(search: dict[str, Any], names: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """:func:`tuned_tables` from a finished search (e.g. tables searched apart, their
    ``results`` joined: :func:`join_searches`)."""
    if len(search["results"]) < 2:
        raise ValueError("tuning by rotation needs at least two tables (choose on the others, report on each)")
    families = [n for n in names if n in CLASSES]
    draws, seed = search["draws"], search["seed"]
    rotation = rotation_report(search, families)
    tables = {stem: _chosen(result, rotation[stem], names) for stem, result in search["results"].items()}
    first = next(iter(search["results"].values()))
    tuning = {"draws": draws, "seed": seed, "rotation": rotation,
              "tables": list(search["results"]), "protocols": list(first["protocols"]),
              "threads_per_fit": search.get("threads_per_fit"),
              "acc10": {f: np.round(table_scores(search, f), 4).tolist() for f in families},
              "settings": {f: [_plain(x) for x in v] for f, v in search["settings"].items()}}
    return tables, tuning


def _chosen(result: dict[str, Any], chosen: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """A table's search result cut to the named models, each family at its chosen draw."""
    protocols = {}
    for protocol, block in result["protocols"].items():
        models = {}
        for name in names:
            if name in chosen:
                models[name] = {**block["models"][draw_name(name, chosen[name]["draw"])],
                                "settings": chosen[name]["settings"]}
            else:
                models[name] = block["models"][name]
        if "lightgbm" in chosen:
            models[SERVED_DEFAULTS] = {**block["models"][draw_name("lightgbm", 0)], "settings": {}}
        protocols[protocol] = {**block, "models": models}
    listed = [*names, SERVED_DEFAULTS] if "lightgbm" in chosen else list(names)
    return {**result, "models": listed, "protocols": protocols}


def tune_on_history(history: Path | Sequence[Path], families: Sequence[str], draws: int = DRAWS, days: int = 3,
                    window_days: int = 30, seed: int = 0, progress: Any = None,
                    pick_sample: int = 200, workers: int = 1, parts_dir: Path | None = None) -> dict[str, Any]:
    """Every draw of every family on the last ``days`` nightly retrains of one or more tuning
    histories (simulator seeds used for nothing else), and each family's best draw by acc@10
    averaged over the nights of every history.

    ``workers`` and ``parts_dir`` as :func:`search_tables` takes them
    (:func:`leap.training.alternatives.search_parts.backtest_in_parts`).

    Returns
    -------
    dict
        ``{"history" (the folders, comma-joined), "histories", "data_hash", "days", "draws",
        "threads_per_fit", "chosen": {family: {"draw", "settings", "acc10", "defaults_acc10"}},
        "acc10": {family: [mean acc@10 per draw]}, "acc10_by_history": {family: [[per draw] per history]}}``.
    """
    from leap.training.alternatives.search_parts import backtest_in_parts

    histories = [history] if isinstance(history, Path) else list(history)
    settings = {f: settings_of(f, draws, seed) for f in families}
    threads = _threads(families, workers)
    specs = [(draw_name(f, k), f, {**s, **threads[f]}) for f in families for k, s in enumerate(settings[f])]
    results = [backtest_in_parts(h, specs, make, (days, window_days, pick_sample), seed, workers, parts_dir, progress)
               for h in histories]
    by_history = {f: [[float(r["mean"][draw_name(f, k)]["acc@10"]) for k in range(len(settings[f]))] for r in results]
                  for f in families}
    acc = {f: list(np.mean(by_history[f], axis=0)) for f in families}
    chosen = {}
    for f in families:
        k = int(np.argmax(np.nan_to_num(acc[f], nan=0.0)))
        chosen[f] = {"draw": k, "settings": _plain(settings[f][k]), "acc10": round(acc[f][k], 4),
                     "defaults_acc10": round(acc[f][0], 4)}
    hashes = [r["data_hash"] for r in results]
    return {"history": ", ".join(map(str, histories)), "histories": [str(h) for h in histories],
            "data_hash": hashes[0] if len(hashes) == 1 else hashes, "days": results[0]["days"], "draws": draws,
            "threads_per_fit": 1 if workers > 1 else "the models' own", "chosen": chosen,
            "acc10": {f: [round(a, 4) for a in v] for f, v in acc.items()},
            "acc10_by_history": {f: [[round(a, 4) for a in v] for v in per] for f, per in by_history.items()}}


def _threads(families: Sequence[str], workers: int) -> dict[str, dict[str, Any]]:
    """Side by side, each fit takes one thread: LightGBM's OpenMP threads spin, and two processes of
    two threads each on two cores ran several times slower than one. (LightGBM's figures move a
    little with the thread count, so a search is compared with searches of the same workers.)"""
    return {f: {"num_threads": 1} if workers > 1 and "num_threads" in inspect.signature(CLASSES[f]).parameters
            else {} for f in families}


def chosen_factories(choice: dict[str, Any]) -> dict[str, Callable[..., Any]]:
    """``family -> (seed) -> model`` at the settings :func:`tune_on_history` chose."""
    return {f: _seeded(f, c["settings"]) for f, c in choice["chosen"].items()}


def _seeded(family: str, setting: dict[str, Any]) -> Callable[..., Any]:
    knobs = {k: tuple(v) if isinstance(v, list) else v for k, v in setting.items()}
    return lambda seed=0: make(family, knobs, seed)


def join_searches(searches: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One search from searches of other tables with the same draws, seed and settings.

    Raises
    ------
    ValueError
        Searches of different draws, seeds or settings, or a table twice.
    """
    first = searches[0]
    out = {"draws": first["draws"], "seed": first["seed"], "settings": first["settings"],
           "threads_per_fit": first.get("threads_per_fit"), "results": {}}
    for search in searches:
        if (search["draws"], search["seed"], search["settings"], search.get("threads_per_fit")) != (
                out["draws"], out["seed"], out["settings"], out["threads_per_fit"]):
            raise ValueError("searches of different draws, seeds, settings or threads cannot be joined")
        twice = set(search["results"]) & set(out["results"])
        if twice:
            raise ValueError(f"{', '.join(sorted(twice))} in more than one search")
        out["results"].update(search["results"])
    return out
