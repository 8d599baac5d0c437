"""``bench predict``: the ranking loop without Kafka, lookup fallback vs LightGBM in one process.

Per batch: decode the submissions from bytes, :meth:`RankingService.rank` (read features, build
rows, predict, price, rank), encode the rankings — the loop the predictor runs, minus
Kafka. Each run passes over the same batches once per variant, variants back to back, so the
ratios between them are measured side by side:

- ``lookup``: the fallback a predictor serves before any model is promoted;
- ``lightgbm``: a model fitted on a simulated history (:mod:`leap.bench.model`), the served model's
  class and size: its throughput is ``served_submissions_per_s``;
- ``bare``: DESIGN §9's plain loop, the same service around a plain 200-tree x 31-leaf LightGBM
  (:class:`leap.bench.model.PlainLightGBM`): ``bare_submissions_per_s``, and ``served_over_bare``;
- ``lightgbm`` and ``bare`` predict with their trees compiled to C (:mod:`predictor.compiled`), as a
  predictor serves them; ``lightgbm_booster`` and ``bare_booster`` are the same models with LightGBM's
  own predict (the same predictions: ``compiled_max_abs_diff``), and ``*_compiled_speedup`` the ratios;
- ``*_no_redis``: the same with snapshots read beforehand (decode, build rows, predict, price,
  encode);
- ``ranking_bytes`` (outside the timed passes): the mean encoded ranking of ``lookup`` and
  ``lightgbm``, with each candidate's basis and the same rankings without it, ``basis_growth``, and
  the median time to encode one of each; ``*_explained_24_rows_us_per_call`` the model's
  ``predict_explained`` (what the service calls) beside ``predict`` on the same 24 rows;
- ``lightgbm_unselected``: the served model without its selectors (:mod:`predictor.selector`),
  compiled, when it has any (a model fitted on 20,000 rows or more): ``selector_cost`` is
  ``lightgbm_unselected`` over ``lightgbm`` in submissions/s.

``--candidates N`` gives every submission N candidates (its own first, then the catalogue's),
the issue's unit being 24.
"""

from __future__ import annotations

import copy
import cProfile
import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from features.rows import build_batch_rows
from features.snapshot import FeatureSnapshot
from features.store import FeatureStore, open_store
from leap.bench.common import (
    SERVED_PER_DAY,
    Figures,
    freeze_heap,
    median_call_us,
    percentiles_ms,
    report,
    say,
    scratch_prefix,
    unfreeze_heap,
)
from leap.bench.model import PlainLightGBM, fit_on_simulated_history, load_fitted, save_fitted
from leap.bench.stages import Clock, PrefetchedStore, TimedModel, TimedStore, timed_rows
from leap.bench.workload import Workload, batches, make_workload, seed_store
from leap.core.hardware import Catalogue, load_catalogue
from leap.core.settings import Settings
from predictor.handler import PREDICT_BATCH_MAX
from predictor.lgbm import LightGBMThroughput
from predictor.models import ThroughputModel
from predictor.service import ActiveModel, ModelHolder, RankingService, lookup_fallback
from streams.events import Submission

#: The predictor ranks up to this many submissions per batch.
PREDICT_BATCH = PREDICT_BATCH_MAX
STAGES = ("decode", "read", "rows", "predict", "other", "encode")
#: DESIGN §9: a plain loop (decode, build rows, predict, encode) of 24 candidates per submission.
DESIGN_LOOP_PER_S = 3200.0
DESIGN_CANDIDATES = 24
#: DESIGN §9's figures, copied into every report beside the measured ones.
DESIGN_9: dict[str, Any] = {
    "loop_submissions_per_s": DESIGN_LOOP_PER_S, "candidates": DESIGN_CANDIDATES,
    "lightgbm_24_rows_us": 220, "lightgbm_bulk_us_per_row": 9, "model": "200 trees x 31 leaves, 1 thread",
}


