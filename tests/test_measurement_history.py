"""A measurement table as LEAP history, and held-out examples that see only what they may."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from features.offline import OfflineFeatureState
from leap.core.hardware import load_catalogue
from leap.training.dataset import History, build_examples, read_history
from leap.training.held_out import build_cross_fitted_examples, build_held_out_examples, select_jobs
from leap.training.measurements import (
    MeasurementError,
    TableHistory,
    job_ids,
    load_table,
    to_history,
    write_history,
)
from leap.training.measurements.history import GAP_S, QUEUE_S, RUN_S, SPAN_DAYS, START
from leap.training.measurements.runner import with_new_type_rows
from streams.events import JobFinish, Submission

ROOT = Path(__file__).resolve().parent.parent
GAVEL = ROOT / "data" / "measurements" / "gavel.csv"

HEADER = "workload,hardware,num_accelerators,global_batch_size,throughput"
#: Two workloads, three configurations; "Mystery GPU" is not in the catalogue; "NVIDIA H100 SXM"
#: and "H100-SXM" spell one type.
SMALL = f"""{HEADER}
resnet,V100,1,32,100
resnet,NVIDIA H100 SXM,1,32,400
resnet,Mystery GPU,1,32,50
resnet,V100,2,64,190
resnet,H100-SXM,2,64,700
bert,V100,1,8,10
bert,NVIDIA H100 SXM,1,8,35
bert,H100-SXM,1,8,36
"""


def _table(tmp_path: Path, text: str = SMALL) -> Path:
    path = tmp_path / "t.csv"
    path.write_text(text)
    return path


def _subs(th: TableHistory) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = th.history.submissions.to_pylist()
    return out


def test_one_job_per_configuration_one_completed_attempt_per_row(tmp_path: Path) -> None:
    t = load_table(_table(tmp_path))
    th = to_history(t, load_catalogue(), seed=0, name="t")
    cfg = job_ids(t)
    assert len(set(th.job_key.tolist())) == int(cfg.max()) + 1
    for c in set(cfg.tolist()):
        assert len(set(th.job_key[cfg == c].tolist())) == 1
    h = th.history
    assert h.submissions.num_rows == h.starts.num_rows == h.finishes.num_rows == len(t)
    fin = {r["attempt_id"]: r for r in h.finishes.to_pylist()}
    assert set(fin) == set(th.attempt_id.tolist())
    for i, a in enumerate(th.attempt_id.tolist()):
        assert fin[a]["outcome"] == "completed"
        assert fin[a]["throughput"] == t.throughput[i]  # summed over accelerators, as the contract says
        assert fin[a]["hardware"] == th.hardware[i]


def test_the_converter_never_invents_fields(tmp_path: Path) -> None:
    th = to_history(load_table(_table(tmp_path)), load_catalogue())
    for field in ("family", "params", "seq_len", "precision", "data_parallel", "tensor_parallel",
                  "pipeline_parallel", "framework"):
        assert {s[field] for s in _subs(th)} == {None}, field
    assert {f["family"] for f in th.history.finishes.to_pylist()} == {None}
    assert {f["precision"] for f in th.history.finishes.to_pylist()} == {None}
    assert set(th.notes["fields_missing"]) >= {"family", "params", "seq_len", "precision", "framework"}
    # The rows built from them carry missing values where nothing can be derived; the layout
    # stands in from the accelerator count (features/completion.py), as for a partial submission.
    ex = build_examples(th.history, load_catalogue())
    for col in ("log_params", "log_seq", "precision_bits", "log_flops_per_sample"):
        assert np.isnan(ex.rows[col]).all(), col
    assert (ex.rows["data_parallel"] >= 1).all()
    assert set(ex.rows["family"].tolist()) == {"unknown"}


def test_labels_the_table_states_are_used(tmp_path: Path) -> None:
    text = HEADER + ",precision,family,framework,params,seq_len\n" + \
        "lm,V100,1,8,10,fp16,language,pytorch,1e8,512\nlm,P100,1,8,5,fp16,language,pytorch,1e8,512\n" + \
        "cnn,V100,1,8,10,amp,,,,\ncnn,P100,1,8,5,amp,,,,\n"
    th = to_history(load_table(_table(tmp_path, text)), load_catalogue())
    by_model = {s["model_type"]: s for s in _subs(th)}
    lm, cnn = by_model["lm"], by_model["cnn"]
    assert (lm["precision"], lm["family"], lm["framework"], lm["params"], lm["seq_len"]) == \
        ("fp16", "language", "pytorch", 1e8, 512)
    # "amp" is not a contract precision: missing, and reported; empty cells stay missing.
    assert (cnn["precision"], cnn["family"], cnn["framework"], cnn["params"]) == (None, None, None, None)
    assert th.notes["precision_not_in_contract"] == ["amp"]


def test_candidates_are_the_configurations_hardware_by_canonical_name(tmp_path: Path) -> None:
    t = load_table(_table(tmp_path))
    cat = load_catalogue()
    th = to_history(t, cat)
    cfg = job_ids(t)
    for s in _subs(th):
        rows = np.flatnonzero(th.job_key == s["job_key"])
        assert s["candidates"] == sorted({cat.canonical(t.hardware[i]) for i in rows.tolist()})
        assert s["candidates"] == sorted(set(s["candidates"]))
    first = next(s for s in _subs(th) if s["job_key"] == th.job_key[0])
    assert first["candidates"] == ["H100-SXM", "Mystery GPU", "V100-16GB"]  # unknown kept as written
    assert th.notes["hardware_not_in_catalogue"] == ["Mystery GPU"]
    assert th.notes["hardware_merged"] == {"H100-SXM": ["H100-SXM", "NVIDIA H100 SXM"]}
    # bert was measured twice on one canonical type: two attempts there, one candidate.
    bert = th.job_key[cfg == cfg[5]][0]
    assert [f["hardware"] for f in th.history.finishes.to_pylist() if f["job_key"] == bert].count("H100-SXM") == 2


def test_attempts_are_seeded_random_and_spaced(tmp_path: Path) -> None:
    t = load_table(_table(tmp_path))
    a, b = to_history(t, load_catalogue(), seed=0), to_history(t, load_catalogue(), seed=0)
    assert a.history.submissions.equals(b.history.submissions)
    orders = set()
    for seed in range(8):
        th = to_history(t, load_catalogue(), seed=seed)
        subs = sorted((s for s in _subs(th) if s["job_key"] == th.job_key[0]), key=lambda s: s["event_time"])
        times = np.array([s["event_time"] for s in subs])
        assert START <= times[0] < START + SPAN_DAYS * 86400
        np.testing.assert_allclose(np.diff(times), QUEUE_S + RUN_S + GAP_S)
        fin = {f["attempt_id"]: f for f in th.history.finishes.to_pylist()}
        assert all(fin[s["attempt_id"]]["event_time"] < times[k + 1] for k, s in enumerate(subs[:-1]))
        orders.add(tuple(fin[s["attempt_id"]]["hardware"] for s in subs))
    assert len(orders) > 1


def test_written_history_reads_back_as_an_archive(tmp_path: Path) -> None:
    th = to_history(load_table(_table(tmp_path)), load_catalogue())
    counts = write_history(th.history, tmp_path / "hist")
    assert counts == {"submissions": 8, "starts": 8, "finishes": 8}
    back = read_history(tmp_path / "hist")
    key = ["attempt_id"]
    for name in ("submissions", "starts", "finishes"):
        ours, theirs = getattr(th.history, name).sort_by([(k, "ascending") for k in key]), \
            getattr(back, name).sort_by([(k, "ascending") for k in key])
        assert ours.to_pylist() == theirs.to_pylist()
    with pytest.raises(MeasurementError, match="already holds an archive"):
        write_history(th.history, tmp_path / "hist")


def test_fractional_accelerators_are_refused(tmp_path: Path) -> None:
    t = load_table(_table(tmp_path, f"{HEADER}\nx,V100,1.5,8,5\nx,P100,1.5,8,3\n"))
    with pytest.raises(MeasurementError, match="num_accelerators must be a whole number"):
        to_history(t, load_catalogue())


# ---------------------------------------------------------------------- held-out examples


@pytest.fixture(scope="module")
def gavel() -> TableHistory:
    return to_history(load_table(GAVEL), load_catalogue(), seed=0, name="gavel")


def _split(th: TableHistory, n_test: int = 12) -> tuple[set[str], History, History]:
    keys = sorted(set(th.job_key.tolist()))
    test = set(keys[::max(1, len(keys) // n_test)])
    h = th.history
    return test, select_jobs(h, test, keep=False), select_jobs(h, test)


def test_select_jobs_partitions_the_history(gavel: TableHistory) -> None:
    test, train, held = _split(gavel)
    h = gavel.history
    for name in ("submissions", "starts", "finishes"):
        a, b = getattr(train, name), getattr(held, name)
        assert a.num_rows + b.num_rows == getattr(h, name).num_rows
        assert set(b.column("job_key").to_pylist()) == test
        assert not set(a.column("job_key").to_pylist()) & test


def test_held_out_job_sees_only_its_own_past_and_training_aggregates(gavel: TableHistory) -> None:
    cat = load_catalogue()
    test, train, held = _split(gavel)
    ex = build_held_out_examples(train, held, cat)
    assert set(ex.job_key.tolist()) == test and len(ex) == held.finishes.num_rows
    # Expected: each job replayed alone for its priors; lookups from the training jobs alone.
    train_state = OfflineFeatureState(cat.canonical)
    for f in sorted(train.finishes.to_pylist(), key=lambda f: f["event_time"]):
        train_state.apply_finish(_finish(f))
    for i, (job, attempt) in enumerate(zip(ex.job_key.tolist(), ex.attempt_id.tolist(), strict=True)):
        sub = next(s for s in held.submissions.to_pylist() if s["attempt_id"] == attempt)
        earlier = [f for f in held.finishes.to_pylist() if f["job_key"] == job and f["event_time"] < sub["event_time"]]
        assert ex.rows["prior_any_n"][i] == len(earlier)
        lookup = train_state.snapshot(_submission(sub)).lookup_model.get(str(ex.hardware[i]))
        assert (math.log(lookup.median) if lookup else math.nan) == pytest.approx(
            ex.rows["lookup_model_log"][i], nan_ok=True)


def test_other_held_out_jobs_never_move_a_held_out_row(gavel: TableHistory) -> None:
    """Scale every other held-out job's throughput by 1000: one job's rows must not change."""
    cat = load_catalogue()
    _, train, held = _split(gavel)
    base = build_held_out_examples(train, held, cat)
    job = str(base.job_key[0])
    tput = held.finishes.column("throughput").to_numpy()
    mine = np.array([k == job for k in held.finishes.column("job_key").to_pylist()])
    moved = held.finishes.set_column(held.finishes.schema.get_field_index("throughput"), "throughput",
                                     [np.where(mine, tput, tput * 1000.0)])
    held2 = History(held.submissions, held.starts, moved, None, "moved")
    again = build_held_out_examples(train, held2, cat)
    a, b = base.job_key == job, again.job_key == job
    for col, values in base.rows.items():
        np.testing.assert_array_equal(values[a], again.rows[col][b], err_msg=col)
    # ... while the training jobs' throughputs do reach them (the check is not vacuous).
    t_tput = train.finishes.column("throughput").to_numpy()
    train2 = History(train.submissions, train.starts, train.finishes.set_column(
        train.finishes.schema.get_field_index("throughput"), "throughput", [t_tput * 3.0]), None, "x3")
    third = build_held_out_examples(train2, held, cat)
    assert not np.allclose(np.nan_to_num(base.rows["lookup_model_log"][a]),
                           np.nan_to_num(third.rows["lookup_model_log"][third.job_key == job]))


def test_new_type_rows_carry_no_aggregate_their_own_type_fed(gavel: TableHistory) -> None:
    cat = load_catalogue()
    examples = build_cross_fitted_examples(gavel.history, cat)
    view = with_new_type_rows(examples, gavel.history, cat)
    rows, new = examples.rows, view.new_type_rows
    assert new is not None and view.rows is rows
    # the same attempts in the same order
    for column in ("model_type", "hardware", "prior_same_n", "prior_other_n"):
        np.testing.assert_array_equal(new[column], rows[column])
    # where the job never ran on the candidate, only its own type could have a median or a paired
    # ratio there: the new-type view has none, the cross-fitted rows (other jobs of the type) have
    elsewhere = rows["prior_same_n"] <= 0
    assert (new["lookup_model_n"][elsewhere] == 0).all() and (new["paired_model_n"][elsewhere] == 0).all()
    assert (rows["lookup_model_n"][elsewhere] > 0).any()
    # a subset of the examples gets its own rows of the same view, aligned by attempt
    some = np.arange(len(examples)) % 7 == 0
    part = with_new_type_rows(examples.select(some), gavel.history, cat).new_type_rows
    assert part is not None
    np.testing.assert_array_equal(part["lookup_model_log"], new["lookup_model_log"][some])


def test_held_out_submissions_get_every_candidates_rows(gavel: TableHistory) -> None:
    _, train, held = _split(gavel)
    ex = build_held_out_examples(train, held, load_catalogue())
    multi = [s for s in held.submissions.to_pylist() if len(s["candidates"]) > 1]
    assert len(ex.full) == len(multi)
    for n, (sub, rows) in ex.full.items():
        assert sub.attempt_id == ex.attempt_id[n]
        assert rows["hardware"].tolist() == list(sub.candidates)


def _finish(f: dict[str, Any]) -> JobFinish:
    return JobFinish(**f)


def _submission(s: dict[str, Any]) -> Submission:
    return Submission(**{**s, "candidates": tuple(s["candidates"])})
