"""``bench features``: online-store write and read throughput against the real Redis.

Writes: :meth:`FeatureStore.apply_finishes` (and ``apply_starts``) in batches of 500, first with
new events, then the same events again (a replay: every one is a duplicate). Reads:
:meth:`FeatureStore.read` of 256 submissions per call; next to it, in the same run and batch by
batch, two anchors: the first round trip of a read (the same ``HGETALL`` commands, one write,
replies not parsed into snapshots), and DESIGN §9's ceiling, one ``MGET`` of 256 packed values
(eight features of each job in one string, split on arrival).

Every run writes under its own scratch key prefix, deleted at the end of the run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from features.layout import text
from features.redis_batch import Batch, _Command
from features.store import FeatureStore, open_store
from leap.bench.common import Figures, freeze_heap, percentiles_ms, report, say, scratch_prefix, unfreeze_heap
from leap.bench.workload import WRITE_BATCH, Workload, batches, make_workload
from leap.core.hardware import load_catalogue
from leap.core.settings import Settings, redact
from streams.events import Submission

READ_BATCH = 256


def _timed_writes(apply: Any, events: Sequence[Any]) -> tuple[float, int]:
    """Seconds to apply ``events`` in write batches, and how many were applied (not duplicates)."""
    applied = 0
    t0 = time.perf_counter()
    for i in range(0, len(events), WRITE_BATCH):
        applied += sum(apply(events[i : i + WRITE_BATCH]))
    return time.perf_counter() - t0, applied


def _raw_read(store: FeatureStore, subs: Sequence[Submission]) -> list[Any]:
    """The first round trip of :meth:`FeatureStore.read` (job hashes, the batch's distinct lookup
    hashes), without turning the replies into snapshots."""
    batch = Batch(store.client)
    lay = store.layout
    for sub in subs:
        batch.hgetall(lay.job(sub.job_key))
    for model in dict.fromkeys(s.model_type for s in subs):
        batch.hgetall(lay.lookup_model(model))
    for family in dict.fromkeys(s.family for s in subs if s.family is not None):
        batch.hgetall(lay.lookup_family(family))
    return batch.execute()


class _AnchorBatch(Batch):
    """A batch that also sends the packed anchor's ``SET`` and ``MGET``: commands the store never
    sends, so they are kept out of :mod:`features.redis_batch` (whose commands the store's ACL
    user is granted, `docs/security.md`)."""

    def mget(self, keys: Sequence[str]) -> None:
        """Values of ``keys`` (on a cluster they must share one hash slot)."""
        self._commands.append(_Command(("MGET", *keys), keys[0]))

    def set(self, key: str, value: str) -> None:
        self._commands.append(_Command(("SET", key, value), key))


def _packed_key(prefix: str, job_key: str) -> str:
    return f"{prefix}:packed:{{anchor}}:{job_key}"  # one hash tag: a cluster serves the MGET from one slot


def _write_packed(store: FeatureStore, subs: Sequence[Submission]) -> None:
    """The anchor's values: eight numbers per job in one string (what a packed layout would store)."""
    batch = _AnchorBatch(store.client)
    values = ",".join(["12", "1790000000.5", "101.25", "99.5", "3", "1", "0", "0"])
    for sub in dict.fromkeys(s.job_key for s in subs):
        batch.set(_packed_key(store.layout.prefix, sub), values)
    batch.execute()


def _packed_read(store: FeatureStore, subs: Sequence[Submission]) -> list[list[bytes]]:
    """DESIGN §9's ceiling: one MGET of the batch's packed values, each split into its features."""
    batch = _AnchorBatch(store.client)
    batch.mget([_packed_key(store.layout.prefix, s.job_key) for s in subs])
    return [v.split(b",") for v in batch.execute()[0]]


def redis_bytes(store: FeatureStore) -> dict[str, float]:
    """Bytes Redis holds under the store's prefix (``MEMORY USAGE``, every sample), per tracked job:
    the job's own keys (hash, window, seen-set, pairs) and the shared aggregates (lookups,
    configurations, pair windows) spread over the same jobs."""
    keys = [text(k) for k in store.client.scan_iter(match=store.layout.pattern(), count=1000)]
    pipe = store.client.pipeline(transaction=False)
    for key in keys:
        pipe.memory_usage(key, samples=0)
    sizes = [int(n or 0) for n in pipe.execute()] if keys else []
    owners = [store.layout.job_of(k) for k in keys]
    jobs = len({job for job in owners if job is not None}) or 1
    job_bytes = sum(n for job, n in zip(owners, sizes, strict=True) if job is not None)
    return {"redis_bytes_per_job": sum(sizes) / jobs, "redis_job_keys_bytes_per_job": job_bytes / jobs,
            "redis_shared_bytes_per_job": (sum(sizes) - job_bytes) / jobs, "redis_tracked_jobs": float(jobs)}


