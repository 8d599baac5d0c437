"""One pipelined round trip per Redis node for a batch of commands, on one server or a Redis Cluster.

The store queues a batch's reads and Lua script calls on a :class:`Batch`; :meth:`Batch.execute`
sends each node's share as one pipeline and returns the replies in the order they were queued.
:meth:`Batch.scripts` runs one script over many events in as few calls as the server allows (one
per batch on one server, one per hash slot on a cluster).
On one server that is one round trip; on a Redis Cluster it is one per node the batch touches
(every key of one job, or of one aggregate, shares a hash tag and so a node: see
:mod:`features.keys`).

Why not redis-py's own pipelines: a plain pipeline that runs scripts asks ``SCRIPT EXISTS``
before every execute (a second round trip per batch), the cluster pipeline refuses ``EVALSHA``
altogether, and its per-command Python (packing, callbacks) cost more than Redis did for a read
of 256 job hashes. A batch is packed by hiredis into one buffer, written once on a pooled
connection of the node, and its replies read back with the connection's hiredis parser.
Scripts are called by SHA and loaded only when a node answers ``NOSCRIPT`` (a restarted or new
node); only the commands that failed are sent again, so a script
that ran is never run twice. A ``MOVED``/``ASK`` reply (slots moved between nodes) refreshes the
cluster's slot map and sends the refused commands to their new node.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import hiredis
import redis
from redis.cluster import RedisCluster
from redis.exceptions import AskError, ClusterDownError, MovedError, NoScriptError, TryAgainError

#: A client of one server or of a cluster.
Client = redis.Redis | RedisCluster

#: How often refused commands (NOSCRIPT, MOVED, ASK, TRYAGAIN) are sent again before giving up.
MAX_RESENDS = 3
#: Most events one script call applies (:meth:`Batch.scripts`): a script blocks the server while
#: it runs, so a batch of 500 finishes is cut into calls of a few milliseconds each.
MAX_EVENTS_PER_CALL = 128

#: One event of a batch script: its keys (they share a hash slot) and its arguments.
Item = tuple[tuple[str, ...], Sequence[Any]]


@dataclass(frozen=True)
class LuaScript:
    """A Lua script known by its SHA1, as ``EVALSHA`` calls it."""

    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


def _as_dict(reply: dict[bytes, bytes] | list[bytes]) -> dict[bytes, bytes]:
    """An ``HGETALL`` reply as a dict: RESP3 sends a map, RESP2 a flat field, value, ... list."""
    if isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2], strict=True))


@dataclass(frozen=True)
class _Command:
    args: tuple[Any, ...]
    key: str
    script: LuaScript | None = None
    convert: Any = None  # turns the raw reply into what the caller gets


def _read_replies(conn: Any, payload: bytes, count: int) -> list[Any]:
    """Write one packed batch and read its ``count`` replies; an error reply comes back as the
    exception redis-py's parser made of it, in its place, like ``execute(raise_on_error=False)``."""
    conn.send_packed_command([payload])
    replies: list[Any] = []
    for _ in range(count):
        try:
            replies.append(conn.read_response(disable_decoding=True))
        except redis.ResponseError as exc:
            replies.append(exc)
    return replies