def _pass(service: RankingService, clock: Clock, raw_batches: Sequence[list[bytes]]) -> Figures:
    """One pass over all batches; per-batch loop times and per-submission stage costs."""
    totals: list[float] = []
    spent = dict.fromkeys(STAGES, 0.0)
    subs_n = rows_n = fallbacks = 0
    clock.take()
    with timed_rows(clock):
        for raw in raw_batches:
            t0 = time.perf_counter()
            subs = [Submission.decode(b) for b in raw]
            t1 = time.perf_counter()
            rankings = service.rank(subs)
            t2 = time.perf_counter()
            encoded = [r.encode() for r in rankings]
            t3 = time.perf_counter()
            inner = clock.take()
            totals.append(t3 - t0)
            spent["decode"] += t1 - t0
            spent["encode"] += t3 - t2
            for stage in ("read", "rows", "predict"):
                spent[stage] += inner.get(stage, 0.0)
            spent["other"] += (t2 - t1) - sum(inner.values())
            subs_n += len(subs)
            rows_n += sum(len(s.candidates) for s in subs)
            fallbacks += sum(1 for r in rankings if r.fallback)
            assert len(encoded) == len(subs)
    loop_s = sum(totals)
    out: Figures = {
        "submissions_per_s": subs_n / loop_s,
        "candidate_rows_per_s": rows_n / loop_s,
        "fallback_share": fallbacks / subs_n,
        **percentiles_ms(totals, "batch"),
    }
    for stage in STAGES:
        out[f"{stage}_us_per_submission"] = spent[stage] / subs_n * 1e6
    return out


def ranking_bytes(service: RankingService, raw_batches: Sequence[list[bytes]]) -> Figures:
    """Encoded size of the rankings of one (untimed) pass, with each candidate's ``basis`` and, on
    the same rankings, without it (schema version 1): what the basis costs on the wire."""
    with_basis = without = n = 0
    encode_us: dict[str, list[float]] = {"with": [], "without": []}
    for raw in raw_batches:
        for ranking in service.rank([Submission.decode(b) for b in raw]):
            bare = [{k: v for k, v in c.items() if k != "basis"} for c in ranking.candidates]
            old = dataclasses.replace(ranking, schema_version=1, candidates=tuple(bare))
            for key, event in (("with", ranking), ("without", old)):  # alternated: side by side
                t0 = time.perf_counter()
                size = len(event.encode())
                encode_us[key].append((time.perf_counter() - t0) * 1e6)
                with_basis, without = (with_basis + size, without) if key == "with" else (with_basis, without + size)
            n += 1
    return {"ranking_bytes": with_basis / n, "ranking_bytes_without_basis": without / n,
            "basis_growth": with_basis / without - 1.0, "encode_us": float(np.median(encode_us["with"])),
            "encode_us_without_basis": float(np.median(encode_us["without"]))}


