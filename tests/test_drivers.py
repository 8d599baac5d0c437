"""Drivers report on a tiny simulated history: shape, finite numbers, the prior group matters."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from leap.cli import app
from leap.core.hardware import load_catalogue
from leap.fleet.history import simulate, write_history
from leap.training.dataset import build_examples, read_history
from leap.training.drivers import VARIANTS, drivers, plot_drivers
from predictor.models import BASELINES
from tests.factories import PLUMBING_PARAMS

KEYS = ("no_prior", "weekly", "window_60", "lookup", "transfer", "transfer_paired")


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("hist")
    write_history(simulate(seed=5, days=8, attempts_per_day=400), folder)
    history = read_history(folder, with_oracle=False)
    ex = build_examples(history, load_catalogue())
    return drivers(folder, days=2, examples=(history, ex), variants=KEYS, jobs=1, params=PLUMBING_PARAMS)


def test_shape_and_finite(result: dict[str, Any]) -> None:
    assert result["days"] == 2
    assert [r["key"] for r in result["variants"]] == ["default", *(v.key for v in VARIANTS if v.key in KEYS)]
    for row in result["variants"]:
        assert {"name", "group", "acc@10", "delta", "delta_sd", "per_day"} <= set(row)
        assert len(row["per_day"]) == 2
        assert all(math.isfinite(row[k]) for k in ("acc@10", "delta", "delta_sd"))
        assert 0.0 <= row["acc@10"] <= 1.0
    default = result["variants"][0]
    assert default["delta"] == 0.0 and default["acc@10"] == pytest.approx(result["baseline_acc@10"])


def test_weekly_equals_nightly_on_the_first_day(result: dict[str, Any]) -> None:
    rows = {r["key"]: r for r in result["variants"]}
    assert rows["weekly"]["per_day"][0]["delta"] == 0.0


def test_window_beyond_history_is_labelled_and_shares_the_default_fit(result: dict[str, Any]) -> None:
    rows = {r["key"]: r for r in result["variants"]}
    assert "all available" in rows["window_60"]["name"]
    # 8 days of history: a 60-day and a 30-day window select the same rows, so one fit serves both;
    # weekly reuses the first day's fit: default and no_prior on two days are all that is fitted.
    assert result["fits"] == 4
    assert rows["window_60"]["per_day"] == rows["default"]["per_day"]
    assert result["params"] == PLUMBING_PARAMS


def test_prior_throughput_drives_accuracy(result: dict[str, Any]) -> None:
    # The simulator's jobs differ from their model type's median by a persistent job factor,
    # which only the job's own prior throughput reveals.
    rows = {r["key"]: r for r in result["variants"]}
    assert rows["no_prior"]["delta"] < -0.05
    assert all(d["delta"] < 0 for d in rows["no_prior"]["per_day"])


def test_every_baseline_is_a_row() -> None:
    # The served model is judged against every baseline the backtest scores, so each is a row here.
    assert {v.baseline for v in VARIANTS if v.baseline is not None} == set(BASELINES)


def test_plot(result: dict[str, Any], tmp_path: Path) -> None:
    (path,) = plot_drivers(result, tmp_path)
    assert path.stat().st_size > 1000


def test_unknown_variant(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown variants"):
        drivers(tmp_path, variants=["bogus"])


def test_cli_refuses_an_unknown_variant_before_reading_anything(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["drivers", "--history", str(tmp_path), "--variants", "small,bogus"])
    assert res.exit_code != 0
    assert "unknown variants ['bogus']" in res.output and "constant_leaves" in res.output



def test_fits_below_the_held_out_tenth_are_started_first_among_their_size() -> None:
    from leap.training.drivers import _cost, _Fit
    from predictor.boosting import HOLDOUT_FROM

    default = _Fit((), 30, 0.0)
    short = _Fit((), 7, 0.0)
    large = _Fit((("num_leaves", 255), ("n_estimators", 600)), 30, 0.0)
    # a 7-day window below HOLDOUT_FROM rows is fitted out of fold: the slowest fit of a report
    assert _cost(short, HOLDOUT_FROM - 1) > _cost(large, 4 * HOLDOUT_FROM) > _cost(default, 4 * HOLDOUT_FROM)
    assert _cost(short, HOLDOUT_FROM) < _cost(default, 4 * HOLDOUT_FROM)
