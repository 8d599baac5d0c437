"""The oracle tables a backtest reads and the submission-time ceiling built from them."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import numpy as np
import pytest

from leap.fleet.history import simulate, write_history
from leap.training.dataset import read_history
from leap.training.oracle import OracleTables, PairTable, ceiling_predictions


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hist")
    write_history(simulate(seed=3, days=4, attempts_per_day=400), folder)
    return folder


def test_pair_table_reads_each_pair_as_the_oracle_table_has_it(history: Path) -> None:
    """Every (attempt, hardware) of the oracle table reads back its value; a pair the table lacks,
    an unknown attempt, None, or a NaN cap read as absent."""
    o = read_history(history).oracle
    assert o is not None
    tables = OracleTables.read(read_history(history))
    attempts, hardware = o.column("attempt_id").to_pylist(), o.column("hardware").to_pylist()
    for ours, theirs in (("throughput", "oracle_throughput"), ("law", "law_throughput"), ("cap", "input_cap")):
        expected = o.column(theirs).to_numpy().astype(np.float64)
        assert np.array_equal(tables.pairs.look(ours, attempts, hardware), expected, equal_nan=True)
    assert np.isnan(expected).any() and not np.isnan(expected).all()  # some jobs have no input cap
    missing = tables.pairs.look("law", [attempts[0], "no-such-attempt", None],
                                ["no-such-hardware", hardware[0], hardware[0]])
    assert np.isnan(missing).all()
    assert tables.pairs.get("cap", "no-such-attempt", hardware[0]) is None
    assert len(tables.pairs) == len(set(zip(attempts, hardware, strict=True)))


def test_pair_table_keeps_the_last_of_a_repeated_pair_and_pickles_small() -> None:
    table = PairTable.from_codes(["a", "b"], np.array([1, 0, 1]), ["x", "y"], np.array([0, 1, 0]),
                                 {"v": np.array([1.0, 2.0, 3.0])})
    assert table.look("v", ["b", "a", "a"], ["x", "y", "x"]).tolist()[:2] == [3.0, 2.0]
    assert np.isnan(table.look("v", ["a"], ["x"])[0])
    n = 200_000
    big = PairTable.from_codes([f"attempt-{i}" for i in range(n // 10)], np.arange(n) // 10,
                               [f"hw{i}" for i in range(10)], np.arange(n) % 10, {"v": np.ones(n)})
    assert len(pickle.dumps(big)) < 40 * n  # about the keys, the values and the names: no per-pair objects


def test_ceiling_rules() -> None:
    """The ceiling knows the law and of the job only its measurements, relative to the law there;
    a job's input cap only once a measurement of the job ran at it."""
    rows = {
        "prior_same_n": np.array([2.0, 0.0, 0.0, 0.0, 0.0]),
        "prior_same_log": np.array([math.log(7.0), np.nan, np.nan, np.nan, np.nan]),
        "prior_other_n": np.array([1.0, 3.0, 0.0, 0.0, 1.0]),
        "prior_other_log": np.array([math.log(9.0), math.log(2.0), np.nan, np.nan, math.log(5.0)]),
        "prior_hw": np.array(["A100-80GB", "A100-80GB", "none", "none", "A100-80GB"], dtype=object),
        "hardware": np.array(["H100-SXM"] * 5, dtype=object),
    }
    law = {("a0", "H100-SXM"): 40.0, ("a1", "H100-SXM"): 60.0, ("a2", "H100-SXM"): 80.0, ("a3", "H100-SXM"): 40.0,
           ("a4", "H100-SXM"): 80.0,
           # the earlier attempts where the priors were measured, at their own configurations
           ("e0", "H100-SXM"): 20.0, ("e1", "A100-80GB"): 16.0, ("e4", "A100-80GB"): 40.0}
    # a3 and a4 would run at their input caps; e4, a4's earlier attempt, ran at its own (20)
    cap = {("a3", "H100-SXM"): 30.0, ("a4", "H100-SXM"): 30.0, ("e4", "A100-80GB"): 20.0}
    finished = {"j0": [(5.0, "e0", "H100-SXM", 2)], "j1": [(5.0, "e1", "A100-80GB", 4), (50.0, "late", "A100-80GB", 4)],
                "j4": [(5.0, "e4", "A100-80GB", 4)]}
    tables = OracleTables.of(throughput={("e4", "A100-80GB"): 20.0}, law=law, cap=cap, finished=finished,
                          submitted={f"a{i}": (f"j{i}", 10.0) for i in range(5)},
                          accelerators={"e0": 2, "e1": 4, "late": 4, "e4": 4})
    attempts = np.array([f"a{i}" for i in range(5)], dtype=object)
    assert tables.cap_revealed(attempts).tolist() == [False, False, False, False, True]
    pred = ceiling_predictions(rows, attempts, np.full(5, 4.0), tables)
    # ran here: 7 measured per accelerator against a law of 20 / 2 there, so 0.7 x 40 / 4; only
    # elsewhere: 2 against 16 / 4 (the attempt after the submission is not known yet), so
    # 0.5 x 60 / 4; no history: the law (80 / 4), a3's cap unknown too (40 / 4); a4 measured 5
    # against 40 / 4 at its cap, so 0.5 x 80 = 40, under its cap of 30: 30 / 4
    assert pred.tolist() == pytest.approx([7.0, 7.5, 20.0, 10.0, 7.5])
    knowing = ceiling_predictions(rows, attempts, np.full(5, 4.0), tables, knows_every_cap=True)
    assert knowing.tolist() == pytest.approx([7.0, 7.5, 20.0, 7.5, 7.5])


