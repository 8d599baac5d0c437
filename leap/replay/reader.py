"""Reading a fixed slice of topics with confluent-kafka: plan, read, report gaps.

Partitions are assigned explicitly (no group membership, no commits), so a replay never moves
a worker's offsets. The end of every partition is fixed when the plan is made: a replay of a
live topic ends instead of following new traffic.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn, TimeRemainingColumn
from rich.text import Text

from leap.core.settings import Settings
from leap.replay.timespec import Bound
from streams.topics import READ_COMMITTED

#: Give up on a partition that yields nothing (no message, no end-of-partition) for this long.
STALL_TIMEOUT_S = 30.0
PKey = tuple[str, int]
_CONSUMER: dict[str, str | int | float | bool] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    # End-of-partition events tell us a partition whose last offsets are transaction markers
    # (or compacted away) is finished even though no message with offset end-1 arrives.
    "enable.partition.eof": True,
    # Report, rather than silently jump over, offsets deleted by retention while we read.
    "auto.offset.reset": "error",
    "fetch.wait.max.ms": 50,
    **READ_COMMITTED,
}


class ReplayError(RuntimeError):
    """A replay that cannot start (unknown topic, broker unreachable); carries a user message."""


@dataclass(frozen=True)
class TopicRange:
    """A topic and the bounds to read it between (``start`` inclusive, ``end`` exclusive)."""

    topic: str
    start: Bound
    end: Bound


@dataclass
class PartitionPlan:
    """Offsets to read on one partition: ``[start, end)``, fixed before reading."""

    topic: str
    partition: int
    low: int
    high: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


@dataclass
class Tally:
    """What a replay saw: messages, bad events by reason, gaps and notes (never fatal)."""

    messages: int = 0
    bad: Counter[str] = field(default_factory=Counter)
    bad_examples: list[dict[str, Any]] = field(default_factory=list)
    gaps: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add_bad(self, msg: Message, reason: str, error: str, keep: int = 5) -> None:
        self.bad[reason] += 1
        if len(self.bad_examples) < keep:
            self.bad_examples.append(
                {"topic": msg.topic(), "partition": msg.partition(), "offset": msg.offset(), "reason": reason,
                 "error": error[:300]}
            )

    def to_json(self) -> dict[str, Any]:
        return {"messages": self.messages, "bad_events": sum(self.bad.values()), "bad_by_reason": dict(self.bad),
                "bad_examples": self.bad_examples, "gaps": self.gaps, "notes": self.notes}


class _RateColumn(ProgressColumn):
    """Events per second, which rich has no column for (its speed column is for bytes)."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.0f} ev/s" if speed else "- ev/s", style="progress.data.speed")


class RateLimiter:
    """Paces a loop to at most ``rate`` events per second (``None`` = unlimited)."""

    def __init__(self, rate: float | None) -> None:
        self.interval = 1.0 / rate if rate else 0.0
        self._next = time.monotonic()

    def wait(self, n: int = 1) -> None:
        if not self.interval:
            return
        self._next = max(self._next, time.monotonic() - 1.0) + n * self.interval
        delay = self._next - time.monotonic()
        if delay > 0.001:  # sleeping for less costs more than it saves
            time.sleep(delay)


def open_consumer(settings: Settings) -> Consumer:
    """A consumer that is never part of a group: librdkafka needs a group id, we never use it."""
    return Consumer(settings.confluent_config(**{"group.id": f"leap-replay-{uuid.uuid4().hex[:12]}", **_CONSUMER}))


def list_partitions(consumer: Consumer, topic: str) -> list[int]:
    """Partition ids of a topic; :class:`ReplayError` if the broker does not know it."""
    try:
        meta = consumer.list_topics(topic, timeout=10)
    except KafkaException as exc:
        raise ReplayError(f"cannot reach Kafka: {exc}") from None
    info = meta.topics.get(topic)
    if info is None or info.error is not None or not info.partitions:
        reason = info.error.str() if info is not None and info.error is not None else "no partitions"
        raise ReplayError(f"topic {topic!r} does not exist ({reason})")
    return sorted(info.partitions)


def _resolve(consumer: Consumer, topic: str, parts: Sequence[int], bound: Bound, default: str,
             marks: dict[int, tuple[int, int]]) -> dict[int, int]:
    """Offset of ``bound`` on each partition; ``default`` ('low'/'high') for an open bound."""
    if bound.kind == "open":
        return {p: marks[p][0 if default == "low" else 1] for p in parts}
    if bound.kind == "offset":
        return {p: bound.value for p in parts}
    found = consumer.offsets_for_times([TopicPartition(topic, p, bound.value) for p in parts], timeout=10)
    # -1: no record at or after that time, i.e. the bound lies beyond the end of the log.
    return {tp.partition: tp.offset if tp.offset >= 0 else marks[tp.partition][1] for tp in found}


def make_plan(consumer: Consumer, ranges: Sequence[TopicRange], partitions: set[int] | None,
              tally: Tally) -> list[PartitionPlan]:
    """Fix ``[start, end)`` on every partition of every range; note deleted and empty spans."""
    plans: list[PartitionPlan] = []
    for rng in ranges:
        parts = [p for p in list_partitions(consumer, rng.topic) if partitions is None or p in partitions]
        marks = {p: consumer.get_watermark_offsets(TopicPartition(rng.topic, p), timeout=10) for p in parts}
        starts = _resolve(consumer, rng.topic, parts, rng.start, "low", marks)
        ends = _resolve(consumer, rng.topic, parts, rng.end, "high", marks)
        for p in parts:
            low, high = marks[p]
            start, end = starts[p], min(ends[p], high)
            if start < low:
                tally.gaps.append({"topic": rng.topic, "partition": p, "from": start, "to": low,
                                   "reason": "deleted before the log start (retention or delete-records)"})
                start = low
            elif rng.start.kind == "time" and start == low and low > 0:
                tally.notes.append(f"{rng.topic}[{p}]: log starts at offset {low}; records before it were deleted, "
                                   f"so the range may begin earlier than the retained data")
            start = min(start, high)
            plans.append(PartitionPlan(rng.topic, p, low, high, start, max(start, end)))
    if plans and not any(pl.size for pl in plans):
        tally.notes.append("no data in the requested range")
    return plans


