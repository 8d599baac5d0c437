"""Where users send their jobs without LEAP: their team's usual hardware.

Real users do not pick a part per job from a price list. A team works on one kind of model and
has a usual part: the one its members know and the organisation gives it capacity on, chosen
once with a rule of thumb (the spec sheet's speed per dollar) and habit (what colleagues use).
A job goes to the first part in its team's order that can run it (framework, memory); when
that part is busy, to the next (availability; :data:`leap.fleet.engine.P_DEFAULT_ROUTE`).

The team's order is the hardware sorted by ``log popularity + log spec value per dollar +
Gumbel noise`` (unit weights and scale: familiarity, the rule of thumb and personal taste count
alike). Spec value is ``sqrt(peak x bandwidth) / price``, the best of the naive spec-sheet rules
(``leap fleet calibrate`` scores it); it knows nothing of the job, of software maturity or of
job-by-hardware effects, which is what LEAP can add.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from leap.fleet.arrays import F, HardwareArrays, I, model_arrays
from leap.fleet.workloads import FAMILIES

TEAMS = 240  # teams in the fleet; each works on one family
MIN_TEAMS_PER_FAMILY = 4
PREFERENCES = 4  # ranked parts kept per job: the requested one and fallbacks when it is busy
USUAL_PARTS = 3  # parts a team uses (has capacity on): the first of its order


@dataclass(frozen=True)
class Teams:
    """The fleet's teams: their family and their order of preference over hardware types.

    Attributes
    ----------
    family
        Index into :data:`leap.fleet.workloads.FAMILIES`, per team.
    order
        (teams x hardware) hardware indices, most preferred first.
    """

    family: I
    order: I

    def __len__(self) -> int:
        return len(self.family)


def spec_value(hw: HardwareArrays) -> F:
    """The spec sheet's speed per dollar of each part: ``sqrt(peak x bandwidth) / price``."""
    return np.asarray(np.sqrt(hw.peak * hw.bw) / hw.price, dtype=np.float64)


def sample_teams(rng: np.random.Generator, hw: HardwareArrays, teams: int = TEAMS) -> Teams:
    """Teams with families in proportion to the families' share of jobs, and their orders."""
    m = model_arrays()
    share = np.bincount(m.family, weights=m.popularity, minlength=len(FAMILIES))
    counts = np.maximum(np.floor(share / share.sum() * teams), MIN_TEAMS_PER_FAMILY).astype(np.int64)
    family = np.repeat(np.arange(len(FAMILIES)), counts)
    score = np.log(hw.popularity)[None, :] + np.log(spec_value(hw))[None, :]
    score = score + rng.gumbel(size=(len(family), len(hw.names)))
    return Teams(family=family.astype(np.int64), order=np.argsort(-score, axis=1).astype(np.int64))


def assign_teams(rng: np.random.Generator, teams: Teams, family: I) -> I:
    """A team of each job's family, uniformly."""
    out = np.empty(len(family), dtype=np.int64)
    for f in np.unique(family):
        members = np.flatnonzero(teams.family == f)
        sel = family == f
        out[sel] = members[rng.integers(0, len(members), int(sel.sum()))]
    return out


def preferences(order: I, eligible: np.ndarray, memory: F) -> I:
    """(rows x :data:`PREFERENCES`) the parts each row's user asks for, most preferred first.

    ``order`` is the team order of each row (rows x hardware). The team's usual parts are the
    first :data:`USUAL_PARTS` of its order; among those that can run the job, the user asks for
    the one with the least memory (a small job does not take the team's biggest part), then the
    other usual ones, then the rest of the team's order. Rows with fewer eligible parts repeat
    their first choice.
    """
    ok = np.take_along_axis(eligible, order, axis=1)
    usual = np.arange(order.shape[1])[None, :] < USUAL_PARTS
    # sort key: not eligible last; usual parts by memory; the others in the team's order
    key = np.where(usual, memory[order] / memory.max(), 1.0 + np.arange(order.shape[1])[None, :])
    key = np.where(ok, key, np.inf)
    position = np.argsort(key, axis=1, kind="stable")
    ranked = np.take_along_axis(order, position, axis=1)[:, :PREFERENCES]
    usable = np.take_along_axis(ok, position, axis=1)[:, :PREFERENCES]
    return np.asarray(np.where(usable, ranked, ranked[:, :1]), dtype=np.int64)
