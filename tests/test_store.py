"""The online store's update scripts and batched reads, on the real redis-server."""

from __future__ import annotations

import gzip
import hashlib
import json
import random
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from features.keys import JOB_WINDOW, KeyLayout
from features.layout import (
    COMPUTED_NUMBER,
    LOOKUP_FIELD,
    WINDOW_ENTRY,
    num,
    pack_window,
    text,
    unpack_window,
)
from features.offline import OfflineFeatureState
from features.snapshot import FeatureSnapshot
from features.sorted_view import pack_sorted_view
from features.store import FeatureStore
from leap.core.hardware import load_catalogue
from leap.replay.rebuild import RebuildResult, compare
from streams.events import JobFinish, JobStart, Submission
from tests.factories import T0, finish, start, submission
from tests.store_workload import FIXTURE, apply_workload, dump_state, sorted_views
from tests.store_workload import events as workload_events

pytestmark = pytest.mark.integration


def test_duplicate_finish_changes_nothing(store: FeatureStore) -> None:
    ev = finish("j", "e1", T0, "H100-SXM", 800.0)
    assert store.apply_finishes([ev]) == [1]
    before = store.read([submission("j", 1)])
    assert store.apply_finishes([ev, ev]) == [0, 0]
    assert store.read([submission("j", 1)]) == before
    assert before[0].prior["H100-SXM"].n == 1


def test_late_event_never_overwrites_newer_state(store: FeatureStore) -> None:
    store.apply_finishes([finish("j", "new", T0 + 100, "H100-SXM", 800.0)])
    store.apply_finishes([finish("j", "old", T0, "H100-SXM", 80.0)])
    prior = store.read([submission("j", 1)])[0].prior["H100-SXM"]
    assert (prior.last_time, prior.last) == (T0 + 100, 100.0)  # per accelerator: 800 / 8
    assert prior.n == 2 and prior.robust == pytest.approx((10.0 + 100.0) / 2)


def test_robust_estimate_ignores_a_straggler(store: FeatureStore) -> None:
    values = [800.0, 810.0, 790.0, 500.0, 805.0]  # one attempt 38% slower
    store.apply_finishes([finish("j", f"e{i}", T0 + i, "A100-80GB", v) for i, v in enumerate(values)])
    prior = store.read([submission("j", 1)])[0].prior["A100-80GB"]
    assert prior.robust == pytest.approx(800.0 / 8)
    assert prior.last == pytest.approx(805.0 / 8)


