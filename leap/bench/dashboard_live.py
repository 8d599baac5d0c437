"""``bench dashboard-live``: is the dashboard responsive while ``rate`` rankings/s flow through a
real broker? Publishes synthetic rankings (and their submissions and finishes) to fresh topics of its own,
serves the app in this process and times ``/api/summary`` every 0.25 s meanwhile. The topics
are deleted at the end.
"""

from __future__ import annotations

import threading
import time
import urllib.request
import uuid
from typing import Any

import numpy as np
import orjson
from confluent_kafka.admin import AdminClient

from leap.bench.dashboard_ingest import synthetic_events
from leap.core.settings import Settings
from leap.dashboard.aggregator import Aggregator
from leap.dashboard.app import create_app
from leap.dashboard.follower import Follower
from leap.dashboard.server import BackgroundServer
from streams.client import SchedulerClient
from streams.topics import Topic, create_topics


def _publish(settings: Settings, topics: dict[str, str], events: list[tuple[bytes, bytes, bytes]], rate: float,
             done: threading.Event) -> None:
    sub_t, rank_t, fin_t = topics["submission"], topics["ranking"], topics["finish"]
    with SchedulerClient(settings, follow_rankings=False) as client:
        start = time.monotonic()
        for i, (sub, ranking, finish) in enumerate(events):
            while i >= (time.monotonic() - start) * rate:
                time.sleep(0.002)
            key = f"k{i % 64}"
            client.publish_raw(sub_t, key, sub)
            client.publish_raw(rank_t, key, ranking)
            client.publish_raw(fin_t, key, finish)
        client.flush()
    done.set()


def measure_live(settings: Settings, rate: float = 1000.0, seconds: float = 10.0) -> dict[str, Any]:
    """Publish ``rate`` rankings/s for ``seconds`` and time the summary endpoint meanwhile."""
    n = int(rate * seconds)
    events = synthetic_events(n, seed=1)
    run = uuid.uuid4().hex[:8]
    names = {"ranking": f"leap-bench-{run}.rankings", "finish": f"leap-bench-{run}.job-finishes",
             "submission": f"leap-bench-{run}.submissions"}
    create_topics(settings, tuple(Topic(name, 6) for name in names.values()))
    agg = Aggregator()
    follower = Follower(settings, agg, topics={v: k for k, v in names.items()})
    times: list[float] = []
    try:
        with BackgroundServer(create_app(agg, follower)) as url:
            done = threading.Event()
            started = time.monotonic()
            threading.Thread(target=_publish, args=(settings, names, events, rate, done), daemon=True).start()
            summary: dict[str, Any] = {}
            while time.monotonic() - started < seconds + 30:
                t0 = time.perf_counter()
                with urllib.request.urlopen(url + "/api/summary", timeout=10) as resp:
                    summary = orjson.loads(resp.read())
                times.append(time.perf_counter() - t0)
                if done.is_set() and summary["totals"]["rankings"] >= n:
                    break
                time.sleep(0.25)
            elapsed = time.monotonic() - started
    finally:
        AdminClient(settings.confluent_config()).delete_topics(list(names.values()), operation_timeout=30)
    ms = np.array(times) * 1000
    return {
        "target_rankings_per_s": rate,
        "rankings_published": n,
        "rankings_counted": summary["totals"]["rankings"],
        "joined": summary["accuracy"]["joined_total"],
        "seconds_until_all_counted": elapsed,
        "summary_requests": len(times),
        "summary_ms_p50": float(np.percentile(ms, 50)),
        "summary_ms_p99": float(np.percentile(ms, 99)),
        "summary_ms_max": float(ms.max()),
    }

