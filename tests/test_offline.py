"""features.offline: the configuration aggregates' queues keep only what the windows will hold, and
read back exactly what inserting every observation in arrival order gives (``lookup.lua``'s
order, which ``tests/test_store.py`` checks the twin against on a real Redis)."""

from __future__ import annotations

import pickle
import random
from typing import Any

import pytest

from features.keys import LOOKUP_WINDOW
from features.offline import OfflineFeatureState, all_with_pairs
from leap.core.hardware import load_catalogue
from streams.events import Submission
from tests.factories import T0, finish, submission


def _submissions(rng: random.Random, n: int, disorder: float) -> list[Submission]:
    """``n`` submissions of 3 model types with unique ids, mostly in time order: a share
    ``disorder`` of them arrive late, and some share a time (ids order the tie)."""
    subs = []
    for i in range(n):
        t = T0 + i // 3  # three a second: ties
        if rng.random() < disorder:
            t -= rng.uniform(0, 400)
        over: dict[str, Any] = {"model_type": f"m{i % 3}", "family": "f" if i % 3 else None, "event_time": t,
                                "params": rng.choice([1e9, 7e9, 7.5e9]), "framework": rng.choice(["jax", "pytorch"]),
                                "tensor_parallel": (tp := rng.choice([1, 2])), "num_accelerators": 16 * tp,
                                "data_parallel": 16}
        if rng.random() < 0.2:
            over[rng.choice(["params", "framework", "tensor_parallel"])] = None
        subs.append(submission(f"j{i}", i, **over))
    return subs


def _partial(k: int) -> Submission:
    return submission(f"new{k}", 10_000 + k, model_type=f"m{k % 3}", family="f", params=None)


def _states() -> tuple[OfflineFeatureState, OfflineFeatureState]:
    """One state told ids are unique (its queues compact), one not (every observation kept)."""
    names = load_catalogue().canonical
    return OfflineFeatureState(names, unique_ids=True), OfflineFeatureState(names)


@pytest.mark.parametrize("disorder", [0.0, 0.05, 0.5])
def test_compacted_queues_read_what_every_observation_inserted_in_order_gives(disorder: float) -> None:
    subs = _submissions(random.Random(3), 1500, disorder)
    compact, whole = _states()
    for i, sub in enumerate(subs):
        compact.apply_submission(sub)
        whole.apply_submission(sub)
        if i % 400 == 399:  # a partial submission reads the aggregates, and later ones queue anew
            for k in range(3):
                assert compact.snapshot(_partial(k)) == whole.snapshot(_partial(k))
    snaps = [compact.snapshot(_partial(k)) for k in range(3)]
    assert snaps == [whole.snapshot(_partial(k)) for k in range(3)]
    assert all(s.config_model["params"].n > LOOKUP_WINDOW for s in snaps)  # more arrived than a window holds
    if disorder == 0.0:  # nothing but the windows' share is kept
        queued = compact._config_queue.values()
        assert all(len(q.head) <= LOOKUP_WINDOW and q.rest is None for qs in queued for q in qs.values())


@pytest.mark.parametrize("disorder", [0.0, 0.05])
def test_forgetting_a_day_gives_what_never_queuing_it_gives(disorder: float) -> None:
    """:meth:`drop_config_before` (a resumed training run whose window moved on), also after a
    pickle round trip (the row cache's checkpoint), equals a replay without the forgotten ones."""
    subs = _submissions(random.Random(5), 1500, disorder)
    cut = T0 + 200.5
    compact, _ = _states()
    for sub in subs:
        compact.apply_submission(sub)
    compact = pickle.loads(pickle.dumps(compact))
    assert compact.drop_config_before(cut)
    never, _ = _states()
    for sub in subs:
        if sub.event_time >= cut:
            never.apply_submission(sub)
    assert [compact.snapshot(_partial(k)) for k in range(3)] == [never.snapshot(_partial(k)) for k in range(3)]
    assert not compact.drop_config_before(cut + 10)  # read once, a window cannot forget


def test_observations_sharing_a_time_are_ordered_by_their_ids() -> None:
    """A hundred observations of one time arriving in descending id order: only the first is the
    newest; once the window is full each later one is older than every kept one and dropped, as
    ``lookup.lua`` drops it."""
    subs = [submission(f"j{i:03d}", 0, event_id=f"sub-{999 - i:03d}", model_type="m0", family="f")
            for i in range(100)]
    compact, whole = _states()
    for sub in subs:
        compact.apply_submission(sub)
        whole.apply_submission(sub)
    snap = compact.snapshot(_partial(0))
    assert snap == whole.snapshot(_partial(0))
    assert snap.config_model["params"].n == LOOKUP_WINDOW


def test_paired_ratios_summarised_later_in_a_batch_are_those_of_the_moment_asked() -> None:
    """A replay defers its snapshots' paired ratios to the row batch: the windows asked at each
    submission, summarised together after the state has moved on, give what an immediate snapshot
    gave (a window read is never changed; each summary depends on its own window only)."""
    rng = random.Random(5)
    parts = ["L4", "H100-SXM", "MI300X", "A100-80GB"]
    state = OfflineFeatureState(load_catalogue().canonical)
    asked, immediate = [], []
    for i in range(600):
        job = f"j{rng.randrange(40)}"
        state.apply_finish(finish(job, f"f{i}", T0 + i, rng.choice(parts), rng.uniform(50, 500),
                                  num_accelerators=rng.choice([8, 16])))
        if i % 3 == 0:
            sub = submission(job, i, event_time=T0 + i + 0.5, candidates=parts,
                             global_batch_size=rng.choice([256, 1024]))
            asked.append(state.unpaired_snapshot(sub, candidates=parts[:2]))
            immediate.append(state.snapshot(sub, candidates=parts[:2]))
    snaps, asks = zip(*asked, strict=True)
    assert all_with_pairs(snaps, asks) == immediate
    assert sum(bool(s.pairs) for s in immediate) > 100  # most had paired ratios to summarise
