"""Prometheus metrics shared by every worker role (one registry per process)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, Info, start_http_server

EVENTS_IN = Counter("leap_events_in_total", "Events read", ["topic"])
EVENTS_OUT = Counter("leap_events_out_total", "Events written", ["topic"])
DEAD_LETTERS = Counter("leap_dead_letters_total", "Events sent to the dead-letter topic", ["topic", "reason"])
DUPLICATES = Counter("leap_duplicate_events_total", "Events already applied (dropped)", ["topic"])
BATCH_SIZE = Histogram(
    "leap_batch_size", "Events per processed batch", ["topic"], buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500)
)
PREDICT_LATENCY = Histogram(
    "leap_prediction_latency_seconds",
    "Submission received to ranking emitted",
    buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0),
)
SINCE_SUBMIT = Histogram(
    "leap_submission_to_ranking_seconds",
    "Submission event_time (the scheduler's clock) to ranking emitted: queueing, outages and failovers included",
    buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0),
)
TRANSACTION_COMMIT = Histogram(
    "leap_transaction_commit_seconds",
    "Exactly-once predictor: one commit of its open transaction (offsets sent, then committed); its rankings are "
    "readable once it ends",
    buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0, 30.0),
)
FEATURE_FRESHNESS = Histogram(
    "leap_feature_freshness_seconds",
    "Event time to feature applied in Redis",
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120, 600, 3600),
)
CONSUMER_LAG = Gauge("leap_consumer_lag_messages", "High watermark minus position", ["topic", "partition"])
DEPENDENCY_UP = Gauge(
    "leap_dependency_up", "1 while the dependency answers, 0 while batches wait for it (nothing is committed)",
    ["dependency"],
)
UNREADABLE_FEATURES = Counter(
    "leap_unreadable_features_total",
    "Stored feature values a read could not parse: a job's (the job fell back to no prior) or one field of a "
    "lookup or pair aggregate (skipped)", ["kind"],
)
MODEL = Info("leap_model", "Model in use by this predictor")
FALLBACKS = Counter("leap_ranking_fallbacks_total", "Rankings that used a fallback", ["reason"])


def serve(port: int, host: str = "127.0.0.1") -> None:
    """Expose ``/metrics`` on ``host:port`` (0 = do not serve)."""
    if port:
        start_http_server(port, addr=host)
