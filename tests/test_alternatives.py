"""The alternative models: every registered one fits and predicts on a tiny sample, the shared
preprocessing, and ``leap alternatives`` on a tiny run (outputs written, bad arguments refused)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from leap.cli import app
from leap.core.hardware import load_catalogue
from leap.fleet.history import simulate, write_history
from leap.training import alternatives as alt
from leap.training.alternatives.preprocess import ANCHOR_COLUMNS, Preprocessor, anchor
from leap.training.alternatives.report import markdown, merge
from leap.training.dataset import Examples, build_examples, read_history
from leap.training.days import parse_day

ROOT = Path(__file__).resolve().parent.parent
GAVEL = ROOT / "data" / "measurements" / "gavel.csv"
#: Models that return NaN where they have no estimate (the baselines without lookup medians, the
#: pairwise model without a prior elsewhere); every other learned alternative always answers.
MAY_ABSTAIN = {"lookup", "transfer", "transfer_paired", "pairwise_lightgbm"}


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three simulated days of 300 attempts."""
    out = tmp_path_factory.mktemp("alt-history")
    write_history(simulate(seed=5, days=3, attempts_per_day=300, start=parse_day("2025-03-01")), out)
    return out


@pytest.fixture(scope="module")
def examples(history: Path) -> Examples:
    return build_examples(read_history(history), load_catalogue())


@pytest.fixture(scope="module")
def split(examples: Examples) -> tuple[Examples, Examples]:
    """Train on the first two thirds of the attempts, test on the rest."""
    cut = int(len(examples) * 2 / 3)
    order = np.arange(len(examples))
    return examples.select(order < cut), examples.select(order >= cut)


def _make(name: str) -> Any:
    try:
        model = alt.ALTERNATIVES[name](0)
    except alt.AlternativeUnavailable as exc:
        pytest.skip(str(exc))
    # Encoding text is the language models' cost: a small sample and a few steps prove the loop
    # (their own tests, tests/test_language_models.py, train further).
    if name.startswith("lm_") and hasattr(model, "max_rows"):
        model.max_rows = 128
    if name == "lm_finetuned":
        tuned: Any = model
        tuned.max_epochs, tuned.learning_rates, tuned.batch = 1, (1e-5,), 8
    return model


@pytest.mark.parametrize("name", alt.NAMES)
def test_every_model_fits_and_predicts_per_accelerator(name: str, split: tuple[Examples, Examples]) -> None:
    train, test = split
    model = _make(name)
    assert alt.fit(model, train.rows, train.y, train.job_key) is model
    pred = model.predict(test.rows)
    assert pred.shape == (len(test),)
    if name not in MAY_ABSTAIN:
        assert np.isfinite(pred).all() and (pred > 0).all()
    ok = np.isfinite(pred)
    # Per accelerator: the median prediction is within a factor of 10 of the measured one.
    assert 0.1 < float(np.median(pred[ok] / test.y[ok])) < 10
    lo, hi = model.predict_band(pred, test.rows)
    assert (lo[ok] <= pred[ok] + 1e-9).all() and (hi[ok] >= pred[ok] - 1e-9).all()
    assert model.predict({c: v[:0] for c, v in test.rows.items()}).shape == (0,)


def test_registry_names_every_model_of_the_report() -> None:
    wanted = {"lightgbm", "lookup", "transfer", "ridge", "knn", "random_forest", "mlp", "lightgbm_plain",
              "pairwise_lightgbm", "lm_frozen", "lm_finetuned"}
    assert wanted <= set(alt.NAMES)
    assert alt.resolve("all") == list(alt.NAMES)
    assert alt.resolve("ridge, knn,ridge") == ["ridge", "knn"]
    with pytest.raises(ValueError, match="unknown model"):
        alt.resolve("ridge,gpt")


def test_a_missing_language_module_fails_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    real = importlib.import_module

    def without_language(name: str, *args: Any) -> Any:
        if name == "leap.training.alternatives.language":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", without_language)
    with pytest.raises(alt.AlternativeUnavailable, match=r"lm_frozen: leap/training/alternatives/language\.py is not"):
        alt.ALTERNATIVES["lm_frozen"](0)


