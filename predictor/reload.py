"""Promotion announcements on the compacted ``leap.models`` topic, and hot reload in predictors.

Every predictor reads the whole (compacted) topic itself, without a consumer group: an
announcement must reach all of them, not one per group. At start-up it catches up to the end
(so it starts with the current model), then follows in a background thread. A new model is
loaded off the hot path and swapped in between two batches: a batch is ranked entirely by one
model, and no submission is dropped or ranked twice across the swap. Its trees are then compiled
(:mod:`predictor.compiled`) in a thread of their own, into ``Settings.compiled_dir``: until that
is done (seconds from the cache, minutes for a new model) LightGBM's predict gives the same output.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from leap.core.settings import Settings
from predictor.compiled import CompiledTrees
from predictor.lgbm import LightGBMThroughput
from predictor.models import ThroughputModel
from predictor.registry import ModelRecord, Registry
from predictor.service import ActiveModel, ModelHolder
from streams import metrics
from streams.events import SCHEMA_VERSION, EventError, ModelAnnouncement
from streams.kafkalog import client_logging
from streams.topics import CURRENT_MODEL_KEY, MODELS, end_offsets

log = logging.getLogger("leap.reload")


def announcement(record: ModelRecord | None, version: str | None = None) -> ModelAnnouncement:
    """The announcement that ``record`` (a promotion, or a rollback to a registered version) or the
    baseline ``version`` (a rollback to ``lookup``: no artifact, no metrics) is now current.

    Raises
    ------
    EventError
        When the announcement would not pass its own contract: the project never publishes one
        that the predictors' decoder rejects (they would ignore it and keep the old model).
    """
    event = ModelAnnouncement(
        schema_version=SCHEMA_VERSION,
        event_id=f"model:{uuid.uuid4().hex}",
        event_time=time.time(),
        model_version=record.version if record is not None else str(version),
        kind=record.kind if record is not None else "lookup",
        artifact=str(record.path) if record is not None else None,
        metrics=record.metadata.get("metrics") if record is not None else None,
    )
    return ModelAnnouncement.decode(event.encode())


def announce(settings: Settings, record: ModelRecord | None, version: str | None = None) -> ModelAnnouncement:
    """Publish :func:`announcement` of ``record`` (or of the baseline ``version``) on ``leap.models``."""
    event = announcement(record, version)
    producer = Producer(settings.confluent_config(**{"enable.idempotence": True}, **client_logging()))
    producer.produce(MODELS.name, key=CURRENT_MODEL_KEY, value=event.encode())
    if producer.flush(30):
        raise RuntimeError("the model announcement was not delivered within 30 s")
    return event


def compile_and_report(model: LightGBMThroughput, compiled_dir: Path, version: str) -> None:
    """Compile ``model``'s trees and log when they serve: until then LightGBM's predict does,
    several times slower (a compile takes minutes on a fresh cache, longer on a busy machine)."""
    started = time.monotonic()
    model.compile_trees(compiled_dir)
    compiled = sum(1 for trees in model.trees_.values() if isinstance(trees, CompiledTrees))
    log.info("model %s: %d of %d boosters serve compiled trees (%.1f s)", version, compiled,
             len(model.trees_), time.monotonic() - started)


class ModelFollower:
    """Keeps a :class:`ModelHolder` on the announced model.

    Parameters
    ----------
    settings
        Kafka connection.
    registry
        Where versions are loaded from when the announced artifact path is not reachable.
    holder
        The predictor's holder; swapped in place.
    """

    def __init__(self, settings: Settings, registry: Registry, holder: ModelHolder) -> None:
        self.registry = registry
        self.holder = holder
        self.compiled_dir = settings.compiled_dir
        #: the thread compiling the last model's trees (None: nothing to compile yet)
        self.compiling: threading.Thread | None = None
        #: bad announcements met since the last good one (only the first of a run is logged)
        self.bad_seen = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.consumer = Consumer(settings.confluent_config(**{
            "group.id": "leap-model-follower-unused", "enable.auto.commit": False,
        }, **client_logging()))
        self.consumer.assign([TopicPartition(MODELS.name, p, OFFSET_BEGINNING)
                              for p in range(MODELS.partitions_in(settings))])

    def _apply(self, raw: bytes) -> None:
        try:
            ann = ModelAnnouncement.decode(raw)
        except EventError as exc:
            # Said once, not once per bad record: the compacted topic may hold it for good.
            if not self.bad_seen:
                log.error("ignoring a bad model announcement (%s); still serving %s", exc, self.holder.active.version)
            self.bad_seen += 1
            return
        self.bad_seen = 0
        self._follow(ann)

    def _follow(self, ann: ModelAnnouncement) -> None:
        if ann.model_version == self.holder.active.version:
            return
        try:
            model = self.load(ann)
        except (LookupError, OSError, ValueError, KeyError) as exc:
            log.error("cannot load announced model %s: %s; keeping %s", ann.model_version, exc,
                      self.holder.active.version)
            return
        previous = self.holder.swap(ActiveModel(model, ann.model_version))
        metrics.MODEL.info({"version": ann.model_version})
        log.info("model %s -> %s", previous.version, ann.model_version)
        if isinstance(model, LightGBMThroughput):
            self.compiling = threading.Thread(target=compile_and_report,
                                              args=(model, self.compiled_dir, ann.model_version),
                                              name="leap-compile-trees", daemon=True)
            self.compiling.start()

    def _latest_raw(self, timeout: float) -> bytes | None:
        """The newest announcement's bytes up to the current end of the topic."""
        ends = {p: high for (_, p), high in end_offsets(self.consumer, (MODELS.name,)).items()}
        if not any(ends.values()):
            return None
        deadline = time.monotonic() + timeout
        positions = {p: 0 for p in ends}
        latest: bytes | None = None
        while any(positions[p] < ends[p] for p in ends) and time.monotonic() < deadline:
            for msg in self.consumer.consume(100, timeout=0.5):
                if msg.error():
                    continue
                positions[msg.partition() or 0] = (msg.offset() or 0) + 1
                latest = msg.value()
        return latest

    def latest(self, timeout: float = 30.0) -> ModelAnnouncement | None:
        """The newest announcement up to the current end of the topic (None: none, or unreadable)."""
        raw = self._latest_raw(timeout)
        try:
            return ModelAnnouncement.decode(raw) if raw is not None else None
        except EventError as exc:
            log.error("ignoring a bad model announcement: %s", exc)
            return None

    def load(self, ann: ModelAnnouncement) -> ThroughputModel:
        """The announced model, from its artifact path or else the registry."""
        return self.registry.load(ann.model_version, Path(ann.artifact) if ann.artifact else None)

    def catch_up(self, timeout: float = 30.0) -> None:
        """Apply the newest announcement up to the current end of the topic (earlier ones were superseded)."""
        raw = self._latest_raw(timeout)
        if raw is not None:
            self._apply(raw)

    def _run(self) -> None:
        while not self._stop.is_set():
            for msg in self.consumer.consume(10, timeout=0.5):
                value = msg.value()
                if not msg.error() and value is not None:
                    self._apply(value)

    def start(self) -> ModelFollower:
        self._thread = threading.Thread(target=self._run, name="leap-model-follower", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.consumer.close()
