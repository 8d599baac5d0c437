"""A fixed stream of start and finish events whose stored state is pinned in ``tests/data``.

:func:`apply_workload` writes them in batches of varied sizes (duplicates, late events, events
of one job and of one aggregate within a batch, lookup and pair windows that overflow);
:func:`dump_state` reads back every key. ``tests/data/store_state.json.gz`` holds the dump the
one-script-per-event store (commit 437666d) produced from these events; ``test_store`` checks
that the store of today stores exactly the same bytes.
"""

from __future__ import annotations

import random
from typing import Any

from features.store import FeatureStore
from streams.events import JobFinish, JobStart
from tests.factories import CANDIDATES, T0, finish_dict, start

FIXTURE = "store_state.json.gz"
MODELS = (("llama-7b", "dense_lm"), ("bert-base", None), ("llama-70b", "dense_lm"))


def events(seed: int = 13) -> list[list[JobStart | JobFinish]]:
    """The workload's batches, in order: each all starts or all finishes."""
    rng = random.Random(seed)
    jobs = [(f"j{i}", *MODELS[i % len(MODELS)]) for i in range(30)]
    hardware = [*CANDIDATES, "H100"]  # an alias: it lands in H100-SXM's field
    finishes: list[JobFinish] = []
    for i in range(1400):
        job, model, family = rng.choice(jobs[: 6 + i // 60])  # few jobs first: their windows fill
        outcome = rng.choice(("completed",) * 6 + ("failed", "preempted"))
        value = round(rng.lognormvariate(5, 0.6), rng.choice((0, 1, 3))) if outcome == "completed" else None
        d = finish_dict(job, f"e{i}", T0 + rng.uniform(0, 5000) + i, rng.choice(hardware), value, model_type=model,
                        family=family, outcome=outcome, num_accelerators=rng.choice((1, 2, 4, 8)))
        d["start_time"] = d["event_time"] - 60
        d.update(global_batch_size=rng.choice((None, 64, 512, 2048)), precision=rng.choice((None, "bf16", "fp32")))
        finishes.append(JobFinish.from_dict(d))
    stream: list[JobStart | JobFinish] = [*finishes, *rng.sample(finishes, 200)]  # redelivered finishes
    rng.shuffle(stream)
    batches: list[list[JobStart | JobFinish]] = []
    while stream:
        size = rng.choice((1, 2, 7, 50, 120, 500))
        batches.append(stream[:size])
        batches.append([start(ev.job_key, f"s-{ev.event_id}-{j}", ev.event_time - 100, ev.hardware)
                        for j, ev in enumerate(stream[:size]) if j % 3 == 0])
        stream = stream[size:]
    return batches


def apply_workload(store: FeatureStore, batches: list[list[JobStart | JobFinish]] | None = None) -> None:
    """Apply ``batches`` (default: all of :func:`events`) in order, one store call per batch."""
    for batch in events() if batches is None else batches:
        if batch and isinstance(batch[0], JobFinish):
            store.apply_finishes([ev for ev in batch if isinstance(ev, JobFinish)])
        else:
            store.apply_starts([ev for ev in batch if isinstance(ev, JobStart)])


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def dump_state(store: FeatureStore) -> dict[str, Any]:
    """Every key under the store's prefix (the prefix cut off): its fields or members, and whether it
    expires; without the lookup windows' sorted views (binary, derived from the windows: see
    :func:`sorted_views`)."""
    out: dict[str, Any] = {}
    prefix = store.layout.prefix
    for raw in store.client.scan_iter(match=store.layout.pattern(), count=1000):
        key = _text(raw)
        if key.endswith(":sorted"):  # only sorted views end so: other keys end with "}" or a short suffix
            continue
        kind = _text(store.client.type(key))
        if kind == "hash":
            value: Any = {_text(f): _text(v) for f, v in sorted(store.client.hgetall(key).items())}
        else:
            value = sorted(_text(m) for m in store.client.smembers(key))
        out[key[len(prefix):]] = {"value": value, "expires": store.client.ttl(key) > 0}
    return dict(sorted(out.items()))


def sorted_views(store: FeatureStore) -> dict[str, dict[str, bytes]]:
    """The lookup windows' sorted views: aggregate key (prefix cut off) -> hardware -> stored bytes."""
    out: dict[str, dict[str, bytes]] = {}
    prefix = store.layout.prefix
    for raw in store.client.scan_iter(match=store.layout.sorted_of(store.layout.pattern()), count=1000):
        key = _text(raw)
        aggregate = key.removesuffix(":sorted")
        out[aggregate[len(prefix):]] = {_text(f): v if isinstance(v, bytes) else v.encode()
                                        for f, v in store.client.hgetall(key).items()}
    return out
