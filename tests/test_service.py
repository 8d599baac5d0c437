"""The ranking service on the real redis-server: read features, predict, fall back, price, rank."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import redis

from features.keys import KeyLayout
from features.rows import build_rows, concat_rows
from features.snapshot import FeatureSnapshot
from features.store import FeatureStore
from leap.core.hardware import load_catalogue
from predictor.lgbm import LightGBMThroughput
from predictor.models import LookupTable, PriorTransfer, ThroughputModel
from predictor.ranking import COLD_START, PEAK_BOUND, UNKNOWN_HARDWARE
from predictor.service import (
    COLD_START_BAND,
    NO_TRAINED_MODEL,
    ActiveModel,
    ModelHolder,
    RankingService,
    lookup_fallback,
)
from streams.events import Ranking, Submission
from tests.factories import CANDIDATES, T0, finish, start
from tests.factories import submission as any_submission

pytestmark = pytest.mark.integration

CAT = load_catalogue()
#: Per-accelerator samples/s that other jobs of ``llama-7b`` measured, one finish each.
LOOKUP = {"H100-SXM": 100.0, "A100-80GB": 60.0, "MI300X": 90.0}


@pytest.fixture
def store(rds: redis.Redis, run_id: str) -> Iterator[FeatureStore]:
    fs = FeatureStore(rds, KeyLayout(f"test-{run_id}"), canonicalize=CAT.canonical)
    yield fs
    fs.delete_all()


def submission(job: str, i: int, **over: Any) -> Submission:
    """A submission of short samples (16 tokens): the throughputs these tests make up stay under every
    part's peak, which the service never predicts above (:func:`predictor.ranking.bound_by_peak`)."""
    return any_submission(job, i, **{"seq_len": 16, **over})


def serve(store: FeatureStore, model: ThroughputModel, version: str = "test-1") -> RankingService:
    return RankingService(store, CAT, ModelHolder(ActiveModel(model, version)))


def seed_lookups(store: FeatureStore) -> None:
    """Give ``llama-7b`` the :data:`LOOKUP` medians (finishes use 8 accelerators)."""
    store.apply_finishes([finish(f"seed-{hw}", f"seed-{hw}", T0 - 100, hw, v * 8) for hw, v in LOOKUP.items()])


def by_name(ranking: Ranking) -> dict[str, dict[str, Any]]:
    return {c["hardware"]: c for c in ranking.candidates}


def test_one_ranking_per_submission_in_order_ranked_by_throughput_per_dollar(store: FeatureStore) -> None:
    seed_lookups(store)
    scales = [("c", 8), ("a", 16), ("b", 4)]
    subs = [submission(f"job-{k}", i, num_accelerators=n, data_parallel=n) for i, (k, n) in enumerate(scales)]
    rankings = serve(store, LookupTable()).rank(subs)
    assert [r.submission_event_id for r in rankings] == [s.event_id for s in subs]
    assert [(r.job_key, r.attempt_id) for r in rankings] == [(s.job_key, s.attempt_id) for s in subs]
    for sub, ranking in zip(subs, rankings, strict=True):
        n = sub.num_accelerators
        assert sorted(c["hardware"] for c in ranking.candidates) == sorted(sub.candidates)
        assert [c["rank"] for c in ranking.candidates] == list(range(1, len(sub.candidates) + 1))
        per_dollar = [c["throughput_per_dollar"] for c in ranking.candidates]
        assert per_dollar == sorted(per_dollar, reverse=True)
        for c in ranking.candidates:
            assert c["hourly_cost"] == CAT.price(c["hardware"]) * n  # type: ignore[operator]
            assert c["throughput_per_dollar"] == pytest.approx(c["predicted_throughput"] * 3600 / c["hourly_cost"])
        for hw, per_acc in LOOKUP.items():  # the model type's medians, scaled to the attempt
            assert by_name(ranking)[hw]["predicted_throughput"] == pytest.approx(per_acc * n)
            assert by_name(ranking)[hw]["reason"] is None
        assert ranking.best_hardware == ranking.candidates[0]["hardware"]


