"""The predictor worker's loop: consume submissions, rank them, produce rankings, commit.

A plain librdkafka consumer around the batch handler (:func:`predictor.handler.handle_submissions`:
dead letters for bad input, one ranking per valid submission, a Redis outage waited out). What is
produced and how offsets are committed is the :class:`predictor.commits.Output`'s: in Kafka
transactions (``Settings.exactly_once``, the default, :mod:`predictor.transactions`) or at least
once (:class:`predictor.commits.AtLeastOnce`).

How a batch moves:

- **taking**: wait for the first submission (``poll``), then take what has already arrived
  (``consume(timeout=0)``): no batching window, so a lone submission is ranked at once and a
  burst makes the next batch larger. While a transaction is open the loop does not wait: finding
  nothing is what commits it;
- **a long batch** (a Redis outage): the consumer keeps polling with its partitions paused, so
  the group does not evict the worker for exceeding ``max.poll.interval.ms``; a partition a
  rebalance assigns is paused too while such a batch runs and resumed otherwise (librdkafka
  would keep an earlier pause across the rebalance);
- **an aborted transaction** hands its batches back (:class:`predictor.commits.Output` keeps
  them until committed): they are handled again before anything taken since, and the consumer
  never moves back (no ``seek``: :mod:`predictor.transactions` says why);
- **a failed handler or delivery** leaves the batch uncommitted and the worker exits
  (:data:`streams.app.EXIT_UNPROCESSED`); its replacement reads the batch again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from leap.core.settings import Settings
from predictor.commits import AtLeastOnce, ConsumedMessage, Output
from predictor.handler import PREDICT_BATCH_MAX, handle_submissions
from predictor.service import RankingService
from predictor.transactions import ExactlyOnce, worker_identity
from streams import metrics
from streams.app import EXIT_UNPROCESSED, Send
from streams.kafkalog import UNREACHABLE, KafkaUnreachable, client_logging
from streams.resilience import KAFKA, Abandoned, stop_waiting_when
from streams.topics import DEAD_LETTER, RANKINGS, READ_COMMITTED, SUBMISSIONS, consumer_group, session_timeout

log = logging.getLogger("leap.predictor")

#: Longest wait for a first submission before the loop looks at its timers and the stop flag.
IDLE_POLL_S = 0.1
#: A batch running longer than this (an outage being waited out) polls the paused consumer.
KEEPALIVE_S = 1.0
#: Lag gauge period (housekeeping's is ``Settings.catalogue_reload_interval``).
LAG_EVERY_S = 5.0
#: A member left without partitions this long says so (again every as long): its group is not
#: rebalancing it back in, and nothing else would show that the worker ranks nothing.
UNASSIGNED_SAY_S = 30.0


@dataclass(frozen=True)
class Routes:
    """Where the loop reads and writes: the LEAP topics and the predictor's group (tests use their
    own; ``None``: the deployment's, :func:`consumer_group`)."""

    submissions: str = SUBMISSIONS.name
    rankings: str = RANKINGS.name
    dead_letter: str = DEAD_LETTER.name
    group: str | None = None


