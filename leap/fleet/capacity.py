"""The simulated fleet's capacity (``leap/fleet/data/capacity.toml``) and its price schedules.

A fleet owns a pool of accelerators per hardware type, pins part of its jobs to the part their
team asks for, and pays either list prices or a negotiated schedule. The scheduler simulator
(:mod:`leap.fleet.scheduler`) and the routing comparison (:mod:`leap.fleet.routing`) read all of it from
here, so every routing sees the same pools and prices.
"""

from __future__ import annotations

import hashlib
import math
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from leap.core.hardware import Catalogue

DEFAULT_CAPACITY_PATH = Path(__file__).resolve().parent / "data" / "capacity.toml"

#: ``list``: the catalogue's on-demand prices. ``flat``: a negotiated schedule (:func:`schedule_prices`).
PRICE_SCHEDULES = ("list", "flat")
#: How far (in log) the negotiated schedule moves a list price toward the fleet's value line.
NEGOTIATED_PULL = 0.75


@dataclass(frozen=True)
class FleetCapacity:
    """Pools, pinning and queueing of the simulated fleet.

    Attributes
    ----------
    pools
        Canonical hardware name -> accelerators at ``reference_attempts_per_day``.
    reference_attempts_per_day
        Submission rate the pools are sized for; :meth:`scaled` sizes them for another.
    pinned_share
        Share of jobs pinned to the part their team asks for.
    max_wait_s
        Longest wait the scheduler accepts for a better part before it takes the next candidate.
    wait_cost
        A waiting hour costs this many hours of the job's allocation on the part it asked for.
    """

    pools: dict[str, int]
    reference_attempts_per_day: float
    pinned_share: float
    max_wait_s: float
    wait_cost: float

    def scaled(self, attempts_per_day: float) -> FleetCapacity:
        """The same fleet sized for ``attempts_per_day`` (pools in proportion, at least one server)."""
        factor = attempts_per_day / self.reference_attempts_per_day
        pools = {hw: max(8, round(n * factor)) for hw, n in self.pools.items()}
        return replace(self, pools=pools, reference_attempts_per_day=attempts_per_day)

    def pinned(self, job_key: str) -> bool:
        """Whether the job is pinned: a stable hash of its key, so every attempt of a job agrees."""
        digest = hashlib.blake2b(job_key.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2.0**64 < self.pinned_share


def _number(table: dict[str, object], key: str, path: Path, section: str) -> float:
    value = table.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{path}: [{section}] {key} must be a number, got {value!r}")
    return float(value)


def load_capacity(catalogue: Catalogue, path: Path | None = None) -> FleetCapacity:
    """Read and check a capacity file.

    Parameters
    ----------
    catalogue
        Resolves the pool names (any spelling) to canonical names.
    path
        Default :data:`DEFAULT_CAPACITY_PATH`.

    Returns
    -------
    FleetCapacity

    Raises
    ------
    ValueError
        Naming the file, section and field: an unknown part, a pool that is not a positive
        integer, a share outside [0, 1], a negative wait or wait cost.
    """
    path = path or DEFAULT_CAPACITY_PATH
    with path.open("rb") as fh:
        data = tomllib.load(fh)
    fleet = data.get("fleet", {})
    pools: dict[str, int] = {}
    for name, count in data.get("pools", {}).items():
        hw = catalogue.resolve(name)
        if hw is None:
            raise ValueError(f"{path}: [pools] {name!r} is not a hardware type of the catalogue")
        if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
            raise ValueError(f"{path}: [pools] {name!r} must be a positive integer, got {count!r}")
        pools[hw.name] = pools.get(hw.name, 0) + count
    cap = FleetCapacity(
        pools=pools,
        reference_attempts_per_day=_number(fleet, "reference_attempts_per_day", path, "fleet"),
        pinned_share=_number(fleet, "pinned_share", path, "fleet"),
        max_wait_s=_number(fleet, "max_wait_s", path, "fleet"),
        wait_cost=_number(fleet, "wait_cost", path, "fleet"),
    )
    if not 0.0 <= cap.pinned_share <= 1.0:
        raise ValueError(f"{path}: [fleet] pinned_share must be within [0, 1], got {cap.pinned_share}")
    if cap.reference_attempts_per_day <= 0 or cap.max_wait_s < 0 or cap.wait_cost < 0:
        raise ValueError(f"{path}: [fleet] reference_attempts_per_day must be positive, max_wait_s and "
                         "wait_cost not negative")
    return cap


def schedule_prices(schedule: str, catalogue: Catalogue) -> dict[str, float]:
    """USD per accelerator-hour of every part under a price schedule.

    ``list`` is the catalogue's prices. ``flat`` is a negotiated schedule: each list price moved
    :data:`NEGOTIATED_PULL` of the way (in log) toward the fleet's value line
    ``c x sqrt(peak x bandwidth)`` (``c`` the catalogue's geometric mean of price over that spec
    value), never above list: parts that list high for what they deliver get the discounts a
    fleet negotiates, so price per unit of capability spreads about 4x instead of 12x. No price
    list publishes such a schedule; it stands for reserved and negotiated prices being flatter.
    """
    if schedule not in PRICE_SCHEDULES:
        raise ValueError(f"unknown price schedule {schedule!r}; choose one of: {', '.join(PRICE_SCHEDULES)}")
    listed = {hw.name: hw.price_per_hour for hw in catalogue}
    if schedule == "list":
        return listed
    value = {hw.name: math.sqrt(hw.peak_tflops * hw.memory_bw_gbps) for hw in catalogue}
    level = math.exp(sum(math.log(listed[h] / value[h]) for h in listed) / len(listed))
    return {h: min(p, p ** (1 - NEGOTIATED_PULL) * (level * value[h]) ** NEGOTIATED_PULL) for h, p in listed.items()}


def write_price_file(prices: dict[str, float], path: Path, source: str) -> Path:
    """Write ``prices`` as a price-override CSV (``LEAP_PRICES_FILE``) so that workers rank with them."""
    lines = ["hardware,price_per_hour,source"] + [f"{h},{p:.4f},{source}" for h, p in prices.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path