def test_window_keeps_only_the_newest(store: FeatureStore) -> None:
    store.apply_finishes([finish("j", f"e{i}", T0 + i, "T4", 8.0 * (i + 1)) for i in range(JOB_WINDOW + 5)])
    prior = store.read([submission("j", 1)])[0].prior["T4"]
    kept = list(range(6, JOB_WINDOW + 6))
    assert prior.n == JOB_WINDOW + 5
    assert prior.robust == pytest.approx(sum(kept[len(kept) // 2 - 1: len(kept) // 2 + 1]) / 2)


def test_aliases_land_in_one_field(store: FeatureStore) -> None:
    store.apply_finishes([finish("j", "a", T0, "H100", 80.0), finish("j", "b", T0 + 1, "H100-SXM", 80.0)])
    snap = store.read([submission("j", 1)])[0]
    assert set(snap.prior) == {"H100-SXM"} and snap.prior["H100-SXM"].n == 2


def test_failed_attempts_are_counted_without_a_throughput(store: FeatureStore) -> None:
    store.apply_finishes([finish("j", "f", T0, "MI300X", None, outcome="failed"),
                          finish("j", "p", T0 + 1, "MI300X", 40.0, outcome="preempted")])
    store.apply_starts([start("j", "s1", T0 - 10, "MI300X"), start("j", "s1", T0 - 10, "MI300X")])
    snap = store.read([submission("j", 1)])[0]
    assert (snap.failed, snap.preempted, snap.completed, snap.starts) == (1, 1, 0, 1)
    assert snap.prior["MI300X"].n == 1


class CountingConnection(redis.Connection):
    """A real connection that counts how many times it writes to the socket."""

    sends = 0

    def send_packed_command(self, command: object, check_health: bool = True) -> None:
        CountingConnection.sends += 1
        super().send_packed_command(command, check_health)


def _node_clients(client: Any) -> list[redis.Redis]:
    if isinstance(client, RedisCluster):
        return [client.get_redis_connection(node) for node in client.get_primaries()]
    return [client]


def _round_trips(store: FeatureStore, subs: list[Submission]) -> tuple[int, list[FeatureSnapshot], int]:
    """Round trips of one read, per node: a cluster's client gets counting connections on every node."""
    if isinstance(store.client, RedisCluster):
        node = store.client.get_default_node()
        client: Any = RedisCluster(host=node.host, port=node.port)
        nodes = len(client.get_primaries())
        for node_client in _node_clients(client):
            node_client.connection_pool.disconnect()
            node_client.connection_pool.reset()  # drop the discovery's connections: new ones count
            node_client.connection_pool.connection_class = CountingConnection
    else:
        kwargs = store.client.connection_pool.connection_kwargs
        pool = redis.ConnectionPool(connection_class=CountingConnection, **kwargs)
        client, nodes = redis.Redis(connection_pool=pool), 1
    for node_client in _node_clients(client):
        node_client.ping()  # the connection's handshake is not the read's round trip
    counted = FeatureStore(client, store.layout)
    CountingConnection.sends = 0
    snaps = counted.read(subs)
    return CountingConnection.sends, snaps, nodes


def test_batch_read_is_one_round_trip_per_node_without_priors(store: FeatureStore) -> None:
    store.apply_finishes([finish(f"j{i}", f"e{i}", T0, "L4", 10.0) for i in range(50)])
    sends, snaps, nodes = _round_trips(store, [submission(f"new{i}", i) for i in range(50)])
    assert sends == nodes and all(s.lookup_model["L4"].n == 50 for s in snaps)


def test_batch_read_with_priors_is_two_round_trips_per_node_whatever_its_size(store: FeatureStore) -> None:
    """The paired ratios a row needs depend on the job's priors, so they come in a second round trip."""
    store.apply_finishes([finish(f"j{i}", f"e{i}", T0, "L4", 10.0) for i in range(50)])
    for n in (1, 50):
        sends, snaps, nodes = _round_trips(store, [submission(f"j{i}", i) for i in range(n)])
        assert all(s.prior["L4"].n == 1 for s in snaps)
        # on a cluster each trip goes to the nodes its keys live on: at most one send per node
        assert sends == 2 if nodes == 1 else 2 <= sends <= 2 * nodes


def _random_events(rng: random.Random) -> list[JobStart | JobFinish]:
    """600 finishes and 200 starts of 12 jobs on 5 hardware types, 80 duplicated, shuffled."""
    hardware = ["H100-SXM", "H100", "A100-80GB", "TPU-v5p", "MI300X"]
    events: list[JobStart | JobFinish] = []
    for i in range(600):
        job = f"j{rng.randrange(12)}"
        hw = rng.choice(hardware)
        outcome = rng.choices(["completed", "failed", "preempted"], [0.85, 0.1, 0.05])[0]
        tput = None if outcome == "failed" else rng.uniform(1, 3000)
        events.append(finish(job, f"e{i}", T0 + rng.uniform(0, 1e5), hw, tput, outcome=outcome,
                             model_type=f"m{rng.randrange(4)}", family=f"f{rng.randrange(2)}"))
    events += [start(f"j{rng.randrange(12)}", f"s{i}", T0 + rng.uniform(0, 1e5), rng.choice(hardware))
               for i in range(200)]
    events += rng.sample(events, 80)  # duplicates
    rng.shuffle(events)  # and out of order
    return events


def test_scripts_agree_with_the_offline_replay(store: FeatureStore) -> None:
    """Random starts and finishes, duplicated and shuffled: Redis and the offline twin read alike."""
    offline = OfflineFeatureState(load_catalogue().canonical)
    events = _random_events(random.Random(3))
    for chunk in range(0, len(events), 97):
        batch = events[chunk: chunk + 97]
        store.apply_starts([ev for ev in batch if isinstance(ev, JobStart)])
        store.apply_finishes([ev for ev in batch if isinstance(ev, JobFinish)])
    for ev in events:
        if isinstance(ev, JobStart):
            offline.apply_start(ev)
        else:
            offline.apply_finish(ev)
    subs = [submission(f"j{k}", k, model_type=f"m{k % 4}", family=f"f{k % 2}") for k in range(12)]
    snaps = store.read(subs)
    assert snaps == [offline.snapshot(s) for s in subs]
    assert sum(s.starts for s in snaps) == 200 and all(s.prior for s in snaps)


def _random_submissions(rng: random.Random) -> list[Submission]:
    """300 submissions of 4 model types that say their parameter count, layout and framework (some
    leave one out), 40 duplicated, shuffled."""
    subs = []
    for i in range(300):
        tp = rng.choice([1, 2, 8])
        over: dict[str, Any] = {"model_type": f"m{i % 4}", "family": f"f{i % 2}",
                                "event_time": T0 + rng.uniform(0, 1e5), "params": rng.choice([1e9, 7e9, 7.5e9]),
                                "framework": rng.choice(["jax", "pytorch"]),
                                "num_accelerators": 16 * tp, "data_parallel": 16, "tensor_parallel": tp}
        if rng.random() < 0.2:
            over[rng.choice(["params", "framework", "tensor_parallel"])] = None
        subs.append(submission(f"s{i}", i, **over))
    subs += rng.sample(subs, 40)
    rng.shuffle(subs)
    return subs


def test_configuration_aggregates_agree_with_the_offline_replay(store: FeatureStore) -> None:
    """What submissions say of their optional fields, duplicated and shuffled: a partial submission
    reads the same configuration aggregates from Redis and from the offline twin."""
    offline = OfflineFeatureState(load_catalogue().canonical)
    subs = _random_submissions(random.Random(7))
    for chunk in range(0, len(subs), 97):
        store.apply_submissions(subs[chunk: chunk + 97])
    assert store.apply_submissions(subs[:5]) == [0] * 5  # every one a duplicate now
    for sub in subs:
        offline.apply_submission(sub)
    partial = [submission(f"new{k}", k, model_type=f"m{k % 4}", family=f"f{k % 2}", params=None,
                          data_parallel=None) for k in range(8)]
    snaps = store.read(partial)
    assert snaps == [offline.snapshot(s) for s in partial]
    assert all(s.config_model["params"].n > 20 and s.config_family for s in snaps)
    assert not store.read([submission("whole", 1)])[0].config_model  # read only for a partial submission


def test_reads_between_writes_find_the_new_pairs_as_the_offline_twin_does(store: FeatureStore) -> None:
    """The store asks the model-type and family levels only for the pair fields it has seen at
    the all level: a read after writes that created new pairs still reads what the twin does."""
    offline = OfflineFeatureState(load_catalogue().canonical)
    events = [ev for ev in _random_events(random.Random(5)) if isinstance(ev, JobFinish)]
    subs = [submission(f"j{k}", k, model_type=f"m{k % 4}", family=f"f{k % 2}") for k in range(12)]
    with_pairs = 0
    for chunk in range(0, len(events), 60):
        batch = events[chunk: chunk + 60]
        store.apply_finishes(batch)
        for ev in batch:
            offline.apply_finish(ev)
        snaps = store.read(subs)
        assert snaps == [offline.snapshot(s) for s in subs], chunk
        with_pairs += sum(bool(s.pairs) for s in snaps)
    assert with_pairs > 12


def test_rebuild_ignores_fields_that_older_versions_wrote(rds: redis.Redis, run_id: str) -> None:
    """Live hashes may still hold the retired ``_last_start*``; a replay never writes them."""
    live, replay = KeyLayout(f"live-{run_id}"), KeyLayout(f"replay-{run_id}")
    events = [finish("j", f"e{i}", T0 + i, "L4", 10.0 + i) for i in range(3)]
    starts = [start("j", "s1", T0 - 5, "L4")]
    stores = [FeatureStore(rds, lay) for lay in (live, replay)]
    try:
        for fs in stores:
            fs.apply_finishes(events)
            fs.apply_starts(starts)
        rds.hset(live.job("j"), mapping={"_last_start": "1789999995.0", "_last_start_id": "s1",
                                          "_last_start_hw": "L4"})
        result = RebuildResult()
        compare(rds, replay, live, ["j"], ["llama-7b"], ["dense_lm"], result)
        assert (result.mismatches, result.keys) == (0, 3)
        rds.hset(live.job("j"), "_starts", "2")  # a hand-edited counter is still reported
        result = RebuildResult()
        compare(rds, replay, live, ["j"], ["llama-7b"], ["dense_lm"], result)
        assert result.mismatches == 1 and result.details[0]["field"] == "_starts"
    finally:
        for fs in stores:
            fs.delete_all()


def test_batched_scripts_store_the_bytes_the_per_event_scripts_stored(store: FeatureStore) -> None:
    """Every key the workload leaves (fields, members, expiry) equals what one script call per event
    stored (pinned from commit 437666d): one call per batch or per slot changes no byte, no count."""
    pinned = json.loads(gzip.decompress((Path(__file__).parent / "data" / FIXTURE).read_bytes()))
    apply_workload(store)
    state = dump_state(store)
    assert state.keys() == pinned.keys()
    for key, stored in pinned.items():
        assert state[key] == stored, key
    _assert_views_describe_their_windows(store, state)


def _assert_views_describe_their_windows(store: FeatureStore, state: dict[str, Any]) -> None:
    """Every lookup window has a sorted view, and each view holds its window's SHA1, its entries'
    times and lengths, and its values in order (what the scripts add to without parsing the window)."""
    views = sorted_views(store)
    windows = {key.removesuffix(":win"): stored["value"] for key, stored in state.items()
               if key.startswith(":lookup:") and key.endswith(":win")}
    assert windows and views.keys() == windows.keys()
    for aggregate, by_hw in windows.items():
        assert views[aggregate].keys() == by_hw.keys(), aggregate
        for hw, packed in by_hw.items():
            entries = unpack_window(packed)
            want = pack_sorted_view(hashlib.sha1(packed.encode()).hexdigest(), [float(e[0]) for e in entries],
                                    [len(WINDOW_ENTRY.pack(*e).encode()) for e in entries],
                                    sorted(float(e[2]) for e in entries))
            assert views[aggregate][hw] == want, (aggregate, hw)


def test_windows_without_their_sorted_views_are_parsed_into_the_same_bytes(store: FeatureStore) -> None:
    """A deployment's windows from before the sorted views (or a view lost or stale): the scripts
    parse those windows as before; the workload stores the same bytes as when every view was there."""
    pinned = json.loads(gzip.decompress((Path(__file__).parent / "data" / FIXTURE).read_bytes()))
    batches = workload_events()
    finishes_seen = 0
    for i, batch in enumerate(batches):
        apply_workload(store, [batch])
        finishes_seen += isinstance(batch[0], JobFinish)
        if i % 7 == 3:  # now and then every view goes, or goes stale (a window re-written by hand)
            for aggregate in sorted_views(store):
                key = store.layout.sorted_of(store.layout.prefix + aggregate)
                if i % 2:
                    store.client.delete(key)
                else:  # each field gets the view of another window: a SHA1 that matches nothing
                    views = list(store.client.hgetall(key).items())
                    store.client.hset(key, mapping={f: views[j - 1][1] for j, (f, _) in enumerate(views)})
    assert finishes_seen > 10
    state = dump_state(store)
    assert state == pinned
    _assert_views_describe_their_windows(store, state)


def test_a_window_left_out_of_order_is_put_in_order_by_the_next_observation(store: FeatureStore) -> None:
    """A window some other writer stored out of (time, id) order is sorted when an event enters it."""
    agg = store.layout.lookup_model("llama-7b")
    entries = [(num(T0 + 5), "b", "2.0"), (num(T0), "a", "1.0"), (num(T0 + 5), "a2", "3.0")]
    store.client.hset(store.layout.window_of(agg), "L4", pack_window(entries))
    store.apply_finishes([finish("j", "new", T0 + 1, "L4", 80.0)])  # 10 per accelerator
    stored = text(store.client.hget(store.layout.window_of(agg), "L4") or b"")
    want = sorted([*entries, (num(T0 + 1), "new", num(10.0))], key=lambda e: (float(e[0]), e[1]))
    assert stored == pack_window(want)
    assert text(store.client.hget(agg, "L4") or b"") == LOOKUP_FIELD.pack(1, COMPUTED_NUMBER % 2.5)
