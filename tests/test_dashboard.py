"""The dashboard: aggregator arithmetic on contract-valid event bytes, bounded memory, CLI
argument errors, and the app on the real Kafka broker (no mocks)."""

from __future__ import annotations

import gc
import math
import sys
import time
import tracemalloc
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import orjson
import pytest
import typer
from confluent_kafka.admin import AdminClient
from typer.testing import CliRunner

from leap.bench.dashboard_ingest import measure
from leap.core.accuracy import summary as metric_summary
from leap.core.settings import Settings
from leap.dashboard.aggregator import Aggregator, AggregatorConfig
from leap.dashboard.app import create_app
from leap.dashboard.cli import dashboard_cmd, parse_since
from leap.dashboard.follower import Follower
from leap.dashboard.rolling import OTHER, PerSecond
from leap.dashboard.server import BackgroundServer, free_port
from leap.dashboard.summary import build_summary
from leap.services.workers import ROOT
from streams.client import SchedulerClient
from streams.events import SCHEMA_VERSION, JobFinish, Ranking
from streams.topics import JOB_FINISHES, RANKINGS, Topic, create_topics
from tests.factories import T0, finish_dict, submission

NOW = T0 + 10_000


def ranking(attempt: str, cands: Sequence[tuple[str, float | None, float]], fallback: str | None = None,
            event_id: str | None = None, model: str = "lgbm-1") -> bytes:
    """A contract-valid ranking of ``cands`` = (hardware, predicted throughput or None, USD/h)."""
    rows: list[dict[str, Any]] = []
    for hw, tput, cost in cands:
        pd = tput * 3600.0 / cost if tput is not None else None
        rows.append({"hardware": hw, "predicted_throughput": tput, "lower": None, "upper": None,
                     "hourly_cost": cost, "throughput_per_dollar": pd, "rank": None,
                     "reason": None if tput is not None else "no_estimate"})
    ranked = sorted((r for r in rows if r["throughput_per_dollar"] is not None),
                    key=lambda r: -r["throughput_per_dollar"])
    for i, r in enumerate(ranked, start=1):
        r["rank"] = i
    rows = ranked + [r for r in rows if r["rank"] is None]
    return Ranking.from_dict({
        "schema_version": SCHEMA_VERSION, "event_id": event_id or f"rank:{attempt}", "event_time": NOW,
        "job_key": attempt.split("-att-")[0], "attempt_id": attempt, "submission_event_id": f"sub-{attempt}",
        "submission_time": NOW - 1, "model_version": model, "candidates": rows,
        "best_hardware": ranked[0]["hardware"] if ranked else None, "features_used": {},
        "fallback": fallback, "latency_ms": 3.0,
    }).encode()


def finish_bytes(attempt: str, hardware: str, throughput: float | None, outcome: str = "completed") -> bytes:
    d = finish_dict(attempt.split("-att-")[0], f"finish-{attempt}", NOW + 3600, hardware, throughput, outcome=outcome)
    return JobFinish.from_dict(d | {"attempt_id": attempt}).encode()


def submission_bytes(attempt: str, requested: str | None) -> bytes:
    job, i = attempt.split("-att-")
    return submission(job, int(i), requested_hardware=requested).encode()


CANDS = [("H100-SXM", 300.0, 20.0), ("A100-80GB", 100.0, 10.0), ("L4", 10.0, 2.0)]


# ---------------------------------------------------------------- aggregator


