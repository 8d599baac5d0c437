"""Compiled trees (predictor/compiled.py) predict what ``Booster.predict`` predicts, to 1e-9 relative.

Tiny boosters trained here (linear leaves and constant leaves, a categorical column, NaN / Zero /
None missing types) scored on rows with NaNs, zeros, values below LightGBM's zero threshold,
values far outside the training range, every category, unseen, negative and fractional
categories; the served model's class fitted on a tiny history, before and after compiling; and
the fallback to ``Booster.predict`` when there is no compiler or the compile fails.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightgbm as lgb
import numpy as np
import pytest

from leap.core.hardware import load_catalogue
from leap.core.settings import Settings
from leap.fleet.history import simulate, write_history
from leap.training.dataset import Examples, build_examples, read_history
from leap.training.train import parse_day
from predictor.compiled import (
    CFLAGS,
    CODEGEN_VERSION,
    COMPILE_TIMEOUT_S,
    CompiledTrees,
    Unsupported,
    c_source,
    library_path,
    prune,
    trees_for,
)
from predictor.lgbm import LightGBMThroughput
from predictor.registry import Registry
from predictor.reload import ModelFollower
from predictor.service import ModelHolder, lookup_fallback
from streams.events import SCHEMA_VERSION, ModelAnnouncement

RTOL = 1e-9
CATEGORIES = 6
#: Names no C source may hold (a model's strings never reach the compiler).
NAMES = ["width", "depth; int evil", "ratio", "kind */ x", "zeroish"]


def training_data(n: int = 600, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Five columns: two with NaNs, one never missing, a categorical one, one with many zeros."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 5))
    x[:, 3] = rng.integers(0, CATEGORIES, n)
    x[:, 4] = np.where(rng.random(n) < 0.4, 0.0, rng.normal(size=n))
    x[rng.random(n) < 0.15, 0] = np.nan
    x[rng.random(n) < 0.15, 1] = np.nan
    y = 2 * np.nan_to_num(x[:, 0]) - np.nan_to_num(x[:, 1]) + x[:, 2] + (x[:, 3] % 3) + 3 * (x[:, 4] == 0)
    return x, y


def scoring_rows(x: np.ndarray, seed: int = 1) -> np.ndarray:
    """Training rows plus every awkward value in every column, and every category."""
    rng = np.random.default_rng(seed)
    special = [np.nan, 0.0, -0.0, 1e-40, -1e-40, 1e-35, 1e10, -1e10, np.inf, -np.inf, 0.5, -0.5, 2.7, -1.0,
               float(CATEGORIES), 40.0, 1e12]
    rows = [x[:200]]
    for col in range(x.shape[1]):
        block = x[rng.integers(0, len(x), len(special))].copy()
        block[:, col] = special
        rows.append(block)
    cats = x[rng.integers(0, len(x), CATEGORIES)].copy()
    cats[:, 3] = np.arange(CATEGORIES)
    rows.append(cats)
    return np.ascontiguousarray(np.vstack(rows))


def train(params: dict[str, Any], seed: int = 0) -> tuple[lgb.Booster, np.ndarray]:
    x, y = training_data(seed=seed)
    data = lgb.Dataset(x, label=y, feature_name=NAMES, categorical_feature=[3])
    base = {"objective": "regression", "num_leaves": 8, "min_data_in_leaf": 5, "min_data_per_group": 5,
            "cat_smooth": 1.0, "max_cat_to_onehot": 2, "verbose": -1, "num_threads": 1, "seed": 0}
    return lgb.train({**base, **params}, data, num_boost_round=25), scoring_rows(x)


def missing_types(booster: lgb.Booster) -> set[str]:
    """The kinds of split (decision, missing type, default side) and the features of linear leaves."""
    found: set[str] = set()

    def walk(node: dict[str, Any]) -> None:
        found.update(f"linear {k}" for k in node.get("leaf_features", []))
        if "split_feature" in node:
            kind = f"{node['decision_type']} {node['missing_type']}"
            if kind == "<= None":  # NaN is read as 0.0: which side 0.0 falls on matters
                found.add(f"{kind} {'0 left' if float(node['threshold']) >= 0 else '0 right'}")
            else:
                found.add(f"{kind} {'left' if node['default_left'] else 'right'}")
            walk(node["left_child"])
            walk(node["right_child"])

    for tree in booster.dump_model()["tree_info"]:
        walk(tree["tree_structure"])
    return found


@pytest.fixture()
def cache(tmp_path: Path) -> Path:
    return tmp_path / "compiled"


@pytest.mark.parametrize("params", [
    {"linear_tree": True, "linear_lambda": 0.1},
    {},
    {"zero_as_missing": True},
], ids=["linear", "plain", "zero-as-missing"])
def test_compiled_equals_booster_predict(params: dict[str, Any], cache: Path) -> None:
    booster, rows = train(params)
    trees = trees_for(booster, cache)
    assert isinstance(trees, CompiledTrees)
    expected = booster.predict(rows, num_threads=1)
    np.testing.assert_allclose(trees.predict(rows), expected, rtol=RTOL, atol=0)
    # one row at a time, and an empty batch
    np.testing.assert_allclose([trees.predict(rows[i:i + 1])[0] for i in range(0, len(rows), 7)],
                               expected[::7], rtol=RTOL, atol=0)
    assert trees.predict(rows[:0]).shape == (0,)
    trees.block = 7  # many blocks of rows, the last one short
    np.testing.assert_allclose(trees.predict(rows), expected, rtol=RTOL, atol=0)


def test_the_models_cover_every_split_kind(cache: Path) -> None:
    """The boosters above hold every decision and missing type the compiler distinguishes
    (else the equality test would not show they are handled)."""
    kinds: set[str] = set()
    for params in ({"linear_tree": True}, {}, {"zero_as_missing": True}):
        kinds |= missing_types(train(params)[0])
    assert {"<= None 0 left", "<= None 0 right", "<= NaN left", "<= NaN right", "<= Zero left", "<= Zero right",
            "== None right"} <= kinds
    # linear leaves reading the columns with NaNs (their NaN rule: the leaf's constant value)
    assert {"linear 0", "linear 1"} <= missing_types(train({"linear_tree": True})[0])


def test_source_holds_numbers_only() -> None:
    booster, _ = train({"linear_tree": True})
    source = c_source(booster.dump_model())
    assert not any(name in source for name in NAMES)
    assert '"' not in source


@pytest.mark.parametrize("threshold", ["1); exit(1); (1", True, float("inf"), [1]])
def test_anything_but_a_finite_number_in_a_split_is_refused(threshold: Any) -> None:
    leaf = {"leaf_value": 1.0}
    split = {"split_feature": 0, "threshold": threshold, "decision_type": "<=", "default_left": True,
             "missing_type": "NaN", "left_child": leaf, "right_child": leaf}
    dump = {"objective": "regression", "max_feature_idx": 0, "tree_info": [{"tree_structure": split}]}
    with pytest.raises(Unsupported):
        c_source(dump)
    categorical = {**split, "decision_type": "==", "threshold": "1||2); exit(1"}
    with pytest.raises(Unsupported):
        c_source({**dump, "tree_info": [{"tree_structure": categorical}]})


def test_a_cached_library_is_used_and_the_folder_is_private(cache: Path) -> None:
    booster, rows = train({})
    first = trees_for(booster, cache)
    assert isinstance(first, CompiledTrees)
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
    again = trees_for(booster, cache, compiler="/nonexistent/cc")  # no compile needed
    assert isinstance(again, CompiledTrees) and again.path == first.path
    np.testing.assert_array_equal(again.predict(rows), first.predict(rows))


#: Libraries a cache may hold under a model's name that this code must not call: one of the first
#: code generator (no version, ``leap_predict`` without the block argument: called with four
#: arguments it writes through the block count), and one of this version for another booster.
STALE_SOURCES = {
    "older code generator": """
        int leap_n_features(void) { return 5; }
        int leap_n_trees(void) { return 25; }
        int leap_predict(const double* X, long n, double* out) { for (long i = 0; i < n; i++) out[i] = 1.0; return 0; }
    """,
    "another booster": f"""
        int leap_n_features(void) {{ return 5; }}
        int leap_n_trees(void) {{ return 3; }}
        int leap_codegen_version(void) {{ return {CODEGEN_VERSION}; }}
        int leap_predict(const double* X, long n, long block, double* out) {{ return -1; }}
    """,
}


@pytest.mark.parametrize("source", STALE_SOURCES.values(), ids=STALE_SOURCES.keys())
def test_a_stale_library_in_the_cache_is_compiled_again(source: str, cache: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    booster, rows = train({})
    cache.mkdir(mode=0o700)
    stale = library_path(booster, cache)
    c_file = stale.with_suffix(".c")
    c_file.write_text(source)
    subprocess.run(["cc", *CFLAGS, "-o", str(stale), str(c_file)], check=True)
    with caplog.at_level(logging.WARNING, "leap.compiled"):
        trees = trees_for(booster, cache)
    assert isinstance(trees, CompiledTrees) and trees.path == stale
    assert "compiling again" in caplog.text
    np.testing.assert_allclose(trees.predict(rows), booster.predict(rows, num_threads=1), rtol=RTOL, atol=0)
    assert "leap_codegen_version" in stale.with_suffix(".c").read_text()


def test_the_cache_keeps_the_most_recently_used_libraries(cache: Path) -> None:
    boosters = [train({}, seed=seed)[0] for seed in range(3)]
    paths = []
    for booster in boosters:
        compiled = trees_for(booster, cache)
        assert isinstance(compiled, CompiledTrees)
        paths.append(compiled.path)
        time.sleep(0.01)
    os.utime(paths[0], (time.time() - 60, time.time() - 60))
    # A worker stopped mid-compile leaves its temporary source: an old one goes, a fresh one stays.
    stale, fresh = cache / ".trees-stale.c", cache / ".trees-fresh.c"
    stale.write_text("/* left over */")
    fresh.write_text("/* being compiled */")
    os.utime(stale, (time.time() - COMPILE_TIMEOUT_S - 60,) * 2)
    prune(cache, keep=2)
    assert sorted(cache.glob("trees-*")) == sorted([*paths[1:], *(p.with_suffix(".c") for p in paths[1:])])
    assert sorted(cache.glob(".trees-*")) == [fresh]


def test_a_folder_others_can_write_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    booster, _ = train({})
    with caplog.at_level(logging.WARNING, "leap.compiled"):
        assert trees_for(booster, shared) is booster
    assert "not private" in caplog.text


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_process_stopping_mid_compile_leaves_no_compiler_and_no_temporary_file(tmp_path: Path) -> None:
    # A stand-in for cc that, like cc with cc1, runs a program of its own and waits for it.
    compiler = tmp_path / "slow-cc"
    pids = tmp_path / "pids"
    compiler.write_text(f"#!/bin/sh\nsleep 60 &\necho $$ $! > {pids}\nwait\n")
    compiler.chmod(0o755)
    cache = tmp_path / "cache"
    cache.mkdir()
    script = (
        "import sys, threading, time\n"
        "from pathlib import Path\n"
        "from predictor.compiled import build_library\n"
        f"args = ('int x;', Path({str(cache / 'trees-x.so')!r}), {str(compiler)!r})\n"
        "threading.Thread(target=build_library, args=args, daemon=True).start()\n"
        f"while not Path({str(pids)!r}).exists(): time.sleep(0.05)\n"
        "time.sleep(0.2)\n"  # the shell has written both pids; the process now exits mid-compile
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60, cwd=Path(__file__).parents[1])
    started = [int(p) for p in pids.read_text().split()]
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in started if _alive(p)], "the compiler or its child outlived the process"
    assert not list(cache.glob(".trees-*")) and not list(cache.glob("*.so"))


@pytest.mark.parametrize("compiler", ["/nonexistent/cc", shutil.which("false") or "false"], ids=["none", "fails"])
def test_falls_back_to_booster_predict_with_one_log_line(compiler: str, cache: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    booster, _ = train({"linear_tree": True})
    with caplog.at_level(logging.WARNING, "leap.compiled"):
        trees = trees_for(booster, cache, compiler=compiler)
    assert trees is booster
    assert len([r for r in caplog.records if r.name == "leap.compiled"]) == 1
    assert not list(cache.glob("*.so")) and not list(cache.glob(".trees-*"))  # nothing half-written left


def test_objectives_with_a_link_function_are_not_compiled(cache: Path, caplog: pytest.LogCaptureFixture) -> None:
    x, y = training_data()
    booster = lgb.train({"objective": "binary", "verbose": -1, "num_threads": 1}, lgb.Dataset(x, label=y > 1),
                        num_boost_round=5)
    with caplog.at_level(logging.WARNING, "leap.compiled"):
        assert trees_for(booster, cache) is booster
    assert "raw score" in caplog.text


# ---------------------------------------------------------------------------- the served model


@pytest.fixture(scope="module")
def tiny() -> Iterator[tuple[LightGBMThroughput, Examples]]:
    """The served model's class (linear base trees, learned roofline) on a tiny simulated history."""
    with tempfile.TemporaryDirectory() as tmp:
        write_history(simulate(seed=3, days=3, attempts_per_day=500, start=parse_day("2025-03-01")), Path(tmp))
        ex = build_examples(read_history(Path(tmp)), load_catalogue())
    model = LightGBMThroughput(n_estimators=20, num_leaves=7, num_threads=1).fit(ex.rows, ex.y, ex.job_key)
    assert model.roofline_ is not None and model.base_ is not None and model.base_linear
    yield model, ex