def _median_pair_us(first: Callable[[], object], second: Callable[[], object], calls: int) -> tuple[float, float]:
    """Median wall time of each of two calls made alternately ``calls`` times, in µs."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(calls):
        for call, out in ((first, times[0]), (second, times[1])):
            t0 = time.perf_counter()
            call()
            out.append(time.perf_counter() - t0)
    return float(np.median(times[0])) * 1e6, float(np.median(times[1])) * 1e6


def _predict_cost(model: ThroughputModel, rows_all: dict[str, np.ndarray], calls: int = 200) -> Figures:
    """Model cost alone: µs per row in one bulk call, and µs per call of 24 rows (DESIGN §9's unit);
    for a LightGBM model also its learned roofline's share of such a call."""
    n = len(rows_all["hardware"])
    t0 = time.perf_counter()
    model.predict(rows_all)
    bulk = time.perf_counter() - t0
    small = {c: v[:DESIGN_CANDIDATES] for c, v in rows_all.items()}
    # predict and what the service calls (the same pass, saying which estimate each row serves),
    # alternated call by call so that a change in the machine's load falls on both alike
    plain, explained = _median_pair_us(lambda: model.predict(small), lambda: model.predict_explained(small), calls)
    figures = {"predict_bulk_us_per_row": bulk / n * 1e6, "predict_24_rows_us_per_call": plain,
               "explained_24_rows_us_per_call": explained, "explained_over_predict": explained / plain}
    roofline = getattr(model, "roofline_", None)
    if roofline is not None:
        # The learned roofline runs twice per predict (candidate and prior hardware rows).
        figures["roofline_24_rows_us_per_call"] = median_call_us(lambda: roofline.predict(small), calls)
    return figures


def _services(store: FeatureStore, catalogue: Catalogue, clock: Clock, models: dict[str, ActiveModel],
              snapshots: dict[str, FeatureSnapshot], no_redis: bool) -> dict[str, RankingService]:
    out = {}
    for name, active in models.items():
        timed = ActiveModel(TimedModel(active.model, clock), active.version, active.fallback)
        out[name] = RankingService(TimedStore(store, clock), catalogue, ModelHolder(timed))
        if no_redis:
            out[f"{name}_no_redis"] = RankingService(PrefetchedStore(store, clock, snapshots), catalogue,
                                                     ModelHolder(timed))
    return out


def run_once(services: dict[str, RankingService], clock: Clock, raw_batches: Sequence[list[bytes]]) -> Figures:
    """One pass per variant, back to back, and each variant's throughput relative to the lookup's."""
    figures: Figures = {}
    for name, service in services.items():
        for key, value in _pass(service, clock, raw_batches).items():
            figures[f"{name}_{key}"] = value
    base = figures["lookup_submissions_per_s"]
    for name in services:
        if name != "lookup":
            figures[f"{name}_over_lookup"] = figures[f"{name}_submissions_per_s"] / base
    # The issue's headline keys: the served model's loop, and DESIGN §9's plain loop beside it.
    figures["served_submissions_per_s"] = figures["lightgbm_submissions_per_s"]
    if "bare_submissions_per_s" in figures:
        figures["served_over_bare"] = figures["lightgbm_submissions_per_s"] / figures["bare_submissions_per_s"]
    if "lightgbm_unselected_submissions_per_s" in figures:
        unselected = figures["lightgbm_unselected_submissions_per_s"]
        figures["selector_cost"] = unselected / figures["lightgbm_submissions_per_s"]
    for name in ("lightgbm", "bare"):
        if f"{name}_booster_submissions_per_s" in figures:
            figures[f"{name}_compiled_speedup"] = (figures[f"{name}_submissions_per_s"]
                                                   / figures[f"{name}_booster_submissions_per_s"])
    return figures


def profile_passes(services: dict[str, RankingService], clock: Clock, raw_batches: Sequence[list[bytes]],
                   folder: Path) -> None:
    """One extra pass per variant under cProfile (not timed: the profiler slows Python code ~2x)."""
    for name, service in services.items():
        prof = cProfile.Profile()
        prof.enable()
        _pass(service, clock, raw_batches)
        prof.disable()
        prof.dump_stats(str(folder / f"predict-{name}.prof"))


def timed_runs(services: dict[str, RankingService], clock: Clock, raw_batches: Sequence[list[bytes]],
               models: dict[str, ActiveModel], rows_all: dict[str, np.ndarray], repeat: int,
               profile_dir: Path | None) -> list[Figures]:
    """``repeat`` runs of :func:`run_once`, each with the models' own cost (:func:`_predict_cost`),
    with the heap frozen so garbage collection of the setup's objects does not land in a run."""
    freeze_heap()
    runs = []
    try:
        for r in range(repeat):
            figures = run_once(services, clock, raw_batches)
            for name in ("lightgbm", "lightgbm_booster"):
                figures.update({f"{name}_{k}": v for k, v in _predict_cost(models[name].model, rows_all).items()})
            figures.update({f"lookup_{k}": v for k, v in _predict_cost(models["lookup"].model, rows_all).items()})
            runs.append(figures)
            say(f"run {r + 1}/{repeat}: lookup {figures['lookup_submissions_per_s']:.0f}/s, "
                f"lightgbm {figures['lightgbm_submissions_per_s']:.0f}/s")
        if profile_dir is not None:
            say(f"profiling one more pass per variant into {profile_dir}")
            profile_passes(services, clock, raw_batches, profile_dir)
    finally:
        unfreeze_heap()
    return runs


def add_design_ratios(runs: list[Figures]) -> None:
    """Each run's no-Redis throughput over DESIGN §9's plain loop (NaN without ``no_redis``)."""
    for f in runs:
        f["lookup_no_redis_over_design_loop"] = f.get("lookup_no_redis_submissions_per_s", np.nan) / DESIGN_LOOP_PER_S
        f["lightgbm_no_redis_rows_over_design_loop"] = (
            f.get("lightgbm_no_redis_candidate_rows_per_s", np.nan) / (DESIGN_LOOP_PER_S * DESIGN_CANDIDATES))


def served_model(catalogue: Catalogue, history_days: int, history_per_day: int, seed: int, trees: int | None,
                 model_dir: Path | None, save_model: Path | None) -> tuple[LightGBMThroughput, dict[str, Any]]:
    """The served model's class fitted on a simulated history, or loaded from ``model_dir``."""
    if model_dir is not None:
        say(f"loading the model saved in {model_dir}")
        return load_fitted(model_dir)
    say(f"fitting LightGBM on a simulated history of {history_days} x {history_per_day} attempts")
    model, info = fit_on_simulated_history(catalogue, history_days, history_per_day, seed, trees)
    say(f"model fitted in {info['fit_s']} s")
    if save_model is not None:
        save_fitted(model, info, save_model)
    return model, info


def bench_models(model: LightGBMThroughput, rows_all: dict[str, np.ndarray], cache_dir: Path
                 ) -> tuple[dict[str, ActiveModel], float]:
    """The variants' models, and the largest difference between the served model's predictions
    compiled and with LightGBM's predict on all rows (log throughput)."""
    served_booster = copy.copy(model)
    served_booster.trees_ = {}
    model.compile_trees(cache_dir)
    with np.errstate(invalid="ignore"):
        diff = np.abs(model._predict_log(rows_all) - served_booster._predict_log(rows_all))
    plain = PlainLightGBM(rows_all, served_booster._predict_log(rows_all))
    plain_booster = copy.copy(plain)
    plain.compile_trees(cache_dir)
    models = {"lookup": lookup_fallback(), "lightgbm": ActiveModel(model, "bench-lightgbm"),
              "lightgbm_booster": ActiveModel(served_booster, "bench-lightgbm"),
              "bare": ActiveModel(plain, "bench-plain"), "bare_booster": ActiveModel(plain_booster, "bench-plain")}
    if model.selectors_:
        unselected = copy.copy(model)
        unselected.selectors_ = {}
        models["lightgbm_unselected"] = ActiveModel(unselected, "bench-lightgbm")
    return models, float(np.nanmax(diff, initial=0.0))


def with_candidates(w: Workload, candidates: int, catalogue: Catalogue) -> Workload:
    """Every submission with ``candidates`` candidates: its own first, then the catalogue's (0: as simulated)."""
    if candidates <= 0:
        return w

    def pad(sub: Submission) -> Submission:
        names = list(dict.fromkeys([*sub.candidates, *catalogue.names()]))[:candidates]
        return dataclasses.replace(sub, candidates=tuple(names))

    return dataclasses.replace(w, submissions=[pad(s) for s in w.submissions])


def bench_predict(
    settings: Settings,
    submissions: int = 5000,
    warm: int = 20000,
    batch: int = PREDICT_BATCH,
    history: tuple[int, int] = (6, SERVED_PER_DAY),
    trees: int | None = None,
    no_redis: bool = True,
    repeat: int = 3,
    seed: int = 0,
    profile_dir: Path | None = None,
    model_dir: Path | None = None,
    save_model: Path | None = None,
    candidates: int = 0,
) -> dict[str, Any]:
    """Run the predict benchmark and return its JSON report.

    Parameters
    ----------
    settings
        Redis connection (the key prefix is replaced by a scratch one).
    submissions, batch, warm
        Submissions ranked per pass, per ``rank`` call; earlier attempts written to the store first.
    history, trees
        Days x attempts per day of simulated history for the model; optional tree count override.
    no_redis, repeat, profile_dir
        Also run each variant on snapshots read beforehand; runs (the report holds medians); write
        a cProfile dump per variant there, from an extra untimed pass.
    model_dir, save_model, candidates
        Load the model from a saved artifact folder instead of fitting; save the fitted one there;
        candidates per submission (0: as the simulator drew them).
    """
    began = time.perf_counter()
    catalogue = load_catalogue()
    model, model_info = served_model(catalogue, *history, seed, trees, model_dir, save_model)
    say(f"simulating {warm} + {submissions} attempts")
    w = with_candidates(make_workload(warm, submissions, seed + 1), candidates, catalogue)
    prefix = scratch_prefix()
    store = open_store(settings, catalogue, prefix=prefix)
    try:
        seed_store(store, w)
        snapshots = dict(zip((s.event_id for s in w.submissions), store.read(w.submissions), strict=True))
        known = sum(1 for s in snapshots.values() if s.prior) / max(1, len(snapshots))
        raw_batches = [[s.encode() for s in b] for b in batches(w.submissions, batch)]
        rows_all = build_batch_rows(w.submissions, [snapshots[s.event_id] for s in w.submissions], catalogue)
        say("compiling the served model's trees; fitting and compiling the plain model of DESIGN §9's loop")
        models, compiled_diff = bench_models(model, rows_all, settings.compiled_dir)
        clock = Clock()
        services = _services(store, catalogue, clock, models, snapshots, no_redis)
        runs = timed_runs(services, clock, raw_batches, models, rows_all, repeat, profile_dir)
        sizes = {name: ranking_bytes(services[name], raw_batches) for name in ("lookup", "lightgbm")}
    finally:
        store.delete_all()
        store.client.close()
    add_design_ratios(runs)
    params = {"submissions": len(w.submissions), "batch": batch, "warm_attempts": warm, "seed": seed,
              "key_prefix": prefix, "candidates": candidates or "as simulated",
              "mean_candidates": round(w.mean_candidates, 2), "known_job_share": round(known, 3),
              "variants": list(services), "model": model_info, "compiled_max_abs_diff": compiled_diff}
    return report("predict", params, runs, extra={"design_9": dict(DESIGN_9), "ranking_bytes": sizes}, started=began)