def test_the_feed_shows_each_top_candidates_basis_and_nothing_for_version_1() -> None:
    v2 = orjson.loads(ranking("j1-att-1", CANDS))
    v2["schema_version"] = 2
    for c in v2["candidates"]:
        c["basis"] = {"evidence": "ran_elsewhere", "estimate": "model", "prior": "A100-80GB", "ratio": 1.83}
    v2["candidates"][2]["basis"] = {"evidence": "none", "estimate": "cold_start"}
    agg = Aggregator()
    agg.add("ranking", Ranking.from_dict(v2).encode(), NOW)
    agg.add("ranking", ranking("j1-att-2", CANDS), NOW)
    old, new = build_summary(agg, NOW + 1)["feed"]
    assert [c["basis"] for c in new["top"]] == [
        {"evidence": "ran_elsewhere", "estimate": "model", "prior_hardware": "A100-80GB", "ratio": 1.83}] * 2 + [
        {"evidence": "none", "estimate": "cold_start", "prior_hardware": None, "ratio": None}]
    assert [c["basis"] for c in old["top"]] == [None] * 3


def test_counts_coverage_fallback_and_share() -> None:
    agg = Aggregator()
    agg.add("ranking", ranking("j1-att-1", CANDS), NOW)
    agg.add("ranking", ranking("j1-att-2", CANDS, fallback="no_trained_model,cold_start_roofline"), NOW)
    agg.add("ranking", ranking("j2-att-3", [("L4", 10.0, 2.0), ("A100-80GB", None, 10.0)]), NOW)
    agg.add("ranking", ranking("j3-att-4", [("MI300X", None, 12.0)], fallback="no_estimate"), NOW + 1)
    s = build_summary(agg, NOW + 2)
    assert s["totals"]["rankings"] == 4
    assert s["coverage"] == 0.75
    assert s["fallback_rate"] == 0.5
    assert s["fallback_reasons"] == {"no_trained_model": 1, "cold_start_roofline": 1, "no_estimate": 1}
    # samples per dollar: H100 300*3600/20 = 54,000 > A100 36,000 > L4 18,000; j2 ranks L4 alone
    assert [(r["hardware"], r["count"]) for r in s["best_hardware_share"]] == [("H100-SXM", 2), ("L4", 1)]
    assert math.isclose(sum(r["share"] for r in s["best_hardware_share"]), 1.0)
    assert s["feed"][0]["attempt_id"] == "j3-att-4" and s["feed"][0]["top"] == []
    assert [c["hardware"] for c in s["feed"][-1]["top"]] == ["H100-SXM", "A100-80GB", "L4"]
    assert s["series"]["rankings"][-2:] == [3, 1]
    assert s["models"] == {"lgbm-1": 4}
    orjson.dumps(s)  # plain JSON all the way down


def test_accuracy_join_matches_predictor_metrics() -> None:
    rng = np.random.default_rng(7)
    agg = Aggregator()
    preds, actuals = [], []
    for i in range(300):
        attempt = f"j{i}-att-{i}"
        cands = [("H100-SXM", float(rng.uniform(50, 500)), 20.0), ("A100-80GB", float(rng.uniform(50, 500)), 10.0),
                 ("L4", None, 2.0)]
        agg.add("ranking", ranking(attempt, cands), NOW)
        hw_i = int(rng.integers(3))
        hw, pred, _ = cands[hw_i]
        actual = (pred or 100.0) * float(rng.uniform(0.7, 1.3))
        agg.add("finish", finish_bytes(attempt, hw, actual), NOW + 1)
        preds.append(math.nan if pred is None else pred)
        actuals.append(actual)
    # boundary: exactly 10% off is a hit, as in leap.core.accuracy.acc_at
    agg.add("ranking", ranking("b1-att-1", [("H100-SXM", 110.0, 20.0)]), NOW)
    agg.add("finish", finish_bytes("b1-att-1", "H100-SXM", 100.0), NOW)
    preds.append(110.0)
    actuals.append(100.0)
    # not scored: unranked attempt, failed without throughput, hardware the ranking did not list
    agg.add("finish", finish_bytes("zz-att-1", "H100-SXM", 100.0), NOW)
    agg.add("ranking", ranking("f1-att-1", CANDS), NOW)
    agg.add("finish", finish_bytes("f1-att-1", "H100-SXM", None, outcome="failed"), NOW)
    agg.add("ranking", ranking("f2-att-2", CANDS), NOW)
    agg.add("finish", finish_bytes("f2-att-2", "TPU-v5p", 100.0), NOW)

    acc = build_summary(agg, NOW + 2)["accuracy"]
    expected = metric_summary(preds, actuals)
    assert acc["n"] == expected["n"] == 301
    assert acc["joined_total"] == 301
    assert acc["n_missing"] == expected["n_missing"] > 0
    for key in ("acc@10", "acc@20", "mape"):
        assert math.isclose(acc[key], expected[key], rel_tol=1e-9), key
    assert (acc["finishes_without_ranking"], acc["finishes_unmeasured"], acc["finishes_not_candidate"]) == (1, 1, 1)
    assert acc["pending"] == 0


