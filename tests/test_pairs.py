"""Paired ratios: observed by the store's scripts and the offline twin alike, summarised near the
submission's configuration, carried into rows; idempotent under redelivery."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from features.keys import PAIR_WINDOW
from features.offline import OfflineFeatureState
from features.pairs import (
    ACCELERATOR_BANDWIDTH,
    BATCH_BANDWIDTH,
    MEDIAN_BELOW_SPREAD,
    PRECISION_MISMATCH,
    SHARPNESS,
    UNKNOWN_COORDINATE,
    Wanted,
    _columns,
    _distances2,
    _summaries,
    coordinates,
    most_informative,
    pair_field,
    stored_values,
    summarise,
    summarise_pairs,
    unpack_value,
)
from features.rows import build_rows
from features.snapshot import PriorStat
from features.store import FeatureStore
from leap.core.hardware import load_catalogue
from tests.factories import T0, finish, submission

CAT = load_catalogue()


def test_pair_fields_are_unordered_and_signed() -> None:
    assert pair_field("L4", "A100-80GB") == ("A100-80GB|L4", 1.0)
    assert pair_field("A100-80GB", "L4") == ("A100-80GB|L4", -1.0)
    (field, value), = stored_values("A100-80GB", [("L4", "0.5")], coordinates(512, 8, "bf16"))
    assert field == "A100-80GB|L4" and unpack_value(value)[0] == -0.5  # stored as log(L4 / A100)


def test_summary_weights_nearby_configurations_most() -> None:
    near, far = coordinates(512, 8, "bf16"), coordinates(512 * 16, 128, "bf16")
    stat = summarise([(0.2, near), (1.0, far)], 1.0, near)
    assert stat is not None and stat.n == 2 and 0.2 < stat.log_ratio < 0.25 and 1.0 < stat.weight < 1.01
    assert summarise([(0.2, near)], -1.0, near).log_ratio == -0.2  # type: ignore[union-attr]
    other_precision = summarise([(0.2, coordinates(512, 8, "fp32")), (1.0, near)], 1.0, near)
    assert other_precision is not None and other_precision.log_ratio > 0.85
    assert summarise([], 1.0, near) is None


def _reference_distance2(a: tuple[float, float, float], b: tuple[float, float, float]) -> float:
    """The kernel's squared distance written out term by term, as first specified."""
    d2 = 0.0
    for x, y, width in ((a[0], b[0], BATCH_BANDWIDTH), (a[1], b[1], ACCELERATOR_BANDWIDTH)):
        d2 += UNKNOWN_COORDINATE if math.isnan(x) or math.isnan(y) else ((x - y) / width) ** 2
    if math.isnan(a[2]) or math.isnan(b[2]):
        d2 += UNKNOWN_COORDINATE
    elif a[2] != b[2]:
        d2 += PRECISION_MISMATCH
    return d2


def test_the_summary_is_the_specified_kernel() -> None:
    """Random windows with unknown coordinates on either side: the distances and the summary equal
    the kernel computed one observation at a time, to rounding (NumPy's squares, sums and
    exponentials against libm's; the store and the offline replay both summarise with this code,
    so rows and served features do not drift apart)."""
    rng = random.Random(7)

    def coordinate(kind: int) -> tuple[float, float, float]:
        batch = math.nan if rng.random() < 0.15 else math.log(rng.uniform(1.0, 4096.0))
        accelerators = math.nan if rng.random() < 0.1 else math.log(rng.choice([1, 2, 3, 8, 24, 64, 512]))
        bits = math.nan if rng.random() < 0.1 else rng.choice([32.0, 19.0, 16.0, 8.0])
        return (batch, accelerators, bits) if kind else (batch, accelerators, 16.0)

    for case in range(1500):
        at = coordinate(case % 2)
        window = [(rng.gauss(0.3, 0.4), coordinate(i % 3)) for i in range(rng.randint(1, PAIR_WINDOW))]
        for sharpness, median_below in ((1.0, 0.0), (SHARPNESS["model"], 0.0), (1.0, 0.3)):
            d2 = [_reference_distance2(c, at) for _, c in window]
            _, batch, accelerators, bits = _columns(window)
            assert _distances2(batch, accelerators, bits, at).tolist() == pytest.approx(d2, rel=1e-15)
            weights = [math.exp(-0.5 * d) for d in d2]
            total = mean_weight = sum(weights)
            if sharpness != 1.0:
                weights = [math.exp(-0.5 * sharpness * (d - min(d2))) for d in d2]
                mean_weight = sum(weights)
            mean = sum(w * r for w, (r, _) in zip(weights, window, strict=True)) / mean_weight
            stat = summarise(window, -1.0, at, sharpness, median_below)
            assert stat is not None and stat.weight == pytest.approx(total, rel=1e-13) and stat.n == len(window)
            if median_below == 0.0:
                assert stat.log_ratio == pytest.approx(-mean, rel=1e-12, abs=1e-14)


