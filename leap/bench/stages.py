"""Stage clocks around :meth:`RankingService.rank`, without changing the service.

The service is timed as it is: the store and the model are replaced by subclasses that time
their own calls, and the row builder (a module-level function the service imports) is wrapped
for the duration of a pass. What remains of ``rank`` after those three is pricing, ranking and
building the :class:`Ranking` records.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

import predictor.service as service_module
from features.rows import Rows
from features.snapshot import FeatureSnapshot
from features.store import FeatureStore
from predictor.models import ThroughputModel
from streams.events import Submission


class Clock:
    """Seconds spent per stage since the last :meth:`take`."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}

    def add(self, stage: str, seconds: float) -> None:
        self.spent[stage] = self.spent.get(stage, 0.0) + seconds

    def take(self) -> dict[str, float]:
        out, self.spent = self.spent, {}
        return out


class TimedStore(FeatureStore):
    """The store, with its batched read timed."""

    def __init__(self, inner: FeatureStore, clock: Clock) -> None:
        super().__init__(inner.client, inner.layout)
        self._hw = inner._hw
        self.clock = clock

    def read(self, submissions: Sequence[Submission]) -> list[FeatureSnapshot]:
        t0 = time.perf_counter()
        try:
            return super().read(submissions)
        finally:
            self.clock.add("read", time.perf_counter() - t0)


class PrefetchedStore(TimedStore):
    """Serves snapshots read beforehand: the ranking loop with Redis taken out (DESIGN §9's loop)."""

    def __init__(self, inner: FeatureStore, clock: Clock, snapshots: dict[str, FeatureSnapshot]) -> None:
        super().__init__(inner, clock)
        self.snapshots = snapshots

    def read(self, submissions: Sequence[Submission]) -> list[FeatureSnapshot]:
        t0 = time.perf_counter()
        out = [self.snapshots[s.event_id] for s in submissions]
        self.clock.add("read", time.perf_counter() - t0)
        return out


class TimedModel(ThroughputModel):
    """A model with ``predict`` and ``predict_band`` timed together as the model stage."""

    kind = "timed"

    def __init__(self, inner: ThroughputModel, clock: Clock) -> None:
        super().__init__()
        self.inner = inner
        self.clock = clock

    def _predict_log(self, rows: Rows) -> np.ndarray:
        return self.inner._predict_log(rows)

    def predict(self, rows: Rows) -> np.ndarray:
        t0 = time.perf_counter()
        try:
            return self.inner.predict(rows)
        finally:
            self.clock.add("predict", time.perf_counter() - t0)

    def predict_explained(self, rows: Rows) -> tuple[np.ndarray, np.ndarray]:
        t0 = time.perf_counter()
        try:
            return self.inner.predict_explained(rows)
        finally:
            self.clock.add("predict", time.perf_counter() - t0)

    def predict_band(self, pred: np.ndarray, rows: Rows | None = None) -> tuple[np.ndarray, np.ndarray]:
        t0 = time.perf_counter()
        try:
            return self.inner.predict_band(pred, rows)
        finally:
            self.clock.add("predict", time.perf_counter() - t0)


@contextmanager
def timed_rows(clock: Clock) -> Iterator[None]:
    """Time the service's row building (one ``build_batch_rows`` per batch)."""
    names = ("build_batch_rows",)
    originals = {n: getattr(service_module, n) for n in names}

    def wrap(fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                clock.add("rows", time.perf_counter() - t0)

        return timed

    for n, fn in originals.items():
        setattr(service_module, n, wrap(fn))
    try:
        yield
    finally:
        for n, fn in originals.items():
            setattr(service_module, n, fn)
