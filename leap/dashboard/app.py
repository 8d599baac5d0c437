"""The ASGI app: the page, ``/api/summary``, a server-sent-event stream and a health check."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio.to_thread
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from leap.dashboard.aggregator import Aggregator
from leap.dashboard.follower import Follower
from leap.dashboard.page import PAGE
from leap.dashboard.summary import build_summary

#: Smallest time between two summaries pushed to a page (at most 2 updates per second).
DEFAULT_PUSH_INTERVAL = 0.5


class SummaryCache:
    """Builds the summary at most once per ``interval`` however many pages are open.

    The build runs in a worker thread: it waits for the aggregator's lock, which the Kafka thread
    holds while it ingests a batch, and the event loop must not wait with it.
    """

    def __init__(self, aggregator: Aggregator, follower: Follower | None, interval: float) -> None:
        self.aggregator = aggregator
        self.follower = follower
        self.interval = interval
        self._at = -1.0
        self._body = b""
        self._lock = asyncio.Lock()

    def _build(self) -> bytes:
        with self.aggregator.lock:
            summary = build_summary(self.aggregator, time.time())
        summary["source"] = self.follower.status() if self.follower is not None else {"state": "detached"}
        summary["push_interval_s"] = self.interval
        return orjson.dumps(summary)

    async def get(self) -> bytes:
        async with self._lock:
            if time.monotonic() - self._at >= self.interval:
                self._body = await anyio.to_thread.run_sync(self._build)
                self._at = time.monotonic()
            return self._body


def create_app(aggregator: Aggregator, follower: Follower | None = None,
               push_interval: float = DEFAULT_PUSH_INTERVAL) -> Starlette:
    """The dashboard app; starts ``follower`` with the app and stops it on shutdown.

    Parameters
    ----------
    aggregator
        Shared with ``follower``.
    follower
        Kafka thread, or ``None`` for an app over an aggregator fed some other way.
    push_interval
        Seconds between pushes to each open page.
    """
    cache: SummaryCache | None = None

    def get_cache() -> SummaryCache:
        # created lazily so its asyncio.Lock belongs to the server's event loop
        nonlocal cache
        if cache is None:
            cache = SummaryCache(aggregator, follower, push_interval)
        return cache

    async def page(_: Request) -> Response:
        return HTMLResponse(PAGE, headers={"Cache-Control": "no-store"})

    async def summary(_: Request) -> Response:
        return Response(await get_cache().get(), media_type="application/json")

    async def health(_: Request) -> Response:
        status: dict[str, Any] = follower.status() if follower is not None else {"state": "detached"}
        ok = follower is None or follower.ready.is_set()
        return JSONResponse(status, status_code=200 if ok else 503)

    async def events(request: Request) -> Response:
        async def stream() -> AsyncIterator[bytes]:
            yield b"retry: 2000\n\n"
            while not await request.is_disconnected():
                yield b"event: summary\ndata: " + await get_cache().get() + b"\n\n"
                await asyncio.sleep(push_interval)

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        if follower is not None and not follower.is_alive():
            follower.start()
        try:
            yield
        finally:
            if follower is not None:
                await anyio.to_thread.run_sync(follower.stop)

    routes = [
        Route("/", page),
        Route("/api/summary", summary),
        Route("/events", events),
        Route("/healthz", health),
    ]
    return Starlette(routes=routes, lifespan=lifespan)