def test_finish_read_before_its_ranking_still_joins() -> None:
    # two topics are not read in order (on replay finishes can come first): join both ways
    agg = Aggregator()
    agg.add("finish", finish_bytes("e-att-1", "A100-80GB", 100.0), NOW)
    assert build_summary(agg, NOW)["accuracy"]["finishes_without_ranking"] == 1
    agg.add("ranking", ranking("e-att-1", CANDS), NOW + 1)
    acc = build_summary(agg, NOW + 1)["accuracy"]
    assert (acc["n"], acc["acc@10"], acc["finishes_without_ranking"], acc["pending"]) == (1, 1.0, 0, 0)


def test_accuracy_window_keeps_only_the_last_n() -> None:
    agg = Aggregator(AggregatorConfig(accuracy_window=10))
    for i in range(40):
        attempt = f"w-att-{i}"
        agg.add("ranking", ranking(attempt, [("H100-SXM", 100.0, 20.0)]), NOW)
        # first 30 are 50% off (misses), the last 10 are exact (hits)
        agg.add("finish", finish_bytes(attempt, "H100-SXM", 200.0 if i < 30 else 100.0), NOW)
    acc = build_summary(agg, NOW)["accuracy"]
    assert (acc["n"], acc["acc@10"], acc["acc@20"], acc["mape"]) == (10, 1.0, 1.0, 0.0)
    assert acc["joined_total"] == 40


@pytest.mark.parametrize("submission_first", [True, False])
def test_savings_against_requested_hardware(submission_first: bool) -> None:
    agg = Aggregator()
    events = [
        ("submission", submission_bytes("s-att-1", "A100-80GB")),
        ("ranking", ranking("s-att-1", CANDS)),
        ("submission", submission_bytes("s-att-2", "H100-SXM")),  # already the best: saves nothing
        ("ranking", ranking("s-att-2", CANDS)),
        ("submission", submission_bytes("s-att-3", "MI300X")),  # not a candidate: not counted
        ("ranking", ranking("s-att-3", CANDS)),
        ("submission", submission_bytes("s-att-4", None)),  # no request: not counted
        ("ranking", ranking("s-att-4", CANDS)),
    ]
    if not submission_first:
        events = [events[i ^ 1] for i in range(len(events))]
    for kind, raw in events:
        assert agg.add(kind, raw, NOW)
    sv = build_summary(agg, NOW)["savings"]
    # s-att-1: an hour on A100 = $10 for 360,000 samples; on H100 at 54,000 samples/$ = $6.667
    usd_best = 100.0 * 3600 / (300.0 * 3600 / 20.0)
    for block in (sv["recent"], sv["total"]):
        assert block["n"] == 2
        assert math.isclose(block["savings"], (10 + 20 - usd_best - 20) / (10 + 20))
        assert math.isclose(block["usd_saved_per_requested_hour"], (10 - usd_best) / 2)
        assert block["rank1_differs_share"] == 0.5
    assert sv["awaiting_submission"] == 0


