"""Smoke test of ``leap.bench``: every benchmark at a tiny size prints one JSON object of the agreed shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from leap.bench.cli import app

pytestmark = pytest.mark.integration

TOP_KEYS = {"benchmark", "machine", "params", "repeat", "median", "spread", "wall_s"}


def run_json(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    # stdout is exactly one JSON object (progress lines go to stderr)
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, result.stdout
    out: dict[str, Any] = json.loads(lines[0])
    assert out.keys() >= TOP_KEYS
    assert out["machine"]["cpu_count"] >= 1 and out["machine"]["python"]
    assert set(out["spread"]) == set(out["median"])
    return out


def no_scratch_keys_left(rds: redis.Redis, out: dict[str, Any]) -> None:
    params = out["params"]
    for prefix in params["key_prefixes"] if "key_prefixes" in params else [params["key_prefix"]]:
        assert not list(rds.scan_iter(match=prefix + "*", count=1000)), "a benchmark left scratch keys behind"


def test_features(rds: redis.Redis) -> None:
    out = run_json("features", "--events", "300", "--reads", "256", "--read-rounds", "1", "--repeat", "2")
    assert out["benchmark"] == "features" and out["repeat"] == 2
    med = out["median"]
    for key in ("write_finishes_events_per_s", "read_entities_per_s", "read_batch_p50_ms", "read_batch_p99_ms"):
        assert med[key] > 0, key
    # Redis bytes per tracked job: the job's own keys and a share of the aggregates
    assert med["redis_bytes_per_job"] == pytest.approx(med["redis_job_keys_bytes_per_job"]
                                                       + med["redis_shared_bytes_per_job"], rel=1e-3)
    assert med["redis_job_keys_bytes_per_job"] > 0 and 0 < med["redis_tracked_jobs"] <= 300
    no_scratch_keys_left(rds, out)


def test_predict(rds: redis.Redis, tmp_path: Path) -> None:
    saved = tmp_path / "models" / "bench-model"
    # --trees 3: the compiled C of a default-sized model takes longer to build than the rest of the test
    out = run_json("predict", "--submissions", "60", "--warm", "200", "--batch", "25", "--history-days", "2",
                   "--history-per-day", "1600", "--trees", "3", "--no-no-redis", "--repeat", "1",
                   "--candidates", "6", "--save-model", str(saved))
    med = out["median"]
    assert out["params"]["variants"] == ["lookup", "lightgbm", "lightgbm_booster", "bare", "bare_booster"]
    assert out["params"]["compiled_max_abs_diff"] <= 1e-9 and med["lightgbm_compiled_speedup"] > 0
    assert out["params"]["mean_candidates"] == 6
    assert med["served_submissions_per_s"] == med["lightgbm_submissions_per_s"] > 0
    assert med["bare_submissions_per_s"] > 0 and med["served_over_bare"] > 0
    for variant in ("lookup", "lightgbm", "bare"):
        assert med[f"{variant}_submissions_per_s"] > 0
        assert med[f"{variant}_batch_p99_ms"] >= med[f"{variant}_batch_p50_ms"]
        for stage in ("decode", "read", "rows", "predict", "other", "encode"):
            assert f"{variant}_{stage}_us_per_submission" in med
    assert med["lookup_fallback_share"] == 1.0  # the fallback always says so
    assert med["lightgbm_over_lookup"] > 0
    no_scratch_keys_left(rds, out)
    # a later run loads the saved model instead of fitting one
    again = run_json("predict", "--submissions", "30", "--warm", "100", "--batch", "25", "--no-no-redis",
                     "--repeat", "1", "--model", str(saved))
    assert again["params"]["model"]["loaded_from"] == str(saved)
    assert again["params"]["model"]["main_trees"] == out["params"]["model"]["main_trees"]
    check_growth(rds, saved)
    no_scratch_keys_left(rds, again)


def test_e2e(topics: dict[str, str], rds: redis.Redis) -> None:
    out = run_json("e2e", "--rate", "50", "--duration", "1", "--drain", "5", "--warm", "100", "--repeat", "1",
                   "--warmup", "1", "--delivery", "both", "--model", "lookup")
    med = out["median"]
    for mode in ("exactly_once", "at_least_once"):
        assert med[f"{mode}_received"] == med[f"{mode}_published"] > 0, mode
        assert out[f"{mode}_model_versions"] == {"lookup": med[f"{mode}_received"]}  # the pinned model
    assert med["exactly_once_over_at_least_once"] > 0
    # the worker's own commit histogram, read from its /metrics around each run
    assert med["exactly_once_commits_per_s"] > 0 and med["exactly_once_commit_mean_ms"] > 0
    assert med["exactly_once_commit_p99_ms_at_most"] > 0 and med["at_least_once_commits_per_s"] == 0
    assert med["published"] > 0
    assert med["received"] == med["published"], "every submission gets a ranking"
    assert med["latency_p50_ms"] > 0 and med["latency_p99_ms"] >= med["latency_p50_ms"]
    assert med["hop_in_p50_ms"] > 0 and med["hop_out_p50_ms"] > 0
    assert med["bare_rankings_per_s"] > 0 and med["ratio_to_bare"] > 0
    assert out["params"]["warmup_s"] == 1.0
    assert out["consumer_group_members"] == 1  # its own worker, alone in the group of its key prefix
    no_scratch_keys_left(rds, out)


@pytest.mark.scale
def test_scale(topics: dict[str, str], rds: redis.Redis) -> None:
    out = run_json("scale", "--duration", "2", "--rate", "50", "--pause-window", "2", "--warm", "200")
    med = out["median"]
    for phase in ("one_worker", "two_workers"):
        assert med[f"{phase}_received"] == med[f"{phase}_published"] > 0, "every submission gets a ranking"
    assert med["two_over_one"] > 0 and med["open_loop_unanswered"] == 0 and len(out["changes_at_s"]) == 2
    assert med["open_loop_longest_gap_ms"] > 0 and med["open_loop_latency_p99_ms"] >= med["open_loop_latency_p50_ms"]
    assert med["rebalance_latency_p99_ms"] >= med["rebalance_latency_p50_ms"] > 0
    no_scratch_keys_left(rds, out)


def test_soak(topics: dict[str, str], rds: redis.Redis) -> None:
    out = run_json("soak", "--minutes", "0.15", "--rate", "40", "--sample-s", "1", "--warmup-s", "2",
                   "--warm", "200", "--bad-share", "0.05")
    med = out["median"]
    assert med["rankings"] == med["submissions"] > 0 and med["finishes"] > 0
    assert med["dead_letters"] >= med["malformed"] > 0, "every malformed message is dead-lettered"
    assert med["lag_features"] == med["lag_predictor"] == 0
    for role in ("features", "predictor"):
        assert med[f"{role}_rss_end_mb"] > 0 and f"{role}_rss_growth" in med
    assert all(out["workers_alive_at_end"].values())
    no_scratch_keys_left(rds, out)


def test_feast_says_clearly_when_feast_is_missing_or_prints_its_json(rds: redis.Redis) -> None:
    """Feast is a bench-only extra: without it the command fails with what to install; with it
    (in this interpreter) the tiny run prints the side-by-side JSON and leaves no keys behind."""
    import importlib.util

    args = ["feast", "--events", "200", "--entities", "256", "--rounds", "1", "--repeat", "1"]
    if importlib.util.find_spec("feast") is None:
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and "Feast is not installed" in result.stderr
        return
    out = run_json(*args)
    med = out["median"]
    assert med["leap_read_entities_per_s"] > 0 and med["feast_read_entities_per_s"] > 0 and med["ratio"] > 0
    no_scratch_keys_left(rds, out)
    assert not list(rds.scan_iter(match="*" + out["params"]["feast_project"], count=1000))


def test_train(tmp_path: Path) -> None:
    history = tmp_path / "history"  # simulated into it (an existing one is reused)
    out = run_json("train", "--days", "3", "--attempts-per-day", "700", "--window-days", "2", "--trees", "3",
                   "--history", str(history), "--repeat", "1")
    med = out["median"]
    assert out["benchmark"] == "train" and out["params"]["history"] == str(history)
    assert med["seconds"] > med["fit_s"] >= 0 and med["train_rows"] > 0
    assert 0.05 < med["peak_rss_gb"] < 64  # a Python process with pandas-free Arrow and LightGBM loaded
    assert 0 <= med["holdout_acc10"] <= 1
    # the next night resumed from the checkpoint of a run a day earlier: the cold run's rows, less replayed
    assert med["resumed"] == 0 and med["nightly_resumed"] == 1
    assert med["nightly_train_rows"] == med["train_rows"] and med["checkpoint_run_seconds"] > 0
    assert med["checkpoint_run_peak_rss_gb"] > 0
    assert med["nightly_holdout_acc10"] == med["holdout_acc10"]  # the same rows, the same fit
    assert 1 <= med["main_trees"] <= 3  # --trees is the most the main model grows


def test_backtest(tmp_path: Path) -> None:
    history = tmp_path / "history"
    kept = tmp_path / "backtest.json"
    out = run_json("backtest", "--days", "2", "--jobs", "2", "--history-days", "4", "--attempts-per-day", "300",
                   "--history", str(history), "--repeat", "1", "--result-json", str(kept))
    med = out["median"]
    assert out["benchmark"] == "backtest" and out["params"]["history"] == str(history)
    assert med["nights"] == 2 and 0 <= med["lightgbm_acc10"] <= 1 and med["seconds"] > 0
    # two workers beside their parent: the tree's peak is more than any one process's
    assert 0.05 < med["peak_process_rss_gb"] < med["peak_tree_rss_gb"] < 64
    assert json.loads(kept.read_text())["mean"]["lightgbm"]["acc@10"] == pytest.approx(med["lightgbm_acc10"], abs=1e-4)


def check_growth(rds: redis.Redis, saved: Path) -> None:
    """``bench growth`` on a model ``bench predict`` saved (fitting one here would double the test)."""
    out = run_json("growth", "--candidates", "2", "--candidates", "5", "--candidates", "99", "--submissions", "40",
                   "--warm", "150", "--memory-attempts", "300", "--model", str(saved), "--repeat", "2")
    assert out["benchmark"] == "growth" and out["repeat"] == 2
    mean = out["params"]["mean_candidates"]
    assert mean["2"] == 2 and mean["5"] == 5 and mean["99"] == out["params"]["catalogue_size"]
    med = out["median"]
    for count in (2, 5, 99):
        for variant in ("lookup", "lightgbm"):
            assert med[f"c{count}_{variant}_submissions_per_s"] > 0
    memory = out["redis_memory"]
    assert memory["jobs"] > 0 and memory["bytes_per_job"] > 0 and memory["shared_mb"] > 0
    assert memory["bytes_per_job"] == pytest.approx(sum(memory["bytes_per_job_by_key"].values()), abs=1)
    assert len(out["params"]["key_prefixes"]) == 2
    no_scratch_keys_left(rds, out)


def test_workloads_are_reproducible() -> None:
    """Benchmarks and tests that never reach a broker start their workload at a fixed time: the
    simulator's arrivals and catalogue depend on the date, so a wall-clock start drew other jobs."""
    from leap.bench.workload import make_workload

    a, b = make_workload(300, 40, seed=3), make_workload(300, 40, seed=3)
    assert a.finishes == b.finishes and a.submissions == b.submissions and a.starts == b.starts


def test_dashboard_ingest() -> None:
    out = run_json("dashboard-ingest", "--rankings", "2000")
    assert out["benchmark"] == "dashboard_ingest"
    med = out["median"]
    assert med["joined"] == med["rankings"] == 2000
    assert med["mixed_rankings_per_s"] > 0 and med["summary_ms"] > 0


def test_dashboard_live(topics: dict[str, str]) -> None:
    """Every ranking published through the broker is counted by the served dashboard."""
    out = run_json("dashboard-live", "--rate", "200", "--seconds", "2")
    med = out["median"]
    assert med["rankings_counted"] == med["rankings_published"] == 400
    assert med["summary_requests"] >= 1 and med["summary_ms_p50"] > 0
