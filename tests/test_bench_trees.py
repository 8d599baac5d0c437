"""``bench trees``: each tree compiler's output against ``Booster.predict`` on boosters of both leaf
kinds the served model has, and what each library does with linear leaves."""

from __future__ import annotations

from pathlib import Path

import lightgbm as lgb
import numpy as np
import pytest

from leap.bench.trees import COMPILERS, EXACT, measure_booster


def _booster(linear: bool) -> tuple[lgb.Booster, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 4))
    x[rng.random(x.shape) < 0.05] = np.nan
    y = 2 * np.nan_to_num(x[:, 0]) + np.sin(np.nan_to_num(x[:, 1])) + rng.normal(0, 0.1, len(x))
    params = {"objective": "regression", "num_leaves": 7, "linear_tree": linear, "verbose": -1, "num_threads": 1}
    return lgb.train(params, lgb.Dataset(x, y), num_boost_round=5), x


@pytest.mark.parametrize("linear", [False, True], ids=["constant_leaves", "linear_leaves"])
def test_each_compiler_against_booster_predict(linear: bool, tmp_path: Path) -> None:
    booster, x = _booster(linear)
    figures, exact = measure_booster("b", booster, x, tmp_path, repeat=1, calls=3)
    assert figures["linear_leaves"] is linear and figures["rows"] == len(x)
    assert figures["leap_c"]["max_abs_diff"] <= EXACT and "leap_c" in exact
    if not linear:
        assert set(exact) == set(COMPILERS)
        assert all(figures[c]["compile_s"] > 0 and figures[c]["call_24_rows_us"] > 0 for c in COMPILERS)
        return
    # Neither library evaluates linear leaves: treelite refuses them, lleaves uses the leaves'
    # constants without a word (what the benchmark's max_abs_diff shows on the served base model).
    assert "linear trees" in figures["tl2cgen"]["error"]
    assert figures["lleaves"]["max_abs_diff"] > 0.01
    assert set(exact) == {"leap_c"}
    # The compiled evaluator matches LightGBM row for row, NaNs included.
    np.testing.assert_array_equal(exact["leap_c"].predict(x, num_threads=1), booster.predict(x, num_threads=1))