def test_served_model_predicts_the_same_compiled(tiny: tuple[LightGBMThroughput, Examples], cache: Path) -> None:
    model, ex = tiny
    before = model.predict(ex.rows)
    lower, upper = model.predict_band(before, ex.rows)
    model.compile_trees(cache)
    try:
        assert set(model.trees_) == {"main", "base"}
        assert all(isinstance(t, CompiledTrees) for t in model.trees_.values())
        after = model.predict(ex.rows)
        assert np.isfinite(before).mean() > 0.5
        np.testing.assert_allclose(after, before, rtol=RTOL, atol=0, equal_nan=True)
        lo, hi = model.predict_band(after, ex.rows)
        np.testing.assert_allclose(lo, lower, rtol=RTOL, atol=0, equal_nan=True)
        np.testing.assert_allclose(hi, upper, rtol=RTOL, atol=0, equal_nan=True)
    finally:
        model.trees_ = {}


def test_served_model_without_a_compiler_predicts_with_lightgbm(tiny: tuple[LightGBMThroughput, Examples],
                                                                cache: Path) -> None:
    model, ex = tiny
    before = model.predict(ex.rows)
    model.compile_trees(cache, compiler="/nonexistent/cc")
    try:
        assert model.trees_ == {"main": model.booster_, "base": model.base_}
        np.testing.assert_array_equal(model.predict(ex.rows), before)
    finally:
        model.trees_ = {}