def test_malformed_and_duplicates_are_counted_not_raised() -> None:
    agg = Aggregator()
    assert not agg.add("ranking", b"{not json", NOW)
    assert not agg.add("ranking", None, NOW)
    assert not agg.add("ranking", orjson.dumps({"event_id": "x", "candidates": []}), NOW)
    assert not agg.add("finish", orjson.dumps([1, 2]), NOW)
    raw = ranking("d-att-1", CANDS)
    assert agg.add("ranking", raw, NOW)
    assert not agg.add("ranking", raw, NOW)
    s = build_summary(agg, NOW)
    assert s["totals"]["rankings"] == 1 and s["totals"]["duplicates"] == 1
    assert s["totals"]["malformed"] == {"ranking": {"bad_json": 1, "no_value": 1, "bad_attempt_id": 1},
                                        "finish": {"bad_json": 1}}


def _feed(agg: Aggregator, start: int, n: int) -> None:
    for i in range(start, start + n):
        # every ranking a new hardware name and model version: labels must stay bounded too
        attempt = f"m{i}-att-{i}"
        agg.add("submission", submission_bytes(attempt, "A100-80GB"), NOW + i / 100)
        agg.add("ranking", ranking(attempt, [(f"HW-{i}", 100.0, 10.0), ("A100-80GB", 50.0, 10.0)],
                                   fallback=f"reason-{i}", model=f"v{i}"), NOW + i / 100)
        if i % 2:
            agg.add("finish", finish_bytes(attempt, "A100-80GB", 55.0), NOW + i / 100)
        agg.add("finish", finish_bytes(f"x{i}-att-{i}", "A100-80GB", 55.0), NOW + i / 100)  # never ranked


def _dashboard_bytes() -> int:
    """Traced memory allocated from ``leap/dashboard/`` code (other threads of the test process excluded)."""
    gc.collect()
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, "*/dashboard/*")])
    return sum(stat.size for stat in snapshot.statistics("filename"))


def test_memory_is_bounded() -> None:
    config = AggregatorConfig(feed_size=5, accuracy_window=50, savings_window=50, pending_limit=200,
                              requested_limit=200, history_seconds=30, seen_limit=500, max_labels=8,
                              candidate_lists=100)
    # The aggregator sys.intern()s hardware names, and every ranking here brings a new one. The
    # interpreter's interned-string table (shared by the whole process) is reallocated, ~2 MB
    # attributed to leap/dashboard/ code, after however many inserts everything imported before left
    # room for: intern the names up front, so only the aggregator's own memory is measured.
    names = [sys.intern(f"HW-{i}") for i in range(6000)]
    tracemalloc.start()  # before anything is kept, so that frees of the first objects are seen
    try:
        agg = Aggregator(config)
        _feed(agg, 0, 2000)  # fill every window and map past its limit
        before = _dashboard_bytes()
        _feed(agg, 2000, 4000)
        grown = _dashboard_bytes() - before
    finally:
        tracemalloc.stop()
        del names
    assert grown < 200_000, f"aggregator grew by {grown} bytes over 4,000 more rankings"
    assert len(agg.pending) <= 200 and agg.pending.evicted > 0
    assert len(agg.requested) <= 200 and len(agg.awaiting_submission) <= 200
    assert len(agg.early_finishes) <= 200 and agg.early_finishes.evicted > 0
    assert len(agg.feed) == 5 and len(agg.accuracy) == 50 and len(agg.savings) == 50
    assert all(len(s) <= 500 for s in agg._seen.values())
    for counter in (agg.best_share, agg.fallback_reasons, agg.models):
        assert len(counter.counts) <= 9 and OTHER in counter.counts
    s = build_summary(agg, NOW + 60)
    assert len(s["series"]["rankings"]) == 30 and len(s["series"]["accuracy"]) <= 30
    assert s["totals"]["rankings"] == 6000


