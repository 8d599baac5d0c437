"""Ranks a batch of submissions: read features, build rows, predict once, price, rank.

Free of Kafka so the predictor agent, topic replay and the benchmarks share it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from features.completion import complete
from features.rows import Rows, build_batch_rows
from features.store import FeatureStore
from leap.core.hardware import Catalogue
from predictor.basis import candidate_bases
from predictor.models import LookupTable, PairedTransfer, ThroughputModel
from predictor.ranking import (
    COLD_START,
    HISTORY_FALLBACK,
    PARTIAL_SUBMISSION,
    PEAK_BOUND,
    bound_by_peak,
    history_where_params_unknown,
    rank_candidates,
    specs_only_reasons,
)
from streams.events import RANKING_SCHEMA_VERSION, Ranking, Submission, ranking_id

#: Band used around a cold-start roofline estimate: it may be off by about 2x either way.
COLD_START_BAND = (0.5, 2.0)
NO_TRAINED_MODEL = "no_trained_model"


@dataclass(frozen=True)
class ActiveModel:
    model: ThroughputModel
    version: str
    fallback: str | None = None  # set when this model is itself a fallback (e.g. lookup only)


class ModelHolder:
    """The model in use; swapped atomically when a new model is promoted."""

    def __init__(self, active: ActiveModel) -> None:
        self._active = active
        self._lock = threading.Lock()

    @property
    def active(self) -> ActiveModel:
        return self._active  # one reference read: a batch sees one model from start to end

    def swap(self, active: ActiveModel) -> ActiveModel:
        with self._lock:
            previous, self._active = self._active, active
        return previous


def served_estimates(model: ThroughputModel, rows: Rows) -> tuple[np.ndarray, ...]:
    """What is served per row: the model's prediction and band and each row's estimate label, with
    the cold-start roofline where the model has none, the paired transfer where the parameter count
    is unknown, and the part's peak as the ceiling. Returns ``pred, lower, upper, estimate`` and the
    masks ``cold``, ``from_history``, ``cut`` (which of those three applied)."""
    pred, estimate = model.predict_explained(rows)
    lower, upper = model.predict_band(pred, rows)
    cold = np.isnan(pred) & np.isfinite(rows["log_roofline"])
    if cold.any():
        roofline = np.exp(rows["log_roofline"][cold])
        pred[cold] = roofline
        lower[cold] = roofline * COLD_START_BAND[0]
        upper[cold] = roofline * COLD_START_BAND[1]
        estimate[cold] = "cold_start"
    pred, lower, upper, from_history = history_where_params_unknown(pred, lower, upper, rows)
    if from_history.any():  # the paired transfer stood in: say which of its columns answered
        estimate = np.where(from_history, PairedTransfer().predict_explained(rows)[1], estimate)
    pred, lower, upper, cut = bound_by_peak(pred, lower, upper, rows)
    estimate = np.where(cut, "peak_bound", estimate)  # what is served is the bound, not the estimate cut
    return pred, lower, upper, estimate, cold, from_history, cut


def lookup_fallback() -> ActiveModel:
    """What the predictor runs when the registry has no promoted model yet."""
    return ActiveModel(LookupTable(), "lookup-0", NO_TRAINED_MODEL)


class RankingService:
    """Turns submissions into rankings.

    Parameters
    ----------
    store
        Online feature store; one pipelined read per batch.
    catalogue
        Hardware specs (row builder) and prices (ranking).
    holder
        The model currently in use.
    """

    def __init__(self, store: FeatureStore, catalogue: Catalogue, holder: ModelHolder) -> None:
        self.store = store
        self.catalogue = catalogue
        self.holder = holder

    def rank(self, subs: Sequence[Submission], received: Sequence[float] | None = None) -> list[Ranking]:
        """One ranking per submission, in order. ``received`` = arrival times (``time.time()``)."""
        if not subs:
            return []
        start = time.time()
        received = received if received is not None else [start] * len(subs)
        active = self.holder.active
        snaps = self.store.read(subs)
        rows = build_batch_rows(subs, snaps, self.catalogue)
        pred, lower, upper, estimate, cold, from_history, cut = served_estimates(active.model, rows)

        out: list[Ranking] = []
        offset = 0
        for sub, snap, arrived in zip(subs, snaps, received, strict=True):
            n = len(sub.candidates)
            span = slice(offset, offset + n)
            offset += n
            reasons: list[str | None] = [COLD_START if c else HISTORY_FALLBACK if h else PEAK_BOUND if b else None
                                         for c, h, b in zip(cold[span], from_history[span], cut[span], strict=True)]
            reasons = specs_only_reasons(sub.candidates, reasons, active.model.trained_hardware(), self.catalogue)
            stand_ins = complete(sub, snap.config_model, snap.config_family)[1]  # field -> what stood in
            bases = candidate_bases(snap, rows, span, pred, estimate, stand_ins)
            priced = rank_candidates(
                sub.candidates, sub.num_accelerators, pred[span], lower[span], upper[span], reasons, self.catalogue,
                bases,
            )
            fallbacks = sorted({r for r in (c["reason"] for c in priced.candidates) if r}
                               | ({snap.fallback} if snap.fallback else set())
                               | ({PARTIAL_SUBMISSION} if stand_ins else set()))
            if active.fallback:
                fallbacks.insert(0, active.fallback)
            now = time.time()
            out.append(
                Ranking(
                    schema_version=RANKING_SCHEMA_VERSION,
                    event_id=ranking_id(sub.event_id),
                    event_time=now,
                    job_key=sub.job_key,
                    attempt_id=sub.attempt_id,
                    submission_event_id=sub.event_id,
                    submission_time=sub.event_time,
                    model_version=active.version,
                    candidates=tuple(priced.candidates),
                    best_hardware=priced.best,
                    features_used={**snap.to_json(), "stand_ins": stand_ins} if stand_ins else snap.to_json(),
                    fallback=",".join(fallbacks) if fallbacks else None,
                    latency_ms=max(0.0, (now - arrived) * 1000.0),
                    since_submit_ms=max(0.0, (now - sub.event_time) * 1000.0),
                )
            )
        return out
