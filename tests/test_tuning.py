"""The one search routine of ``leap alternatives --tune``: the same budget for every family,
choices by table rotation, the chosen settings in the result; and the inputs, targets and
held-out parts by job that every alternative now has."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import orjson
import pytest

from leap.core.hardware import load_catalogue
from leap.fleet.history import simulate, write_history
from leap.training.alternatives import tuning
from leap.training.alternatives.pairwise import PairwiseLightGBM
from leap.training.alternatives.plain import PlainLightGBM
from leap.training.alternatives.report import markdown
from leap.training.alternatives.sklearn_models import RidgeThroughput, held_out_jobs
from leap.training.dataset import Examples, build_examples, read_history
from leap.training.days import parse_day
from tests.factories import slice_table

ROOT = Path(__file__).resolve().parent.parent
GAVEL = ROOT / "data" / "measurements" / "gavel.csv"


@pytest.mark.parametrize("family", list(tuning.CLASSES))
def test_every_family_gets_the_same_number_of_settings_defaults_first(family: str) -> None:
    settings = tuning.settings_of(family, draws=20, seed=3)
    assert len(settings) == 20
    assert settings[0] == {}
    assert len({tuple(sorted((k, repr(v)) for k, v in s.items())) for s in settings}) == 20
    taken = inspect.signature(tuning.CLASSES[family]).parameters
    assert all(set(s) <= set(taken) for s in settings)
    assert settings == tuning.settings_of(family, draws=20, seed=3)  # seeded
    tuning.make(family, settings[-1], seed=0)  # every drawn setting makes a model


def test_rotation_chooses_each_table_on_the_others_only() -> None:
    # draws x tables x protocols: draw 1 is best on table 0 only, draw 2 on tables 1 and 2
    scores = np.zeros((3, 3, 2))
    scores[1, 0] = 0.9
    scores[2, 1:] = 0.5
    # table 0 sees only draw 2's 0.5; tables 1 and 2 see draw 1's 0.45 against draw 2's 0.25
    assert tuning.choose_by_rotation(scores) == [2, 1, 1]
    rng = np.random.default_rng(0)
    for table in range(3):  # a table's own scores never move its choice
        moved = scores.copy()
        moved[:, table] = rng.random((3, 2))
        assert tuning.choose_by_rotation(moved)[table] == tuning.choose_by_rotation(scores)[table]
    with pytest.raises(ValueError, match="two tables"):
        tuning.choose_by_rotation(scores[:, :1])


def test_tuned_tables_report_each_family_at_its_chosen_draw(tmp_path: Path) -> None:
    paths = [slice_table(GAVEL, tmp_path / "a.csv", {"LM", "ResNet-18", "Transformer"}),
             slice_table(GAVEL, tmp_path / "b.csv", {"A3C", "CycleGAN", "ResNet-50", "Recommendation"})]
    names = ["transfer_paired", "ridge", "pairwise_lightgbm"]
    tables, tun = tuning.tuned_tables(paths, names, draws=2, seed=0)
    assert tun["tables"] == ["a", "b"] and tun["draws"] == 2
    for stem in ("a", "b"):
        for protocol, block in tables[stem]["protocols"].items():
            assert set(block["models"]) == set(names)
            for family in ("ridge", "pairwise_lightgbm"):
                chosen = tun["rotation"][stem][family]
                assert chosen["chosen_on"] == [s for s in ("a", "b") if s != stem]
                assert block["models"][family]["settings"] == tun["settings"][family][chosen["draw"]]
                k, p = ["a", "b"].index(stem), tun["protocols"].index(protocol)
                assert block["models"][family]["acc@10"] == pytest.approx(tun["acc10"][family][chosen["draw"]][k][p],
                                                                          abs=1e-4, nan_ok=True)
    text = markdown({"models": names, "seed": 0, "simulator": None, "tables": tables, "tuning": tun})
    assert "## Settings chosen (tables)" in text and "| a | ridge |" in text
    with pytest.raises(ValueError, match="two tables"):
        tuning.tuned_tables(paths[:1], names, draws=2)


def test_searches_of_tables_run_apart_join() -> None:
    a = {"draws": 2, "seed": 1, "settings": {"ridge": [{}]}, "results": {"a": {}}}
    b = {**a, "results": {"b": {}}}
    assert list(tuning.join_searches([a, b])["results"]) == ["a", "b"]
    with pytest.raises(ValueError, match="more than one"):
        tuning.join_searches([a, a])
    with pytest.raises(ValueError, match="different"):
        tuning.join_searches([a, {**b, "seed": 2}])


def test_held_out_part_is_whole_jobs() -> None:
    groups = np.repeat(np.array([f"job{i}" for i in range(60)]), 5)
    held = held_out_jobs(len(groups), groups, seed=1)
    for job in np.unique(groups):
        assert len(set(held[groups == job].tolist())) == 1
    assert 0 < held.sum() < len(groups)


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Examples:
    out = tmp_path_factory.mktemp("tune-history")
    write_history(simulate(seed=5, days=3, attempts_per_day=300, start=parse_day("2025-03-01")), out)
    return build_examples(read_history(out), load_catalogue())


@pytest.mark.parametrize("model", [
    RidgeThroughput(target="log"), RidgeThroughput(target="residual"), PlainLightGBM(target="anchor"),
    PlainLightGBM(target="log"), PairwiseLightGBM(reference="anchor", n_estimators=50),
], ids=["ridge-log", "ridge-residual", "plain-anchor", "plain-log", "pairwise-anchor"])
def test_every_target_fits_and_predicts(model: object, examples: Examples) -> None:
    cut = int(len(examples) * 2 / 3)
    order = np.arange(len(examples))
    train, test = examples.select(order < cut), examples.select(order >= cut)
    pred = model.fit(train.rows, train.y, train.job_key).predict(test.rows)  # type: ignore[attr-defined]
    has = np.isfinite(pred)
    assert has.any() and (pred[has] > 0).all()
    ok = np.abs(pred[has] / test.y[has] - 1) <= 0.5
    assert ok.mean() > 0.2  # learns something: a broken target scores near 0


def test_a_bad_target_is_refused(examples: Examples) -> None:
    with pytest.raises(ValueError, match="target"):
        RidgeThroughput(target="raw").fit(examples.rows, examples.y, examples.job_key)
    with pytest.raises(ValueError, match="reference"):
        PairwiseLightGBM(reference="raw").fit(examples.rows, examples.y)


@pytest.fixture(scope="module")
def tuning_history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tuning-history") / "h"
    write_history(simulate(seed=31, days=3, attempts_per_day=300, start=parse_day("2025-03-01")), out)
    return out


@pytest.fixture(scope="module")
def half_tuning_history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tuning history at half the attempts a day: the command's plumbing, not its scores, is
    under test where it is used, and the served model's fits take time in proportion to the rows."""
    out = tmp_path_factory.mktemp("half-tuning-history") / "h"
    write_history(simulate(seed=31, days=3, attempts_per_day=150, start=parse_day("2025-03-01")), out)
    return out