def test_per_second_series_and_rate() -> None:
    ps = PerSecond(5)
    for t, n in ((100.2, 3), (101.5, 1), (103.9, 2), (104.1, 4)):
        ps.add(t, n)
    assert ps.series(105.0) == [3, 1, 0, 2, 4]
    assert ps.series(107.0) == [0, 2, 4, 0, 0]  # old seconds age out
    assert ps.rate(105.0, 2) == 3.0


def test_ingest_benchmark_joins_every_ranking_with_its_finish() -> None:
    """``bench dashboard-ingest`` measures the real join: every synthetic ranking meets its finish
    (its speed is a figure of docs/dashboard.md, not asserted here)."""
    result = measure(3000)
    assert result["rankings"] == result["joined"] == 3000
    assert result["pending_after_rankings_only"] > 0  # rankings without finishes wait, as in serving


def test_grafana_dashboard_uses_only_defined_metrics() -> None:
    import re

    from prometheus_client.metrics import MetricWrapperBase

    from streams import metrics

    defined = {m._name for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)}
    board = orjson.loads((ROOT / "grafana" / "leap.json").read_bytes())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    used = {re.sub(r"_(bucket|sum|count|total|info)$", "", name) for e in exprs for name in re.findall(r"leap_\w+", e)}
    assert used == defined, (used ^ defined)
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])


# ---------------------------------------------------------------- CLI arguments


def _cli() -> typer.Typer:
    app = typer.Typer()
    app.command()(dashboard_cmd)
    return app


@pytest.mark.parametrize("args, message", [
    (["--port", "0"], "--port"),
    (["--port", "70000"], "--port"),
    (["--from", "last tuesday"], "ISO time"),
    (["--from", "2999-01-01T00:00"], "future"),
    (["--host", "no-such-host.invalid"], "cannot resolve"),
])
def test_bad_arguments_exit_non_zero_with_a_clear_message(args: list[str], message: str) -> None:
    result = CliRunner().invoke(_cli(), args)
    assert result.exit_code == 2
    assert message in result.output.replace("\n", " ")


def test_port_in_use_is_a_clear_error() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        result = CliRunner().invoke(_cli(), ["--port", str(s.getsockname()[1])])
    assert result.exit_code == 2 and "already in use" in result.output


def test_parse_since() -> None:
    assert parse_since("15m", now=10_000.0) == 10_000.0 - 900
    assert parse_since("1970-01-01T01:00:00") == 3600.0
    assert parse_since("1970-01-01T02:00:00+01:00") == 3600.0


# ---------------------------------------------------------------- on the real broker


