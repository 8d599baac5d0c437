"""The predictor agent: submissions in, exactly one ranking per valid submission out."""

from __future__ import annotations

import logging
import time
from typing import Any

import faust

from features.agents import with_redis_retry
from predictor.service import RankingService
from streams import metrics
from streams.app import decode_batch, send_dead_letters
from streams.events import Submission
from streams.topics import DEAD_LETTER, RANKINGS, SUBMISSIONS

log = logging.getLogger("leap.predictor")

#: A short window: at low rates it bounds the added latency, at high rates batches fill first.
PREDICT_BATCH = (500, 0.01)


def attach_predictor_agent(app: faust.App, topics: dict[str, faust.TopicT], service: RankingService) -> None:
    dlq = topics[DEAD_LETTER.name]
    out = topics[RANKINGS.name]

    @app.agent(topics[SUBMISSIONS.name], name="leap.predictor")
    async def predict(stream: Any) -> None:
        async for batch in stream.take_events(*PREDICT_BATCH):
            received = time.time()
            metrics.EVENTS_IN.labels(SUBMISSIONS.name).inc(len(batch))
            metrics.BATCH_SIZE.labels(SUBMISSIONS.name).observe(len(batch))
            subs, letters = decode_batch(Submission, batch)
            await send_dead_letters(dlq, letters)
            if not subs:
                continue
            rankings = await with_redis_retry(service.rank, subs, [received] * len(subs))
            for ranking in rankings:
                await out.send(key=ranking.job_key.encode(), value=ranking.encode())
                metrics.PREDICT_LATENCY.observe(ranking.latency_ms / 1000.0)
                if ranking.fallback:
                    for reason in ranking.fallback.split(","):
                        metrics.FALLBACKS.labels(reason).inc()
            metrics.EVENTS_OUT.labels(RANKINGS.name).inc(len(rankings))