def run_once(settings: Settings, w: Workload, read_rounds: int, prefix: str) -> Figures:
    """One run in a fresh scratch prefix (deleted before returning)."""
    store = open_store(settings, load_catalogue(), prefix=prefix)
    try:
        starts_s, _ = _timed_writes(store.apply_starts, w.starts)
        fin_s, applied = _timed_writes(store.apply_finishes, w.finishes)
        dup_s, reapplied = _timed_writes(store.apply_finishes, w.finishes)
        if applied != len(w.finishes) or reapplied != 0:
            raise RuntimeError(f"unexpected write results: {applied} new, {reapplied} re-applied duplicates")

        read_batches = batches(w.submissions, READ_BATCH)
        full = [b for b in read_batches if len(b) == READ_BATCH] or read_batches
        parsed: list[float] = []
        raw: list[float] = []
        packed: list[float] = []
        known = sum(1 for s in store.read(w.submissions) if s.prior) / max(1, len(w.submissions))
        memory = redis_bytes(store)
        _write_packed(store, w.submissions)
        for _ in range(read_rounds):
            # Alternate the read paths batch by batch, so all see the same machine load.
            for b in full:
                t0 = time.perf_counter()
                store.read(b)
                t1 = time.perf_counter()
                _raw_read(store, b)
                t2 = time.perf_counter()
                _packed_read(store, b)
                t3 = time.perf_counter()
                parsed.append(t1 - t0)
                raw.append(t2 - t1)
                packed.append(t3 - t2)
        entities = sum(len(b) for b in full) * read_rounds
        figures: Figures = {
            "write_finishes_events_per_s": len(w.finishes) / fin_s,
            "write_finishes_duplicates_per_s": len(w.finishes) / dup_s,
            "write_starts_events_per_s": len(w.starts) / starts_s,
            "read_entities_per_s": entities / sum(parsed),
            "read_raw_pipeline_entities_per_s": entities / sum(raw),
            "read_packed_mget_entities_per_s": entities / sum(packed),
            "read_over_packed_mget": sum(packed) / sum(parsed),
            "read_parse_share": (sum(parsed) - sum(raw)) / sum(parsed),
            "read_known_job_share": known,
            **memory,
            **percentiles_ms(parsed, "read_batch"),
            **percentiles_ms(raw, "read_raw_batch"),
        }
        return figures
    finally:
        store.delete_all()
        store.client.close()


def bench_features(
    settings: Settings, events: int = 20000, reads: int = 4096, read_rounds: int = 5, repeat: int = 3, seed: int = 0
) -> dict[str, Any]:
    """Run the features benchmark ``repeat`` times and return its JSON report.

    Parameters
    ----------
    settings
        Redis connection (the key prefix is replaced by a scratch one).
    events
        Finish (and start) events written per run.
    reads
        Submissions read per round, in batches of 256.
    read_rounds
        Passes over those submissions per run.
    repeat
        Runs; the report holds medians.
    seed
        Fleet seed.
    """
    began = time.perf_counter()
    say(f"simulating {events} attempts and {reads} later submissions")
    w = make_workload(events, reads, seed)
    prefix = scratch_prefix()
    freeze_heap()
    try:
        runs = []
        for r in range(repeat):
            runs.append(run_once(settings, w, read_rounds, f"{prefix}-r{r}"))
            say(f"run {r + 1}/{repeat}: {runs[-1]['write_finishes_events_per_s']:.0f} finishes/s, "
                f"{runs[-1]['read_entities_per_s']:.0f} entities/s read")
    finally:
        unfreeze_heap()
    params = {"events": len(w.finishes), "measured_finishes": sum(f.throughput is not None for f in w.finishes),
              "write_batch": WRITE_BATCH, "reads": len(w.submissions), "read_batch": READ_BATCH,
              "read_rounds": read_rounds, "seed": seed, "key_prefix": prefix, "redis": redact(settings.redis_url)}
    return report("features", params, runs, started=began)