def test_unknown_hardware_is_listed_unranked_with_its_reason(store: FeatureStore) -> None:
    seed_lookups(store)
    sub = submission("job", 1, candidates=["Quantum-9000", "H100", "A100-80GB"])
    [ranking] = serve(store, LookupTable()).rank([sub])
    assert [c["hardware"] for c in ranking.candidates[:2]] in (["H100", "A100-80GB"], ["A100-80GB", "H100"])
    assert by_name(ranking)["H100"]["predicted_throughput"] == pytest.approx(LOOKUP["H100-SXM"] * 8)  # an alias
    assert ranking.candidates[2] == {
        "hardware": "Quantum-9000", "predicted_throughput": None, "lower": None, "upper": None,
        "hourly_cost": None, "throughput_per_dollar": None, "rank": None, "reason": UNKNOWN_HARDWARE,
        "basis": {"evidence": "none", "estimate": "none"},  # no history, and no estimate for an unknown part
    }
    assert ranking.fallback == UNKNOWN_HARDWARE


def test_cold_start_falls_back_to_the_roofline_where_the_model_has_no_estimate(store: FeatureStore) -> None:
    seed_lookups(store)
    known = submission("known", 1, candidates=list(LOOKUP))
    new = submission("new", 2, model_type="brand-new", family="brand_new_family")
    rankings = serve(store, LookupTable()).rank([known, new])
    assert rankings[0].fallback is None
    assert all(c["reason"] is None for c in rankings[0].candidates)

    [snap] = store.read([new])
    roofline = np.exp(build_rows(new, snap, new.candidates, CAT)["log_roofline"]) * new.num_accelerators
    assert rankings[1].fallback == COLD_START
    for name, estimate in zip(new.candidates, roofline, strict=True):
        c = by_name(rankings[1])[name]
        assert c["reason"] == COLD_START and c["rank"] is not None
        assert c["predicted_throughput"] == pytest.approx(estimate)
        assert (c["lower"], c["upper"]) == pytest.approx((estimate * COLD_START_BAND[0], estimate * COLD_START_BAND[1]))


def test_an_estimate_above_the_parts_peak_is_served_as_the_peak_but_a_measurement_there_is_not(
        store: FeatureStore) -> None:
    """llama-7b at 2048 tokens: ~3.6 samples/s per A100 and ~11.5 per H100 at their peaks. The job was
    measured at 50/s per A100 (its stated size must be wrong): that measurement is served as it is,
    while its transfer to the H100 (50 x 100/60) is cut to the H100's peak and says so."""
    seed_lookups(store)
    store.apply_finishes([finish("big", "e1", T0, "A100-80GB", 400.0)])
    sub = any_submission("big", 2, candidates=["A100-80GB", "H100-SXM"])
    [ranking] = serve(store, PriorTransfer()).rank([sub])
    a100, h100 = by_name(ranking)["A100-80GB"], by_name(ranking)["H100-SXM"]
    assert a100["predicted_throughput"] == pytest.approx(400.0) and a100["reason"] is None
    assert a100["basis"]["estimate"] == "measured_here" and a100["basis"]["ratio"] == 1.0
    h100_spec = CAT.resolve("H100-SXM")
    assert h100_spec is not None
    peak = h100_spec.peak_tflops * 1e12 / (6 * 7e9 * 2048) * 8
    assert h100["predicted_throughput"] == pytest.approx(peak, rel=1e-9) and peak < 400.0 * 100 / 60
    assert h100["reason"] == PEAK_BOUND and h100["basis"]["estimate"] == "peak_bound"
    assert PEAK_BOUND in (ranking.fallback or "").split(",")


def test_records_the_model_version_and_the_features_it_read(store: FeatureStore) -> None:
    seed_lookups(store)
    store.apply_finishes([finish("job", "e1", T0, "A100-80GB", 400.0), finish("job", "e2", T0 + 1, "A100-80GB", 420.0)])
    store.apply_starts([start("job", "s3", T0 + 2, "H100-SXM")])
    subs = [submission("job", 3), submission("other", 4)]
    rankings = RankingService(store, CAT, ModelHolder(lookup_fallback())).rank(subs)
    read = store.read(subs)
    assert [r.features_used for r in rankings] == [snap.to_json() for snap in read]
    assert read[0].prior["A100-80GB"].n == 2 and read[0].starts == 1  # the job's own history was read
    assert [r.model_version for r in rankings] == [lookup_fallback().version] * 2
    assert all((r.fallback or "").split(",")[0] == NO_TRAINED_MODEL for r in rankings)
    assert [Ranking.decode(r.encode()) for r in rankings] == rankings  # what the agent sends, intact