def test_preprocessor_learns_from_training_rows_only(split: tuple[Examples, Examples]) -> None:
    train, test = split
    pre = Preprocessor().fit(train.rows, np.log(train.y))
    x, base, source = pre.transform(test.rows)
    assert x.shape == (len(test), pre.n_features()) and np.isfinite(x).all()
    assert np.isfinite(base).all() and ((source >= 0) & (source <= len(ANCHOR_COLUMNS))).all()
    # A category never seen in training lands in the "other" column; nothing breaks.
    odd = {**test.rows, "hardware": np.full(len(test), "NoSuchChip", dtype=object)}
    assert np.isfinite(pre.transform(odd)[0]).all()
    ordinal = Preprocessor(categorical="ordinal").fit(train.rows, np.log(train.y))
    assert ordinal.transform(test.rows)[0].shape[1] == ordinal.n_features() < pre.n_features()


def test_anchor_follows_the_chain_and_falls_back() -> None:
    nan = np.nan
    rows = {c: np.array([1.0, nan, nan]) if c == ANCHOR_COLUMNS[0] else np.array([nan, 2.0, nan])
            for c in ANCHOR_COLUMNS}
    rows["hardware"] = np.array(["a", "b", "c"], dtype=object)
    value, source = anchor(rows, fallback=7.0)
    assert value.tolist() == [1.0, 2.0, 7.0]
    assert source.tolist() == [0, 1, len(ANCHOR_COLUMNS)]


# ---------------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def tiny_table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three Gavel workloads: folds under both protocols in seconds."""
    with GAVEL.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["workload"] in {"LM", "ResNet-18", "Transformer"}]
    path = tmp_path_factory.mktemp("alt-table") / "tiny.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def test_cli_writes_json_markdown_and_png(history: Path, tiny_table: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["alternatives", "--history", str(history), "--days", "1", "--models", "lightgbm_plain,ridge,transfer",
            "--tables", str(tiny_table), "--json", str(out / "a.json"), "--markdown", str(out / "a.md"),
            "--plot", str(out / "a.png")]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    result = orjson.loads((out / "a.json").read_bytes())
    assert result["simulator"]["days"] == 1
    for name in ("lightgbm_plain", "ridge", "transfer"):
        figures = result["simulator"]["mean"][name]
        assert {"acc@10", "acc@20", "mape", "top1", "regret", "fit_s", "predict_us_per_row"} <= set(figures)
        for protocol in ("config_fold", "leave_one_workload_out"):
            assert "acc@10" in result["tables"]["tiny"]["protocols"][protocol]["models"][name]
    text = (out / "a.md").read_text()
    assert "| model | acc@10 | acc@20 | MAPE | top-1 | regret | band | fit s | µs/row |" in text
    assert "## tiny config_fold" in text and "| ridge |" in text
    assert (out / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("extra", "message"), [
    (["--models", "ridge,gpt"], "unknown model(s) gpt"),
    (["--models", " , "], "no model named"),
    (["--tables", "no/such.csv"], "no such table(s): no/such.csv"),
    (["--days", "5"], "too short for 5 test days"),
    (["--plot", "chart.svg"], "--plot writes a PNG"),
])
def test_cli_refuses_bad_arguments(history: Path, extra: list[str], message: str) -> None:
    res = CliRunner().invoke(app, ["alternatives", "--history", str(history), "--tables", "none",
                                   "--models", "transfer", *extra])
    assert res.exit_code == 2
    assert message in " ".join(res.output.split())


def test_cli_refuses_a_missing_history(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["alternatives", "--history", str(tmp_path / "nope"), "--tables", "none"])
    assert res.exit_code == 2
    assert "no such history folder" in " ".join(res.output.split())


