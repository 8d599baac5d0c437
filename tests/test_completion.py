"""Stand-ins for the fields a submission leaves out (features.completion)."""

from __future__ import annotations

import pytest

from features.completion import (
    DEFAULT_FRAMEWORK,
    FRAMEWORK_PREFIX,
    complete,
    config_observations,
    drop_field,
    partial,
)
from features.snapshot import LookupStat
from tests.factories import submission

#: What 40 earlier submissions of a model type said: 8e9 parameters, tensor 8, pipeline 2, mostly jax.
HISTORY = {
    "params": LookupStat(40, 8e9),
    "tensor_parallel": LookupStat(40, 8.0),
    "pipeline_parallel": LookupStat(40, 2.0),
    FRAMEWORK_PREFIX + "jax": LookupStat(30, 1.0),
    FRAMEWORK_PREFIX + "pytorch": LookupStat(10, 1.0),
}


def test_a_complete_submission_is_left_as_it_is() -> None:
    sub = submission("j", 1)
    assert not partial(sub) and complete(sub, HISTORY, {}) == (sub, {})


def test_each_dropped_field_gets_the_model_types_history_and_says_so() -> None:
    sub = submission("j", 1, num_accelerators=64, data_parallel=4, tensor_parallel=8, pipeline_parallel=2)
    for name in ("params", "framework", "layout"):
        done, stand_ins = complete(drop_field(sub, name), HISTORY, {})
        assert partial(drop_field(sub, name)) and not partial(done), name
        if name == "params":
            assert done.params == 8e9 and "40 earlier submissions of the model type" in stand_ins["params"]
        elif name == "framework":
            assert done.framework == "jax" and stand_ins["framework"].startswith("jax (used by 30 of 40")
        else:
            assert (done.data_parallel, done.tensor_parallel, done.pipeline_parallel) == (4, 8, 2)
            assert set(stand_ins) == {"data_parallel", "tensor_parallel", "pipeline_parallel"}


def test_the_family_stands_in_for_a_model_type_without_history() -> None:
    done, stand_ins = complete(submission("j", 1, params=None), {}, {"params": LookupStat(3, 1e9)})
    assert done.params == 1e9 and "of the family" in stand_ins["params"]


def test_without_history_the_layout_is_data_parallel_and_params_stay_unknown() -> None:
    sub = submission("j", 1, params=None, framework=None, data_parallel=None, tensor_parallel=None,
                     pipeline_parallel=None)
    done, stand_ins = complete(sub, {}, {})
    assert (done.data_parallel, done.tensor_parallel, done.pipeline_parallel) == (8, 1, 1)
    assert done.params is None and stand_ins["params"].startswith("unknown")
    assert done.framework == DEFAULT_FRAMEWORK and stand_ins["framework"].startswith(f"{DEFAULT_FRAMEWORK} (default")


def test_a_history_degree_that_does_not_divide_the_accelerators_gives_way() -> None:
    """tensor 8 x pipeline 2 does not fit 4 accelerators: tensor stays 1 unless it divides them."""
    sub = submission("j", 1, num_accelerators=4, data_parallel=None, tensor_parallel=None, pipeline_parallel=None)
    done, stand_ins = complete(sub, {"tensor_parallel": LookupStat(5, 4.0), "pipeline_parallel": LookupStat(5, 2.0)},
                               {})
    assert (done.data_parallel, done.tensor_parallel, done.pipeline_parallel) == (1, 4, 1)
    assert "does not divide" in stand_ins["pipeline_parallel"]


def test_given_layout_fields_are_kept_and_the_rest_fills_the_accelerator_count() -> None:
    sub = submission("j", 1, num_accelerators=64, data_parallel=None, tensor_parallel=4, pipeline_parallel=None)
    done, stand_ins = complete(sub, HISTORY, {})
    assert (done.data_parallel, done.tensor_parallel, done.pipeline_parallel) == (8, 4, 2)
    assert set(stand_ins) == {"data_parallel", "pipeline_parallel"}


def test_a_layout_that_fits_nothing_is_left_unknown() -> None:
    sub = submission("j", 1, num_accelerators=6, data_parallel=4, tensor_parallel=None, pipeline_parallel=None)
    done, stand_ins = complete(sub, {}, {})
    assert done.tensor_parallel is None and stand_ins["tensor_parallel"].startswith("unknown")


def test_observations_are_what_the_submission_says() -> None:
    assert config_observations(submission("j", 1)) == [
        ("params", 7e9), ("tensor_parallel", 1.0), ("pipeline_parallel", 1.0), ("framework=pytorch", 1.0)]
    dropped = drop_field(submission("j", 1), "layout")
    assert config_observations(dropped) == [("params", 7e9), ("framework=pytorch", 1.0)]


def test_dropping_an_unknown_field_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot drop 'seq_len'"):
        drop_field(submission("j", 1), "seq_len")


def test_a_backtest_history_loses_the_field_from_the_first_test_day_on() -> None:
    """``leap backtest --drop-field layout``: the three degrees null from the given time on, the rest as sent."""
    import pyarrow as pa

    from leap.training.dataset import History
    from leap.training.partial import without_field

    subs = pa.table({"event_time": [1.0, 2.0, 3.0], "params": [7e9, 7e9, 7e9],
                     **{f: pa.array([8, 8, 8], pa.int64()) for f in ("data_parallel", "tensor_parallel",
                                                                     "pipeline_parallel")}})
    history = History(subs, pa.table({}), pa.table({}), None, "d")
    sent = without_field(history, "layout", 2.0).submissions
    assert sent["tensor_parallel"].to_pylist() == [8, None, None] and sent["data_parallel"].null_count == 2
    assert sent["params"].to_pylist() == [7e9] * 3
    assert without_field(history, "params", None).submissions["params"].null_count == 3