class Reader:
    """Yields every message of a plan once, then stops.

    Parameters
    ----------
    settings
        Connection settings.
    ranges
        Topics and bounds.
    partitions
        Restrict to these partition ids (``None`` = all).
    rate_limit
        At most this many messages per second.
    progress
        Show a rich progress bar (on stderr) with rate and time left.
    """

    def __init__(self, settings: Settings, ranges: Sequence[TopicRange], partitions: set[int] | None = None,
                 rate_limit: float | None = None, progress: bool = True, console: Console | None = None) -> None:
        self.settings = settings
        self.tally = Tally()
        self.console = console or Console(stderr=True)
        self._progress = progress and self.console.is_terminal
        self._limiter = RateLimiter(rate_limit)
        self._consumer = open_consumer(settings)
        try:
            self.plan = make_plan(self._consumer, ranges, partitions, self.tally)
        except BaseException:
            self._consumer.close()
            raise

    @property
    def total(self) -> int:
        return sum(p.size for p in self.plan)

    def __iter__(self) -> Generator[Message, None, None]:
        try:
            yield from self._read()
        finally:
            self._consumer.close()

    def _read(self) -> Iterator[Message]:
        todo = {(p.topic, p.partition): p for p in self.plan if p.size}
        if not todo:
            return
        pos = {k: p.start for k, p in todo.items()}
        self._consumer.assign([TopicPartition(t, p, pl.start) for (t, p), pl in todo.items()])
        columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:,}/{task.total:,}"),
                   _RateColumn(), TimeRemainingColumn())
        with Progress(*columns, console=self.console, disable=not self._progress, transient=False) as bar:
            task = bar.add_task("replay", total=self.total)
            last_progress = time.monotonic()
            while todo:
                batch = self._consumer.consume(num_messages=1000, timeout=0.5)
                if not batch and time.monotonic() - last_progress > STALL_TIMEOUT_S:
                    for (t, p), pl in todo.items():
                        self.tally.gaps.append({"topic": t, "partition": p, "from": pos[(t, p)], "to": pl.end,
                                                "reason": f"no data for {STALL_TIMEOUT_S:.0f}s; gave up"})
                    break
                advanced = 0
                for msg in batch:
                    key = (msg.topic() or "", msg.partition() or 0)
                    err = msg.error()
                    if err is not None:
                        advanced += self._on_error(err, key, todo, pos, msg.offset())
                        continue
                    found = todo.get(key)
                    offset = msg.offset()
                    if found is None or offset is None:
                        continue  # a partition already finished: prefetched beyond its end
                    if offset >= found.end:
                        advanced += self._finish(key, todo, pos)
                        continue
                    advanced += offset + 1 - pos[key]
                    pos[key] = offset + 1
                    self.tally.messages += 1
                    self._limiter.wait()
                    yield msg
                    if offset + 1 >= found.end:
                        advanced += self._finish(key, todo, pos)
                if advanced:
                    last_progress = time.monotonic()
                    bar.update(task, advance=advanced)

    def _finish(self, key: PKey, todo: dict[PKey, PartitionPlan], pos: dict[PKey, int]) -> int:
        pl = todo.pop(key, None)
        if pl is None:
            return 0
        self._consumer.incremental_unassign([TopicPartition(pl.topic, pl.partition)])
        return max(0, pl.end - pos[key])

    def _on_error(self, err: KafkaError, key: PKey, todo: dict[PKey, PartitionPlan],
                  pos: dict[PKey, int], at: int | None) -> int:
        code = err.code()
        if code == KafkaError._PARTITION_EOF:
            plan = todo.get(key)
            if plan is not None and at is not None and 0 <= at < plan.end:
                # An end below the planned one (a fetch that saw an older high watermark): the
                # records up to the plan's end exist, so keep reading; the stall timeout still
                # ends a partition that really shrank.
                return 0
            return self._finish(key, todo, pos)
        if code in (KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET) and key in todo:
            # Retention deleted the segment we were about to read: skip to the new log start.
            pl = todo[key]
            low, _ = self._consumer.get_watermark_offsets(TopicPartition(pl.topic, pl.partition), timeout=10)
            self.tally.gaps.append({"topic": pl.topic, "partition": pl.partition, "from": pos[key],
                                    "to": min(low, pl.end), "reason": "deleted while reading (retention)"})
            skipped = max(0, min(low, pl.end) - pos[key])
            if low >= pl.end:
                return skipped + self._finish(key, todo, pos)
            pos[key] = low
            self._consumer.incremental_unassign([TopicPartition(pl.topic, pl.partition)])
            self._consumer.incremental_assign([TopicPartition(pl.topic, pl.partition, low)])
            return skipped
        if err.fatal():
            raise ReplayError(f"Kafka error: {err.str()}")
        self.tally.notes.append(f"kafka: {err.str()}")  # transient (broker reconnects etc.): keep reading
        return 0
