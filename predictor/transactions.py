"""Exactly-once rankings: a batch's rankings, dead letters and consumed offsets in one transaction.

A reader with ``isolation.level=read_committed`` (every LEAP reader of rankings) sees a transaction
whole or not at all. A predictor that dies mid-transaction leaves neither its rankings nor its
offsets behind: whoever takes its partitions ranks those submissions again, once.

- **one producer per worker**, ``transactional.id`` = the group and the worker's identity
  (:func:`worker_identity`): a restarted worker takes its predecessor's id, and
  ``init_transactions`` aborts whatever that one left open at once (instead of the broker
  aborting it after ``transaction.timeout.ms``, during which ``read_committed`` readers of the
  partitions it wrote wait). Offsets are sent with the consumer's group metadata (KIP-447): a
  zombie whose partitions moved on is refused by the group coordinator.
- **sends are buffered** for the length of a batch and produced once its handler returned: a
  transaction never stays open while a batch waits out a Redis outage.
- **commit**: when the loop finds nothing more to take, or once the open transaction is
  ``Settings.transaction_interval`` old, also while the next batch is being ranked (in a thread:
  the loop commits meanwhile). At low rates each batch is its own transaction; at high rates one
  transaction carries the batches produced within the interval.
- **errors** (librdkafka's classes): retriable ones are retried (the broker is away: said once,
  ``kafka is unavailable`` / ``kafka is back``); one that requires an abort aborts, and the
  transaction's batches (and one in flight, dropped) are handed back to the loop, which ranks
  them again. A fatal one is a fenced producer: the broker aborted a transaction that outlived its
  timeout (a worker starved of CPU, a broker restart) and bumped the producer's epoch, or a newer
  instance took this id. The loop then starts a new producer under the same id (which fences any
  other holder in turn) and hands the batches back the same way, as it does after any other
  failed call (a request that timed out while a restarted broker loaded its transaction log);
  more than :data:`MAX_RESTARTS` a minute (two live workers sharing an id) stop the worker
  (exit 75), nothing committed.
- **batches are kept until committed**, and handed back from memory rather than read again from
  the broker: the consumer never moves back. confluent-kafka's ``seek`` waits without a limit
  for the partition's fetcher to take it (a killed-broker test saw the loop stall for good after
  such a rewind), and librdkafka can replace a seek with a position it was still settling
  (confluentinc/librdkafka#2256), which loses the batches.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from leap.core.settings import Settings
from predictor.commits import ConsumedMessage, Offsets, batch_offsets, produce, producer_config
from streams.metrics import TRANSACTION_COMMIT
from streams.resilience import KAFKA
from streams.topics import deployment_headers

log = logging.getLogger("leap.predictor")

#: How long the broker lets a transaction stay open before aborting it itself (and the longest a
#: ranking waits in the producer, ``message.timeout.ms`` following it). Only a dead worker's
#: transaction (when no worker of its identity starts again) lasts that long, and it holds
#: ``read_committed`` readers of the partitions it wrote until then: it bounds failover when a kill
#: lands inside a transaction (docs/faults.md). Ours last a batch's produce and commit
#: (milliseconds; never a Redis wait), but a broker starved of CPU answered produce requests after
#: more than a second (load average 33 on 2 cores): at 2 s transactions of large batches kept timing
#: out and were ranked again, and a closed loop ranked nothing. 10 s is Kafka Streams' choice too.
TRANSACTION_TIMEOUT_S = 10.0
#: Longest a transactional call (init, commit, abort) waits before it is retried (resumed).
CALL_TIMEOUT_S = 10.0
#: How much longer than its own timeout a transactional call may take before the producer is given
#: up for stuck: librdkafka does not always enforce that timeout (after a broker restart
#: ``send_offsets_to_transaction`` waited on a decommissioned coordinator for minutes;
#: confluentinc/librdkafka#5456, #5511).
STUCK_MARGIN_S = 5.0
#: Longest a commit or an abort is retried through retriable failures before the producer is replaced.
GIVE_UP_S = 2 * CALL_TIMEOUT_S
#: First wait before a request is retried (librdkafka's default: 100 ms, doubling up to
#: ``retry.backoff.max.ms``). A transaction begun right after the previous one committed is refused
#: with CONCURRENT_TRANSACTIONS until the coordinator has written the previous one's markers
#: (milliseconds), and librdkafka retries ``send_offsets_to_transaction`` after this backoff: at
#: 100 ms, back-to-back transactions at 200 submissions/s put a 100 ms step into the tail
#: (KAFKA-5477 lowered the Java client's to 20 ms; confluent-kafka-python#967). docs/benchmarks.md.
RETRY_BACKOFF_MS = 10
#: How often a transactional call retried through retriable failures says it still is.
STILL_SAY_S = 10.0
#: Fenced producers replaced within a minute before the worker gives up (see the module docstring).
MAX_RESTARTS = 5

T = TypeVar("T")

_held_slots: list[int] = []  # lock files of worker identities this process holds (kept open for its life)


def worker_identity(settings: Settings, group: str) -> str:
    """This worker's identity within ``group``: ``Settings.worker_id``, or the host, its ``home``
    and the home's lowest free slot.

    A slot is an exclusive lock on a file under ``home/workers`` (released by the kernel when the
    process dies, even by ``kill -9``): a worker restarted on the same host and home takes the slot
    of the one it replaces, so its transactional id, and two live workers never share one (workers
    of other homes on the host have ids of their own: the home is part of it).
    """
    if settings.worker_id:
        return settings.worker_id
    host = socket.gethostname()
    folder = settings.home / "workers"
    folder.mkdir(parents=True, exist_ok=True)
    for slot in range(1024):
        fd = os.open(folder / f"{group}.{host}.{slot}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        _held_slots.append(fd)
        home = hashlib.sha256(str(settings.home.resolve()).encode()).hexdigest()[:8]
        return f"{host}-{home}-{slot}"
    raise RuntimeError(f"no free worker slot under {folder}")


class ExactlyOnce:
    """Transactional output of the predictor loop (:class:`predictor.commits.Output`).

    Parameters
    ----------
    settings
        Broker connection and ``transaction_interval``.
    consumer
        The loop's consumer (its group metadata goes with the offsets).
    assigned
        The loop's set of assigned partitions (shared, kept current by the loop).
    transactional_id
        Unique per live worker, the same for its replacement.
    """

    def __init__(self, settings: Settings, consumer: Consumer, assigned: set[tuple[str, int]],
                 transactional_id: str) -> None:
        self.consumer = consumer
        self.assigned = assigned
        self.interval = settings.transaction_interval
        self.transactional_id = transactional_id
        self.config = producer_config(settings, **{
            "transactional.id": transactional_id,
            "transaction.timeout.ms": int(TRANSACTION_TIMEOUT_S * 1000),
            "retry.backoff.ms": RETRY_BACKOFF_MS,
        })
        self.producer = Producer(self.config)
        self.headers = deployment_headers(settings)
        self.aborted = 0  # transactions aborted (and their batches handed back) so far
        self.restarts: list[float] = []  # when a fenced producer was replaced
        self.broken = False  # a transactional call failed for good: nothing more is tried, the worker exits
        self._buffer: list[tuple[str, bytes, bytes]] = []
        self._batch: list[ConsumedMessage] | None = None  # the batch in flight
        self._opened_at: float | None = None  # None: no transaction open
        self._offsets: Offsets = {}  # next offsets to commit with the open transaction
        self._held: list[ConsumedMessage] = []  # the open transaction's batches, in consumption order
        self._void = False  # the batch in flight was handed back with an aborted transaction: drop it
        self._start_producer()

    # ------------------------------------------------------------------ a batch

    def begin_batch(self, msgs: Sequence[ConsumedMessage]) -> None:
        self._batch = list(msgs)

    def send(self, topic: str, key: bytes, value: bytes) -> None:
        assert self._batch is not None, "a send outside a batch"
        self._buffer.append((topic, key, value))

    def end_batch(self, handled: bool) -> list[ConsumedMessage]:
        batch, self._batch = self._batch, None
        buffered, self._buffer = self._buffer, []
        void, self._void = self._void, False
        if not handled or batch is None or void:
            return []  # not produced: the worker exits, or the abort already handed it back
        offsets = batch_offsets(batch)
        if not offsets.keys() <= self.assigned:
            # A rebalance took some of its partitions meanwhile: their new owner ranks those
            # submissions, and the rest is handled again here.
            return self._still_ours(batch)
        self._batch = batch  # in flight until produced: a failure below hands it back with the rest
        try:
            if self._opened_at is None:
                self.producer.begin_transaction()
                self._opened_at = time.monotonic()
            for topic, key, value in buffered:
                produce(self.producer, topic, key, value, headers=self.headers)
        except KafkaException as exc:
            again = self._recover(exc)
            self._batch, self._void = None, False
            return again
        self._batch = None
        self._offsets.update(offsets)
        self._held += batch
        self.producer.poll(0)
        return []

    def due(self, idle: bool) -> bool:
        return self._opened_at is not None and (idle or time.monotonic() - self._opened_at >= self.interval)

    def until_due(self) -> float | None:
        """Seconds until the open transaction is due even while submissions keep arriving (None: none open)."""
        return None if self._opened_at is None else self._opened_at + self.interval - time.monotonic()

    @property
    def open(self) -> bool:
        return self._opened_at is not None

    # ------------------------------------------------------------------ commit, abort

    def commit(self, asynchronous: bool = True) -> list[ConsumedMessage]:
        """Commit the open transaction with its offsets. Returns its batches to handle again when
        it had to be aborted instead (empty when committed or when nothing was open)."""
        if self._opened_at is None or self.broken:
            return []
        offsets = [TopicPartition(t, p, o) for (t, p), o in self._offsets.items() if (t, p) in self.assigned]
        began = time.perf_counter()
        try:
            if offsets:
                # Unlike init, commit and abort, a timed-out send_offsets cannot be resumed (called
                # again, it is refused as a conflicting call in progress): a timeout replaces the
                # producer (_recover), whose successor aborts this transaction. librdkafka does not
                # always keep that timeout, so the call runs on a thread of its own and a producer
                # stuck in it is given up the same way (the loop must keep ranking).
                producer, metadata = self.producer, self.consumer.consumer_group_metadata()
                _bounded(lambda: producer.send_offsets_to_transaction(offsets, metadata, CALL_TIMEOUT_S),
                         "send_offsets_to_transaction")
                KAFKA.mark_up()
            # Bounded: a coordinator cached from before a broker restart can time every attempt
            # out (librdkafka#5511); a new producer finds the current one.
            self._call("commit_transaction", "committing", GIVE_UP_S)
        except KafkaException as exc:
            return self._recover(exc)
        except _Stuck as stuck:
            return self._replace(str(stuck))
        TRANSACTION_COMMIT.observe(time.perf_counter() - began)
        self._done()
        return []

    def abort(self) -> list[ConsumedMessage]:
        """Abort the open transaction; its batches (and one in flight) to handle again."""
        again = self._handed_back()
        if self._opened_at is not None and not self.broken:
            try:
                self._call("abort_transaction", "aborting", GIVE_UP_S)
            except KafkaException as exc:
                # fenced, or still failing: the new producer's init aborts what this one left open
                return self._replace(f"{'fenced' if _fatal(exc.args[0]) else 'failed'} while aborting "
                                     f"({exc.args[0].str()})", exc)
            except _Stuck as stuck:
                return self._replace(f"{stuck} while aborting")
            self.aborted += 1
        self._done()
        return again

    def _handed_back(self) -> list[ConsumedMessage]:
        """What the loop handles again when the open transaction is given up: its batches, then a
        batch in flight (which is dropped), of the partitions still assigned."""
        again = self._still_ours(self._held)
        if self._batch is not None:
            self._void = True
            again += self._still_ours(self._batch)
        return again

    def _still_ours(self, msgs: list[ConsumedMessage]) -> list[ConsumedMessage]:
        return [m for m in msgs if (m.topic, m.partition) in self.assigned]

    def _recover(self, exc: KafkaException) -> list[ConsumedMessage]:
        """After a failed transactional call: abort, or replace the producer; the batches to handle again.

        An error that requires an abort aborts. Any other (a fenced producer, or a call that failed
        otherwise: ``send_offsets_to_transaction`` whose request timed out while a restarted broker
        loaded its transaction log) replaces the producer without calling it again (a call after a
        failed one can wait for it for ever): the new one's ``init_transactions`` under the same id
        aborts what the old one left open. More than :data:`MAX_RESTARTS` replacements a minute
        leave the output :attr:`broken` and raise."""
        err = exc.args[0]
        if not _fatal(err) and err.txn_requires_abort():
            log.warning("transaction aborted (%s): its batches are read again", err.str())
            return self.abort()
        return self._replace(f"{'fenced' if _fatal(err) else 'failed'} ({err.str()})", exc)

    def _replace(self, why: str, exc: Exception | None = None) -> list[ConsumedMessage]:
        """Give the producer up and start a new one under the same id (its ``init_transactions``
        aborts what the old one left open, and fences it); the batches to handle again. More than
        :data:`MAX_RESTARTS` a minute leave the output :attr:`broken` and raise."""
        now = time.monotonic()
        self.restarts = [t for t in self.restarts if now - t < 60.0] + [now]
        if len(self.restarts) > MAX_RESTARTS:
            self.broken = True
            # another live worker holds this id: fencing each other, neither gets anywhere
            raise exc if exc is not None else RuntimeError(f"transactional producer {why}, {len(self.restarts)} "
                                                           "times in a minute")
        log.warning("transactional producer %s: a new one under %s; its batches are read again",
                    why, self.transactional_id)
        again = self._handed_back()
        try:
            self._start_producer()
        except _Stuck as stuck:  # counted as one more replacement: MAX_RESTARTS bounds the attempts
            self._done()
            self._replace(str(stuck))  # nothing more to hand back: all of it is in ``again``
            return again
        self._done()
        return again

    def _start_producer(self) -> None:
        """A new producer under this output's transactional id, its transactions initialised (which
        fences an older holder of the id and aborts what it left open). The producer it replaces
        is destroyed on a thread of its own: librdkafka's destroy joins the client's threads, which
        a fenced or stuck producer can keep busy, and the loop must not wait for that."""
        given_up = getattr(self, "producer", None)
        self.producer = Producer(self.config)
        if given_up is not None:
            # the thread holds the last reference: the destroy runs there, when it ends
            threading.Thread(target=_drop, args=(given_up,), name="leap-producer-destroy", daemon=True).start()
            del given_up
        self._call("init_transactions", "starting transactions")

    def _call(self, method: str, what: str, give_up_s: float | None = None) -> None:
        """The producer's transactional ``method`` (init, commit or abort: each takes its timeout and
        can be called again after one), bounded (:func:`_bounded`) and retried (:meth:`_retry`)."""
        self._retry(lambda: _bounded(lambda: getattr(self.producer, method)(CALL_TIMEOUT_S), method), what, give_up_s)

    def _done(self) -> None:
        self._opened_at = None
        self._offsets = {}
        self._held = []

    def _retry(self, call: Callable[[], T], what: str, give_up_s: float | None = None) -> T:
        """``call()``, again while it fails with a retriable error (the broker is away), saying so
        once; past ``give_up_s`` seconds of such failures the last one is raised (None: never).
        Every :data:`STILL_SAY_S` of failures it says so again with the last error: Kafka may have
        been marked unavailable before (by any client of the process), and a loop that retries
        without a word looks like one that hangs."""
        began = said = time.monotonic()
        while True:
            try:
                result = call()
            except KafkaException as exc:
                err = exc.args[0]
                if err.fatal() or not err.retriable():
                    raise
                now = time.monotonic()
                if give_up_s is not None and now - began > give_up_s:
                    raise
                KAFKA.mark_down(_Unavailable(f"{what}: {err.str()}"))
                if now - said >= STILL_SAY_S:
                    log.warning("still %s after %.0f s: %s", what, now - began, err.str())
                    said = now
                time.sleep(0.2)
                continue
            KAFKA.mark_up()
            return result

    # ------------------------------------------------------------------ the loop's events

    def keepalive(self) -> None:
        self.producer.poll(0)

    def revoke(self, gone: set[tuple[str, int]]) -> list[ConsumedMessage]:
        return self.commit()  # before the partitions go: their new owner starts where this transaction ends

    def lose(self, gone: set[tuple[str, int]]) -> None:
        self.abort()  # the offsets' generation is gone: the coordinator would refuse them

    def close(self) -> None:
        self.commit()
        if not self.broken:
            self.producer.flush(CALL_TIMEOUT_S)


def _drop(_producer: Producer) -> None:
    """Nothing: the thread's reference to the producer is released when it ends."""