def exchange(client: redis.Redis, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """One round trip to one server: ``commands`` packed into one write, their raw replies in order.

    A connection that fails is dropped and the batch sent again on a fresh one as the client's
    retry policy allows (as redis-py's pipelines do): reads repeat harmlessly and every store
    script is idempotent.
    """
    payload = b"".join([hiredis.pack_command(args) for args in commands])
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        replies: list[Any] = conn.retry.call_with_retry(lambda: _read_replies(conn, payload, len(commands)),
                                                        lambda _error: conn.disconnect())
        return replies
    except BaseException:
        conn.disconnect()  # replies may still be on the wire: nobody may read them as theirs
        raise
    finally:
        pool.release(conn)


class Batch:
    """Commands queued for one round trip per node.

    Parameters
    ----------
    client
        A ``redis.Redis`` or ``redis.cluster.RedisCluster`` (``decode_responses=False``).

    Notes
    -----
    Replies come back as redis-py's pipelines give them (``HGETALL`` a dict, ``HMGET`` a list);
    an error reply is raised after every command ran, like ``pipeline.execute()``.
    """

    def __init__(self, client: Client) -> None:
        self.client = client
        self._commands: list[_Command] = []

    def __len__(self) -> int:
        return len(self._commands)

    def hgetall(self, key: str) -> None:
        self._commands.append(_Command(("HGETALL", key), key, convert=_as_dict))

    def hmget(self, key: str, fields: Sequence[str]) -> None:
        self._commands.append(_Command(("HMGET", key, *fields), key))

    def unlink(self, key: str) -> None:
        self._commands.append(_Command(("UNLINK", key), key))

    def script(self, script: LuaScript, keys: Sequence[str], args: Sequence[Any]) -> None:
        """Queue ``EVALSHA`` of ``script``; its keys must share one hash tag on a cluster."""
        self._commands.append(_Command(("EVALSHA", script.sha, len(keys), *keys, *args), keys[0], script))

    def scripts(self, script: LuaScript, header: Sequence[Any], items: Sequence[Item],
                reply_width: int) -> Callable[[list[Any]], list[list[Any]]]:
        """Queue ``script`` over many events, as few calls as a server or a cluster allows.

        One server takes a whole batch in one call (up to :data:`MAX_EVENTS_PER_CALL` events each);
        a Redis Cluster refuses a script whose keys span hash slots, so there it is one call per
        slot (per job for the job scripts, per aggregate for the aggregates). Events of one key
        tuple are queued side by side, in the order given, so they apply in that order (a run cut
        between two calls is still in order: a node's calls run in the order of its pipeline). The script
        takes ``ARGV = header + per event: the index in KEYS of its first key, its arguments``,
        with each distinct key tuple in KEYS once, and returns ``reply_width`` values per event
        (the ``apply_all`` form of ``features/lua/window.lua``).

        Returns
        -------
        callable
            Maps :meth:`execute`'s replies to each event's reply values, in the order of ``items``.
        """
        groups: dict[int, list[int]] = {}
        slot = self.client.keyslot if isinstance(self.client, RedisCluster) else None
        for i, (first_keys, _) in enumerate(items):
            groups.setdefault(slot(first_keys[0]) if slot else 0, []).append(i)
        calls: list[tuple[int, list[int]]] = []
        for group in groups.values():
            # Events of one key side by side (in their order), so that a key's events share a call
            # and a script reads each key once per batch; events of different keys are independent.
            members = sorted(group, key=lambda i: items[i][0])
            for start in range(0, len(members), MAX_EVENTS_PER_CALL):
                chunk = members[start : start + MAX_EVENTS_PER_CALL]
                keys: list[str] = []
                where: dict[tuple[str, ...], int] = {}
                args: list[Any] = list(header)
                for i in chunk:
                    item_keys, item_args = items[i]
                    first = where.get(item_keys)
                    if first is None:
                        first = where[item_keys] = len(keys) + 1
                        keys.extend(item_keys)
                    args.append(first)
                    args.extend(item_args)
                calls.append((len(self._commands), chunk))
                self.script(script, keys, args)

        def per_event(replies: list[Any]) -> list[list[Any]]:
            out: list[list[Any]] = [[] for _ in items]
            for command, chunk in calls:
                flat = replies[command]
                for j, i in enumerate(chunk):
                    out[i] = flat[j * reply_width : (j + 1) * reply_width]
            return out

        return per_event

    def execute(self) -> list[Any]:
        """Send the batch; the replies in queued order. The batch is empty afterwards.

        Raises
        ------
        redis.ConnectionError
            When the cluster keeps refusing (down, or slots still moving after
            :data:`MAX_RESENDS`): an outage to wait out, not a bad event.
        redis.ResponseError
            The first error reply (e.g. a script that rejected its event), after every command ran.
        """
        commands, self._commands = self._commands, []
        replies: list[Any] = [None] * len(commands)
        pending = list(range(len(commands)))
        asking: dict[int, tuple[str, int]] = {}
        for attempt in range(MAX_RESENDS + 1):
            refused = self._send(commands, pending, asking, replies)
            if not refused:
                break
            if attempt == MAX_RESENDS:
                raise redis.ConnectionError(f"redis kept refusing the batch: {replies[refused[0]]}")
            asking = self._prepare_resend(commands, refused, replies)
            pending = refused
        for reply in replies:
            if isinstance(reply, ClusterDownError):
                raise redis.ConnectionError(f"redis cluster is down: {reply}")
            if isinstance(reply, Exception):
                raise reply
        return replies

    def _send(self, commands: list[_Command], pending: list[int], asking: dict[int, tuple[str, int]],
              replies: list[Any]) -> list[int]:
        """Send ``pending`` commands, one pipeline per node; returns those a node refused.

        ``asking`` maps a command to the node an ``ASK`` named: it goes there after ``ASKING``.
        """
        refused = []
        for node_client, indices in self._by_node(commands, pending, asking):
            sent: list[tuple[Any, ...]] = []
            for i in indices:
                if i in asking:
                    sent.append(("ASKING",))
                sent.append(commands[i].args)
            answers = iter(exchange(node_client, sent))
            for i in indices:
                if i in asking:
                    next(answers)
                reply = next(answers)
                convert = commands[i].convert
                replies[i] = convert(reply) if convert is not None and not isinstance(reply, Exception) else reply
                if isinstance(reply, NoScriptError | AskError | TryAgainError):
                    refused.append(i)
        return refused

    def _by_node(self, commands: list[_Command], pending: list[int],
                 asking: dict[int, tuple[str, int]]) -> list[tuple[redis.Redis, list[int]]]:
        if not isinstance(self.client, RedisCluster):
            return [(self.client, pending)]
        groups: dict[str, tuple[redis.Redis, list[int]]] = {}
        for i in pending:
            if i in asking:
                host, port = asking[i]
                node = self.client.get_node(host=host, port=port)
            else:
                node = self.client.get_node_from_key(commands[i].key)
            if node is None:  # a node the slot map does not know yet
                self.client.nodes_manager.initialize()
                node = self.client.get_node_from_key(commands[i].key)
            conn = self.client.get_redis_connection(node)
            groups.setdefault(node.name, (conn, []))[1].append(i)
        return list(groups.values())

    def _prepare_resend(self, commands: list[_Command], refused: list[int],
                        replies: list[Any]) -> dict[int, tuple[str, int]]:
        """Load missing scripts, refresh a moved slot map; the ``ASK`` targets of the next send."""
        if isinstance(self.client, RedisCluster) and any(isinstance(replies[i], MovedError) for i in refused):
            self.client.nodes_manager.initialize()
        for script in {commands[i].script for i in refused if isinstance(replies[i], NoScriptError)}:
            if script is not None:
                load_script(self.client, script)
        return {i: replies[i].node_addr for i in refused
                if isinstance(replies[i], AskError) and not isinstance(replies[i], MovedError)}


def load_script(client: Client, script: LuaScript) -> None:
    """Load ``script`` into every primary's script cache (one server: that server)."""
    if isinstance(client, RedisCluster):
        for node in client.get_primaries():
            client.get_redis_connection(node).script_load(script.source)
    else:
        client.script_load(script.source)
