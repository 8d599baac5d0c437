"""The measurement-table evaluation: folds, the served model scored on identical rows, the CLI."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from leap.core.accuracy import summary
from leap.core.hardware import load_catalogue
from leap.training import measurements as m
from leap.training.alternatives.pairwise import PairwiseLightGBM
from leap.training.dataset import read_history
from leap.training.train import fit_model
from predictor.lgbm import evidence_level
from predictor.models import PriorTransfer
from tests.factories import slice_table

ROOT = Path(__file__).resolve().parent.parent
GAVEL = ROOT / "data" / "measurements" / "gavel.csv"
LAMBDA = ROOT / "data" / "measurements" / "lambda.csv"
MLPERF = ROOT / "data" / "measurements" / "mlperf.csv"


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three Gavel workloads: enough configurations for 5 folds, fast to fit."""
    return slice_table(GAVEL, tmp_path_factory.mktemp("m") / "small.csv", {"LM", "ResNet-18", "Transformer"})


@pytest.mark.parametrize("protocol", m.PROTOCOLS)
def test_folds_partition_rows_and_never_split_a_configuration(small: Path, protocol: str) -> None:
    t = m.load_table(small)
    cfg = m.configuration_ids(t)  # every suite's measurements of a configuration on one side
    masks = list(m.folds(t, protocol, seed=0))
    assert np.array_equal(np.sum(masks, axis=0), np.ones(len(t)))  # every row tested exactly once
    for test in masks:
        assert not set(cfg[test].tolist()) & set(cfg[~test].tolist())
    if protocol == "config_fold":
        assert len(masks) == m.N_FOLDS
    else:  # one fold per workload, holding out all of it
        assert sorted({t.workload[int(np.flatnonzero(k)[0])] for k in masks}) == sorted(set(t.workload))
        for test in masks:
            assert len({t.workload[i] for i in np.flatnonzero(test).tolist()}) == 1


def test_config_fold_holds_a_configuration_out_in_every_suite_at_once() -> None:
    t = m.load_table(LAMBDA)
    configuration = m.configuration_ids(t)
    # the table measures some configurations in both suites: two jobs, one configuration
    assert int(m.job_ids(t).max()) > int(configuration.max())
    for test in m.folds(t, "config_fold", seed=1):
        assert not set(configuration[test].tolist()) & set(configuration[~test].tolist())


def test_leave_one_workload_out_folds_do_not_move_with_the_seed(small: Path) -> None:
    t = m.load_table(small)
    seed0 = list(m.folds(t, "leave_one_workload_out", seed=0))
    seed1 = list(m.folds(t, "leave_one_workload_out", seed=1))
    assert all(np.array_equal(a, b) for a, b in zip(seed0, seed1, strict=True))


def test_a_fold_trains_on_other_jobs_and_tests_every_attempt_of_its_own(small: Path) -> None:
    t, th = m.load_history(small)
    test_rows = next(iter(m.folds(t, "config_fold", seed=0)))
    fold = m.make_fold(th, test_rows, load_catalogue())
    assert sorted(fold.test.attempt_id.tolist()) == sorted(th.attempt_id[test_rows].tolist())
    assert sorted(fold.train.attempt_id.tolist()) == sorted(th.attempt_id[~test_rows].tolist())
    assert not set(fold.train.job_key.tolist()) & set(fold.test.job_key.tolist())


def test_lambda_suites_are_never_one_job(tmp_path: Path) -> None:
    t, th = m.load_history(slice_table(LAMBDA, tmp_path / "l.csv", {"resnet50"}))
    assert {"v0", "v1_v2_curated"} <= set(t.suite)
    for job in set(th.job_key.tolist()):
        assert len({t.suite[i] for i in np.flatnonzero(th.job_key == job).tolist()}) == 1


def test_the_served_model_is_what_is_scored(small: Path) -> None:
    """The report's ``lightgbm`` equals LightGBMThroughput fitted by leap.training.train.fit_model."""
    result = m.evaluate(small, models="lightgbm", protocols=("config_fold",))
    t, th = m.load_history(small)
    cat = load_catalogue()
    preds, ys, levels, inside = [], [], [], []
    for test_rows in m.folds(t, "config_fold", seed=0):
        fold = m.make_fold(th, test_rows, cat)
        model = fit_model(fold.train, {"seed": 0})
        preds.append(model.predict(fold.test.rows))
        lower, upper = model.predict_band(preds[-1], fold.test.rows)
        inside.append((fold.test.y >= lower) & (fold.test.y <= upper))
        ys.append(fold.test.y)
        levels.append(evidence_level(fold.test.rows))
    p, y, lv = np.concatenate(preds), np.concatenate(ys), np.concatenate(levels)
    banded = (lv == 1) & np.isfinite(p)
    scored = result["protocols"]["config_fold"]["models"]["lightgbm"]
    assert scored["all"] == summary(p, y)
    assert {k: scored[k] for k in ("acc@10", "acc@20", "mape", "n")} == \
        {k: v for k, v in summary(p[lv == 1], y[lv == 1]).items() if k != "n_missing"}
    # the band the served model reports, over the same rows (a baseline without one reports none)
    assert scored["band_coverage"] == float(np.mean(np.concatenate(inside)[banded]))
    assert m.REGISTRY["lightgbm"] is m.ServedModel


