"""``leap worker ROLE``: run the feature agents, the predictor agent, or both, under Faust; the archiver
(topics to the Parquet history archive); or the nightly trainer."""

from __future__ import annotations

import gc
import logging

import faust

from core.hardware import load_catalogue
from core.settings import Settings
from features.agents import attach_feature_agents
from features.store import open_store
from predictor.agent import attach_predictor_agent
from predictor.registry import Registry
from predictor.reload import ModelFollower
from predictor.service import ModelHolder, RankingService, lookup_fallback
from streams import metrics
from streams.app import build_app
from streams.archive import ArchiveConfig
from streams.archiver import attach_archiver_agents
from streams.topics import create_topics
from training.nightly import NightlyConfig
from training.nightly import serve as serve_nightly

ROLES = ("features", "predictor", "all", "archiver", "trainer")
DEFAULT_METRICS_PORTS = {"features": 9101, "predictor": 9102, "all": 9100, "archiver": 9103, "trainer": 9104}

log = logging.getLogger("leap.worker")


def build(settings: Settings, role: str, archive: ArchiveConfig | None = None) -> faust.App:
    """The Faust app of a role, with its agents attached."""
    if role not in ROLES or role == "trainer":
        raise ValueError(f"no Faust app for worker role {role!r}; choose one of {', '.join(ROLES[:-1])}")
    if role == "archiver":  # needs neither Redis nor the catalogue
        app, topics = build_app(settings, role)
        attach_archiver_agents(app, topics, archive or ArchiveConfig.from_settings(settings))
        return app
    catalogue = load_catalogue()
    store = open_store(settings, catalogue)
    app, topics = build_app(settings, role)
    if role in ("features", "all"):
        attach_feature_agents(app, topics, store)
    if role in ("predictor", "all"):
        holder = ModelHolder(lookup_fallback())
        follower = ModelFollower(settings, Registry(settings.registry_dir), holder)
        follower.catch_up()  # start with the announced model, not the fallback
        metrics.MODEL.info({"version": holder.active.version})
        log.info("predictor starts with model %s", holder.active.version)
        attach_predictor_agent(app, topics, RankingService(store, catalogue, holder))

        @app.task
        async def follow_models() -> None:
            follower.start()

        @app.timer(interval=30.0)
        async def reload_prices() -> None:
            if catalogue.reload_prices_if_changed():
                log.info("hourly prices reloaded from %s", catalogue.prices_path)
    return app


def run(settings: Settings, role: str, metrics_port: int, archive: ArchiveConfig | None = None,
        nightly: NightlyConfig | None = None) -> None:
    """Create missing topics, serve metrics and run the worker until SIGTERM/SIGINT."""
    create_topics(settings)
    if role == "trainer":  # a scheduled loop, not a stream processor
        metrics.serve(metrics_port)
        archive_root = (archive or ArchiveConfig.from_settings(settings)).root
        serve_nightly(settings, nightly or NightlyConfig(archive_root, settings.registry_dir))
        return
    app = build(settings, role, archive)
    metrics.serve(metrics_port)
    # Long-lived objects built above never die: keep the collector from rescanning them
    # (GC pauses are the main p99 cost of a Python server).
    gc.collect()
    gc.freeze()
    # loglevel=info: at faust's default level the root logger goes to DEBUG and every send
    # builds a log record.
    worker = faust.Worker(app, loglevel="info", quiet=True)
    worker.execute_from_commandline()