def _summary(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/api/summary", timeout=5) as resp:
        return dict(orjson.loads(resp.read()))


def _wait(url: str, done: Any, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        s = _summary(url)
        if done(s) or time.monotonic() > deadline:
            return s
        time.sleep(0.25)


@pytest.fixture
def own_topics(settings: Settings) -> Iterator[dict[str, str]]:
    """Fresh rankings / finishes / submissions topics, so that the counts are exact."""
    run = uuid.uuid4().hex[:8]
    kinds = {f"leap-test-{run}.rankings": "ranking", f"leap-test-{run}.job-finishes": "finish",
             f"leap-test-{run}.submissions": "submission"}
    create_topics(settings, tuple(Topic(name, 3) for name in kinds))
    try:
        yield kinds
    finally:
        AdminClient(settings.confluent_config()).delete_topics(list(kinds), operation_timeout=30)


@pytest.mark.integration
def test_app_on_own_topics_exact(settings: Settings, own_topics: dict[str, str]) -> None:
    agg = Aggregator()
    follower = Follower(settings, agg, topics=own_topics)
    topic = {kind: name for name, kind in own_topics.items()}
    with BackgroundServer(create_app(agg, follower, push_interval=0.2)) as url, \
            SchedulerClient(settings, follow_rankings=False) as client:
        for i in range(20):
            attempt = f"it-att-{i}"
            client.publish_raw(topic["submission"], "it", submission_bytes(attempt, "A100-80GB"))
            client.publish_raw(topic["ranking"], "it", ranking(attempt, CANDS))
            # H100 was predicted 300; half the attempts measure 300 (hit), half 400 (25% off: miss)
            client.publish_raw(topic["finish"], "it", finish_bytes(attempt, "H100-SXM", 300.0 if i % 2 else 400.0))
        client.publish_raw(topic["ranking"], "it", b"{broken")
        client.flush()
        s = _wait(url, lambda s: s["accuracy"]["n"] == 20 and s["savings"]["total"]["n"] == 20)
    assert s["source"]["state"] == "following"
    assert s["totals"] | {"malformed": None} == {"rankings": 20, "finishes": 20, "submissions": 20,
                                                 "duplicates": 0, "malformed": None}
    assert s["totals"]["malformed"] == {"ranking": {"bad_json": 1}}
    assert s["accuracy"]["acc@10"] == 0.5 and s["accuracy"]["acc@20"] == 0.5
    assert math.isclose(s["accuracy"]["mape"], 0.125)
    assert math.isclose(s["savings"]["total"]["savings"], 1 - (100.0 * 3600 / 54_000) / 10)
    assert s["best_hardware_share"] == [{"hardware": "H100-SXM", "count": 20, "share": 1.0}]
    assert s["coverage"] == 1.0 and s["fallback_rate"] == 0.0


@pytest.mark.integration
def test_app_on_leap_topics_and_event_stream(settings: Settings, topics: dict[str, str]) -> None:
    run = uuid.uuid4().hex[:8]
    agg = Aggregator()
    with BackgroundServer(create_app(agg, Follower(settings, agg), push_interval=0.2)) as url, \
            SchedulerClient(settings, follow_rankings=False) as client:
        before = _summary(url)["totals"]
        attempts = [f"dash{run}-att-{i}" for i in range(5)]
        for a in attempts:
            client.publish_raw(RANKINGS.name, a, ranking(a, CANDS, fallback="cold_start_roofline"))
            client.publish_raw(JOB_FINISHES.name, a, finish_bytes(a, "A100-80GB", 100.0))
        client.flush()
        s = _wait(url, lambda s: {f["attempt_id"] for f in s["feed"]} >= set(attempts)
                  and s["accuracy"]["joined_total"] >= 5)
        # others may publish on the shared topics meanwhile: at least ours arrived
        assert s["totals"]["rankings"] - before["rankings"] >= 5
        assert s["totals"]["finishes"] - before["finishes"] >= 5
        assert s["fallback_reasons"].get("cold_start_roofline", 0) >= 5
        with urllib.request.urlopen(url + "/events", timeout=5) as resp:
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            lines = [resp.readline() for _ in range(4)]
        assert lines[0] == b"retry: 2000\n" and lines[2] == b"event: summary\n"
        assert orjson.loads(lines[3].removeprefix(b"data: "))["totals"]["rankings"] >= 5
        with urllib.request.urlopen(url + "/", timeout=5) as resp:
            page = resp.read().decode()
        assert "<canvas" in page and "http://" not in page and "https://" not in page  # self-contained


@pytest.mark.integration
def test_health_is_503_until_kafka_answers() -> None:
    # nothing listens on this port: the follower keeps retrying and the page says so
    dead = Settings(kafka_bootstrap=f"127.0.0.1:{free_port()}")
    agg = Aggregator()
    follower = Follower(dead, agg, metadata_timeout=2.0)
    server = BackgroundServer(create_app(agg, follower), ready_path="/", timeout=10)
    with server as url:
        try:
            urllib.request.urlopen(url + "/healthz", timeout=5)
            raise AssertionError("expected 503")
        except urllib.error.HTTPError as exc:
            assert exc.code == 503
        s = _wait(url, lambda s: s["source"]["state"] == "error", timeout=20)
        assert s["source"]["state"] == "error" and s["source"]["error"]