class _Constant:
    """A plug-in under the estimator contract: the training median everywhere."""

    def fit(self, rows: dict[str, np.ndarray], y: np.ndarray, groups: np.ndarray) -> _Constant:
        assert len(groups) == len(y)
        self.value = float(np.median(y))
        return self

    def predict(self, rows: dict[str, np.ndarray]) -> np.ndarray:
        return np.full(len(rows["hardware"]), self.value)


def test_any_estimator_plugs_in_on_identical_rows(small: Path) -> None:
    result = m.evaluate(small, factories={"constant": _Constant, "transfer": PriorTransfer})
    for block in result["protocols"].values():
        a, b = block["models"]["constant"], block["models"]["transfer"]
        assert a["n"] == b["n"] and a["all"]["n"] == b["all"]["n"] == result["rows"]
        assert a["n_ranked"] == b["n_ranked"] > 0
        assert a["fit_s"] >= 0 and a["predict_us_per_row"] > 0


def test_every_registered_model_takes_the_run_seed_as_its_seed() -> None:
    """A factory is called with the run's seed as its one argument (``--seed 1``): it must land in
    the model's ``seed``, never in its first parameter (that made 1-leaf trees and a crash)."""
    for name, make in m.REGISTRY.items():
        model = make(7)
        params = model.get_params() if hasattr(model, "get_params") else {}
        if "seed" in params:
            assert params["seed"] == 7, name
            assert [k for k, v in params.items() if v == 7 and k != "seed"] == [], name


def test_pairwise_model_needs_a_prior_elsewhere(small: Path) -> None:
    t, th = m.load_history(small)
    fold = m.make_fold(th, next(iter(m.folds(t, "config_fold", 0))), load_catalogue())
    pred = PairwiseLightGBM().fit(fold.train.rows, fold.train.y, fold.train.job_key).predict(fold.test.rows)
    cold = fold.test.rows["prior_other_n"] == 0
    assert np.isnan(pred[cold]).all() and np.isfinite(pred[~cold]).all()


def test_cli_json_shape_and_determinism(small: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    res = CliRunner().invoke(m.app, [str(small), "--json", str(out), "--models", "lookup,transfer"])
    assert res.exit_code == 0, res.output
    doc = orjson.loads(out.read_bytes())
    assert doc["rows"] == len(m.load_table(small)) and doc["models"] == ["lookup", "transfer"]
    assert set(doc["protocols"]) == set(m.PROTOCOLS)
    for block in doc["protocols"].values():
        assert sum(block["rows"].values()) == doc["rows"]
        for s in block["models"].values():
            assert {"acc@10", "acc@20", "mape", "n", "all", "by_evidence", "top1", "regret", "fit_s",
                    "predict_us_per_row"} <= set(s)
            assert s["n"] == block["rows"]["other"] == s["by_evidence"]["other"]["n"]
            assert 0.0 <= s["acc@10"] <= s["acc@20"] <= 1.0
    again = orjson.loads(orjson.dumps(m.evaluate(small, models="lookup,transfer")))  # NaN -> null
    for p in m.PROTOCOLS:  # deterministic, same as the API (timings aside)
        for name, s in again["protocols"][p]["models"].items():
            drop = ("fit_s", "predict_us_per_row")
            assert {k: v for k, v in s.items() if k not in drop} == \
                {k: v for k, v in doc["protocols"][p]["models"][name].items() if k not in drop}


def test_cli_writes_a_history_that_leap_train_reads(small: Path, tmp_path: Path) -> None:
    from leap.training.train import train
    from predictor.registry import Registry

    res = CliRunner().invoke(m.app, [str(small), "--out", str(tmp_path / "h"), "--convert-only"])
    assert res.exit_code == 0, res.output
    history = read_history(tmp_path / "h")
    assert history.finishes.num_rows == len(m.load_table(small))
    _record, report = train(tmp_path / "h", Registry(tmp_path / "reg"))
    assert report["training_window"]["rows"] > 0 and report["holdout"]["rows"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--models", "lightgbm,no_such_model"], "unknown model(s) no_such_model; known: lightgbm, lookup, transfer"),
        (["--models", ","], "no model named"),
        (["--convert-only"], "--convert-only needs --out DIR"),
    ],
)
def test_bad_arguments_are_refused_clearly(small: Path, args: list[str], message: str) -> None:
    res = CliRunner().invoke(m.app, [str(small), *args])
    assert res.exit_code == 2
    assert message in res.output


