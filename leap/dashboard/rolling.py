"""Bounded, O(1)-per-event building blocks of the dashboard aggregator.

Everything here has a fixed maximum size, so a dashboard left running for weeks on a busy
stream uses the same memory as after its first minute.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

OTHER = "(other)"


class BoundedMap(Generic[K, V]):
    """Insertion-ordered map that forgets its oldest entry beyond ``limit``.

    ``OrderedDict.popitem(last=False)`` is O(1); a plain dict's oldest key is not (its first
    slots fill with tombstones as the front is deleted).

    Parameters
    ----------
    limit
        Largest number of entries kept.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self.evicted = 0
        self._data: OrderedDict[K, V] = OrderedDict()

    def put(self, key: K, value: V) -> None:
        data = self._data
        if key in data:
            data.move_to_end(key)
        data[key] = value
        if len(data) > self.limit:
            data.popitem(last=False)
            self.evicted += 1

    def pop(self, key: K) -> V | None:
        return self._data.pop(key, None)

    def get(self, key: K) -> V | None:
        return self._data.get(key)

    def __len__(self) -> int:
        return len(self._data)


class SeenSet:
    """Remembers the last ``limit`` ids, to drop duplicates that a replay or a retry re-delivers."""

    def __init__(self, limit: int) -> None:
        self._order: deque[str] = deque()
        self._ids: set[str] = set()
        self.limit = limit

    def add(self, item: str) -> bool:
        """Record ``item``; ``False`` if it was seen among the last ``limit`` ids."""
        if item in self._ids:
            return False
        self._ids.add(item)
        self._order.append(item)
        if len(self._order) > self.limit:
            self._ids.discard(self._order.popleft())
        return True

    def __len__(self) -> int:
        return len(self._ids)


class LabelCounter:
    """Counts per label, with at most ``max_labels`` distinct labels (the rest go to ``(other)``).

    Labels come from the stream (hardware names, fallback reasons, model versions): a faulty
    producer must not be able to grow the dashboard's memory without bound.
    """

    def __init__(self, max_labels: int = 64) -> None:
        self.max_labels = max_labels
        self.counts: dict[str, int] = {}

    def add(self, label: str, n: int = 1) -> None:
        counts = self.counts
        if label in counts:
            counts[label] += n
        elif len(counts) < self.max_labels:
            counts[label] = n
        else:
            counts[OTHER] = counts.get(OTHER, 0) + n

    def top(self) -> list[tuple[str, int]]:
        return sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))


class PerSecond:
    """Event counts per wall-clock second over the last ``seconds`` seconds (a ring of buckets)."""

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds
        self._label = [-1] * seconds
        self._count = [0] * seconds

    def add(self, now: float, n: int = 1) -> None:
        second = int(now)
        i = second % self.seconds
        if self._label[i] != second:
            self._label[i] = second
            self._count[i] = 0
        self._count[i] += n

    def series(self, now: float) -> list[int]:
        """Counts of the last ``seconds`` whole seconds before ``now``, oldest first."""
        end = int(now)
        out = []
        for second in range(end - self.seconds, end):
            i = second % self.seconds
            out.append(self._count[i] if self._label[i] == second else 0)
        return out

    def rate(self, now: float, window: int) -> float:
        """Mean events per second over the last ``window`` complete seconds."""
        window = max(1, min(window, self.seconds))
        return sum(self.series(now)[-window:]) / window


class WindowSums:
    """Running sums of fixed-width numeric rows over the last ``size`` rows.

    Sums are updated by adding the new row and subtracting the one that falls out; they are
    recomputed from the window every ``size`` rows so that float rounding cannot accumulate.
    """

    def __init__(self, size: int, width: int) -> None:
        self.size = size
        self.width = width
        self.rows: deque[tuple[float, ...]] = deque()
        self.sums = [0.0] * width
        self._since_exact = 0

    def add(self, row: tuple[float, ...]) -> None:
        sums = self.sums
        self.rows.append(row)
        for j in range(self.width):
            sums[j] += row[j]
        if len(self.rows) > self.size:
            old = self.rows.popleft()
            for j in range(self.width):
                sums[j] -= old[j]
        self._since_exact += 1
        if self._since_exact >= self.size:
            self._since_exact = 0
            self.sums = [sum(r[j] for r in self.rows) for j in range(self.width)]

    def __len__(self) -> int:
        return len(self.rows)
