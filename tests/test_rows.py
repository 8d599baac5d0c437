"""The row builder: one row per candidate, identical for serving and for training."""

from __future__ import annotations

import math

import numpy as np
import pytest
import redis

from features.keys import KeyLayout
from features.offline import OfflineFeatureState
from features.rows import (
    CATEGORICAL,
    COLUMNS,
    DERIVED_COLUMNS,
    GROUPS,
    HARDWARE_COLUMNS,
    PAIR_COLUMNS,
    build_batch_rows,
    build_rows,
    concat_rows,
    hardware_table,
    with_hardware,
)
from features.snapshot import FeatureSnapshot, LookupStat, PriorStat
from features.store import FeatureStore
from leap.core.hardware import load_catalogue
from tests.factories import T0, finish, submission

CAT = load_catalogue()


def _assert_rows_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for col in a:
        if col in CATEGORICAL:
            assert list(a[col]) == list(b[col]), col
        else:
            np.testing.assert_array_equal(a[col], b[col], err_msg=col)


def test_groups_cover_every_column_once() -> None:
    grouped = [c for cols in GROUPS.values() for c in cols]
    assert len(grouped) == len(set(grouped))
    assert set(COLUMNS) == set(grouped)
    assert set(GROUPS["hardware"]) == {*HARDWARE_COLUMNS, *DERIVED_COLUMNS, *PAIR_COLUMNS}


@pytest.mark.integration
def test_served_rows_equal_training_rows(rds: redis.Redis, run_id: str) -> None:
    """Rows from the store's snapshots, a batch at a time as the predictor builds them, equal rows
    from the offline twin's snapshots, one candidate at a time as training builds them."""
    canon = CAT.canonical
    store = FeatureStore(rds, KeyLayout(f"rows-{run_id}"), canonicalize=canon)
    offline = OfflineFeatureState(canon)
    events = [
        finish("j", "e1", T0, "A100-80GB", 400.0),
        finish("j", "e2", T0 + 50, "A100-80GB", 420.0),
        finish("k", "e3", T0 + 60, "H100-SXM", 1200.0),
        finish("j", "e4", T0 + 70, "MI300X", None, outcome="failed"),
        # jobs seen on both A100 and H100: paired ratios for j's H100 row
        *(finish(f"p{n}", f"p{n}{hw}", T0 + 80 + n, hw, 300.0 * scale * (n + 1))
          for n in range(3) for hw, scale in (("A100-80GB", 1.0), ("H100-SXM", 2.5))),
    ]
    try:
        store.apply_finishes(events)
        for ev in events:
            offline.apply_finish(ev)
        subs = [submission("j", 9, event_time=T0 + 3600), submission("new", 10, event_time=T0 + 3700),
                submission("k", 11, event_time=T0 + 3800, candidates=["H100", "A100-80GB", "Quantum-9000"])]
        served = build_batch_rows(subs, store.read(subs), CAT)
        trained = concat_rows([build_batch_rows([sub], [offline.snapshot(sub, candidates=(c,))], CAT, [(c,)])
                               for sub in subs for c in sub.candidates])
        assert not np.isnan(served["paired_model_log"]).all() and not np.isnan(served["prior_other_log"]).all()
        _assert_rows_equal(served, trained)
    finally:
        store.delete_all()


def test_prior_on_other_hardware_is_transferred_by_the_lookup_ratio() -> None:
    snap = FeatureSnapshot(
        prior={"A100-80GB": PriorStat(3, T0, 50.0, 50.0)},
        lookup_model={"A100-80GB": LookupStat(10, 40.0), "H100-SXM": LookupStat(10, 120.0)},
    )
    sub = submission("j", 1, event_time=T0 + 7200)
    rows = build_rows(sub, snap, ["H100-SXM", "A100-80GB"], CAT)
    assert math.exp(rows["transfer_log"][0]) == pytest.approx(50.0 * 120.0 / 40.0)
    assert math.exp(rows["transfer_log"][1]) == pytest.approx(50.0)  # own history on that hardware
    assert rows["prior_hw"][0] == "A100-80GB" and rows["prior_same_age_h"][1] == pytest.approx(2.0)


def test_unknown_hardware_has_no_specs_but_keeps_its_name() -> None:
    rows = build_rows(submission("j", 1), FeatureSnapshot(), ["Quantum-9000"], CAT)
    assert rows["hardware"][0] == "Quantum-9000" and rows["vendor"][0] == "unknown"
    assert math.isnan(rows["peak_tflops"][0]) and math.isnan(rows["log_roofline"][0])


def test_aliases_resolve_to_canonical_rows() -> None:
    a = build_rows(submission("j", 1), FeatureSnapshot(), ["H100"], CAT)
    b = build_rows(submission("j", 1), FeatureSnapshot(), ["H100-SXM"], CAT)
    _assert_rows_equal(a, b)


