"""The measurement-table evaluation: protocol hygiene, output shape and input validation."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from core.accuracy import TRUST_GRID
from training import measurements as m

ROOT = Path(__file__).resolve().parent.parent
GAVEL = ROOT / "data" / "measurements" / "gavel.csv"
LAMBDA = ROOT / "data" / "measurements" / "lambda.csv"


def _slice(src: Path, dst: Path, workloads: set[str]) -> Path:
    with src.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["workload"] in workloads]
    with dst.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return dst


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three Gavel workloads: enough configurations for 5 folds, fast to fit."""
    return _slice(GAVEL, tmp_path_factory.mktemp("m") / "small.csv", {"LM", "ResNet-18", "Transformer"})


def test_pairs_use_only_other_hardware_of_the_same_configuration(small: Path) -> None:
    t = m.load_table(small)
    cfg = m.config_ids(t)
    pairs = m.build_pairs(t, cfg)
    assert len(pairs) > 0
    for p in range(len(pairs)):
        i = int(pairs.row[p])
        assert pairs.prior_hw[p] != t.hardware[i]
        same = [j for j in range(len(t)) if cfg[j] == cfg[i] and t.hardware[j] == pairs.prior_hw[p]]
        assert same and pairs.prior[p] == np.median(t.throughput[same])


@pytest.mark.parametrize("protocol", m.PROTOCOLS)
def test_folds_partition_rows_and_never_split_a_configuration(small: Path, protocol: str) -> None:
    t = m.load_table(small)
    cfg = m.config_ids(t)
    masks = list(m.folds(t, cfg, protocol, seed=0))
    assert np.array_equal(np.sum(masks, axis=0), np.ones(len(t)))  # every row tested exactly once
    for test in masks:
        assert not set(cfg[test].tolist()) & set(cfg[~test].tolist())


def test_test_targets_never_reach_their_predictions(small: Path) -> None:
    """Scale every test-fold measurement on one hardware type h by 1000.

    Pairs whose target is on h take their priors from other hardware, so with no leakage from
    test targets (into features, training, medians or ratios) their predictions cannot move.
    """
    t = m.load_table(small)
    cfg = m.config_ids(t)
    pairs = m.build_pairs(t, cfg)
    space = m.FeatureSpace.build(t)
    for protocol in m.PROTOCOLS:
        test_rows = next(iter(m.folds(t, cfg, protocol, seed=0)))
        h = t.hardware[int(np.flatnonzero(test_rows)[0])]
        on_h = test_rows & (np.array(t.hardware) == h)
        test, before = m.fold_predictions(t, pairs, test_rows, space)
        own = on_h[pairs.row[test]]
        assert own.any()

        t2 = t.with_throughput(np.where(on_h, t.throughput * 1000.0, t.throughput))
        test2, after = m.fold_predictions(t2, m.build_pairs(t2, cfg), test_rows, space)
        assert np.array_equal(test, test2)
        for model in m.MODELS:
            np.testing.assert_array_equal(before[model][own], after[model][own])


def test_training_rows_changes_do_move_predictions(small: Path) -> None:
    """The check above is not vacuous: the models do read the training folds."""
    t = m.load_table(small)
    cfg = m.config_ids(t)
    space = m.FeatureSpace.build(t)
    test_rows = next(iter(m.folds(t, cfg, "config_fold", seed=0)))
    _, before = m.fold_predictions(t, m.build_pairs(t, cfg), test_rows, space)
    tput = np.where(test_rows, t.throughput, t.throughput * 3.0)
    t2 = t.with_throughput(tput)
    _, after = m.fold_predictions(t2, m.build_pairs(t2, cfg), test_rows, space)
    assert not np.allclose(before["lookup"], after["lookup"])


def test_new_workload_blends_trees_with_transfer(small: Path) -> None:
    """A held-out workload gets transfer x (trees / transfer) ** w, w from the trust grid."""
    t = m.load_table(small)
    cfg = m.config_ids(t)
    pairs = m.build_pairs(t, cfg)
    space = m.FeatureSpace.build(t)
    test_rows = next(iter(m.folds(t, cfg, "leave_one_workload_out", seed=0)))
    test, preds = m.fold_predictions(t, pairs, test_rows, space)
    train = np.flatnonzero(~test_rows[pairs.row])
    keep = [k for k, n in enumerate(space.names) if n not in m.DEFAULT_EXCLUDE]
    names = [space.names[k] for k in keep]
    trees = m.fit_predict(
        space.matrix(t, pairs, train)[:, keep],
        np.log(t.throughput[pairs.row[train]] / pairs.prior[train]),
        space.matrix(t, pairs, test)[:, keep], names, [n for n in space.categorical if n in names], 0,
    ) + np.log(pairs.prior[test])
    transfer = np.log(preds["transfer"])
    w = (np.log(preds["lightgbm"]) - transfer) / (trees - transfer)
    moved = np.abs(trees - transfer) > 1e-6
    assert moved.any()
    assert np.allclose(w[moved], w[moved][0], atol=1e-6)  # one weight for the whole fold
    assert min(abs(w[moved][0] - g) for g in TRUST_GRID) < 1e-6


def test_evaluate_and_cli_json_shape(small: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    res = CliRunner().invoke(m.app, [str(small), "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = orjson.loads(out.read_bytes())
    assert doc["rows"] == len(m.load_table(small)) and doc["pairs"] > 0
    assert set(doc["protocols"]) == set(m.PROTOCOLS)
    for models in doc["protocols"].values():
        assert set(models) == set(m.MODELS)
        for s in models.values():
            assert {"acc@10", "acc@20", "mape", "n"} <= set(s)
            assert s["n"] == doc["pairs"]
            assert 0.0 <= s["acc@10"] <= s["acc@20"] <= 1.0
    assert doc == orjson.loads(orjson.dumps(m.evaluate(small)))  # deterministic, same as the API


def test_lambda_suites_are_never_paired(tmp_path: Path) -> None:
    t = m.load_table(_slice(LAMBDA, tmp_path / "l.csv", {"resnet50"}))
    cfg = m.config_ids(t)
    pairs = m.build_pairs(t, cfg)
    assert {"v0", "v1_v2_curated"} <= set(t.suite)
    for p in range(len(pairs)):
        i = int(pairs.row[p])
        prior_rows = [j for j in range(len(t)) if cfg[j] == cfg[i] and t.hardware[j] == pairs.prior_hw[p]]
        assert {t.suite[j] for j in prior_rows} == {t.suite[i]}


HEADER = "workload,hardware,num_accelerators,global_batch_size,throughput"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


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
    ],
)
def test_bad_csv_gives_clear_error_and_nonzero_exit(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path / "bad.csv", text)
    with pytest.raises(m.MeasurementError, match=message.replace("(", r"\(").replace(")", r"\)")):
        m.evaluate(path)
    res = CliRunner().invoke(m.app, [str(path)])
    assert res.exit_code == 2
    assert message in res.output


def test_missing_file(tmp_path: Path) -> None:
    res = CliRunner().invoke(m.app, [str(tmp_path / "nope.csv")])
    assert res.exit_code == 2
    assert "no such file" in res.output
