"""The predictor agent: submissions in, exactly one ranking per valid submission out.

The Faust agent only loops over batches; :func:`handle_submissions` does the work of one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import faust

from features.agents import PROCESSING_ERROR, with_redis_retry
from predictor.service import RankingService
from streams import metrics
from streams.app import (
    Send,
    SourceEvent,
    SourceMessage,
    decode_batch,
    letter_for,
    run_batches,
    send_dead_letters,
    topic_sender,
)
from streams.events import Ranking, Submission
from streams.topics import DEAD_LETTER, RANKINGS, SUBMISSIONS

log = logging.getLogger("leap.predictor")

#: A short window: at low rates it bounds the added latency, at high rates batches fill first.
PREDICT_BATCH = (500, 0.003)


async def handle_submissions(
    batch: Sequence[SourceEvent], service: RankingService, send_ranking: Send, send_dead_letter: Send
) -> list[Ranking]:
    """Rank one batch of submissions.

    Parameters
    ----------
    batch
        Consumed submission messages (Faust events).
    service
        Ranks the valid submissions, one Redis read for the batch.
    send_ranking
        Sends one ranking (key: the job key).
    send_dead_letter
        Sends one dead letter, for each message that is not a valid submission.

    Returns
    -------
    The rankings sent, one per valid submission, in batch order.
    """
    received = time.time()  # latency is measured from here: the batch's arrival
    metrics.EVENTS_IN.labels(SUBMISSIONS.name).inc(len(batch))
    metrics.BATCH_SIZE.labels(SUBMISSIONS.name).observe(len(batch))
    decoded = decode_batch(Submission, batch)
    await send_dead_letters(send_dead_letter, decoded.letters)
    subs = decoded.events
    if not subs:
        return []
    # A Redis outage holds the batch (nothing is sent yet, so nothing is sent twice).
    rankings = await rank_with_isolation(service, subs, decoded.sources, received, send_dead_letter)
    for ranking in rankings:
        await send_ranking(ranking.job_key.encode(), ranking.encode())
        metrics.PREDICT_LATENCY.observe(ranking.latency_ms / 1000.0)
        if ranking.since_submit_ms is not None:
            metrics.SINCE_SUBMIT.observe(ranking.since_submit_ms / 1000.0)
        if ranking.fallback:
            for reason in ranking.fallback.split(","):
                metrics.FALLBACKS.labels(reason).inc()
    metrics.EVENTS_OUT.labels(RANKINGS.name).inc(len(rankings))
    return rankings


async def rank_with_isolation(service: RankingService, subs: Sequence[Submission], sources: Sequence[SourceMessage],
                              received: float, send_dead_letter: Send) -> list[Ranking]:
    """Rank a batch; if ranking fails, rank one by one and dead-letter the submissions that fail.

    A Redis outage is waited out (:func:`with_redis_retry`); any other error is one submission's
    (e.g. a corrupt feature hash), and must not cost the other submissions of the batch.
    """
    try:
        return list(await with_redis_retry(service.rank, subs, [received] * len(subs)))
    except Exception:
        log.warning("ranking a batch of %d failed; ranking its submissions one by one", len(subs), exc_info=True)
    out: list[Ranking] = []
    for sub, msg in zip(subs, sources, strict=True):
        try:
            out.extend(await with_redis_retry(service.rank, [sub], [received]))
        except Exception as exc:
            letter = letter_for(msg, PROCESSING_ERROR, f"{type(exc).__name__}: {exc}")
            await send_dead_letters(send_dead_letter, [letter])
    return out


def attach_predictor_agent(app: faust.App, topics: dict[str, faust.TopicT], service: RankingService) -> None:
    """The agent that ranks every submission (:func:`handle_submissions` per batch)."""
    send_ranking = topic_sender(topics[RANKINGS.name])
    send_dead_letter = topic_sender(topics[DEAD_LETTER.name])

    @app.agent(topics[SUBMISSIONS.name], name="leap.predictor")
    async def predict(stream: Any) -> None:
        await run_batches(stream, PREDICT_BATCH, lambda batch: handle_submissions(
            batch, service, send_ranking, send_dead_letter), "predictor")
