"""Backtest on a tiny simulated history: shape, the references' order, the ceiling's rules."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from leap.cli import app
from leap.fleet.history import simulate, write_history
from leap.training.backtest import METHODS
from leap.training.backtest import backtest as run_backtest
from leap.training.backtest_plots import plot_report

SMALL = {"num_leaves": 15, "n_estimators": 60}
# The backtest's logic is under test, not the model: small trees, and no learned roofline (a fixed
# cost per fit) where the command line does not set the parameters.
FAST = {**SMALL, "learned_roofline": False}


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hist")
    write_history(simulate(seed=3, days=8, attempts_per_day=600), folder)
    return folder


@pytest.fixture(scope="module")
def result(history: Path) -> dict[str, Any]:
    return run_backtest(history, days=2, params=FAST)


def test_nights_scored_in_worker_processes_equal_nights_scored_here(history: Path) -> None:
    one_thread = {**FAST, "num_threads": 1}  # what each worker's fit gets
    here = run_backtest(history, days=2, params=one_thread)
    pooled = run_backtest(history, days=2, params=one_thread, jobs=2)
    assert here["days"] == pooled["days"] == 2
    for key in ("per_day", "lightgbm_by_hardware", "lightgbm_by_family", "lightgbm_sample"):
        assert orjson.dumps(pooled[key]) == orjson.dumps(here[key]), key


def test_shape(result: dict[str, Any]) -> None:
    assert result["days"] == 2 and len(result["per_day"]) == 2
    assert list(result["mean"]) == list(METHODS)
    for name in METHODS:
        extra = {"band_coverage"} if name == "lightgbm" else set()
        assert set(result["mean"][name]) == {"acc@10", "acc@20", "mape", "top1", "regret"} | extra
    low, high = result["band_coverage_range"]
    assert 0.0 < low <= high <= 1.0 and result["mean"]["lightgbm"]["band_coverage"] > 0.5
    for values in result["mean"].values():
        assert all(math.isfinite(v) for v in values.values())
    # Extra cost of a pick is bounded by the worst candidate: lookup and transfer, which have
    # nothing to say for some jobs, still pick among the candidates.
    assert all(0.0 <= m["regret"] < 20.0 for m in result["mean"].values())
    shares = [v["share"] for v in result["by_evidence"].values()]
    assert sum(shares) == pytest.approx(1.0)
    assert set(result["by_evidence"]) == {"same", "other", "none"}


def test_references_bound_the_models(result: dict[str, Any]) -> None:
    mean = {name: m["acc@10"] for name, m in result["mean"].items()}
    # The oracle knows each job's own speed factor; the ceiling only what its history shows.
    assert mean["oracle"] > mean["ceiling"] > mean["lookup"]
    other = result["by_evidence"]["other"]
    # With the law's exact ratio a prior carries across hardware far better than by medians.
    assert other["ceiling"] > other["transfer"] + 0.1
    # A ranking compares candidates of one job, so its speed factor cancels: with the law's
    # exact ratios the ceiling ranks nearly as well as the oracle, far better than any model.
    assert result["mean"]["ceiling"]["top1"] > max(result["mean"][n]["top1"] for n in ("lightgbm", "transfer"))
    # Without history the ceiling cannot know the job factor: far below the oracle.
    none = result["by_evidence"]["none"]
    assert none["ceiling"] < none["oracle"] - 0.3


def test_plot_report(result: dict[str, Any], tmp_path: Path) -> None:
    paths = plot_report(result, tmp_path)
    assert {p.name for p in paths} >= {"accuracy_per_day.png", "predicted_vs_actual.png"}
    assert all(p.stat().st_size > 5000 for p in paths)


def test_cli_writes_json_and_prints_tables(history: Path, tmp_path: Path) -> None:
    out = tmp_path / "bt.json"
    res = CliRunner().invoke(app, ["backtest", "--history", str(history), "--days", "1", "--json", str(out),
                                   "--trees", str(SMALL["n_estimators"]), "--leaves", str(SMALL["num_leaves"])])
    assert res.exit_code == 0, res.output
    doc = orjson.loads(out.read_bytes())
    assert doc["days"] == 1 and set(doc["mean"]) == set(METHODS)
    assert doc["params"] == SMALL
    assert "ceiling" in res.output and "history" in res.output


def test_cli_refuses_a_history_too_short(history: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["backtest", "--history", str(history), "--days", "30",
                                   "--json", str(tmp_path / "x.json")])
    assert res.exit_code != 0
    assert "too short" in res.output
