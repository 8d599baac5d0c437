"""A batch's rows equal its submissions' rows built one by one, bit for bit.

Serving builds a whole batch of submissions at once and training a batch of examples at once,
each submission with its own candidates: no submission's rows may depend on its neighbours."""

from __future__ import annotations

import numpy as np

from features.offline import OfflineFeatureState
from features.rows import CATEGORICAL, COLUMNS, build_batch_rows, build_rows, concat_rows
from features.snapshot import FeatureSnapshot, LookupStat, PairStat, PriorStat
from leap.bench.workload import make_workload
from leap.core.hardware import load_catalogue
from streams.events import Submission
from tests.factories import T0, submission

CAT = load_catalogue()


def _assert_equal_one_by_one(subs: list[Submission], snaps: list[FeatureSnapshot]) -> None:
    expected = concat_rows([build_rows(s, snap, s.candidates, CAT) for s, snap in zip(subs, snaps, strict=True)])
    got = build_batch_rows(subs, snaps, CAT)
    _assert_bits_equal(got, expected)
    # each submission's rows, candidate by candidate, as training builds them
    one_each = [(s, snap, (c,)) for s, snap in zip(subs, snaps, strict=True) for c in s.candidates]
    _assert_bits_equal(build_batch_rows([s for s, _, _ in one_each], [snap for _, snap, _ in one_each], CAT,
                                        [c for _, _, c in one_each]), expected)


def _assert_bits_equal(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert list(got) == list(COLUMNS)
    for col in COLUMNS:
        assert got[col].dtype == expected[col].dtype, col
        if col in CATEGORICAL:
            assert got[col].tolist() == expected[col].tolist(), col
        else:  # bit for bit, NaNs in the same places
            assert got[col].tobytes() == expected[col].tobytes(), col


def test_simulated_fleet_batch_equals_its_submissions_one_by_one() -> None:
    """Submissions of a simulated fleet after 6,000 finishes: new jobs, retries, paired ratios."""
    w = make_workload(6000, 300, seed=3)
    state = OfflineFeatureState(lambda n: hw.name if (hw := CAT.resolve(n)) is not None else n)
    for start in w.starts:
        state.apply_start(start)
    for fin in w.finishes:
        state.apply_finish(fin)
    snaps = [state.snapshot(s) for s in w.submissions]
    assert sum(1 for s in snaps if s.prior) > 20 and sum(1 for s in snaps if s.pairs) > 5
    _assert_equal_one_by_one(w.submissions, snaps)


def test_edge_cases_equal_their_submissions_one_by_one() -> None:
    """Aliases and unknown names, a prior only on the candidate itself, unknown families and
    configurations, priors on unknown hardware, lookups without priors."""
    rich = FeatureSnapshot(
        prior={"A100-80GB": PriorStat(3, T0, 50.0, 48.0), "H100-SXM": PriorStat(3, T0 + 5, 90.0, 0.0),
               "Quantum-9000": PriorStat(9, T0, 10.0, 11.0)},
        lookup_model={"A100-80GB": LookupStat(10, 40.0), "H100-SXM": LookupStat(10, 120.0)},
        lookup_family={"MI300X": LookupStat(4, 70.0), "A100-80GB": LookupStat(4, 35.0)},
        pairs={"model": {"H100-SXM": {"Quantum-9000": PairStat(3, 1.5, 0.4)}},
               "all": {"MI300X": {"Quantum-9000": PairStat(2, 0.5, -0.1), "A100-80GB": PairStat(5, 2.0, 0.3)}}},
        starts=4, completed=2, failed=1, preempted=1,
    )
    subs = [
        submission("a", 1, candidates=["H100", "A100-80GB", "Quantum-9000", "MI300X", "L4"]),
        submission("b", 2, candidates=["A100-80GB"], family=None, params=None, seq_len=None, precision=None,
                   data_parallel=None, tensor_parallel=None, pipeline_parallel=None, framework=None),
        submission("c", 3, candidates=["TPU-v5p"]),
        submission("d", 4, candidates=["L4", "TPU-v5p"]),
        submission("e", 5, candidates=["H100-SXM", "MI300X"], event_time=T0 + 86400),
    ]
    snaps = [rich, FeatureSnapshot(prior={"A100-80GB": PriorStat(1, T0, 5.0, 5.0)}), rich,
             FeatureSnapshot(lookup_model={"L4": LookupStat(2, 3.0)}), rich]
    _assert_equal_one_by_one(subs, snaps)


def test_an_empty_batch_has_every_column() -> None:
    rows = build_batch_rows([], [], CAT)
    assert list(rows) == list(COLUMNS) and all(len(v) == 0 for v in rows.values())
    assert np.asarray(rows["log_batch"]).dtype == np.float64
