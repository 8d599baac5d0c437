"""The backtest of a scheduler that leaves optional fields out: ``leap drivers --drop-fields``."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from leap.cli import app
from leap.core.hardware import load_catalogue
from leap.training.partial import examples_without, missing_fields
from tests.factories import PLUMBING_PARAMS


def test_each_dropped_field_is_a_row_beside_the_complete_run(tiny_history: Path) -> None:
    rows = missing_fields(tiny_history, 2, ["layout", "params"], load_catalogue(), params=PLUMBING_PARAMS)
    assert [r["dropped"] for r in rows] == [None, "layout", "params"]
    for row in rows:
        assert all(0.0 <= row[k] <= 1.0 for k in ("acc@10", "top1", "transfer", "transfer_paired")), row
        low, high = row["band_coverage_range"]
        assert 0.0 <= low <= high <= 1.0 and 0 <= row["below_transfer_days"] <= 2
    # the baselines read the job's prior and the lookup medians, never the configuration fields
    assert all(math.isclose(r["transfer"], rows[0]["transfer"]) for r in rows)
    assert rows[1]["acc@10"] != rows[0]["acc@10"]  # without the layout the model reads other rows


def test_an_unknown_field_is_refused(tiny_history: Path) -> None:
    with pytest.raises(ValueError, match="cannot drop 'seq_len'"):
        missing_fields(tiny_history, 2, ["seq_len"], load_catalogue())


def test_the_cli_refuses_an_unknown_field_before_reading_anything(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["drivers", "--history", str(tmp_path), "--drop-fields", "layout,seq_len"])
    said = " ".join(res.output.split())  # the console wraps long lines
    assert res.exit_code != 0
    assert "--drop-fields: cannot drop 'seq_len'" in said and "params, framework, layout" in said
    res = CliRunner().invoke(app, ["drivers", "--tables", "x.csv", "--drop-fields", "layout"])
    assert res.exit_code != 0 and "--drop-fields needs --history" in res.output


def test_the_new_type_view_is_built_from_the_same_partial_submissions(tiny_history: Path) -> None:
    from leap.training.dataset import build_examples
    from leap.training.days import checked_first_test_day
    from leap.training.new_types import with_unseen_type_rows

    cat = load_catalogue()
    history, partial = examples_without(tiny_history, 2, "params", cat)
    complete = with_unseen_type_rows(build_examples(history, cat), history, cat)
    assert partial.new_type_rows is not None and complete.new_type_rows is not None
    position = {a: i for i, a in enumerate(complete.attempt_id.tolist())}
    same = np.array([position[a] for a in partial.attempt_id.tolist()])
    late = partial.submit_time >= checked_first_test_day(history, 2)
    sent = np.nan_to_num(partial.new_type_rows["log_params"])
    full = np.nan_to_num(complete.new_type_rows["log_params"][same])
    np.testing.assert_allclose(sent[~late], full[~late])  # before the test days the field was sent
    assert not np.allclose(sent[late], full[late])  # after, its stand-in, as in the rows themselves