class _Stuck(Exception):
    """A producer call outlived its own timeout by :data:`STUCK_MARGIN_S`."""


def _bounded(call: Callable[[], T], what: str) -> T:
    """A transactional call of the producer, given up for stuck :data:`STUCK_MARGIN_S` past
    :data:`CALL_TIMEOUT_S` (:func:`_within`). Every one is: librdkafka's coordinator requests do not
    check their timeout (confluentinc/librdkafka#5456), and a call that never returns would stop the
    loop without a word."""
    return _within(call, CALL_TIMEOUT_S + STUCK_MARGIN_S, what)


def _within(call: Callable[[], T], seconds: float, what: str) -> T:
    """``call()`` (named ``what``) on a thread of its own, raising :class:`_Stuck` when it has not
    returned within ``seconds`` (the thread is left to librdkafka; its producer is not called
    again) and what it raised otherwise."""
    failed: list[BaseException] = []
    result: list[T] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:  # handed to the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=run, name=f"leap-{what}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise _Stuck(f"stuck in {what} for more than {seconds:.0f} s")
    if failed:
        raise failed[0]
    return result[0]


def _fatal(err: KafkaError) -> bool:
    """Whether ``err`` says the producer is dead (fenced): a transactional call's error flags it
    fatal; ``produce`` refuses with the ``_FATAL`` code alone (its error carries no flags). A fenced
    producer is found out by either, whichever call comes first (the loop's next produce, often)."""
    return bool(err.fatal()) or err.code() == KafkaError._FATAL


class _Unavailable(Exception):
    """What :class:`streams.resilience.Dependency` logs for a retriable transactional error."""
