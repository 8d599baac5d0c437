"""A fleet history's new-type rows: each model type's rows as if the fleet had never run it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from leap.core.hardware import load_catalogue
from leap.training.dataset import DAY, Examples, History, build_examples, read_history
from leap.training.new_types import for_nightly_fits, needed, with_unseen_type_rows
from predictor.boosting import HOLDOUT_FROM

CAT = load_catalogue()


@pytest.fixture(scope="module")
def built(tiny_history: Path) -> tuple[History, Examples]:
    history = read_history(tiny_history, with_oracle=False)
    return history, build_examples(history, CAT)


def test_rows_of_an_unseen_type_read_no_aggregate_it_fed(built: tuple[History, Examples]) -> None:
    history, examples = built
    rows = examples.rows
    model_type = str(rows["model_type"][np.argmax(rows["lookup_model_n"])])  # a type with medians
    alone = build_examples(history, CAT, unseen_types=frozenset({model_type}))
    assert set(alone.rows["model_type"].tolist()) == {model_type}
    mine = np.flatnonzero(rows["model_type"] == model_type)
    np.testing.assert_array_equal(alone.attempt_id, examples.attempt_id[mine])
    # the job's own history is still there, the type's medians and paired ratios are not
    for column in ("prior_same_n", "prior_other_n", "prior_same_log"):
        np.testing.assert_array_equal(alone.rows[column], rows[column][mine])
    assert (alone.rows["lookup_model_n"] == 0).all() and (alone.rows["paired_model_n"] == 0).all()
    assert (rows["lookup_model_n"][mine] > 0).any()
    # the aggregates it shares with other types of its family hold only theirs
    assert (alone.rows["lookup_family_n"] <= rows["lookup_family_n"][mine]).all()
    assert (alone.rows["lookup_family_n"] < rows["lookup_family_n"][mine]).any()


def test_every_example_gets_its_new_type_row_in_order(built: tuple[History, Examples]) -> None:
    history, examples = built
    some = examples.select(np.arange(len(examples)) % 3 == 0)
    view = with_unseen_type_rows(some, history, CAT)
    new = view.new_type_rows
    assert new is not None and view.rows is some.rows
    for column in ("model_type", "hardware", "prior_same_n"):
        np.testing.assert_array_equal(new[column], some.rows[column])
    assert (new["lookup_model_n"] == 0).all()  # every type is unseen in its own fold's replay
    assert (new["lookup_family_n"] <= some.rows["lookup_family_n"]).all()
    # the all-jobs paired ratio lost the fold's own pairs
    assert not np.allclose(np.nan_to_num(new["paired_all_log"]), np.nan_to_num(some.rows["paired_all_log"]))


def test_only_fits_below_the_holdout_size_pay_for_the_replays(built: tuple[History, Examples]) -> None:
    history, examples = built
    assert needed(HOLDOUT_FROM - 1) and not needed(HOLDOUT_FROM)
    last = float(examples.submit_time.max())
    nightly = for_nightly_fits(examples, history, CAT, [last], window_days=30)
    assert len(examples) < HOLDOUT_FROM and nightly.new_type_rows is not None
    assert for_nightly_fits(nightly, history, CAT, [last], 30) is nightly  # built once
    assert for_nightly_fits(examples, history, CAT, [last - 30 * DAY], 30).new_type_rows is not None