def test_a_window_summarises_the_same_alone_and_among_others() -> None:
    """The store summarises a read batch's windows in one pass, the offline replay a submission's:
    each window's summary must not depend on the others beside it, to the bit."""
    rng = np.random.default_rng(3)

    def window(n: int) -> list[tuple[float, tuple[float, float, float]]]:
        return [(float(rng.normal(0.3, 0.4)), (float(rng.uniform(0, 8)), float(rng.choice([0.0, 1.1, 2.1, np.nan])),
                                              float(rng.choice([16.0, 32.0])))) for _ in range(n)]

    asks = [(window(int(rng.integers(1, PAIR_WINDOW + 1))), (float(rng.uniform(0, 8)), 1.1, 16.0),
             float(rng.choice([1.0, SHARPNESS["model"]])), float(rng.choice([0.0, 0.3, 5.0]))) for _ in range(300)]
    together = _summaries(asks)
    alone = [_summaries([ask])[0] for ask in asks]
    assert together == alone and all(stat is not None for stat in alone)


def test_the_model_level_follows_the_nearest_configuration_and_reports_the_wide_weight() -> None:
    """Within a model type the nearest configuration decides (sharpened kernel); across model types
    the wide kernel averages; both report the same total weight, and a far window stays finite."""
    at = coordinates(512, 8, "bf16")
    window = [(0.2, coordinates(512, 16, "bf16")), (1.0, coordinates(512, 32, "bf16"))]
    want: Wanted = {"H": [("P", "H|P", 1.0)]}
    stats = summarise_pairs(want, {"model": {"H|P": window}, "family": {"H|P": window}}, at)
    model, family = stats["model"]["H"]["P"], stats["family"]["H"]["P"]
    assert SHARPNESS["model"] > SHARPNESS["family"] == 1.0
    assert model.log_ratio == pytest.approx(0.2, abs=1e-3) and family.log_ratio > 0.23  # wide: 1.0 counts
    assert model.weight == family.weight and model.n == family.n == 2
    far = [(0.3, coordinates(2 ** 20, 1, "fp32")), (0.5, coordinates(2 ** 21, 1, "fp32"))]
    sharp = summarise(far, 1.0, at, SHARPNESS["model"])
    assert sharp is not None and 0.3 <= sharp.log_ratio < 0.31 and sharp.weight > 0.0


def test_a_tight_window_across_model_types_reports_its_median_and_a_spread_one_its_mean() -> None:
    """At the family and all levels a clustered window ignores its far-off workload (median), a
    widely spread one is averaged (mean); the model level always averages; the sign flips exactly."""
    at = coordinates(512, 8, "bf16")
    tight = [(0.2 + 0.01 * i, at) for i in range(9)] + [(1.0, at)]  # spread 0.24: one far-off workload
    spread = [(-0.5, at), (0.0, at), (1.0, at)]  # spread 0.62: no cluster
    assert MEDIAN_BELOW_SPREAD["model"] == 0.0 < 0.24 < MEDIAN_BELOW_SPREAD["all"] < 0.62
    want: Wanted = {"H": [("P", "H|P", 1.0)], "P": [("H", "H|P", -1.0)]}
    stats = summarise_pairs(want, {level: {"H|P": tight} for level in ("model", "family", "all")}, at)
    mean = sum(r for r, _ in tight) / len(tight)
    assert stats["model"]["H"]["P"].log_ratio == pytest.approx(mean)
    for level in ("family", "all"):
        assert stats[level]["H"]["P"].log_ratio == pytest.approx(0.24)  # the weighted median
        assert stats[level]["P"]["H"].log_ratio == -stats[level]["H"]["P"].log_ratio
        assert stats[level]["H"]["P"].weight == stats["model"]["H"]["P"].weight
    wide = summarise_pairs(want, {"all": {"H|P": spread}}, at)
    assert wide["all"]["H"]["P"].log_ratio == pytest.approx(0.5 / 3)  # the mean, not the median 0.0


def test_the_row_uses_the_most_observed_other_hardware() -> None:
    prior = {"A": PriorStat(3, T0, 1.0, 1.0), "B": PriorStat(1, T0 + 9, 1.0, 1.0), "C": PriorStat(3, T0 + 1, 1.0, 1.0)}
    assert most_informative(prior, "Z")[0] == "C"  # type: ignore[index]
    assert most_informative(prior, "C")[0] == "A"  # type: ignore[index]


def _two_hardware_jobs(store: FeatureStore | None, twin: OfflineFeatureState, n: int) -> None:
    """``n`` jobs, each first on L4 and then on H100-SXM, 2.5x faster there, at one configuration."""
    for j in range(n):
        events = [finish(f"j{j}", f"a{j}", T0 + j, "L4", 100.0 * (j + 1)),
                  finish(f"j{j}", f"b{j}", T0 + 100 + j, "H100-SXM", 250.0 * (j + 1))]
        for ev in events:
            if store is not None:
                store.apply_finishes([ev])
            twin.apply_finish(ev)


