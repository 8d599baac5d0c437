"""The fleet's pools, queues and price schedules, and the routings played under them."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from leap.core.hardware import load_catalogue
from leap.fleet.capacity import FleetCapacity, load_capacity, schedule_prices
from leap.fleet.engine import Draws, Fleet
from leap.fleet.pools import Cluster, Decision, Option, Pool
from leap.fleet.routing import ROUTINGS, Outcome, Record, route, scenario

CAT = load_catalogue()
CAPACITY = load_capacity(CAT)
LIST = schedule_prices("list", CAT)
START = 1.75e9 - 1.75e9 % 86_400  # a fixed midnight: the fleet's daily rhythm would follow the wall clock


def records(seed: int = 4, warm: int = 1500, live: int = 1500) -> list[Record]:
    """Attempts of one fleet, with LEAP's predictions drawn around the oracle and a lookup table
    that knows half the parts."""
    rng = np.random.default_rng(seed)
    fleet = Fleet(seed=seed, attempts_per_day=5000, catalogue=CAT)
    warmed = fleet.sample_attempts(warm, start_time=START)
    out = [Record(a, frac=float(Draws.sample(rng, 1).frac[0]), warm=True) for a in warmed]
    for a in fleet.sample_attempts(live):
        n = a.submission.num_accelerators
        r = Record(a, frac=float(Draws.sample(rng, 1).frac[0]),
                   pinned=CAPACITY.pinned(a.submission.job_key) and CAPACITY.pools[a.preference[0]] >= n)
        r.leap = {h: t * math.exp(rng.normal(0, 0.3)) for h, t in a.oracle.items()}
        r.learned = frozenset(r.leap)
        r.lookup = {h: t for h, t in a.oracle.items() if rng.random() < 0.5}
        out.append(r)
    return out


RECORDS = records()


def peak_use(outcomes: list[Outcome]) -> dict[str, int]:
    """Most accelerators each part held at once (a sweep over starts and ends; ends first)."""
    events: dict[str, list[tuple[float, int]]] = {}
    for o in outcomes:
        end = o.decision.start + o.record.seconds(o.decision.hardware)
        events.setdefault(o.decision.hardware, []).extend([(o.decision.start, o.record.n), (end, -o.record.n)])
    peaks = {}
    for hw, evs in events.items():
        level = peak = 0
        for _, delta in sorted(evs):
            level += delta
            peak = max(peak, level)
        peaks[hw] = peak
    return peaks


def with_warm_outcomes(routing: str, recs: list[Record], cap: FleetCapacity) -> list[Outcome]:
    unwarmed = [replace(r, warm=False, pinned=True) if r.warm else r for r in recs]  # warm ones counted too
    return route(unwarmed, routing, LIST, cap)


@pytest.mark.parametrize("routing", ROUTINGS)
def test_no_pool_is_ever_over_filled(routing: str) -> None:
    outcomes = with_warm_outcomes(routing, RECORDS, CAPACITY)
    peaks = peak_use(outcomes)
    assert all(peaks[hw] <= CAPACITY.pools.get(hw, 0) for hw in peaks), peaks
    # and the pools bind: some part runs full at some point
    assert any(peaks[hw] > 0.9 * CAPACITY.pools[hw] for hw in peaks)


def test_every_routing_sees_the_same_pools_and_queues_under_them() -> None:
    empty = replace(CAPACITY, pools={**CAPACITY.pools, "T4": 0, "H100-SXM": 0})
    for routing in ROUTINGS:
        unlimited = route(RECORDS, routing, LIST, None)
        limited = route(RECORDS, routing, LIST, empty)
        assert all(o.decision.wait_s == 0.0 for o in unlimited)
        assert not any(o.decision.hardware in ("T4", "H100-SXM") for o in limited)
        assert any(o.decision.wait_s > 0 for o in limited), routing  # capacity binds for every routing
    # the records left out (no pool big enough) are the same for every routing
    kept = [{id(o.record) for o in route(RECORDS, r, LIST, empty)} for r in ROUTINGS]
    assert all(k == kept[0] for k in kept)


def _placed(decision: Decision | None) -> Decision:
    assert decision is not None
    return decision


def test_place_takes_room_waits_a_bounded_time_or_takes_the_next() -> None:
    cluster = Cluster({"A": 8, "B": 8}, max_wait_s=3600.0, wait_cost=1.0)
    cluster.commit(_placed(cluster.place([Option("A", 0.0)], 8, 0.0, 1.0)), seconds=1800.0, n=8)  # A full until 1800
    cheap_a = [Option("A", 10.0), Option("B", 100.0)]
    d = _placed(cluster.place(cheap_a, 4, 0.0, waiting_hourly=1.0))  # waiting 0.5 h costs 0.5: worth it
    assert (d.hardware, d.start, d.wait_s) == ("A", 1800.0, 1800.0)
    d = _placed(cluster.place(cheap_a, 4, 0.0, waiting_hourly=1000.0))  # waiting costs 500: take B now
    assert (d.hardware, d.wait_s) == ("B", 0.0)
    cluster.commit(_placed(cluster.place([Option("B", 0.0)], 8, 0.0, 1.0)), seconds=10_000.0, n=8)  # B full long
    tight = Cluster({"A": 8, "B": 8}, max_wait_s=600.0, wait_cost=0.0)
    tight.commit(_placed(tight.place([Option("A", 0.0)], 8, 0.0, 1.0)), seconds=1800.0, n=8)
    tight.commit(_placed(tight.place([Option("B", 0.0)], 8, 0.0, 1.0)), seconds=900.0, n=8)
    d = _placed(tight.place(cheap_a, 8, 0.0, 0.0))  # neither within 600 s: the one that starts first
    assert (d.hardware, d.wait_s) == ("B", 900.0)
    assert tight.place([Option("A", 0.0)], 16, 0.0, 0.0) is None  # bigger than the pool


def test_waits_beyond_the_bound_only_when_no_candidate_starts_sooner() -> None:
    routable = [r for r in RECORDS if not r.pinned and not r.warm]
    outcomes = route(RECORDS, "leap", LIST, CAPACITY)
    waits = np.array([o.decision.wait_s for o in outcomes if not o.record.pinned])
    assert len(waits) == len(routable)
    # a routable attempt has many candidates: it waits past the bound very rarely
    assert np.mean(waits > CAPACITY.max_wait_s) < 0.02
    assert np.percentile(waits, 90) <= CAPACITY.max_wait_s


def test_pool_earliest_start_matches_a_brute_force_timeline() -> None:
    rng = np.random.default_rng(0)
    pool = Pool(32.0)
    held: list[tuple[float, float, int]] = []
    now = 0.0
    for _ in range(300):
        now += float(rng.exponential(50.0))
        n = int(rng.integers(1, 17))
        start = pool.earliest_start(n, now)
        end = start + float(rng.exponential(400.0))
        # brute force: from start on, every instant has room for n
        for t in [start] + [e for _, e, _ in held if start < e < end]:
            assert sum(m for s, e, m in held if s <= t < e) + n <= 32
        pool.commit(start, end, n)
        held.append((start, end, n))


def test_scenario_reports_the_keys_and_capacity_costs_savings() -> None:
    on = scenario(RECORDS, LIST, CAPACITY, "list")
    off = scenario(RECORDS, LIST, None, "list")
    assert on["capacity"] is True and off["capacity"] is False and on["price_schedule"] == "list"
    assert off["queue_wait_p99_s"] == 0.0 and on["queue_wait_p99_s"] > 0.0
    assert 0.0 < on["savings_vs_default"] < off["savings_vs_default"]  # the pools of cheap parts fill
    assert on["lookup_rankable_hours_share"] < on["eligible_hours_ranked_share"] == pytest.approx(1.0)


def test_negotiated_prices_are_flatter_and_never_above_list() -> None:
    flat = schedule_prices("flat", CAT)
    value = {hw.name: math.sqrt(hw.peak_tflops * hw.memory_bw_gbps) for hw in CAT}
    spread = {name: max(p[h] / value[h] for h in p) / min(p[h] / value[h] for h in p)
              for name, p in (("list", LIST), ("flat", flat))}
    assert spread["flat"] < spread["list"] / 2
    assert all(flat[h] <= LIST[h] for h in LIST)
    with pytest.raises(ValueError, match="unknown price schedule"):
        schedule_prices("cheap", CAT)


def test_capacity_file_errors_name_the_field(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parent.parent / "leap" / "fleet" / "data" / "capacity.toml").read_text()
    bad = tmp_path / "c.toml"
    bad.write_text(text.replace('"T4" = ', '"T5" = '))
    with pytest.raises(ValueError, match=r"\[pools\] 'T5' is not a hardware type"):
        load_capacity(CAT, bad)
    bad.write_text(text.replace('"T4" = ', '"T4" = -'))
    with pytest.raises(ValueError, match=r"\[pools\] 'T4' must be a positive integer"):
        load_capacity(CAT, bad)
    bad.write_text(text.replace("pinned_share = 0.5", "pinned_share = 2"))
    with pytest.raises(ValueError, match=r"pinned_share must be within"):
        load_capacity(CAT, bad)
    scaled = CAPACITY.scaled(2 * CAPACITY.reference_attempts_per_day)
    assert scaled.pools["T4"] == 2 * CAPACITY.pools["T4"]
    nvidia = sum(n for h, n in CAPACITY.pools.items() if CAT.types[h].vendor == "nvidia")
    assert nvidia > 0.5 * sum(CAPACITY.pools.values())  # mostly NVIDIA


def test_pinning_is_per_job_and_near_its_share() -> None:
    keys = [f"job-{i}" for i in range(4000)]
    assert np.mean([CAPACITY.pinned(k) for k in keys]) == pytest.approx(CAPACITY.pinned_share, abs=0.03)
    assert all(CAPACITY.pinned(k) == CAPACITY.pinned(k) for k in keys[:50])


def test_a_schedule_written_as_a_price_file_is_what_workers_rank_with(tmp_path: Path) -> None:
    from leap.core.hardware import Catalogue
    from leap.fleet.capacity import write_price_file

    flat = schedule_prices("flat", CAT)
    path = write_price_file(flat, tmp_path / "prices-flat.csv", "flat schedule")
    loaded = Catalogue.load(prices=path)
    assert {hw.name: hw.price_per_hour for hw in loaded} == pytest.approx(flat, abs=1e-4)
