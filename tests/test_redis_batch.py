"""Batches of reads and script calls, one pipeline per node, on the real server and the real cluster."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from features.redis_batch import Batch, LuaScript

pytestmark = pytest.mark.integration

#: Counts its own runs per key, so a script that ran twice shows.
COUNT = LuaScript("count", "return redis.call('INCR', KEYS[1])")
#: Rejects its call, like a store script given an event it cannot apply.
REJECT = LuaScript("reject", "return redis.error_reply('rejected ' .. ARGV[1])")


def _flush_scripts(client: Any) -> None:
    nodes = ([client.get_redis_connection(n) for n in client.get_primaries()]
             if isinstance(client, RedisCluster) else [client])
    for node in nodes:
        node.script_flush()


def test_replies_come_back_in_queued_order_across_nodes(store_client: Any, run_id: str) -> None:
    keys = [f"rb-{run_id}:{{k{i}}}" for i in range(40)]  # forty hash tags: every node of a cluster
    for i, key in enumerate(keys):
        store_client.hset(key, "i", str(i))
    batch = Batch(store_client)
    for key in keys:
        batch.hgetall(key)
        batch.hmget(key, ["i", "missing"])
    replies = batch.execute()
    assert replies[0::2] == [{b"i": str(i).encode()} for i in range(40)]
    assert replies[1::2] == [[str(i).encode(), None] for i in range(40)]
    assert len(batch) == 0
    for key in keys:
        store_client.delete(key)


def test_an_empty_script_cache_is_refilled_and_no_script_runs_twice(store_client: Any, run_id: str) -> None:
    keys = [f"rb-{run_id}:{{c{i}}}" for i in range(12)]
    _flush_scripts(store_client)  # as after a restart: the server knows no script
    batch = Batch(store_client)
    for key in keys + keys:
        batch.script(COUNT, keys=[key], args=[])
    assert batch.execute() == [1] * 12 + [2] * 12
    assert [int(store_client.get(k)) for k in keys] == [2] * 12
    for key in keys:
        store_client.delete(key)


def test_an_error_reply_is_raised_after_every_command_ran(store_client: Any, run_id: str) -> None:
    good, bad = f"rb-{run_id}:{{g}}", f"rb-{run_id}:{{b}}"
    batch = Batch(store_client)
    batch.script(REJECT, keys=[bad], args=["this"])
    batch.script(COUNT, keys=[good], args=[])
    with pytest.raises(redis.ResponseError, match="rejected this"):
        batch.execute()
    assert int(store_client.get(good)) == 1
    store_client.delete(good)


def test_the_local_cluster_has_three_masters_covering_every_slot(cluster_settings: Any) -> None:
    from features.store import redis_client

    client = redis_client(cluster_settings)
    assert isinstance(client, RedisCluster)
    primaries = client.get_primaries()
    assert len(primaries) == 3
    info = client.get_redis_connection(primaries[0]).execute_command("CLUSTER", "INFO").decode()
    assert "cluster_state:ok" in info and "cluster_slots_assigned:16384" in info


#: Echoes each event's first key and argument in the batch form (``apply_all`` of window.lua).
ECHO = LuaScript("echo", """
local out = {}
for i = 2, #ARGV, 2 do
  out[#out + 1] = KEYS[tonumber(ARGV[i])]
  out[#out + 1] = ARGV[i + 1]
end
return out
""")


def test_a_batch_script_takes_one_call_per_server_or_per_slot(store_client: Any, run_id: str) -> None:
    """Many events, one script call on one server; on a cluster one per hash slot (its keys must share
    one), each event's keys once in KEYS and the replies mapped back to the events in order."""
    tags = [f"{{t{i % 7}}}" for i in range(40)]
    items = [((f"rb-{run_id}:{tag}", f"rb-{run_id}:{tag}:w"), (f"arg{i}",)) for i, tag in enumerate(tags)]
    batch = Batch(store_client)
    per_event = batch.scripts(ECHO, ("header",), items, 2)
    calls = len(batch)
    replies = per_event(batch.execute())
    assert [[r.decode() for r in reply] for reply in replies] == [[keys[0], args[0]] for keys, args in items]
    slots = {store_client.keyslot(keys[0]) for keys, _ in items} if isinstance(store_client, RedisCluster) else {0}
    assert calls == len(slots)


def test_a_batch_on_a_connection_the_server_dropped_is_sent_again_on_a_new_one(rds: redis.Redis, run_id: str) -> None:
    """Batches write on pooled connections themselves: one the server closed between two batches is
    replaced and the batch answered, as redis-py's own pipelines did."""
    if isinstance(rds, RedisCluster):
        pytest.skip("one server's connection pool")
    kwargs = rds.connection_pool.connection_kwargs
    client = redis.Redis(connection_pool=redis.ConnectionPool(max_connections=1, **kwargs))
    key = f"rb-{run_id}:{{dropped}}"
    client.hset(key, "f", "1")
    ours = client.client_id()  # the pool's one connection
    rds.client_kill_filter(_id=str(ours))
    batch = Batch(client)
    batch.hgetall(key)
    assert batch.execute() == [{b"f": b"1"}]
    assert client.client_id() != ours
    rds.delete(key)
    client.close()
