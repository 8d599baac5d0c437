"""Backtest on a tiny simulated history: shape, the references' order, the ceiling's rules."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from leap.cli import app
from leap.fleet.history import simulate, write_history
from leap.training.backtest import METHODS, OracleTables, ceiling_predictions
from leap.training.backtest import backtest as run_backtest
from leap.training.backtest_plots import plot_report

SMALL = {"num_leaves": 15, "n_estimators": 60}


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hist")
    write_history(simulate(seed=3, days=8, attempts_per_day=600), folder)
    return folder


@pytest.fixture(scope="module")
def result(history: Path) -> dict[str, Any]:
    return run_backtest(history, days=2, params=SMALL)


def test_nights_scored_in_worker_processes_equal_nights_scored_here(history: Path) -> None:
    one_thread = {**SMALL, "num_threads": 1}  # what each worker's fit gets
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


def test_ceiling_rules() -> None:
    """The ceiling knows the law and of the job only its measurements, relative to the law there;
    a job's input cap only once a measurement of the job ran at it."""
    rows = {
        "prior_same_n": np.array([2.0, 0.0, 0.0, 0.0, 0.0]),
        "prior_same_log": np.array([math.log(7.0), np.nan, np.nan, np.nan, np.nan]),
        "prior_other_n": np.array([1.0, 3.0, 0.0, 0.0, 1.0]),
        "prior_other_log": np.array([math.log(9.0), math.log(2.0), np.nan, np.nan, math.log(5.0)]),
        "prior_hw": np.array(["A100-80GB", "A100-80GB", "none", "none", "A100-80GB"], dtype=object),
        "hardware": np.array(["H100-SXM"] * 5, dtype=object),
    }
    law = {("a0", "H100-SXM"): 40.0, ("a1", "H100-SXM"): 60.0, ("a2", "H100-SXM"): 80.0, ("a3", "H100-SXM"): 40.0,
           ("a4", "H100-SXM"): 80.0,
           # the earlier attempts where the priors were measured, at their own configurations
           ("e0", "H100-SXM"): 20.0, ("e1", "A100-80GB"): 16.0, ("e4", "A100-80GB"): 40.0}
    # a3 and a4 would run at their input caps; e4, a4's earlier attempt, ran at its own (20)
    cap = {("a3", "H100-SXM"): 30.0, ("a4", "H100-SXM"): 30.0, ("e4", "A100-80GB"): 20.0}
    finished = {"j0": [(5.0, "e0", "H100-SXM", 2)], "j1": [(5.0, "e1", "A100-80GB", 4), (50.0, "late", "A100-80GB", 4)],
                "j4": [(5.0, "e4", "A100-80GB", 4)]}
    tables = OracleTables(throughput={("e4", "A100-80GB"): 20.0}, law=law, cap=cap, finished=finished,
                          submitted={f"a{i}": (f"j{i}", 10.0) for i in range(5)},
                          accelerators={"e0": 2, "e1": 4, "late": 4, "e4": 4})
    attempts = np.array([f"a{i}" for i in range(5)], dtype=object)
    assert tables.cap_revealed(attempts).tolist() == [False, False, False, False, True]
    pred = ceiling_predictions(rows, attempts, np.full(5, 4.0), tables)
    # ran here: 7 measured per accelerator against a law of 20 / 2 there, so 0.7 x 40 / 4; only
    # elsewhere: 2 against 16 / 4 (the attempt after the submission is not known yet), so
    # 0.5 x 60 / 4; no history: the law (80 / 4), a3's cap unknown too (40 / 4); a4 measured 5
    # against 40 / 4 at its cap, so 0.5 x 80 = 40, under its cap of 30: 30 / 4
    assert pred.tolist() == pytest.approx([7.0, 7.5, 20.0, 10.0, 7.5])
    knowing = ceiling_predictions(rows, attempts, np.full(5, 4.0), tables, knows_every_cap=True)
    assert knowing.tolist() == pytest.approx([7.0, 7.5, 20.0, 7.5, 7.5])


