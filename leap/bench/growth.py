"""``bench growth``: what the ranking loop and the online store cost as the work grows.

Two measurements in one run:

- **Candidates per submission.** One model, one warm store, the same submissions padded to each
  candidate count (their own candidates first, then the catalogue's: :func:`leap.bench.predict.with_candidates`).
  Every run passes over each count in turn, so the counts are compared side by side, not across
  runs at different loads. A count above the catalogue's size ranks the whole catalogue
  (``mean_candidates`` says what was ranked).
- **Redis memory per tracked job.** The starts and finishes of a simulated fleet written through
  :class:`~features.store.FeatureStore` under a scratch prefix, then ``MEMORY USAGE`` of every key:
  the keys of one job (:meth:`~features.keys.KeyLayout.job` and its siblings) are per-job cost, the
  rest (lookups, pair windows, their views) is shared by all jobs. ``gb_at_1m_jobs`` scales the
  per-job bytes to a million jobs.

Training time and memory against days of history are ``bench train --days N``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from features.keys import KeyLayout
from features.store import FeatureStore, open_store
from leap.bench.common import SERVED_PER_DAY, Figures, freeze_heap, report, say, scratch_prefix, unfreeze_heap
from leap.bench.predict import PREDICT_BATCH, _pass, _services, served_model, with_candidates
from leap.bench.stages import Clock
from leap.bench.workload import Workload, batches, make_workload, seed_store
from leap.core.hardware import load_catalogue
from leap.core.settings import Settings
from predictor.service import ActiveModel, RankingService, lookup_fallback


def _job_key_kinds(layout: KeyLayout) -> tuple[str, dict[str, str]]:
    """The start shared by every job's keys, and each kind's suffix after the job hash's key, read
    off the layout (the one place that spells a key)."""
    base = layout.job("j")
    kinds = (("job", layout.job), ("job_window", layout.job_window), ("job_seen", layout.job_seen),
             ("job_outbox", layout.job_outbox))
    return base[: base.index("{")], {key("j")[len(base):]: kind for kind, key in kinds}


def candidate_runs(services: dict[str, RankingService], clock: Clock, by_count: dict[int, list[list[bytes]]],
                   repeat: int) -> list[Figures]:
    """``repeat`` runs; in each, every variant passes over every candidate count's batches in turn."""
    runs = []
    freeze_heap()
    try:
        for r in range(repeat):
            figures: Figures = {}
            for count, raw_batches in by_count.items():
                for name, service in services.items():
                    for key, value in _pass(service, clock, raw_batches).items():
                        figures[f"c{count}_{name}_{key}"] = value
            runs.append(figures)
            say(f"run {r + 1}/{repeat}: " + ", ".join(
                f"{c} candidates {figures[f'c{c}_lightgbm_submissions_per_s']:.0f}/s" for c in by_count))
    finally:
        unfreeze_heap()
    return runs


def job_memory(store: FeatureStore, w: Workload) -> dict[str, Any]:
    """Bytes per tracked job by key kind, and the shared aggregates, after writing ``w``'s history."""
    seed_store(store, w)
    job_head, suffixes = _job_key_kinds(store.layout)
    keys = list(store.client.scan_iter(match=store.layout.pattern(), count=1000))
    pipe = store.client.pipeline(transaction=False)
    for k in keys:
        pipe.memory_usage(k, samples=0)
    sizes = pipe.execute()
    per_kind = dict.fromkeys(suffixes.values(), 0)
    shared = 0
    for key, size in zip(keys, sizes, strict=True):
        name = key.decode() if isinstance(key, bytes) else str(key)
        if name.startswith(job_head):
            per_kind[suffixes.get(name[name.rindex("}") + 1:], "job")] += int(size or 0)
        else:
            shared += int(size or 0)
    jobs = len({s.job_key for s in w.starts} | {f.job_key for f in w.finishes})
    per_job = {kind: total / jobs for kind, total in per_kind.items()}
    total = sum(per_job.values())
    return {"jobs": jobs, "finishes": len(w.finishes), "keys": len(keys),
            "finishes_per_job": round(len(w.finishes) / jobs, 2),
            "bytes_per_job": round(total, 1), "bytes_per_job_by_key": {k: round(v, 1) for k, v in per_job.items()},
            "shared_mb": round(shared / 1e6, 2), "gb_at_1m_jobs": round(total / 1e3, 3)}


def bench_growth(
    settings: Settings,
    candidates: Sequence[int] = (4, 24, 64),
    submissions: int = 2000,
    warm: int = 20000,
    memory_attempts: int = 50000,
    history: tuple[int, int] = (6, SERVED_PER_DAY),
    repeat: int = 3,
    seed: int = 0,
    model_dir: Any = None,
    trees: int | None = None,
) -> dict[str, Any]:
    """Run the growth benchmark and return its JSON report.

    Parameters
    ----------
    settings
        Redis connection (the key prefix is replaced by scratch ones, deleted at the end).
    candidates
        Candidate counts ranked side by side.
    submissions, warm
        Submissions ranked per pass; earlier attempts written to the store first.
    memory_attempts
        Attempts whose starts and finishes are written for the memory figure (0: skip it).
    history, repeat, seed, model_dir, trees
        As ``bench predict``: the model's simulated history (or a saved model), runs, fleet seed,
        an optional tree count.
    """
    began = time.perf_counter()
    catalogue = load_catalogue()
    model, model_info = served_model(catalogue, *history, seed, trees, model_dir, None)
    model.compile_trees(settings.compiled_dir)
    say(f"simulating {warm} + {submissions} attempts")
    w = make_workload(warm, submissions, seed + 1)
    padded = {c: with_candidates(w, c, catalogue) for c in candidates}
    prefixes = [scratch_prefix(), scratch_prefix()]
    store = open_store(settings, catalogue, prefix=prefixes[0])
    try:
        seed_store(store, w)
        clock = Clock()
        by_count = {c: [[s.encode() for s in b] for b in batches(p.submissions, PREDICT_BATCH)]
                    for c, p in padded.items()}
        models = {"lookup": lookup_fallback(), "lightgbm": ActiveModel(model, "bench-lightgbm")}
        runs = candidate_runs(_services(store, catalogue, clock, models, {}, no_redis=False), clock, by_count, repeat)
    finally:
        store.delete_all()
        store.client.close()
    memory = None
    if memory_attempts:
        say(f"writing {memory_attempts} attempts' starts and finishes for the memory figure")
        mem_store = open_store(settings, catalogue, prefix=prefixes[1])
        try:
            memory = job_memory(mem_store, make_workload(memory_attempts, 0, seed + 2))
        finally:
            mem_store.delete_all()
            mem_store.client.close()
    params = {"candidates": list(candidates), "submissions": submissions, "warm_attempts": warm, "seed": seed,
              "mean_candidates": {str(c): round(p.mean_candidates, 2) for c, p in padded.items()},
              "catalogue_size": len(catalogue.names()), "key_prefixes": prefixes, "model": model_info}
    return report("growth", params, runs, extra={"redis_memory": memory}, started=began)
