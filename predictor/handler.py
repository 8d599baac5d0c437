"""The predictor's batch handler: submissions in, exactly one ranking per valid submission out.

:mod:`predictor.loop` consumes, produces and commits; :func:`handle_submissions` does the work of
one batch, through plain callables, so it runs (and is tested) without a broker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from predictor.service import RankingService
from streams import metrics
from streams.app import (
    Send,
    SourceEvent,
    SourceMessage,
    decode_batch,
    letter_for,
    send_dead_letters,
)
from streams.deadletter import PROCESSING_ERROR
from streams.events import Ranking, Submission
from streams.resilience import with_redis_retry
from streams.topics import RANKINGS, SUBMISSIONS

log = logging.getLogger("leap.predictor")

#: Most submissions ranked in one batch (one Redis read): what has arrived, up to this many.
PREDICT_BATCH_MAX = 500


async def handle_submissions(
    batch: Sequence[SourceEvent], service: RankingService, send_ranking: Send, send_dead_letter: Send
) -> list[Ranking]:
    """Rank one batch of submissions.

    Parameters
    ----------
    batch
        Consumed submission messages.
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