HEADER = "workload,hardware,num_accelerators,global_batch_size,throughput"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("workload,hardware,throughput\nx,A,1\n", "missing column(s) num_accelerators, global_batch_size"),
        (f"{HEADER}\nx,A,1,8,0\n", "throughput must be"),
        (f"{HEADER}\nx,A,1,8,-3\n", "throughput must be"),
        (f"{HEADER}\nx,A,1,8,fast\n", "not a number"),
        (f"{HEADER}\nx,A,0,8,5\n", "num_accelerators must be"),
        (f"{HEADER}\n", "no data rows"),
        (f"{HEADER}\nx,A,1,8,5\n", "nothing to pair"),
        (f"{HEADER}\nx,A,1,8.5,5\nx,B,1,8.5,6\n", "global_batch_size must be a whole number"),
    ],
)
def test_bad_csv_gives_clear_error_and_nonzero_exit(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(m.MeasurementError, match=message.replace("(", r"\(").replace(")", r"\)")):
        m.evaluate(path)
    res = CliRunner().invoke(m.app, [str(path)])
    assert res.exit_code == 2
    assert message in res.output


def test_missing_file(tmp_path: Path) -> None:
    res = CliRunner().invoke(m.app, [str(tmp_path / "nope.csv")])
    assert res.exit_code == 2
    assert "no such file" in res.output


def test_mlperf_table_is_one_configuration_per_round_and_benchmark() -> None:
    t = m.load_table(MLPERF)
    cfg = m.job_ids(t)
    keys = {(t.suite[i], t.workload[i]) for i in range(len(t))}
    assert int(cfg.max()) + 1 == len(keys)
    assert set(t.batch.tolist()) == {1.0}


def test_a_throughput_model_without_groups_plugs_in_as_it_is(small: Path) -> None:
    result = m.evaluate(small, factories={"transfer": PriorTransfer}, protocols=("config_fold",))
    wrapped = m.evaluate(small, models="transfer", protocols=("config_fold",))
    drop = ("fit_s", "predict_us_per_row")
    a = result["protocols"]["config_fold"]["models"]["transfer"]
    b = wrapped["protocols"]["config_fold"]["models"]["transfer"]
    assert orjson.dumps({k: v for k, v in a.items() if k not in drop}) == \
        orjson.dumps({k: v for k, v in b.items() if k not in drop})


def test_a_checkpointed_run_reads_back_each_fold_it_kept_and_resumes_at_one_it_lacks(small: Path, tmp_path: Path
                                                                                      ) -> None:
    """Each (model, fold) is kept as it ends; a run again reads every kept fold (its recorded fit
    time comes back to the digit) to the same scores, NaNs and band included, and fits only a
    fold whose file is gone."""
    kept = tmp_path / "folds"
    run = functools.partial(m.evaluate, small, models="pairwise_lightgbm,transfer_paired",
                            protocols=("config_fold",), checkpoint=kept)
    first = run()
    files = sorted(kept.glob("*.json"))
    assert len(files) == 2 * first["protocols"]["config_fold"]["folds"]
    again = run()
    scores = [result["protocols"]["config_fold"]["models"] for result in (first, again)]

    def same(a: dict[str, Any], b: dict[str, Any], drop: tuple[str, ...]) -> bool:
        return orjson.dumps({k: {s: v for s, v in a[k].items() if s not in drop} for k in a}) == \
            orjson.dumps({k: {s: v for s, v in b[k].items() if s not in drop} for k in b})

    assert same(scores[0], scores[1], ("predict_us_per_row",))  # the fit times too: read, not fitted
    assert 0 < scores[1]["pairwise_lightgbm"]["band_coverage"] <= 1  # the band's inside flags came back
    files[0].unlink()
    resumed = run()["protocols"]["config_fold"]["models"]
    assert sorted(kept.glob("*.json")) == files and not list(kept.glob("*.partial"))
    assert same(scores[0], resumed, ("predict_us_per_row", "fit_s"))
    res = CliRunner().invoke(m.app, [str(small), "--models", "transfer_paired", "--seed", "3",
                                     "--checkpoint", str(tmp_path / "cli")])
    assert res.exit_code == 0, res.output
    assert len(list((tmp_path / "cli").glob("*.json"))) > 0
