"""The dashboard page in headless Chromium while live traffic flows through a real worker.

A background thread plays the scheduler: it publishes simulated submissions, reads their
rankings, places each attempt on its rank-1 hardware and publishes the finish at once, so the
page has rankings, shares, savings and accuracy to show. Saves ``artifacts/dashboard.png``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from leap.core.settings import Settings
from leap.dashboard.aggregator import Aggregator
from leap.dashboard.app import create_app
from leap.dashboard.follower import Follower
from leap.dashboard.server import BackgroundServer
from leap.fleet.engine import Attempt, Fleet
from leap.services.workers import ROOT, WorkerProcess
from streams.client import SchedulerClient

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.e2e]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
SCREENSHOT = ROOT / "artifacts" / "dashboard.png"
RATE = 60.0  # submissions per second
TRAFFIC_S = 14.0  # at least this long before the screenshot, so the line charts have a history


class Traffic(threading.Thread):
    """Submissions in, rankings back, finishes out, until stopped."""

    def __init__(self, settings: Settings, seed: int | None = None) -> None:
        super().__init__(name="traffic", daemon=True)
        self.settings = settings
        # A fresh seed per run: event ids derive from the seed, and an id must never be
        # reused for a different event on the shared topics.
        seed = int(time.time() * 1000) % 1_000_000 if seed is None else seed
        self.fleet = Fleet(seed, attempts_per_day=50_000)
        self.rng = np.random.default_rng(seed)
        self.stop_event = threading.Event()
        self.published = self.ranked = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the test, not lost in the thread
            self.error = exc

    def _run(self) -> None:
        waiting: dict[str, Attempt] = {}
        with SchedulerClient(self.settings) as client:
            start = time.monotonic()
            while not self.stop_event.is_set():
                due = int((time.monotonic() - start) * RATE) - self.published
                if due > 0:
                    for a in self.fleet.sample_attempts(due):
                        client.publish(a.submission)
                        waiting[a.submission.attempt_id] = a
                    self.published += due
                for ranking, _ in client.rankings(timeout=0.05):
                    if ranking.attempt_id not in waiting:  # not ours (other traffic on the topic)
                        continue
                    a = waiting.pop(ranking.attempt_id)
                    self.ranked += 1
                    hw = ranking.best_hardware or a.submission.requested_hardware or a.candidates[0]
                    client.publish_finish(self.fleet.run(a, hw, self.rng).finish)
            client.flush()


def test_page_shows_live_rankings(settings: Settings, worker: WorkerProcess) -> None:
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed")
    agg = Aggregator()
    traffic = Traffic(settings)
    errors: list[str] = []
    with BackgroundServer(create_app(agg, Follower(settings, agg))) as url, sync_playwright() as pw:
        traffic.start()
        started = time.monotonic()
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(url + "/")
            page.wait_for_selector("#feed td.top", timeout=30_000)
            first = page.evaluate("window.__leap.summary.totals.rankings")
            page.wait_for_function(f"window.__leap.summary.totals.rankings > {first}", timeout=10_000)
            # the line charts need a few seconds of history and accuracy needs finished attempts
            page.wait_for_function("window.__leap.summary.accuracy.n >= 20", timeout=20_000)
            time.sleep(max(3.0, TRAFFIC_S - (time.monotonic() - started)))
            second = page.evaluate("window.__leap.summary")
            SCREENSHOT.parent.mkdir(exist_ok=True)
            page.screenshot(path=str(SCREENSHOT), full_page=True)
            rows = page.locator("#feed tr").count()
            kpi = page.inner_text("#k-total")
        finally:
            browser.close()
            traffic.stop_event.set()
            traffic.join(30)
    assert traffic.error is None, traffic.error
    assert not errors, errors
    assert second["totals"]["rankings"] > first > 0
    assert second["rates"]["rankings_per_s_10s"] > 0
    assert second["best_hardware_share"] and second["coverage"] > 0
    assert second["source"]["state"] == "following"
    assert rows >= 10 and kpi.replace(",", "").isdigit()
    assert SCREENSHOT.stat().st_size > 10_000
