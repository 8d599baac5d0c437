"""Serving helpers of the served model give what the numpy formulations they replace gave."""

from __future__ import annotations

import numpy as np

from predictor.boosting import map_values


def test_map_values_equals_unique_and_lookup() -> None:
    values = np.array(["H100", "A100", "none", "H100", float("nan"), None, "unseen", "A100"], dtype=object)
    table = {"H100": 0, "A100": 1, "none": 2, "nan": 3}
    distinct, inverse = np.unique(values.astype(str), return_inverse=True)
    expected = np.array([table.get(v, np.nan) for v in distinct], dtype=np.float64)[inverse]
    got = map_values(values, table, np.nan, np.float64)
    assert got.dtype == np.float64 and got.tobytes() == expected.tobytes()
    assert map_values(values[:0], table, -1, np.int64).shape == (0,)
    assert map_values(values, {"H100": True}, False, bool).tolist() == [True, False, False, True] + [False] * 4
