"""The rooflines: the public-spec terms and their one link rule; the learned roofline recovers a
step-time law of its own form, carries a job's speed across hardware better than the public-spec
roofline, falls back sensibly and saves as JSON."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import pytest

from features.roofline import ROOFLINE_MFU, TERMS, link_bandwidth, roofline_log, step_terms
from features.rows import Rows, build_rows
from features.snapshot import FeatureSnapshot
from leap.core.hardware import load_catalogue
from leap.training.dataset import Examples, build_examples, read_history
from predictor.boosting import job_effects
from predictor.learned_roofline import LearnedRoofline, cell_layout, usable_rows
from tests.factories import submission

CAT = load_catalogue()


@pytest.fixture(scope="module")
def examples(small_history: Path) -> Examples:
    return build_examples(read_history(small_history), load_catalogue())


def _by_job(examples: Examples) -> tuple[np.ndarray, np.ndarray]:
    """Two disjoint sets of jobs (even and odd hash)."""
    odd = np.array([zlib.crc32(str(k).encode()) % 2 == 1 for k in examples.job_key])
    return ~odd, odd


def _select(rows: Rows, mask: np.ndarray) -> Rows:
    return {c: v[mask] for c, v in rows.items()}


def test_a_collective_uses_the_scale_up_link_only_within_one_domain() -> None:
    rows = {"node_size": np.full(3, 8.0), "interconnect_gbps": np.full(3, 900.0), "scale_out_gbps": np.full(3, 50.0)}
    # Half the bidirectional scale-up figure while the ranks fit in one domain; the network beyond.
    np.testing.assert_array_equal(link_bandwidth(rows, np.array([1.0, 8.0, 16.0])), [450e9, 450e9, 50e9])


def test_the_all_reduce_spans_every_accelerator_and_the_tensor_exchange_its_ranks() -> None:
    # 16 accelerators on 8-accelerator nodes, tensor-parallel within a node: the gradient
    # all-reduce crosses nodes, the tensor exchange does not.
    sub = submission("j", 1, num_accelerators=16, data_parallel=2, tensor_parallel=8)
    h100 = CAT.resolve("H100-SXM")
    assert h100 is not None and h100.node_size == 8
    rows = build_rows(sub, FeatureSnapshot(), ["H100-SXM"], CAT)
    terms, per_acc = step_terms(rows)
    assert sub.params is not None and sub.tensor_parallel is not None and sub.seq_len is not None
    local_params = sub.params / sub.tensor_parallel
    allreduce = 2.0 * (2 - 1) / 2 * 2.0 * local_params / (h100.scale_out_gbps * 1e9)
    tensor = per_acc[0] * sub.seq_len / 8 / (h100.interconnect_gbps * 0.5e9)
    assert terms[0, TERMS.index("allreduce")] == pytest.approx(allreduce)
    assert terms[0, TERMS.index("tensor")] == pytest.approx(tensor)


def test_both_rooflines_read_the_same_public_terms() -> None:
    rows = build_rows(submission("j", 1), FeatureSnapshot(), ["A100-80GB", "MI300X"], CAT)
    terms, _ = step_terms(rows)
    for term, col in (("compute", "log_step_compute"), ("weights", "log_step_memory"), ("allreduce", "log_step_comm")):
        np.testing.assert_allclose(terms[:, TERMS.index(term)], np.exp(rows[col]))
    # The cold-start estimate: the quoted peak at a typical share of it.
    peak = rows["peak_tflops"]
    np.testing.assert_allclose(
        np.exp(rows["log_roofline"]), peak * 1e12 * ROOFLINE_MFU / np.exp(rows["log_flops_per_sample"])
    )
    np.testing.assert_array_equal(rows["log_roofline"], roofline_log(peak, rows["log_flops_per_sample"]))


def test_recovers_a_law_of_its_own_form(examples: Examples) -> None:
    rows = examples.rows
    rng = np.random.default_rng(0)
    terms, per_acc = step_terms(rows)
    theta = {t: rng.normal(0.0, 1.0, len(TERMS)) for t in sorted(set(rows["model_type"].tolist()))}
    efficiency = {h: rng.normal(0.0, 0.3) for h in sorted(set(rows["hardware"].tolist()))}
    weights = np.exp(np.array([theta[t] for t in rows["model_type"]]))
    weights[:, 0] *= np.exp(np.array([efficiency[h] for h in rows["hardware"]]))
    scale = np.nanmedian(np.where(terms > 0, terms, np.nan), axis=0)
    truth = np.log(per_acc) - np.log((weights * terms / scale).sum(axis=1))
    train, test = _by_job(examples)

    model = LearnedRoofline(steps=1500).fit(_select(rows, train), truth[train])

    error = model.predict(_select(rows, test)) - truth[test]
    assert np.median(np.abs(error)) < 0.05
    assert model.loss_ < 0.01


def test_carries_speed_across_hardware_better_than_the_public_roofline(examples: Examples) -> None:
    """On jobs it never saw, the fitted ratio between two hardware types a job ran on is closer
    to the measured ratio than the datasheet roofline's (median error 0.19 against 0.28)."""
    train, test = _by_job(examples)
    log_y, jobs = np.log(examples.y[train]), np.asarray(examples.job_key)[train]
    model = LearnedRoofline().fit(_select(examples.rows, train), log_y)
    # Refit with each job's own speed factor removed, as the LightGBM model does.
    own = job_effects(log_y - model.predict(_select(examples.rows, train)), jobs)
    model = LearnedRoofline().fit(_select(examples.rows, train), log_y - own)
    rows = _select(examples.rows, test)
    learned, public, measured = model.predict(rows), rows["log_roofline_step"], np.log(examples.y[test])
    jobs = np.asarray(examples.job_key)[test]
    errors: dict[str, list[float]] = {"learned": [], "public": []}
    for job in np.unique(jobs):
        idx = np.flatnonzero(jobs == job)
        hardware = rows["hardware"][idx]
        if len(set(hardware.tolist())) < 2:
            continue
        a, b = idx[0], idx[np.flatnonzero(hardware != hardware[0])[0]]
        truth = measured[b] - measured[a]
        errors["learned"].append(abs(learned[b] - learned[a] - truth))
        errors["public"].append(abs(public[b] - public[a] - truth))
    assert len(errors["learned"]) >= 100
    assert np.median(errors["learned"]) < 0.8 * np.median(errors["public"])