def test_the_model_follower_compiles_an_announced_model(tiny: tuple[LightGBMThroughput, Examples],
                                                        settings: Settings, tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """A promoted model is swapped in first, then its trees are compiled into ``home / "compiled"``,
    and the log says when they serve."""
    model, ex = tiny
    record = Registry(tmp_path / "registry").save(model, {"metrics": {}}, version="lgbm-compiled-test")
    holder = ModelHolder(lookup_fallback())
    follower = ModelFollower(dataclasses.replace(settings, home=tmp_path), Registry(tmp_path / "registry"), holder)
    caplog.set_level(logging.INFO, "leap.reload")
    try:
        follower._apply(ModelAnnouncement(
            schema_version=SCHEMA_VERSION, event_id="model:compiled-test", event_time=time.time(),
            model_version=record.version, kind=record.kind, artifact=str(record.path), metrics={}).encode())
        assert holder.active.version == record.version and follower.compiling is not None
        follower.compiling.join(120)
        served = holder.active.model
        assert isinstance(served, LightGBMThroughput)
        assert all(isinstance(t, CompiledTrees) and t.path.parent == tmp_path / "compiled"
                   for t in served.trees_.values()) and set(served.trees_) == {"main", "base"}
        np.testing.assert_allclose(served.predict(ex.rows), model.predict(ex.rows), rtol=RTOL, atol=0, equal_nan=True)
        assert f"model {record.version}: 2 of 2 boosters serve compiled trees" in caplog.text
    finally:
        follower.consumer.close()


def test_a_replay_ranks_with_the_compiled_trees(tiny: tuple[LightGBMThroughput, Examples], settings: Settings,
                                                tmp_path: Path) -> None:
    """`leap replay rerank --model VERSION` loads the model as a predictor serves it: compiled."""
    from leap.replay.rerank import load_model

    model, ex = tiny
    home = dataclasses.replace(settings, home=tmp_path)
    Registry(home.registry_dir).save(model, {"metrics": {}}, version="lgbm-replay-test")
    served = load_model("lgbm-replay-test", home).model
    assert isinstance(served, LightGBMThroughput) and set(served.trees_) == {"main", "base"}
    assert all(isinstance(t, CompiledTrees) and t.path.parent == home.compiled_dir for t in served.trees_.values())
    np.testing.assert_allclose(served.predict(ex.rows), model.predict(ex.rows), rtol=RTOL, atol=0, equal_nan=True)


def test_the_demo_fills_the_cache_before_its_workers_start(tiny: tuple[LightGBMThroughput, Examples],
                                                          settings: Settings, tmp_path: Path) -> None:
    """`leap demo` compiles the served model's trees before the clock starts: a worker stopped by a
    short run would otherwise leave the cache empty, and every run would serve beside a compiler."""
    from leap.demo import compile_before_serving

    model, _ = tiny
    home = dataclasses.replace(settings, home=tmp_path)
    Registry(home.registry_dir).save(model, {"metrics": {}}, version="lgbm-demo-test")
    compile_before_serving(home, "lgbm-demo-test")
    for booster in (model.booster_, model.base_):
        assert booster is not None and library_path(booster, home.compiled_dir).is_file()
    compile_before_serving(home, "lookup")  # the baseline has no trees: nothing to do, no error