def consumer_config(settings: Settings, group: str) -> dict[str, Any]:
    """The predictor's group member: commits only through its :class:`Output`, a new group starts
    at the end (nobody waits for rankings of old submissions), the worker's session timeout, and
    only committed submissions (a publisher's aborted transaction is never ranked)."""
    session_ms = int(session_timeout(settings) * 1000)
    return settings.confluent_config(**{
        "group.id": group,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "latest",
        **READ_COMMITTED,
        "session.timeout.ms": session_ms,
        "heartbeat.interval.ms": max(100, session_ms // 5),
        "fetch.wait.max.ms": 100,
    })


class ConfluentPredictor:
    """The predictor worker's consume, rank, produce, commit loop.

    Parameters
    ----------
    settings
        Broker connection, session timeout, ``exactly_once`` and ``transaction_interval``.
    service
        Ranks the submissions.
    housekeeping
        Called between batches every ``settings.catalogue_reload_interval`` seconds (price and
        operator hardware reload).
    routes
        Topics and consumer group (the LEAP ones by default).
    consumer_overrides
        librdkafka settings of the consumer over :func:`consumer_config`'s (tests, tuning).
    """

    def __init__(self, settings: Settings, service: RankingService,
                 housekeeping: Callable[[], object] | None = None, routes: Routes | None = None,
                 consumer_overrides: dict[str, Any] | None = None) -> None:
        self.service = service
        self.housekeeping = housekeeping
        self.routes = routes or Routes()
        self.group = self.routes.group or consumer_group(settings, "predictor")
        self.consumer = Consumer({**consumer_config(settings, self.group), **(consumer_overrides or {}),
                                  **client_logging()})
        self.revocations = 0  # partitions revoked or lost so far (rebalances seen by this member)
        self.assigned: set[tuple[str, int]] = set()
        self.output: Output
        if settings.exactly_once:
            self.output = ExactlyOnce(settings, self.consumer, self.assigned,
                                      f"{self.group}-{worker_identity(settings, self.group)}")
        else:
            self.output = AtLeastOnce(settings, self.consumer, self.assigned)
        self.stopping = False
        # handed back by an aborted transaction, or taken while a long batch kept the consumer polled
        self._stash: list[ConsumedMessage] = []
        self._paused = False
        self.housekeeping_every = settings.catalogue_reload_interval
        self._due = {"lag": 0.0, "housekeeping": time.monotonic() + self.housekeeping_every,
                     "unassigned": time.monotonic() + UNASSIGNED_SAY_S}
        self.send_ranking = self._sender(self.routes.rankings)
        self.send_dead_letter = self._sender(self.routes.dead_letter)

    def _sender(self, topic: str) -> Send:
        async def send(key: bytes, value: bytes) -> None:
            self.output.send(topic, key, value)
        return send

    # ------------------------------------------------------------------ group membership

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Take ``partitions`` on, paused while a long batch runs (:meth:`_await_handled` resumes
        the whole assignment when it ends), fetched otherwise.

        Resumed explicitly: librdkafka keeps a partition's pause across its revocation and
        re-assignment (confluentinc/librdkafka#1849). A long batch pauses the assignment; a
        rebalance in it (a killed broker moved the group's coordinator) revokes the partitions,
        the batch ends and resumes what is assigned then (nothing), and the partitions handed back
        stayed paused for good: the loop polled without a word and ranked nothing more.
        """
        self.assigned |= {(tp.topic, tp.partition) for tp in partitions}
        if self._paused:
            consumer.pause(partitions)
        else:
            consumer.resume(partitions)
        log.info("assigned %d partition(s) of %s", len(partitions), self.routes.submissions)

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        gone = {(tp.topic, tp.partition) for tp in partitions}
        again = self.output.revoke(gone)
        self._forget(gone)
        self._handle_again(again)

    def _on_lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        gone = {(tp.topic, tp.partition) for tp in partitions}
        self.output.lose(gone)  # nothing committed: they may be another's
        self._forget(gone)

    def _forget(self, gone: set[tuple[str, int]]) -> None:
        self.revocations += 1
        self.assigned -= gone
        self._stash = [m for m in self._stash if (m.topic, m.partition) not in gone]
        log.info("revoked %d partition(s)", len(gone))

    def _handle_again(self, msgs: list[ConsumedMessage]) -> None:
        """Handle ``msgs`` (an aborted transaction's batches, in consumption order) before anything
        taken since, which they precede. Those of partitions no longer assigned are their new
        owner's, who reads them from the group's committed offsets."""
        again = [m for m in msgs if (m.topic, m.partition) in self.assigned]
        if again:
            self._stash = again + self._stash
            log.info("handling %d submission(s) of an aborted transaction again", len(again))

    # ------------------------------------------------------------------ the loop

    def _take(self, wait: float) -> list[ConsumedMessage]:
        """What has arrived, after what was handed back or stashed, waiting up to ``wait`` seconds
        for a first message when there is none."""
        out, self._stash = self._stash[:PREDICT_BATCH_MAX], self._stash[PREDICT_BATCH_MAX:]
        raw: list[Message] = []
        if not out:
            first = self.consumer.poll(wait)
            if first is None:
                return []
            raw.append(first)
        room = PREDICT_BATCH_MAX - len(out) - len(raw)
        if room > 0:
            raw.extend(self.consumer.consume(room, timeout=0))
        return out + self._arrived(raw)

    def _arrived(self, msgs: list[Message]) -> list[ConsumedMessage]:
        """The submissions among ``msgs``; errors said, an unreachable broker marked down."""
        out = []
        for m in msgs:
            err = m.error()
            if err is None:
                out.append(ConsumedMessage(m))
            elif err.code() in UNREACHABLE:
                KAFKA.mark_down(KafkaUnreachable(err.str()))
            elif err.code() != KafkaError._PARTITION_EOF:
                log.warning("consumer error: %s", err)
        if out:
            KAFKA.mark_up()  # submissions arrive: the broker is back, if it was away
        return out

    async def _await_handled(self, work: Coroutine[Any, Any, object]) -> None:
        """Await a batch's handler (it ranks in a thread). Meanwhile commit what earlier batches
        left open once it is due (their rankings are not held for the length of this batch), and
        past :data:`KEEPALIVE_S` keep the paused consumer polled."""
        task = asyncio.ensure_future(work)
        started = time.monotonic()
        while True:
            left = self.output.until_due()
            await asyncio.wait((task,), timeout=KEEPALIVE_S if left is None else min(KEEPALIVE_S, max(left, 0.0)))
            if task.done():
                break
            if self.output.due(False):
                self._handle_again(self.output.commit())
            if time.monotonic() - started < KEEPALIVE_S:
                continue
            if not self._paused:
                self.consumer.pause(self.consumer.assignment())
                self._paused = True
                self._handle_again(self.output.commit())  # earlier batches: not held back by this one
            self.output.keepalive()
            msg = self.consumer.poll(0)
            if msg is not None:
                self._stash += self._arrived([msg])
        if self._paused:
            self.consumer.resume(self.consumer.assignment())
            self._paused = False
        task.result()

    async def _handle(self, batch: list[ConsumedMessage]) -> None:
        self.output.begin_batch(batch)
        handled = False
        try:
            await self._await_handled(handle_submissions(batch, self.service, self.send_ranking,
                                                         self.send_dead_letter))
            handled = True
        finally:
            self._handle_again(self.output.end_batch(handled))

    def _timers(self, idle: bool) -> None:
        if self.output.due(idle):
            self._handle_again(self.output.commit())
        now = time.monotonic()
        if now >= self._due["lag"]:
            self._export_lag()
            self._due["lag"] = now + LAG_EVERY_S
        if self.assigned:
            self._due["unassigned"] = now + UNASSIGNED_SAY_S
        elif now >= self._due["unassigned"]:
            log.warning("no partition of %s assigned to this member of %s for %.0f s", self.routes.submissions,
                        self.group, UNASSIGNED_SAY_S)
            self._due["unassigned"] = now + UNASSIGNED_SAY_S
        if now >= self._due["housekeeping"] and self.housekeeping is not None:
            self.housekeeping()
            self._due["housekeeping"] = now + self.housekeeping_every

    def _export_lag(self) -> None:
        parts = [TopicPartition(t, p) for t, p in self.assigned]
        for tp in self.consumer.position(parts) if parts else []:
            if tp.offset < 0:
                continue  # nothing read yet
            _, high = self.consumer.get_watermark_offsets(tp, cached=True)
            if high >= 0:
                metrics.CONSUMER_LAG.labels(tp.topic, str(tp.partition)).set(max(0, high - tp.offset))

    async def run(self) -> None:
        """Consume, rank and commit until :attr:`stopping`; then commit and leave the group."""
        self.consumer.subscribe([self.routes.submissions], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_lost)
        _RUNNING.add(self)
        try:
            while not self.stopping:
                # An open transaction is committed as soon as nothing more has arrived: no waiting then.
                msgs = self._take(0.0 if self.output.due(True) else IDLE_POLL_S)
                if msgs:
                    await self._handle(msgs)
                self._timers(idle=not msgs)
            self.output.close()
        finally:
            _RUNNING.discard(self)
            self.consumer.close()  # on_revoke commits what is open, never a failed batch


#: Loops running in this process: an outage wait gives up (:class:`Abandoned`) once one is stopping.
_RUNNING: set[ConfluentPredictor] = set()
stop_waiting_when(lambda: any(loop.stopping for loop in _RUNNING))


def serve(settings: Settings, service: RankingService, housekeeping: Callable[[], object] | None = None) -> None:
    """Run the predictor until SIGTERM/SIGINT (``leap worker predictor``).

    A batch whose handler or delivery failed stays uncommitted and the process exits with
    :data:`streams.app.EXIT_UNPROCESSED`.
    """
    loop = ConfluentPredictor(settings, service, housekeeping)

    def stop(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping after the current batch", signum)
        loop.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    run_or_exit(loop)


def serve_in_thread(settings: Settings, service: RankingService,
                    housekeeping: Callable[[], object] | None = None) -> tuple[ConfluentPredictor, threading.Thread]:
    """The predictor in a thread of a process that runs something else (``leap worker all``):
    stop it by setting ``loop.stopping`` and joining the thread."""
    loop = ConfluentPredictor(settings, service, housekeeping)
    thread = threading.Thread(target=run_or_exit, args=(loop,), name="leap-predictor", daemon=True)
    thread.start()
    return loop, thread


def run_or_exit(loop: ConfluentPredictor) -> None:
    """Run ``loop``; if a batch could not be finished, exit the process, the batch uncommitted."""
    try:
        asyncio.run(loop.run())
    except Abandoned as exc:
        log.warning("predictor: %s; the batch stays uncommitted; exiting", exc)
        _exit()
    except Exception:
        log.critical("predictor: a batch failed and stays uncommitted; exiting", exc_info=True)
        _exit()


def _exit() -> None:
    logging.shutdown()
    os._exit(EXIT_UNPROCESSED)
