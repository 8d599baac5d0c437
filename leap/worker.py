"""``leap worker ROLE``: run the feature agents, the predictor agent, or both, under Faust; the archiver
(topics to the Parquet history archive); or the nightly trainer. The predictor role alone may run on
the confluent-kafka engine instead (``LEAP_PREDICTOR_ENGINE=confluent``, :mod:`predictor.loop`)."""

from __future__ import annotations

import gc
import logging
from pathlib import Path

import faust

from core.hardware import Catalogue, load_catalogue
from core.settings import Settings
from features.agents import attach_feature_agents
from features.store import FeatureStore, open_store
from predictor.agent import attach_predictor_agent
from predictor.lgbm import LightGBMThroughput
from predictor.loop import serve as serve_confluent_predictor
from predictor.registry import Registry
from predictor.reload import ModelFollower, compile_and_report
from predictor.service import ActiveModel, ModelHolder, RankingService, lookup_fallback
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
    if catalogue.reload_prices_if_changed():
        log.info("hourly prices reloaded from %s", catalogue.prices_path)


def build(settings: Settings, role: str, archive: ArchiveConfig | None = None,
          model_dir: Path | None = None) -> faust.App:
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
        service, follower = predictor_service(settings, store, catalogue, model_dir)
        attach_predictor_agent(app, topics, service)

        if follower is not None:
            @app.task
            async def follow_models() -> None:
                follower.start()

        @app.timer(interval=30.0)
        async def prices() -> None:
            reload_prices(catalogue)
    return app


def run_confluent_predictor(settings: Settings, model_dir: Path | None) -> None:
    """The predictor role on the confluent-kafka engine (:mod:`predictor.loop`)."""
    # The Faust worker's log format and level (faust.Worker configures them for the other roles).
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s")
    catalogue = load_catalogue()
    service, follower = predictor_service(settings, open_store(settings, catalogue), catalogue, model_dir)
    if follower is not None:
        follower.start()
    gc.collect()
    gc.freeze()  # as for the Faust worker: long-lived objects are not rescanned
    log.info("predictor runs on the confluent-kafka engine")
    serve_confluent_predictor(settings, service, lambda: reload_prices(catalogue))


def check_engine(engine: str | None, role: str) -> None:
    """Raise ValueError for an engine asked for (``--engine``) that the role cannot run."""
    if engine == "confluent" and role == "all":
        # The features and the predictor of `all` share one consumer group, and one group cannot mix
        # Faust's assignor with librdkafka's.
        raise ValueError("the confluent-kafka engine runs the predictor role only: run `leap worker features` "
                         "and `leap worker predictor`, or the Faust engine for `all`")


def run(settings: Settings, role: str, metrics_port: int, archive: ArchiveConfig | None = None,
        nightly: NightlyConfig | None = None, model_dir: Path | None = None) -> None:
    """Create missing topics, serve metrics and run the worker until SIGTERM/SIGINT."""
    confluent = settings.predictor_engine == "confluent" and role == "predictor"
    if role == "all":
        log.info("role all runs its predictor agent on Faust (LEAP_PREDICTOR_ENGINE is for `leap worker predictor`)")
    create_topics(settings)
    if role == "trainer":  # a scheduled loop, not a stream processor
        metrics.serve(metrics_port)
        archive_root = (archive or ArchiveConfig.from_settings(settings)).root
        serve_nightly(settings, nightly or NightlyConfig(archive_root, settings.registry_dir))
        return
    if confluent:
        metrics.serve(metrics_port)
        run_confluent_predictor(settings, model_dir)
        return
    app = build(settings, role, archive, model_dir)
    metrics.serve(metrics_port)
    # Long-lived objects built above never die: keep the collector from rescanning them
    # (GC pauses are the main p99 cost of a Python server).
    gc.collect()
    gc.freeze()
    # loglevel=info: at faust's default level the root logger goes to DEBUG and every send
    # builds a log record.
    worker = faust.Worker(app, loglevel="info", quiet=True)
    worker.execute_from_commandline()
