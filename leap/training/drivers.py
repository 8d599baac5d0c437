"""Drivers report: what moves accuracy and what does not.

Each variant changes one thing about the default model (feature groups, training window,
retrain cadence, model size, target transform) and is scored like the backtest: for each of
the last ``days`` days, train on attempts that finished before the day and score the day's
finished attempts. A variant is reported as the change in mean acc@10 against the default model
on the same days, with the spread (sd across days) of the per-day change: a difference smaller
than its spread is not a driver. The baselines (lookup table, prior transfer) are rows too.

Point-in-time rows are built once; only the models differ. Fits are shared where they are the
same model (the weekly model of the first day is the default's nightly model of that day), run
in worker processes of one LightGBM thread each (on a shared machine OpenMP threads that wait
for each other cost more than they gain; LightGBM is deterministic, so the thread count does
not change any number). ``max_train_rows`` can cap the rows per fit, but it saves little
(fit time is dominated by boosting rounds, not rows) and it changes the answers: a capped
default model loses accuracy and then looks beaten by a smaller model and a shorter window
(docs/model.md), so it is off by default.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from leap.core.accuracy import summary
from leap.core.hardware import Catalogue, load_catalogue
from leap.training import new_types
from leap.training.dataset import DAY, Examples, History, read_history
from leap.training.days import checked_first_test_day, day_text, submitted_on, training_mask
from leap.training.pool import run_shared, shared
from leap.training.row_cache import built_examples
from leap.training.train import fit_model
from predictor.boosting import HOLDOUT_FROM, size_for
from predictor.models import BASELINES

ALL_GROUPS = ("config", "hardware", "prior", "lookup")


@dataclass(frozen=True)
class Variant:
    """One row of the report: a change to the default model, or a baseline."""

    key: str
    name: str
    group: str
    params: tuple[tuple[str, Any], ...] = ()
    window_days: int | None = None  # None: the report's default window
    cadence_days: int = 1
    baseline: str | None = None  # a key of predictor.models.BASELINES


def _groups(*drop: str) -> tuple[tuple[str, Any], ...]:
    return (("feature_groups", tuple(g for g in ALL_GROUPS if g not in drop)),)


VARIANTS: tuple[Variant, ...] = (
    Variant("default", "default model", "default"),
    Variant("no_prior", "no prior throughput", "features", _groups("prior")),
    Variant("no_hardware", "no hardware specs", "features", _groups("hardware")),
    Variant("no_config", "no configuration", "features", _groups("config")),
    Variant("no_lookup", "no lookup medians", "features", _groups("lookup")),
    Variant("no_learned_roofline", "no learned roofline", "features", (("learned_roofline", False),)),
    Variant("window_7", "window 7 d", "window", window_days=7),
    Variant("window_60", "window 60 d", "window", window_days=60),
    Variant("weekly", "weekly retrain", "cadence", cadence_days=7),
    Variant("small", "small (15 leaves, 100 trees)", "size", (("num_leaves", 15), ("n_estimators", 100))),
    # Between small and the default: what serving could save if accuracy does not move.
    Variant("medium", "medium (31 leaves, 150 trees)", "size", (("num_leaves", 31), ("n_estimators", 150))),
    Variant("trees_150", "fewer trees (63 leaves, 150 trees)", "size", (("num_leaves", 63), ("n_estimators", 150))),
    Variant("large", "large (255 leaves, 600 trees)", "size", (("num_leaves", 255), ("n_estimators", 600))),
    Variant("all_trees", "main model grows all its trees (no early stopping)", "size", (("early_stopping_rounds", 0),)),
    Variant("constant_leaves", "base model with constant leaves", "size", (("base_linear", False),)),
    Variant("target_log", "target log(y)", "target", (("target", "log"),)),
    Variant("target_raw", "target raw y", "target", (("target", "raw"),)),
    # Remove-one of the served model's stages: each stays only while removing it costs more than its noise.
    Variant("no_selectors", "no selectors (the prediction is served)", "stage", (("selectors", False),)),
    Variant("no_trust", "no trust weights (the whole correction)", "stage", (("trust", False),)),
    Variant("blend_base", "anchor carried by the base model's ratio alone", "stage", (("blend", "base"),)),
    Variant("no_job_effects", "base model not refitted without the jobs' speed", "stage", (("job_effects", False),)),
    Variant("anchor_only", "no main model: the anchor is served", "stage",
            (("correction", False), ("selectors", False))),
    Variant("no_gate", "no gate (the model is served where it was not shown better)", "stage", (("gate", False),)),
    # The stages whose remove-one rows sit within the fit seed's noise, removed together.
    Variant("lean", "no learned roofline, no trust weights, constant-leaf base", "stage",
            (("learned_roofline", False), ("trust", False), ("base_linear", False))),
    Variant("lookup", "lookup table (baseline)", "baseline", baseline="lookup"),
    Variant("transfer", "prior transfer (baseline)", "baseline", baseline="transfer"),
    Variant("transfer_paired", "paired transfer (baseline)", "baseline", baseline="transfer_paired"),
)


@dataclass
class _Fit:
    """One model to train (parameters, window, training day) and the days it scores."""

    params: tuple[tuple[str, Any], ...]
    window_days: int
    train_day: float
    score_days: list[float] = field(default_factory=list)


def _train_rows(ex: Examples, day: float, window_days: int, max_rows: int | None) -> Examples:
    """The night's training rows, sampled down to ``max_rows`` if there are more."""
    mask = training_mask(ex, day, window_days)
    idx = np.flatnonzero(mask)
    if max_rows is not None and len(idx) > max_rows:
        # Seeded by the day alone: every variant with this window trains on the same sample.
        rng = np.random.default_rng(int(day // DAY))
        keep = np.zeros(len(mask), dtype=bool)
        keep[np.sort(rng.choice(idx, size=max_rows, replace=False))] = True
        mask = keep
    return ex.select(mask)


def _run_fit(job: _Fit, max_rows: int | None) -> tuple[dict[float, float], int, float]:
    """Train one model on the examples :func:`~leap.training.pool.shared` holds and score its days;
    returns (acc@10 per day, training rows, seconds)."""
    (ex,) = shared()
    t0 = time.perf_counter()
    train = _train_rows(ex, job.train_day, job.window_days, max_rows)
    model = fit_model(train, {"num_threads": 1, **dict(job.params)})
    accs = {}
    for day in job.score_days:
        test = submitted_on(ex, day)
        accs[day] = summary(model.predict(test.rows), test.y)["acc@10"]
    return accs, len(train), time.perf_counter() - t0


def _fit_key(v: Variant, i: int, test_days: list[float], window_days: int, first_submit: float,
             base_params: dict[str, Any]) -> tuple[Any, ...]:
    """(params, window, training day) of the model that scores test day ``i`` for ``v``.

    A window reaching past the first submission selects the same rows as any longer one: it
    is cut to what the history holds, so such variants share one fit instead of repeating it.
    """
    train_day = test_days[i - i % v.cadence_days]
    window = min(v.window_days or window_days, math.ceil((train_day - first_submit) / DAY))
    return tuple({**base_params, **dict(v.params)}.items()), window, train_day


#: ``key_of(variant, i)``: the key of the fit scoring test day ``i`` (:func:`_fit_key` with the run's settings)
KeyOf = Callable[[Variant, int], tuple[Any, ...]]


def _plan(variants: Sequence[Variant], test_days: list[float], window_days: int, first_submit: float,
          params: dict[str, Any]) -> tuple[dict[tuple[Any, ...], _Fit], KeyOf]:
    """Distinct fits over all model variants, keyed by what makes a fit distinct; the key function."""

    def key_of(v: Variant, i: int) -> tuple[Any, ...]:
        return _fit_key(v, i, test_days, window_days, first_submit, params)

    fits: dict[tuple[Any, ...], _Fit] = {}
    for v in variants:
        if v.baseline is not None:
            continue
        for i, day in enumerate(test_days):
            key = key_of(v, i)
            fits.setdefault(key, _Fit(*key)).score_days.append(day)
    for f in fits.values():
        f.score_days = sorted(set(f.score_days))
    return fits, key_of


#: How many times a fit below :data:`predictor.boosting.HOLDOUT_FROM` training rows counts in the
#: order: it fits its stages once per fold, by jobs and by model types, before the final fit, so
#: on a quarter of the rows it still takes several times as long (docs/benchmarks.md).
OUT_OF_FOLD_COST = 10


def _cost(f: _Fit, rows: int) -> float:
    """Rough relative cost of a fit on ``rows`` training rows, to start the slow fits first
    (better packing on the workers)."""
    size = size_for(rows, dict(f.params))
    return float(size["num_leaves"] * size["n_estimators"]) \
        * (OUT_OF_FOLD_COST if rows < HOLDOUT_FROM else 1) + f.window_days


def _run_all(fits: dict[tuple[Any, ...], _Fit], ex: Examples, max_rows: int | None, jobs: int,
             progress: Any) -> dict[tuple[Any, ...], dict[float, float]]:
    rows = {k: int(training_mask(ex, f.train_day, f.window_days).sum()) for k, f in fits.items()}
    if max_rows is not None:
        rows = {k: min(n, max_rows) for k, n in rows.items()}
    order = sorted(fits, key=lambda k: -_cost(fits[k], rows[k]))
    out: dict[tuple[Any, ...], dict[float, float]] = {}

    def report(k: tuple[Any, ...], res: tuple[dict[float, float], int, float]) -> None:
        out[k] = res[0]
        if progress is not None:
            f = fits[k]
            desc = ", ".join(f"{a}={b}" for a, b in f.params) or "default params"
            progress.print(f"[{len(out)}/{len(fits)}] {desc}, window {f.window_days} d, trained before "
                           f"{day_text(f.train_day)} on {res[1]} rows in {res[2]:.0f} s: acc@10 "
                           + " ".join(f"{a:.3f}" for a in res[0].values()))

    for i, res in run_shared(_run_fit, [(fits[k], max_rows) for k in order], (ex,), jobs, in_order=False):
        report(order[i], res)
    return out


def _window_name(v: Variant, first_test: float, last_test: float, first_day: float) -> str:
    """Say so when the window reaches back before the history starts."""
    if v.window_days is None:
        return v.name
    lo, hi = (first_test - first_day) / DAY, (last_test - first_day) / DAY
    if v.window_days > lo:
        span = f"{lo:.0f}-{hi:.0f} d" if hi > lo else f"{lo:.0f} d"
        return f"{v.name} (all available: {span})"
    return v.name


def drivers(
    history_dir: Path,
    days: int = 7,
    progress: Any = None,
    examples: tuple[History, Examples] | None = None,
    variants: Sequence[str] | None = None,
    window_days: int = 30,
    max_train_rows: int | None = None,
    jobs: int = 2,
    catalogue: Catalogue | None = None,
    params: dict[str, Any] | None = None,
    row_cache: Path | None = None,
) -> dict[str, Any]:
    """Score every variant by nightly retrains over the last ``days`` days.

    Parameters
    ----------
    history_dir, row_cache
        History folder (ignored when ``examples`` is given); a folder keeping its built rows
        (:func:`leap.training.row_cache.built_examples`; None: built every run).
    days
        Test days at the end of the history.
    progress, examples
        Anything with ``print`` (a rich console), for one line per fit; ``(history, examples)`` already built.
    variants
        Keys of :data:`VARIANTS` to run (``default`` is always run); all by default.
    window_days
        The default model's training window.
    max_train_rows
        At most this many training rows per fit (one random sample per window and day); None: all.
    jobs
        Worker processes, one LightGBM thread each; 1 runs in this process. Workers are spawned
        (not forked): a script calling this with ``jobs > 1`` needs ``if __name__ == "__main__":``.
    params
        Model parameters under every fit; a variant's own parameters win over them.

    Returns
    -------
    dict
        ``{"days", "baseline_acc@10", "variants": [{"name", "group", "acc@10", "delta",
        "delta_sd", "per_day"}, ...], ...}``; ``per_day`` lists ``{"day", "acc@10", "delta"}``.
    """
    t0 = time.perf_counter()
    chosen = _chosen_variants(variants)
    history, ex = _history_examples(history_dir, catalogue, progress, examples, row_cache)
    test_days = [checked_first_test_day(history, days) + d * DAY for d in range(days)]
    ex = new_types.for_nightly_fits(ex, history, catalogue or load_catalogue(), test_days,
                                    min(v.window_days or window_days for v in chosen))
    fits, key_of = _plan(chosen, test_days, window_days, float(ex.submit_time.min()), dict(params or {}))
    if progress is not None:
        progress.print(f"{len(ex)} examples; {len(fits)} fits for {len(chosen)} variants over {days} days")
    accs = _run_all(fits, ex, max_train_rows, jobs, progress)
    per_variant = {v.key: _variant_accuracy(v, accs, ex, test_days, key_of) for v in chosen}
    base = np.array(per_variant["default"])
    rows = [_report_row(v, np.array(per_variant[v.key]), base, test_days, history.first_day) for v in chosen]
    return {"days": days, "baseline_acc@10": float(base.mean()), "window_days": window_days,
            "max_train_rows": max_train_rows, "params": dict(params or {}), "examples": len(ex), "fits": len(fits),
            "test_days": [day_text(d) for d in test_days], "data_hash": history.digest,
            "elapsed_s": round(time.perf_counter() - t0, 1), "variants": rows}


def _history_examples(history_dir: Path, catalogue: Catalogue | None, progress: Any,
                      examples: tuple[History, Examples] | None, row_cache: Path | None) -> tuple[History, Examples]:
    """The history and its examples; rows are built (or read from ``row_cache``) unless given."""
    if examples is not None:
        return examples
    # Without the oracle table: the report scores models against measurements only.
    history = read_history(history_dir, with_oracle=False)
    return history, built_examples(history, catalogue or load_catalogue(), progress, row_cache)


def _chosen_variants(keys: Sequence[str] | None) -> list[Variant]:
    """The variants named by ``keys`` and the default, in :data:`VARIANTS` order; all for None."""
    known = {v.key: v for v in VARIANTS}
    unknown = set(keys or ()) - set(known)
    if unknown:
        raise ValueError(f"unknown variants {sorted(unknown)}; known: {sorted(known)}")
    return [v for v in VARIANTS if keys is None or v.key in keys or v.key == "default"]


def _variant_accuracy(v: Variant, accs: dict[tuple[Any, ...], dict[float, float]], ex: Examples,
                      test_days: list[float], key_of: KeyOf) -> list[float]:
    """acc@10 of variant ``v`` on each test day: a baseline's own, or that of the fit serving the day."""
    if v.baseline is not None:
        model = BASELINES[v.baseline]()
        return [summary(model.predict(t.rows), t.y)["acc@10"] for t in (submitted_on(ex, d) for d in test_days)]
    return [accs[key_of(v, i)][d] for i, d in enumerate(test_days)]


def _report_row(v: Variant, acc: np.ndarray, base: np.ndarray, test_days: list[float],
                first_day: float) -> dict[str, Any]:
    """A variant's line of the report: mean acc@10, its change against the default and the spread."""
    delta = acc - base
    return {
        "key": v.key, "name": _window_name(v, test_days[0], test_days[-1], first_day),
        "group": v.group, "acc@10": float(acc.mean()), "delta": float(delta.mean()),
        # The spread across days says whether a change is larger than day-to-day noise.
        "delta_sd": float(delta.std(ddof=1)) if len(delta) > 1 else 0.0,
        "per_day": [{"day": day_text(d), "acc@10": float(a), "delta": float(x)}
                    for d, a, x in zip(test_days, acc, delta, strict=True)],
    }


def plot_drivers(result: dict[str, Any], folder: Path) -> list[Path]:
    """Horizontal bars: change in mean acc@10 against the default, with the daily sd as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    rows = [r for r in result["variants"] if r["group"] != "default"][::-1]  # first variant on top
    groups = list(dict.fromkeys(r["group"] for r in rows[::-1]))
    colours = {g: plt.get_cmap("tab10")(i) for i, g in enumerate(groups)}
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.6))
    y = np.arange(len(rows))
    ax.barh(y, [r["delta"] for r in rows], xerr=[r["delta_sd"] for r in rows],
            color=[colours[r["group"]] for r in rows], capsize=3)
    ax.set_yticks(y, [r["name"] for r in rows], fontsize=8)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel("change in mean acc@10 against the default model (error bar: sd of the daily change)")
    ax.set_title(f"Drivers: default acc@10 {result['baseline_acc@10']:.3f} over {result['days']} nightly retrains")
    ax.grid(axis="x", alpha=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[g]) for g in groups]
    ax.legend(handles, groups, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    path = folder / "drivers.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