def test_evaluate_measurements_scores_the_alternatives(tiny_table: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.json"
    res = CliRunner().invoke(app, ["evaluate-measurements", str(tiny_table), "--models", "lightgbm,ridge,knn",
                                   "--json", str(out)])
    assert res.exit_code == 0, res.output
    protocols = orjson.loads(out.read_bytes())["protocols"]
    for block in protocols.values():
        assert {"lightgbm", "ridge", "knn"} <= set(block["models"])


def test_alternatives_report_merges_saved_results(tiny_table: Path, tmp_path: Path) -> None:
    # Two invocations of different models on the same table and seed, merged into one report.
    for name in ("transfer", "lookup"):
        res = CliRunner().invoke(app, ["alternatives", "--tables", str(tiny_table), "--models", name, "--seed", "1",
                                       "--json", str(tmp_path / f"{name}.json")])
        assert res.exit_code == 0, res.output
    out = tmp_path / "out"
    saved = [str(tmp_path / "transfer.json"), str(tmp_path / "lookup.json")]
    res = CliRunner().invoke(app, ["alternatives-report", *saved, "--json", str(out / "m.json"),
                                   "--markdown", str(out / "m.md"), "--plot", str(out / "m.png")])
    assert res.exit_code == 0, res.output
    merged = orjson.loads((out / "m.json").read_bytes())
    assert merged["models"] == ["transfer", "lookup"] and merged["seed"] == 1
    single = orjson.loads((tmp_path / "lookup.json").read_bytes())["tables"]["tiny"]["protocols"]
    for protocol, block in merged["tables"]["tiny"]["protocols"].items():
        assert list(block["models"]) == ["transfer", "lookup"]
        assert block["models"]["lookup"] == single[protocol]["models"]["lookup"]  # figures carried unchanged
    assert "| lookup |" in (out / "m.md").read_text() and "| transfer |" in (out / "m.md").read_text()
    assert (out / "m.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The same model twice is refused, as is a result of another seed.
    res = CliRunner().invoke(app, ["alternatives-report", str(tmp_path / "lookup.json"), str(tmp_path / "lookup.json")])
    assert res.exit_code == 2 and "lookup in more than one result" in " ".join(res.output.split())


def test_merge_refuses_different_folds_and_seeds() -> None:
    def result(seed: int, folds: int, model: str) -> dict[str, Any]:
        block = {"folds": folds, "rows": {"other": 3}, "seconds": 1.0, "models": {model: {"acc@10": 0.5}}}
        table = {"rows": 10, "jobs": 2, "seed": seed, "models": [model], "seconds": 1.0,
                 "protocols": {"config_fold": block}}
        return {"models": [model], "seed": seed, "simulator": None, "tables": {"t": table}}

    merged = merge([result(1, 5, "a"), result(1, 5, "b")])
    assert set(merged["tables"]["t"]["protocols"]["config_fold"]["models"]) == {"a", "b"}
    assert merged["tables"]["t"]["protocols"]["config_fold"]["seconds"] == 2.0
    with pytest.raises(ValueError, match="folds differ"):
        merge([result(1, 5, "a"), result(1, 4, "b")])
    with pytest.raises(ValueError, match="different seeds"):
        merge([result(1, 5, "a"), result(2, 5, "b")])
    with pytest.raises(ValueError, match="nothing to merge"):
        merge([])


def _simulated(model: str, seed: int = 0, data_hash: str = "h", pick_sample: int = 1500) -> dict[str, Any]:
    """A saved simulator backtest of one model over two nights, shaped as ``backtest_alternatives`` returns."""
    figures = {"acc@10": 0.5, "top1": 0.4, "regret": 0.3, "fit_s": 1.0, "pick_sample": pick_sample}
    per_day = [{"day": day, "train_rows": 100, "test_rows": 10, "candidate_rows": 20 * pick_sample,
                model: {**figures}, "by_evidence": {"same": {"share": 0.6, model: 0.9}}}
               for day in ("2025-01-01", "2025-01-02")]
    sim = {"history": "H", "data_hash": data_hash, "days": 2, "window_days": 30, "seed": seed,
           "models": [model], "mean": {model: figures},
           "by_evidence": {"same": {"share": 0.6, model: 0.9}}, "per_day": per_day}
    return {"models": [model], "seed": seed, "simulator": sim, "tables": {}}


def test_merge_joins_backtests_of_the_same_nights() -> None:
    # Cheap models ranked in full on 1,500 submissions a day, a language model on 200: one report.
    merged = merge([_simulated("served"), _simulated("lm", pick_sample=200)])
    sim = merged["simulator"]
    assert sim["models"] == ["served", "lm"] and set(sim["mean"]) == {"served", "lm"}
    assert sim["by_evidence"]["same"] == {"share": 0.6, "served": 0.9, "lm": 0.9}
    for day in sim["per_day"]:
        assert "candidate_rows" not in day  # they differ: each model keeps its own
        assert day["served"]["candidate_rows"] == 30_000 and day["lm"]["candidate_rows"] == 4_000
        assert set(day["by_evidence"]["same"]) == {"share", "served", "lm"}
    text = markdown(merged)
    assert "| served |" in text and "| lm |" in text
    assert "submissions ranked in full a day (served: 1,500; lm: 200)" in text
    # A third result, merged into one already split: every model keeps its own count.
    third = merge([merged, _simulated("knn", pick_sample=50)])["simulator"]["per_day"][0]
    assert [third[n]["candidate_rows"] for n in ("served", "lm", "knn")] == [30_000, 4_000, 1_000]
    # Same sample: no note, the day keeps one count.
    same = merge([_simulated("a"), _simulated("b")])
    assert same["simulator"]["per_day"][0]["candidate_rows"] == 30_000
    assert "ranked in full a day" not in markdown(same)


@pytest.mark.parametrize(("other", "message"), [
    (_simulated("lm", data_hash="other"), "data_hash differ"),
    (_simulated("lm", seed=1), "different seeds"),
    (_simulated("served"), "served in more than one result"),
])
def test_merge_refuses_backtests_of_other_nights(other: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        merge([_simulated("served"), other])


def test_without_tune_the_parts_dir_keeps_each_table_fold_and_a_rerun_reads_them(tiny_table: Path,
                                                                                 tmp_path: Path) -> None:
    args = ["alternatives", "--tables", str(tiny_table), "--models", "transfer,ridge", "--seed", "1",
            "--parts-dir", str(tmp_path / "parts")]
    for run in ("first", "again"):
        res = CliRunner().invoke(app, [*args, "--json", str(tmp_path / f"{run}.json")])
        assert res.exit_code == 0, res.output
    assert list((tmp_path / "parts").glob("*.json"))
    first, again = ({p: block["models"] for p, block in orjson.loads((tmp_path / f"{run}.json").read_bytes())
                     ["tables"]["tiny"]["protocols"].items()} for run in ("first", "again"))
    assert first == again  # fit times included: the folds were read back, not fitted again


def _scores(result: dict[str, Any]) -> dict[str, Any]:
    """A table's scores per protocol and model, without the times (which differ run by run)."""
    return {protocol: {name: {k: v for k, v in scores.items() if k not in ("fit_s", "predict_us_per_row")}
                       for name, scores in block["models"].items()}
            for protocol, block in result["tables"]["tiny"]["protocols"].items()}


def test_workers_fit_the_table_folds_in_processes_to_the_scores_of_one_process(tiny_table: Path,
                                                                              tmp_path: Path) -> None:
    args = ["alternatives", "--tables", str(tiny_table), "--models", "transfer,ridge", "--seed", "1"]
    one = CliRunner().invoke(app, [*args, "--json", str(tmp_path / "one.json")])
    two = CliRunner().invoke(app, [*args, "--workers", "2", "--parts-dir", str(tmp_path / "parts"),
                                   "--json", str(tmp_path / "two.json")])
    assert one.exit_code == 0 and two.exit_code == 0, one.output + two.output
    assert "ridge under leave_one_workload_out: every fold kept" in two.output
    folds = sum(orjson.loads((tmp_path / "one.json").read_bytes())["tables"]["tiny"]["protocols"][p]["folds"]
                for p in ("config_fold", "leave_one_workload_out"))
    assert len(list((tmp_path / "parts").glob("*.json"))) == 2 * folds  # every (model, fold), each once
    assert _scores(orjson.loads((tmp_path / "two.json").read_bytes())) == _scores(
        orjson.loads((tmp_path / "one.json").read_bytes()))