def test_the_ceiling_knows_an_architecture_effect_only_once_a_finish_revealed_it() -> None:
    """A model type's effect on an architecture counts for the ceiling from its first finish there."""
    rows = {
        "prior_same_n": np.zeros(3), "prior_same_log": np.full(3, np.nan),
        "prior_other_n": np.zeros(3), "prior_other_log": np.full(3, np.nan),
        "prior_hw": np.array(["none"] * 3, dtype=object),
        "hardware": np.array(["TPU-v5e", "TPU-v5e", "H100-SXM"], dtype=object),
    }
    # The law includes the model type's effect: 0.5 on TPUs for bert, 2.0 on Hopper for bert.
    law = {("a0", "TPU-v5e"): 40.0, ("a1", "TPU-v5e"): 40.0, ("a2", "H100-SXM"): 80.0}
    effect = {("a0", "TPU-v5e"): 0.5, ("a1", "TPU-v5e"): 0.5, ("a2", "H100-SXM"): 2.0}
    tables = OracleTables.of(
        throughput={}, law=law, cap={}, finished={}, submitted={"a0": ("j0", 10.0), "a1": ("j1", 30.0),
                                                                  "a2": ("j2", 30.0)},
        architecture_effect=effect,
        # a bert job finished on a part of the TPU architecture at t = 20, none on Hopper
        revealed={("bert", "tpu"): 20.0, ("bert", "ampere"): 1.0},
        model_type={"a0": "bert", "a1": "bert", "a2": "bert"},
        architecture={"TPU-v5e": "tpu", "H100-SXM": "hopper"},
    )
    attempts = np.array(["a0", "a1", "a2"], dtype=object)
    hidden = tables.unrevealed(attempts, rows["hardware"])
    assert hidden.tolist() == [True, False, True]
    pred = ceiling_predictions(rows, attempts, np.ones(3), tables)
    # a0 was submitted before the TPU finish: the law without the effect; a1 after it: the law
    assert pred.tolist() == pytest.approx([80.0, 40.0, 40.0])
    knowing = ceiling_predictions(rows, attempts, np.ones(3), tables, knows_every_effect=True)
    assert knowing.tolist() == pytest.approx([40.0, 40.0, 80.0])


def test_the_oracle_table_says_which_part_of_the_law_is_the_architecture_effect(history: Path) -> None:
    """The simulator writes each candidate's architecture effect (spread across model types), and
    every measured finish reveals its model type on its architecture no later than it happened."""
    h = read_history(history)
    assert h.oracle is not None
    effect = h.oracle.column("architecture_effect").to_numpy()
    assert np.all(effect > 0) and np.std(np.log(effect)) > 0.05
    tables = OracleTables.read(h)
    assert tables.revealed and all(t >= 0 for t in tables.revealed.values())
    first = next(iter(tables.finished.values()))[0]
    key = (tables.model_type[first[1]], tables.architecture[first[2]])
    assert tables.revealed[key] <= first[0]


def test_the_oracle_tables_know_which_measured_attempts_ran_at_their_input_cap(history: Path) -> None:
    """An attempt counts as capped when its noise-free throughput is its input cap; some are, most are not."""
    tables = OracleTables.read(read_history(history))
    measured = [(a, hw) for runs in tables.finished.values() for _, a, hw, _ in runs]
    attempts, hardware = [a for a, _ in measured], [hw for _, hw in measured]
    throughput, cap = tables.pairs.look("throughput", attempts, hardware), tables.pairs.look("cap", attempts, hardware)
    capped = np.array([a in tables.capped for a in attempts])
    assert 0 < capped.sum() < len(measured) / 2
    assert throughput[capped] == pytest.approx(cap[capped])
    uncapped = ~capped & ~np.isnan(cap)
    assert uncapped.any() and np.all(throughput[uncapped] < cap[uncapped])


