"""``leap worker ROLE``: run the feature agents (Faust), the predictor (a confluent-kafka loop,
:mod:`predictor.loop`), or both in one process; the archiver (topics to the Parquet history
archive); or the nightly trainer."""

from __future__ import annotations

import gc
import logging
import threading
from pathlib import Path

import faust

from features.agents import attach_feature_agents
from features.store import FeatureStore, open_store
from leap.core.hardware import Catalogue, load_catalogue
from leap.core.settings import Settings
from leap.training.nightly import NightlyConfig
from leap.training.nightly import serve as serve_nightly
from predictor.lgbm import LightGBMThroughput
from predictor.loop import ConfluentPredictor, serve_in_thread
from predictor.loop import serve as serve_predictor
from predictor.registry import Registry
from predictor.reload import ModelFollower, compile_and_report
from predictor.service import ActiveModel, ModelHolder, RankingService, lookup_fallback
from streams import metrics
from streams.app import build_app
from streams.archive import ArchiveConfig
from streams.archiver import attach_archiver_agents
from streams.topics import create_topics

ROLES = ("features", "predictor", "all", "archiver", "trainer")
DEFAULT_METRICS_PORTS = {"features": 9101, "predictor": 9102, "all": 9100, "archiver": 9103, "trainer": 9104}

log = logging.getLogger("leap.worker")


def predictor_service(settings: Settings, store: FeatureStore, catalogue: Catalogue,
                      model_dir: Path | None = None) -> tuple[RankingService, ModelFollower | None]:
    """The predictor's ranking service, on the announced model (and a follower of announcements to
    start), or pinned to the saved model in ``model_dir`` (no follower: announcements are ignored;
    its trees are compiled before the first submission, as the follower compiles a promoted model's)."""
    if model_dir is not None:
        model = Registry(model_dir.parent).load(model_dir.name, model_dir)
        if isinstance(model, LightGBMThroughput):
            compile_and_report(model, settings.compiled_dir, model_dir.name)
        holder = ModelHolder(ActiveModel(model, model_dir.name))
        follower = None
    else:
        holder = ModelHolder(lookup_fallback())
        follower = ModelFollower(settings, Registry(settings.registry_dir), holder)
        follower.catch_up()  # start with the announced model, not the fallback
    metrics.MODEL.info({"version": holder.active.version})
    log.info("predictor starts with model %s%s", holder.active.version, " (pinned)" if follower is None else "")
    return RankingService(store, catalogue, holder), follower


def reload_prices(catalogue: Catalogue) -> None:
    """Re-read the price and operator hardware files when they changed; a bad file is logged and
    the catalogue keeps serving what it had (the next change is tried again)."""
    try:
        if catalogue.reload_prices_if_changed():
            log.info("catalogue reloaded (prices %s, operator hardware %s): %d types",
                     catalogue.prices_path, catalogue.hardware_path, len(catalogue))
    except (OSError, ValueError) as exc:
        log.error("catalogue not reloaded, keeping the previous one: %s", exc)


def build(settings: Settings, role: str, archive: ArchiveConfig | None = None) -> faust.App:
    """The Faust app of a role (the feature agents of ``features`` and ``all``, or the archiver's)."""
    if role not in ("features", "all", "archiver"):
        raise ValueError(f"no Faust app for worker role {role!r}; choose one of features, all, archiver")
    app, topics = build_app(settings, role)
    if role == "archiver":  # needs neither Redis nor the catalogue
        attach_archiver_agents(app, topics, archive or ArchiveConfig.from_settings(settings))
    else:
        catalogue = load_catalogue()
        attach_feature_agents(app, topics, open_store(settings, catalogue))
    return app


def start_predictor(settings: Settings, model_dir: Path | None,
                    in_thread: bool) -> tuple[ConfluentPredictor, threading.Thread] | None:
    """The predictor role (:mod:`predictor.loop`): run here until SIGTERM, or, ``in_thread``,
    started beside a Faust worker (``all``) and returned with its thread."""
    catalogue = load_catalogue()
    service, follower = predictor_service(settings, open_store(settings, catalogue), catalogue, model_dir)
    if follower is not None:
        follower.start()
    if in_thread:
        return serve_in_thread(settings, service, lambda: reload_prices(catalogue))
    gc.collect()
    gc.freeze()  # long-lived objects built above are not rescanned (GC pauses cost p99)
    serve_predictor(settings, service, lambda: reload_prices(catalogue))
    return None


def run(settings: Settings, role: str, metrics_port: int, archive: ArchiveConfig | None = None,
        nightly: NightlyConfig | None = None, model_dir: Path | None = None) -> None:
    """Create missing topics, serve metrics and run the worker until SIGTERM/SIGINT."""
    create_topics(settings)
    if role == "trainer":  # a scheduled loop, not a stream processor
        metrics.serve(metrics_port)
        archive_root = (archive or ArchiveConfig.from_settings(settings)).root
        serve_nightly(settings, nightly or NightlyConfig(archive_root, settings.registry_dir,
                                                          row_cache=settings.row_cache_dir))
        return
    if role == "predictor":
        metrics.serve(metrics_port)
        logging.basicConfig(level=logging.INFO, format="[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s")
        start_predictor(settings, model_dir, in_thread=False)
        return
    app = build(settings, role, archive)
    metrics.serve(metrics_port)
    # `all`: the predictor beside the feature agents, in a thread with a consumer group of its own
    # (one group cannot mix Faust's assignor with librdkafka's).
    predictor = start_predictor(settings, model_dir, in_thread=True) if role == "all" else None
    # Long-lived objects built above never die: keep the collector from rescanning them
    # (GC pauses are the main p99 cost of a Python server).
    gc.collect()
    gc.freeze()
    # loglevel=info: at faust's default level the root logger goes to DEBUG and every send
    # builds a log record.
    worker = faust.Worker(app, loglevel="info", quiet=True)
    try:
        worker.execute_from_commandline()
    finally:
        if predictor is not None:  # SIGTERM stopped the agents: the predictor commits and leaves too
            predictor[0].stopping = True
            predictor[1].join(30)