def test_paired_ratio_reaches_a_new_job_whatever_its_speed(store: FeatureStore) -> None:
    twin = OfflineFeatureState(CAT.canonical)
    _two_hardware_jobs(store, twin, 5)
    newcomer = finish("new", "n1", T0 + 500, "L4", 40.0)  # a slow job: its factor must cancel
    store.apply_finishes([newcomer])
    twin.apply_finish(newcomer)
    sub = submission("new", 1, candidates=["H100-SXM", "L4", "MI300X"])
    online = store.read([sub])[0]
    assert online == twin.snapshot(sub)
    for level in ("model", "family", "all"):
        stat = online.pairs[level]["H100-SXM"]["L4"]
        assert stat.n == 5 and stat.log_ratio == pytest.approx(math.log(2.5))
    assert "MI300X" not in online.pairs["model"]  # nothing observed on that pair
    rows = build_rows(sub, online, sub.candidates, CAT)
    h100 = list(rows["hardware"]).index("H100-SXM")
    assert math.exp(rows["transfer_paired_log"][h100]) * 8 == pytest.approx(2.5 * 40.0)
    assert rows["transfer_paired_log"][list(rows["hardware"]).index("L4")] == pytest.approx(math.log(40.0 / 8))


def test_a_redelivered_finish_completes_its_pairs_and_adds_nothing_twice(store: FeatureStore) -> None:
    twin = OfflineFeatureState(CAT.canonical)
    _two_hardware_jobs(store, twin, 3)
    pair_key = store.layout.pairs("model", "llama-7b")
    before = store.client.hgetall(pair_key)
    store.client.delete(pair_key)  # as if the writer died between its two round trips
    again = [finish(f"j{j}", f"b{j}", T0 + 100 + j, "H100-SXM", 250.0 * (j + 1)) for j in range(3)]
    assert store.apply_finishes(again) == [0, 0, 0]
    assert store.client.hgetall(pair_key) == before
    assert store.apply_finishes(again) == [0, 0, 0]
    assert store.client.hgetall(pair_key) == before


def test_pair_windows_keep_the_newest_observations(store: FeatureStore) -> None:
    twin = OfflineFeatureState(CAT.canonical)
    _two_hardware_jobs(store, twin, PAIR_WINDOW + 5)
    sub = submission("j0", 99, candidates=["H100-SXM", "L4"])
    assert store.read([sub])[0].pairs["model"]["L4"]["H100-SXM"].n == PAIR_WINDOW
    assert store.read([sub]) == [twin.snapshot(sub)]


def test_held_out_jobs_see_their_own_history_and_the_training_aggregates() -> None:
    train, own = OfflineFeatureState(CAT.canonical), OfflineFeatureState(CAT.canonical)
    _two_hardware_jobs(None, train, 4)
    own.apply_finish(finish("held", "h1", T0 + 900, "L4", 80.0))
    sub = submission("held", 1, candidates=["H100-SXM"])
    snap = train.snapshot(sub, job_source=own)
    assert snap.prior["L4"].n == 1 and snap.pairs["model"]["H100-SXM"]["L4"].n == 4
    assert train.snapshot(sub).prior == {} and own.snapshot(sub).pairs == {}


def test_every_informative_prior_is_carried_across_and_combined(store: FeatureStore) -> None:
    """A job seen on L4 and on MI300X reaches H100 through both pairs; the estimates are averaged."""
    twin = OfflineFeatureState(CAT.canonical)
    events = []
    for j in range(4):  # H100 is 2.5x L4 and 2x MI300X for every job
        events += [finish(f"j{j}", f"a{j}", T0 + j, "L4", 100.0 * (j + 1)),
                   finish(f"j{j}", f"m{j}", T0 + 50 + j, "MI300X", 125.0 * (j + 1)),
                   finish(f"j{j}", f"b{j}", T0 + 100 + j, "H100-SXM", 250.0 * (j + 1))]
    events += [finish("new", "n1", T0 + 500, "L4", 40.0), finish("new", "n2", T0 + 600, "MI300X", 55.0)]
    for ev in events:
        store.apply_finishes([ev])
        twin.apply_finish(ev)
    sub = submission("new", 1, candidates=["H100-SXM"])
    snap = store.read([sub])[0]
    assert snap == twin.snapshot(sub)
    assert set(snap.pairs["model"]["H100-SXM"]) == {"L4", "MI300X"}
    rows = build_rows(sub, snap, sub.candidates, CAT)
    # L4 says 2.5 x 40 = 100, MI300X says 2 x 55 = 110: equal weights, so the geometric mean
    assert math.exp(rows["transfer_paired_log"][0]) * 8 == pytest.approx(math.sqrt(100 * 110))
    assert rows["transfer_paired_spread"][0] == pytest.approx(0.5 * math.log(110 / 100))
    assert rows["transfer_paired_weight"][0] == pytest.approx(2 * snap.pairs["model"]["H100-SXM"]["L4"].weight)
