"""Every reader of rankings reads only what committed transactions wrote (the predictors rank in
transactions: an aborted transaction's rankings must never reach a scheduler, dashboard or archive)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

from leap.core.settings import Settings
from leap.dashboard import follower
from leap.replay import reader
from predictor.loop import consumer_config
from streams import client
from streams.app import build_app
from streams.topics import READ_COMMITTED


def test_the_confluent_readers_read_committed() -> None:
    for config in (client._CONSUMER, follower._CONSUMER, reader._CONSUMER, consumer_config(Settings(), "g")):
        assert config["isolation.level"] == READ_COMMITTED["isolation.level"] == "read_committed"


def test_the_faust_workers_consumers_read_committed(tmp_path: Path) -> None:
    """The archiver (and the feature agents) run on Faust, whose aiokafka consumer reads
    uncommitted data unless told otherwise."""
    async def created_level() -> str:
        app, _ = build_app(Settings(home=tmp_path), "archiver")
        consumer = cast(Any, app.consumer)._thread._create_worker_consumer(app.consumer.transport)
        try:
            return str(consumer._isolation_level)
        finally:
            await consumer.stop()

    assert asyncio.run(created_level()) == "read_committed"