def test_latency_is_counted_from_each_submissions_arrival(store: FeatureStore) -> None:
    service = serve(store, LookupTable())
    subs = [submission("a", 1), submission("b", 2), submission("c", 3)]
    before = time.time()
    rankings = service.rank(subs, [before - 1.5, before, before + 60.0])
    took_ms = (time.time() - before) * 1000.0
    assert 1500.0 <= rankings[0].latency_ms <= 1500.0 + took_ms
    assert 0.0 <= rankings[1].latency_ms <= took_ms
    assert rankings[2].latency_ms == 0.0  # a clock ahead of ours never gives a negative latency
    before = time.time()
    [ranking] = service.rank(subs[:1])  # no arrival time: counted from the call
    assert 0.0 <= ranking.latency_ms <= (time.time() - before) * 1000.0


def test_a_swapped_model_serves_from_the_next_batch(store: FeatureStore) -> None:
    # llama-7b medians: H100 100/s, A100 80/s (this job's 50 and another job's 110).
    store.apply_finishes([finish("other", "o1", T0, "H100-SXM", 800.0), finish("other", "o2", T0, "A100-80GB", 880.0),
                          finish("job", "j1", T0 + 1, "A100-80GB", 400.0)])
    sub = submission("job", 2, candidates=["H100-SXM", "A100-80GB"])
    holder = ModelHolder(ActiveModel(LookupTable(), "lookup-1"))
    service = RankingService(store, CAT, holder)
    [first] = service.rank([sub])
    previous = holder.swap(ActiveModel(PriorTransfer(), "transfer-2"))
    [second] = service.rank([sub])
    assert previous.version == "lookup-1"
    assert (first.model_version, second.model_version) == ("lookup-1", "transfer-2")

    def per_acc(ranking: Ranking, hw: str) -> float:
        return float(by_name(ranking)[hw]["predicted_throughput"]) / sub.num_accelerators

    assert (per_acc(first, "H100-SXM"), per_acc(first, "A100-80GB")) == pytest.approx((100.0, 80.0))
    # The job's own 50/s on A100, and moved to H100 by its model type's ratio 100/80.
    assert (per_acc(second, "H100-SXM"), per_acc(second, "A100-80GB")) == pytest.approx((62.5, 50.0))


@pytest.fixture(scope="module")
def small_lightgbm() -> LightGBMThroughput:
    """A LightGBM model fitted in well under a second on roofline-shaped synthetic rows."""
    rng = np.random.default_rng(7)
    parts, ys = [], []
    for i in range(150):
        sub = submission(f"train-{i}", i, params=float(rng.choice([1e8, 1e9, 7e9, 3e10])),
                         global_batch_size=int(rng.choice([64, 256, 1024])), seq_len=int(rng.choice([512, 2048])))
        rows = build_rows(sub, FeatureSnapshot(), CANDIDATES, CAT)
        parts.append(rows)
        ys.append(np.exp(rows["log_roofline"]) * rng.uniform(0.6, 1.4, len(CANDIDATES)))
    return LightGBMThroughput(n_estimators=20, num_leaves=7, min_child_samples=5).fit(concat_rows(parts),
                                                                                     np.concatenate(ys))


def test_a_fitted_lightgbm_model_ranks_from_the_features_the_store_read(
    store: FeatureStore, small_lightgbm: LightGBMThroughput
) -> None:
    seed_lookups(store)
    store.apply_finishes([finish("job", "e1", T0, "A100-80GB", 400.0)])
    subs = [submission("job", 2, candidates=[*CANDIDATES, "Quantum-9000"]), submission("new", 3, model_type="new")]
    rankings = serve(store, small_lightgbm, "lightgbm-1").rank(subs)
    for sub, snap, ranking in zip(subs, store.read(subs), rankings, strict=True):
        expected = small_lightgbm.predict(build_rows(sub, snap, sub.candidates, CAT)) * sub.num_accelerators
        assert ranking.model_version == "lightgbm-1"
        for name, estimate in zip(sub.candidates, expected, strict=True):
            c = by_name(ranking)[name]
            if name == "Quantum-9000":
                assert (c["rank"], c["reason"]) == (None, UNKNOWN_HARDWARE)
            else:  # the trees estimate every known type: no cold start, even for a new model type
                assert c["reason"] is None and c["rank"] is not None
                assert c["predicted_throughput"] == pytest.approx(estimate, rel=1e-9)