def test_tune_on_history_chooses_each_familys_best_night_score(tuning_history: Path) -> None:
    choice = tuning.tune_on_history(tuning_history, ["ridge", "lightgbm_plain"], draws=3, days=1, pick_sample=20)
    for family in ("ridge", "lightgbm_plain"):
        scores = choice["acc10"][family]
        chosen = choice["chosen"][family]
        assert len(scores) == 3 and chosen["acc10"] == max(scores)
        assert chosen["settings"] == tuning.settings_of(family, 3)[chosen["draw"]]
        assert chosen["defaults_acc10"] == scores[0]
    model = tuning.chosen_factories(choice)["ridge"](0)
    assert isinstance(model, RidgeThroughput)


def test_cli_tune_needs_two_tables_or_a_tuning_history(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from leap.cli import app

    one = slice_table(GAVEL, tmp_path / "a.csv", {"LM", "ResNet-18", "Transformer"})
    res = CliRunner().invoke(app, ["alternatives", "--tables", str(one), "--tune", "2", "--models", "ridge"])
    assert res.exit_code == 2 and "at least two tables" in " ".join(res.output.split())
    res = CliRunner().invoke(app, ["alternatives", "--tables", "none", "--history", str(tmp_path), "--tune", "2",
                                   "--models", "ridge"])
    assert res.exit_code == 2 and "--tune-history for the simulator" in " ".join(res.output.split())


def test_a_search_in_parts_scores_as_one_run_and_resumes_from_its_saved_parts(tmp_path: Path) -> None:
    from leap.training.alternatives import search_parts

    paths = [slice_table(GAVEL, tmp_path / "a.csv", {"LM", "ResNet-18", "Transformer"}),
             slice_table(GAVEL, tmp_path / "b.csv", {"A3C", "CycleGAN", "ResNet-50", "Recommendation"})]
    one = tuning.search_tables(paths, ["ridge", "knn"], draws=2, seed=1, fixed=["transfer_paired"])
    parts_dir = tmp_path / "parts"
    two = tuning.search_tables(paths, ["ridge", "knn"], draws=2, seed=1, fixed=["transfer_paired"], workers=2,
                               parts_dir=parts_dir)
    assert len(list(parts_dir.glob("*.json"))) == 4  # two parts per table, each saved
    assert two["threads_per_fit"] == 1 and one["threads_per_fit"] != 1
    for stem in ("a", "b"):
        assert two["results"][stem]["models"] == one["results"][stem]["models"]
        for protocol, block in one["results"][stem]["protocols"].items():
            other = two["results"][stem]["protocols"][protocol]["models"]
            assert list(other) == list(block["models"])
            assert _json({m: s["acc@10"] for m, s in other.items()}) == _json(
                {m: s["acc@10"] for m, s in block["models"].items()})

    def refit(*args: object) -> None:
        raise AssertionError("a saved part was fitted again")

    original = search_parts.evaluate_part
    search_parts.evaluate_part = refit  # type: ignore[assignment]
    try:
        again = tuning.search_tables(paths, ["ridge", "knn"], draws=2, seed=1, fixed=["transfer_paired"],
                                     parts_dir=parts_dir, workers=2)
    finally:
        search_parts.evaluate_part = original
    assert _json(again["results"]) == _json(two["results"])


def test_cli_tunes_the_simulator_on_its_tuning_history_and_reports_the_served_defaults_beside(
        half_tuning_history: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from leap.cli import app

    history = half_tuning_history
    out = tmp_path / "sim.json"
    res = CliRunner().invoke(app, ["alternatives", "--history", str(history), "--days", "1", "--tables", "none",
                                   "--tune", "2", "--tune-history", str(history), "--tune-days", "1",
                                   "--models", "lightgbm,ridge,transfer_paired", "--pick-sample", "20",
                                   "--json", str(out)])
    assert res.exit_code == 0, res.output
    result = orjson.loads(out.read_bytes())
    chosen = result["tuning"]["simulator"]["chosen"]
    assert result["tuning"]["simulator"]["histories"] == [str(history)]
    assert set(chosen) == {"lightgbm", "ridge"}  # the families with knobs; the baseline has none
    assert result["simulator"]["models"] == ["lightgbm", "ridge", "transfer_paired", tuning.SERVED_DEFAULTS]
    searched = result["tuning"]["simulator"]["acc10"]["lightgbm"]
    assert result["simulator"]["mean"][tuning.SERVED_DEFAULTS]["acc@10"] == pytest.approx(searched[0], abs=1e-4)
    assert result["simulator"]["mean"]["lightgbm"]["acc@10"] == pytest.approx(searched[chosen["lightgbm"]["draw"]],
                                                                             abs=1e-4)


def test_tuning_on_two_histories_chooses_by_the_mean_over_both(tuning_history: Path, tmp_path: Path) -> None:
    other = tmp_path / "h5"
    write_history(simulate(seed=5, days=3, attempts_per_day=300, start=parse_day("2025-03-01")), other)
    each = [tuning.tune_on_history(h, ["ridge"], draws=3, days=1, pick_sample=20) for h in (tuning_history, other)]
    both = tuning.tune_on_history([tuning_history, other], ["ridge"], draws=3, days=1, pick_sample=20)
    assert both["acc10_by_history"]["ridge"] == [e["acc10"]["ridge"] for e in each]
    mean = np.mean([e["acc10"]["ridge"] for e in each], axis=0)
    np.testing.assert_allclose(both["acc10"]["ridge"], mean, atol=1e-4)
    assert both["chosen"]["ridge"]["draw"] == int(np.argmax(both["acc10"]["ridge"]))
    assert both["data_hash"] == [e["data_hash"] for e in each] and len(both["histories"]) == 2


def test_a_history_search_in_parts_scores_as_one_run_and_resumes_from_its_saved_parts(
        tuning_history: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from leap.training.alternatives import search_parts

    families = ["ridge", "knn"]
    one = tuning.tune_on_history(tuning_history, families, draws=2, days=1, pick_sample=20)
    parts_dir = tmp_path / "parts"
    two = tuning.tune_on_history(tuning_history, families, draws=2, days=1, pick_sample=20, workers=2,
                                 parts_dir=parts_dir)
    assert len(list(parts_dir.glob("history-*.json"))) == 2  # two cheap parts, one per worker, each saved
    assert two["threads_per_fit"] == 1 and one["threads_per_fit"] != 1
    assert two["data_hash"] == one["data_hash"]
    assert _json(two["acc10"]) == _json(one["acc10"]) and _json(two["chosen"]) == _json(one["chosen"])

    def refit(*args: object, **kwargs: object) -> None:
        raise AssertionError("a saved part was run again, or the rows built again")

    monkeypatch.setattr(search_parts, "backtest_part", refit)
    monkeypatch.setattr("leap.training.backtest.history_examples", refit)
    again = tuning.tune_on_history(tuning_history, families, draws=2, days=1, pick_sample=20, workers=2,
                                   parts_dir=parts_dir)
    assert _json(again) == _json(two)


def test_parts_of_other_nights_are_refused_together(tuning_history: Path) -> None:
    from leap.training.alternatives.search_parts import join_nights

    part = {"data_hash": "a", "days": 1, "window_days": 30, "seed": 0, "per_day": [], "mean": {"x": {}},
            "by_evidence": {}, "models": ["x"]}
    with pytest.raises(ValueError, match="data_hash"):
        join_nights([part, {**part, "data_hash": "b", "mean": {"y": {}}}], ["x", "y"])
    with pytest.raises(ValueError, match="no part scored z"):
        join_nights([part], ["x", "z"])


def test_parts_split_the_costly_fits_first_and_leave_none_empty() -> None:
    from leap.training.alternatives.search_parts import Spec, split

    specs: list[Spec] = [("ridge#0", "ridge", {}), ("lightgbm#0", "lightgbm", {}), ("lightgbm#1", "lightgbm", {}),
             ("transfer", None, {})]
    parts = split(specs, 2)
    assert [[name for name, _, _ in p if name.startswith("lightgbm")] for p in parts] == [["lightgbm#0"],
                                                                                         ["lightgbm#1"]]
    assert sorted(name for p in parts for name, _, _ in p) == sorted(name for name, _, _ in specs)
    assert len(split(specs[:1], 3)) == 1
    with pytest.raises(ValueError, match="at least 1"):
        split(specs, 0)


def _json(value: object) -> bytes:
    """The stored form (NaN as null), so that scores read back from a saved part compare equal."""
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)