def test_the_gradients_are_those_of_the_loss() -> None:
    """The per-cell sums give each parameter the derivative of the loss (squared log error, linear
    beyond 0.5), checked against central differences on a small problem with errors on both sides
    and rows that repeat a configuration (the same cell and terms) with other targets."""
    rng = np.random.default_rng(0)
    n, k = 300, len(TERMS)
    codes = np.stack([rng.integers(0, 3, n), rng.integers(0, 4, n), rng.integers(0, 2, n), rng.integers(0, 2, n)], 1)
    x = rng.uniform(0.1, 2.0, (n, k))
    again = rng.integers(0, n, 100)  # a third of the rows repeat another's cell and terms
    codes, x = np.concatenate([codes, codes[again]]), np.concatenate([x, x[again]])
    grouped = cell_layout(codes, x)
    assert len(grouped[1].indptr) - 1 == n  # one design row per distinct (cell, terms)
    target = rng.normal(1.5, 0.7, n + len(again))
    params = [rng.normal(0, 0.3, (3, k)), rng.normal(0, 0.3, 4), rng.normal(0, 0.3, 2), rng.normal(0, 0.3, 2)]
    model = LearnedRoofline()

    def loss(ps: list[np.ndarray]) -> float:
        e = np.log(model._gradients(ps, grouped, target)[1][grouped[4]]) - target
        return float(np.mean(np.where(np.abs(e) <= 0.5, e**2, np.abs(e) - 0.25)))

    e = np.log(model._gradients(params, grouped, target)[1][grouped[4]]) - target
    assert (np.abs(e) > 0.5).any() and (np.abs(e) < 0.5).any()
    grads = model._gradients(params, grouped, target)[0]
    for which, grad in enumerate(grads):
        for idx in np.ndindex(params[which].shape):
            up, down = [p.copy() for p in params], [p.copy() for p in params]
            up[which][idx] += 1e-6
            down[which][idx] -= 1e-6
            assert grad[idx] == pytest.approx((loss(up) - loss(down)) / 2e-6, rel=1e-4, abs=1e-9)


def test_unknown_model_type_and_hardware(examples: Examples) -> None:
    model = LearnedRoofline(steps=200).fit(examples.rows, np.log(examples.y))
    rows = _select(examples.rows, np.arange(len(examples.y)) < 20)
    rows["model_type"] = np.array(["never-seen"] * 20, dtype=object)
    assert np.isfinite(model.predict(rows)).all()  # the family's median constants
    rows["hardware"] = np.array(["X1000"] * 20, dtype=object)
    assert np.isnan(model.predict(rows)).all()  # no efficiency for a part never measured


def test_no_usable_rows_is_an_error(examples: Examples) -> None:
    rows = _select(examples.rows, np.arange(len(examples.y)) < 20)
    rows["memory_bw_gbps"] = np.full(20, np.nan)  # hardware not in the catalogue
    assert usable_rows(rows) == 0
    with pytest.raises(ValueError, match="no rows with finite terms"):
        LearnedRoofline().fit(rows, np.zeros(20))


def test_state_is_json_and_round_trips(examples: Examples) -> None:
    model = LearnedRoofline(steps=200).fit(examples.rows, np.log(examples.y))
    loaded = LearnedRoofline.from_state(json.loads(json.dumps(model.state())))
    np.testing.assert_array_equal(loaded.predict(examples.rows), model.predict(examples.rows))
    with pytest.raises(RuntimeError, match="not fitted"):
        LearnedRoofline().predict(examples.rows)