def test_roofline_uses_the_peak_for_the_jobs_precision() -> None:
    h100 = CAT.resolve("H100-SXM")
    assert h100 is not None
    bf16 = build_rows(submission("j", 1, precision="bf16"), FeatureSnapshot(), ["H100-SXM"], CAT)
    fp32 = build_rows(submission("j", 1, precision="fp32"), FeatureSnapshot(), ["H100-SXM"], CAT)
    assert math.exp(bf16["log_peak_at_precision"][0]) == pytest.approx(h100.peak_tflops)
    assert math.exp(fp32["log_peak_at_precision"][0]) == pytest.approx(h100.peak_fp32_tflops)
    # Same FLOPs at a lower peak: more compute time per step, the rest of the step unchanged.
    assert fp32["log_step_compute"][0] - bf16["log_step_compute"][0] == pytest.approx(
        math.log(h100.peak_tflops / h100.peak_fp32_tflops)
    )
    assert fp32["log_step_memory"][0] == bf16["log_step_memory"][0]


def test_roofline_step_adds_its_terms() -> None:
    sub = submission("j", 1)
    rows = build_rows(sub, FeatureSnapshot(), ["A100-80GB", "T4"], CAT)
    parts = np.exp(rows["log_step_compute"]) + np.exp(rows["log_step_memory"])
    parts += np.where(np.isfinite(rows["log_step_comm"]), np.exp(rows["log_step_comm"]), 0.0)
    np.testing.assert_allclose(np.exp(rows["log_step_estimate"]), parts)
    per_accelerator_batch = sub.global_batch_size / sub.num_accelerators
    np.testing.assert_allclose(np.exp(rows["log_roofline_step"]), per_accelerator_batch / parts)
    assert rows["log_roofline_step"][0] > rows["log_roofline_step"][1]  # an A100 outruns a T4


def test_rows_moved_to_other_hardware_equal_rows_built_there() -> None:
    # The base model re-evaluates rows on the job's prior hardware with with_hardware; what it
    # gets must be what the row builder makes for that hardware, derived columns included.
    sub = submission("j", 1, precision="fp8", num_accelerators=16, data_parallel=8, tensor_parallel=2)
    candidates = ["H100", "A100-80GB", "MI300X", "TPU-v5p", "Quantum-9000"]
    rows = build_rows(sub, FeatureSnapshot(), candidates, CAT)
    table = hardware_table(rows)
    assert list(table) == ["H100-SXM", "A100-80GB", "MI300X", "TPU-v5p", "Quantum-9000"]
    names = rows["hardware"][::-1].copy()
    moved = with_hardware(rows, table, names)
    _assert_rows_equal(moved, build_rows(sub, FeatureSnapshot(), list(names), CAT))
    assert rows["hardware"][0] == "H100-SXM"  # the input rows are left alone
    with pytest.raises(KeyError):
        with_hardware(rows, table, np.array(["T4"] * len(candidates), dtype=object))


def test_moving_rows_keeps_the_jobs_history() -> None:
    snap = FeatureSnapshot(prior={"A100-80GB": PriorStat(3, T0, 50.0, 50.0)})
    rows = build_rows(submission("j", 1), snap, ["A100-80GB", "H100-SXM"], CAT)
    moved = with_hardware(rows, hardware_table(rows), rows["hardware"][::-1].copy())
    assert list(moved["hardware"]) == ["H100-SXM", "A100-80GB"]
    np.testing.assert_array_equal(moved["prior_same_log"], rows["prior_same_log"])
    np.testing.assert_array_equal(moved["spec_ratio_peak"], rows["spec_ratio_peak"])


def test_a_submission_that_leaves_out_its_configuration_gets_stand_ins_only_where_derivable() -> None:
    """Without history: the layout from the accelerator count, the default framework; nothing
    stands in for the parameter count, sequence length or precision (missing values, no guesses)."""
    unknown = ("family", "params", "seq_len", "precision", "data_parallel", "tensor_parallel",
               "pipeline_parallel", "framework")
    sub = submission("j", 1, **dict.fromkeys(unknown))
    rows = build_rows(sub, FeatureSnapshot(), ["H100-SXM", "A100-80GB"], CAT)
    for col in ("log_params", "log_seq", "precision_bits", "log_flops_per_sample", "log_roofline",
                "log_step_compute", "log_step_estimate"):
        assert np.isnan(rows[col]).all(), col
    assert rows["data_parallel"].tolist() == [8.0, 8.0] and rows["tensor_parallel"].tolist() == [1.0, 1.0]
    assert rows["pipeline_parallel"].tolist() == [1.0, 1.0]
    assert rows["family"].tolist() == ["unknown", "unknown"] and rows["framework"].tolist() == ["pytorch", "pytorch"]
    assert (rows["log_batch"] == math.log(512)).all() and (rows["peak_tflops"] > 0).all()


def test_unknown_family_feeds_no_family_aggregate_in_either_store(rds: redis.Redis, run_id: str) -> None:
    store = FeatureStore(rds, KeyLayout(f"fam-{run_id}"), canonicalize=CAT.canonical)
    twin = OfflineFeatureState(CAT.canonical)
    ev = finish("j", "e1", T0, "H100-SXM", 800.0).__class__.from_dict(
        {**finish("j", "e1", T0, "H100-SXM", 800.0).to_dict(), "family": None})
    try:
        assert store.apply_finishes([ev]) == [1] and twin.apply_finish(ev)
        sub = submission("j", 2, family=None)
        assert store.read([sub]) == [twin.snapshot(sub)]
        assert store.read([sub])[0].lookup_family == {} and store.read([sub])[0].lookup_model["H100-SXM"].n == 1
    finally:
        store.delete_all()