def test_the_ceiling_knows_an_architecture_effect_only_once_a_finish_revealed_it() -> None:
    """A model type's effect on an architecture counts for the ceiling from its first finish there."""
    rows = {
        "prior_same_n": np.zeros(3), "prior_same_log": np.full(3, np.nan),
        "prior_other_n": np.zeros(3), "prior_other_log": np.full(3, np.nan),
        "prior_hw": np.array(["none"] * 3, dtype=object),
        "hardware": np.array(["TPU-v5e", "TPU-v5e", "H100-SXM"], dtype=object),
    }
    # The law includes the model type's effect: 0.5 on TPUs for bert, 2.0 on Hopper for bert.
    law = {("a0", "TPU-v5e"): 40.0, ("a1", "TPU-v5e"): 40.0, ("a2", "H100-SXM"): 80.0}
    effect = {("a0", "TPU-v5e"): 0.5, ("a1", "TPU-v5e"): 0.5, ("a2", "H100-SXM"): 2.0}
    tables = OracleTables(
        throughput={}, law=law, cap={}, finished={}, submitted={"a0": ("j0", 10.0), "a1": ("j1", 30.0),
                                                                  "a2": ("j2", 30.0)},
        architecture_effect=effect,
        # a bert job finished on a part of the TPU architecture at t = 20, none on Hopper
        revealed={("bert", "tpu"): 20.0, ("bert", "ampere"): 1.0},
        model_type={"a0": "bert", "a1": "bert", "a2": "bert"},
        architecture={"TPU-v5e": "tpu", "H100-SXM": "hopper"},
    )
    attempts = np.array(["a0", "a1", "a2"], dtype=object)
    hidden = tables.unrevealed(attempts, rows["hardware"])
    assert hidden.tolist() == [True, False, True]
    pred = ceiling_predictions(rows, attempts, np.ones(3), tables)
    # a0 was submitted before the TPU finish: the law without the effect; a1 after it: the law
    assert pred.tolist() == pytest.approx([80.0, 40.0, 40.0])
    knowing = ceiling_predictions(rows, attempts, np.ones(3), tables, knows_every_effect=True)
    assert knowing.tolist() == pytest.approx([40.0, 40.0, 80.0])


def test_the_oracle_table_says_which_part_of_the_law_is_the_architecture_effect(history: Path) -> None:
    """The simulator writes each candidate's architecture effect (spread across model types), and
    every measured finish reveals its model type on its architecture no later than it happened."""
    from leap.training.dataset import read_history

    h = read_history(history)
    assert h.oracle is not None
    effect = h.oracle.column("architecture_effect").to_numpy()
    assert np.all(effect > 0) and np.std(np.log(effect)) > 0.05
    tables = OracleTables.read(h)
    assert tables.revealed and all(t >= 0 for t in tables.revealed.values())
    first = next(iter(tables.finished.values()))[0]
    key = (tables.model_type[first[1]], tables.architecture[first[2]])
    assert tables.revealed[key] <= first[0]


def test_the_oracle_tables_know_which_measured_attempts_ran_at_their_input_cap(history: Path) -> None:
    """An attempt counts as capped when its noise-free throughput is its input cap; some are, most are not."""
    from leap.training.dataset import read_history

    tables = OracleTables.read(read_history(history))
    measured = [(a, hw) for runs in tables.finished.values() for _, a, hw, _ in runs]
    capped = [key for key in measured if key[0] in tables.capped]
    assert 0 < len(capped) < len(measured) / 2
    assert all(tables.throughput[key] == pytest.approx(tables.cap[key]) for key in capped)
    uncapped = [key for key in measured if key[0] not in tables.capped and tables.cap.get(key) is not None]
    assert all(tables.throughput[key] < tables.cap[key] for key in uncapped)


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
