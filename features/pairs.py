"""Paired ratios: how much faster a model type runs on one hardware type than on another, learned
from the jobs that ran on both.

When a job finishes on hardware ``b`` having run on ``a`` before, its per-accelerator throughput
on ``b`` over its robust throughput on ``a`` is one observation of the ratio ``b / a`` in which
the job's own speed (its input pipeline, its code) cancels. The store keeps the newest
observations per hardware pair at three levels — the job's model type, its family, and all jobs —
each with the configuration it was measured at (per-accelerator batch, accelerators, precision).

At read time the observations of the pair (candidate, the job's prior hardware) are averaged with
weights that fall with the distance between each observation's configuration and the
submission's: the ratio between two parts moves smoothly with batch size and scale within a
workload, so neighbouring configurations say the most, and far ones still say something; at
the model-type level the kernel is sharpened (:data:`SHARPNESS`), so there the nearest measured
configurations of the same workload and pair decide, an interpolation between them; at the
family and all levels a window whose ratios cluster tightly reports their weighted median
(:data:`MEDIAN_BELOW_SPREAD`), so a few far-off workloads do not pull the estimate. This
is what carries a job's prior across hardware types; the lookup medians' ratio
(``transfer_log``) compares unrelated jobs and configurations instead.

Everything here is pure: :mod:`features.store` (Redis) and :mod:`features.offline` (training)
both observe and summarise through these functions, so they agree.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from features.layout import (
    COMPUTED_NUMBER,
    OBSERVATION_SEP,
    PAIR_OBSERVATION,
    PAIR_VALUE,
    pairable,
    unpack_window,
)
from features.snapshot import PairStat, PriorStat
from streams.events import JobFinish, Submission

#: Aggregation levels, most specific first; a level's key names the model type, family or nothing.
LEVELS: tuple[str, ...] = ("model", "family", "all")
#: Separator of the two hardware names in a pair's field.
PAIR_SEP = "|"
#: Bandwidths of the configuration kernel, in natural-log units (0.7 ~ a factor of two).
BATCH_BANDWIDTH = 0.7
ACCELERATOR_BANDWIDTH = 0.7
#: Squared distance added when the two precisions differ, or when a coordinate is unknown.
PRECISION_MISMATCH = 4.0
UNKNOWN_COORDINATE = 1.0

#: How much sharper the kernel is at each level when it averages: weights are raised to this power
#: (every distance scaled by its square root). Within one model type the ratio follows the
#: configuration closely (on Gavel, V100 over P100 ranges from 1.2x to 5x with the accelerator
#: count at one batch), so the nearest configurations of the same workload should decide; across
#: model types (family, all) configurations are less comparable and the wide kernel's average is
#: what helps. Chosen on fold seeds 0 and 2 of the public tables (``docs/evaluation.md``). The
#: total weight a summary reports is the wide kernel's at every level, so the rows' weight columns
#: keep their meaning.
SHARPNESS: Mapping[str, float] = {"model": 16.0, "family": 1.0, "all": 1.0}

#: Below this weighted spread (standard deviation of the window's log ratios under the wide kernel)
#: a level reports the weighted median instead of the weighted mean. Across model types (family,
#: all) a pair's ratios cluster with a few far-off workloads, and those pull a mean that a workload
#: never seen before (or any of the cluster) should not follow; a widely spread window has no
#: cluster to be robust about, and there the mean's compromise does better. 0 keeps the mean (the
#: model level, whose sharpened kernel already follows the nearest configurations). Chosen on fold
#: seeds 0 and 2 of the public tables (``docs/evaluation.md``).
MEDIAN_BELOW_SPREAD: Mapping[str, float] = {"model": 0.0, "family": 0.3, "all": 0.3}

#: Bits per value of each precision: a pair coordinate here, a configuration column of the model rows.
PRECISION_BITS: Mapping[str, float] = {"fp32": 32.0, "tf32": 19.0, "bf16": 16.0, "fp16": 16.0, "fp8": 8.0}
NAN = float("nan")

Coordinates = tuple[float, float, float]  # log per-accelerator batch, log accelerators, precision bits


def pair_field(a: str, b: str) -> tuple[str, float]:
    """The field of the unordered pair ``{a, b}`` and the sign that turns its stored ratio into
    ``log(a / b)``: fields store ``log(high / low)`` with ``low < high`` by name."""
    low, high = sorted((a, b))
    return f"{low}{PAIR_SEP}{high}", 1.0 if a == high else -1.0


def coordinates(global_batch_size: int | None, num_accelerators: int, precision: str | None) -> Coordinates:
    """Where an attempt's configuration sits for the kernel (NaN for what is unknown)."""
    batch = math.log(global_batch_size / num_accelerators) if global_batch_size else NAN
    bits = PRECISION_BITS.get(precision, NAN) if precision is not None else NAN
    return batch, math.log(num_accelerators), bits


def finish_coordinates(ev: JobFinish) -> Coordinates:
    return coordinates(ev.global_batch_size, ev.num_accelerators, ev.precision)


def submission_coordinates(sub: Submission) -> Coordinates:
    return coordinates(sub.global_batch_size, sub.num_accelerators, sub.precision)


def observations(prior: Mapping[str, PriorStat], hardware: str, value: float) -> list[tuple[str, str]]:
    """The ``(other hardware, log ratio text)`` a finish on ``hardware`` yields, exactly as
    ``job_finish.lua`` writes them (two logs, one subtraction, :data:`COMPUTED_NUMBER`)."""
    if not pairable(hardware):
        return []
    return [(other, COMPUTED_NUMBER % (math.log(value) - math.log(stat.robust))) for other, stat in prior.items()
            if other != hardware and pairable(other) and stat.robust > 0]


def unpack_observations(packed: str) -> list[tuple[str, str]]:
    """A finish's observations as the job script returns them (``''``: none)."""
    out = []
    for item in packed.split(OBSERVATION_SEP) if packed else ():
        other, ratio = PAIR_OBSERVATION.unpack(item)
        out.append((other, ratio))
    return out


def stored_values(hardware: str, observed: Sequence[tuple[str, str]], coords: Coordinates
                  ) -> list[tuple[str, str]]:
    """``(pair field, packed value)`` for each observation of a finish on ``hardware``.

    Fields store ``log(high / low)``; an observation is ``log(hardware / other)``, so it flips
    sign when ``hardware`` is the lower name (text negation is exact: the format is symmetric).
    """
    out = []
    for other, ratio in observed:
        field, sign = pair_field(hardware, other)
        text = ratio if sign > 0 else COMPUTED_NUMBER % -float(ratio)
        out.append((field, PAIR_VALUE.pack(text, *(_coordinate_text(x) for x in coords))))
    return out


def _coordinate_text(x: float) -> str:
    return "" if math.isnan(x) else repr(x)


def _coordinate(text: str) -> float:
    return float(text) if text else NAN


def unpack_value(value: str) -> tuple[float, Coordinates]:
    ratio, batch, accelerators, bits = PAIR_VALUE.unpack(value)
    return float(ratio), (_coordinate(batch), _coordinate(accelerators), _coordinate(bits))


Observation = tuple[float, Coordinates]  # stored log ratio and the configuration it was measured at


class Observations(list[Observation]):
    """A pair window's observations, whose columns (log ratio, batch, accelerators, bits) are taken
    once however often the window is summarised: the offline replay reads one window, unchanged
    between two finishes on both parts, for many submissions. Not changed once read."""

    __slots__ = ("_columns",)

    def columns(self) -> np.ndarray:
        """Four rows (log ratio, batch, accelerators, bits), a column per observation."""
        found: np.ndarray | None = getattr(self, "_columns", None)
        if found is None:
            found = self._columns = _as_columns(self)
        return found


def _columns(observed: Sequence[Observation]) -> np.ndarray:
    return observed.columns() if isinstance(observed, Observations) else _as_columns(observed)


def _as_columns(observed: Sequence[Observation]) -> np.ndarray:
    ratios, coordinates = zip(*observed, strict=True)  # transposed by zip: half the time of a row each
    return np.array((ratios, *zip(*coordinates, strict=True)), dtype=np.float64)


def _distances2(batch: np.ndarray, accelerators: np.ndarray, bits: np.ndarray,
                at: Coordinates | np.ndarray) -> np.ndarray:
    """Squared kernel distance of each observation's configuration (three columns) from ``at``
    (one configuration, or three columns: one per observation).

    Per observation: ``((x - y) / bandwidth) ** 2`` for the batch and the accelerators
    (:data:`UNKNOWN_COORDINATE` when either is unknown), plus :data:`UNKNOWN_COORDINATE` for an
    unknown precision or :data:`PRECISION_MISMATCH` for another one, summed in that order.
    """
    at_batch, at_accelerators, at_bits = at
    d2 = np.where(np.isnan(batch) | (at_batch != at_batch), UNKNOWN_COORDINATE,
                  np.square((batch - at_batch) / BATCH_BANDWIDTH))
    d2 += np.where(np.isnan(accelerators) | (at_accelerators != at_accelerators), UNKNOWN_COORDINATE,
                   np.square((accelerators - at_accelerators) / ACCELERATOR_BANDWIDTH))
    d2 += np.where(np.isnan(bits) | (at_bits != at_bits), UNKNOWN_COORDINATE,
                   np.where(bits != at_bits, PRECISION_MISMATCH, 0.0))
    return d2


def summarise(observed: Sequence[Observation], sign: float, at: Coordinates, sharpness: float = 1.0,
              median_below: float = 0.0) -> PairStat | None:
    """Kernel-weighted mean (or median) log ratio of a pair's observations, as seen from ``at``.

    Parameters
    ----------
    observed
        The pair's window, parsed (:func:`unpack_value`).
    sign
        From :func:`pair_field`: +1 when the wanted ratio is the stored one, -1 for its inverse.
    at
        The submission's coordinates.
    sharpness
        The mean's weights are the kernel's raised to this power (:data:`SHARPNESS`); the
        reported total weight is the kernel's own.
    median_below
        The weighted median is reported instead of the mean when the window's weighted standard
        deviation is below this (:data:`MEDIAN_BELOW_SPREAD`; 0: always the mean).

    Returns
    -------
    PairStat or None
        Observations, their total kernel weight and the weighted mean (or median); None without
        observations.
    """
    if not observed:
        return None
    stat = _summaries([(observed, at, sharpness, median_below)])[0]
    if stat is None or sign > 0:
        return stat
    return PairStat(stat.n, stat.weight, -stat.log_ratio)


def _summaries(windows: Sequence[tuple[Sequence[Observation], Coordinates, float, float]]) -> list[PairStat | None]:
    """:func:`summarise` (stored sign) of every ``(window, at, sharpness, median_below)``, in one
    pass over all their observations: the innermost loop of building training rows (a full
    snapshot summarises about a hundred windows of up to 32 observations) and of a store read.
    Each result depends on its own window only, so the offline replay (a submission at a time)
    and the store (a read batch at a time) get the same numbers."""
    observed, at, sharpness, median_below = zip(*windows, strict=True)
    lengths = np.fromiter(map(len, observed), np.int64, len(observed))
    starts = np.zeros(len(observed), np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    ratio, batch, accelerators, bits = np.concatenate([_columns(w) for w in observed], axis=1)
    d2 = _distances2(batch, accelerators, bits, np.repeat(np.array(at, dtype=np.float64).T, lengths, axis=1))
    weights = np.exp(-0.5 * d2)
    total = np.add.reduceat(weights, starts)
    sharp = np.repeat(np.asarray(sharpness, dtype=np.float64), lengths)
    # Sharpened weights are measured from the window's nearest observation: the weights' scale
    # cancels in the mean, and a far window does not underflow to zero once sharpened.
    nearest = np.repeat(np.minimum.reduceat(d2, starts), lengths)
    mean_weights = np.where(sharp == 1.0, weights, np.exp(-0.5 * sharp * (d2 - nearest)))
    with np.errstate(invalid="ignore", divide="ignore"):  # a window of zero weight is left out below
        mean_weight = np.add.reduceat(mean_weights, starts)
        mean = np.add.reduceat(mean_weights * ratio, starts) / mean_weight
        below = np.asarray(median_below, dtype=np.float64)
        robust = (below > 0.0) & (lengths > 2)  # a median of two is no more robust than their mean
        if robust.any():
            deviation = ratio - np.repeat(mean, lengths)
            spread2 = np.add.reduceat(mean_weights * deviation * deviation, starts) / mean_weight
            for i in np.flatnonzero(robust & (spread2 < below * below)).tolist():
                part = slice(starts[i], starts[i] + lengths[i])
                mean[i] = _weighted_median(ratio[part].tolist(), mean_weights[part].tolist(), mean_weight[i])
    return [PairStat(n, t, m) if t > 0.0 else None
            for n, t, m in zip(lengths.tolist(), total.tolist(), mean.tolist(), strict=True)]


def _weighted_median(values: Sequence[float], weights: Sequence[float], total: float) -> float:
    """The smallest value with at least half the total weight at or below it."""
    acc = 0.0
    ranked = sorted(zip(values, weights, strict=True))
    for value, weight in ranked:
        acc += weight
        if acc >= 0.5 * total:
            return value
    return ranked[-1][0]


def most_informative(prior: Mapping[str, PriorStat], exclude: str) -> tuple[str, PriorStat] | None:
    """The job's other hardware with the most observations (newest on ties): the prior a row uses."""
    best = informative_priors(prior, exclude, 1)
    return (best[0], prior[best[0]]) if best else None


def informative_priors(prior: Mapping[str, PriorStat], exclude: str, limit: int) -> list[str]:
    """Up to ``limit`` of the job's other hardware, most observations first (newest on ties)."""
    ranked = sorted(((stat.n, stat.last_time, hw) for hw, stat in prior.items() if hw != exclude), reverse=True)
    return [hw for _, _, hw in ranked[:limit]]


#: Priors carried across per candidate: each is an estimate, and their weighted mean beats the
#: best one alone (fold seeds 0 and 2 of the public tables: two and more about tie, one is worse).
MAX_PRIORS = 2

Wanted = dict[str, Sequence[tuple[str, str, float]]]  # candidate -> [(prior hardware, pair field, sign)]


def wanted_pairs(prior: Mapping[str, PriorStat], candidates: Sequence[str]) -> Wanted:
    """For each candidate, the pairs with the job's most informative other hardware (the row's own
    prior first): ``(prior hardware, pair field, sign)``."""
    out: Wanted = {}
    if not prior:
        return out
    ranked = ranked_priors(prior)
    for cand in candidates:
        pairs = _candidate_pairs(cand, ranked)
        if pairs:
            out[cand] = pairs
    return out


def ranked_priors(prior: Mapping[str, PriorStat]) -> tuple[str, ...]:
    """The job's priors that any candidate's pairs use: :func:`informative_priors` of a candidate
    is this ranking without the candidate, so a candidate among the top MAX_PRIORS + 1 leaves
    the others."""
    return tuple(informative_priors(prior, "", MAX_PRIORS + 1))


@lru_cache(maxsize=65536)
def _candidate_pairs(cand: str, ranked: tuple[str, ...]) -> tuple[tuple[str, str, float], ...]:
    """A candidate's pairs given the job's ranked priors (pure, so shared between submissions)."""
    if not pairable(cand):
        return ()
    return tuple((hw, *pair_field(cand, hw)) for hw in [hw for hw in ranked if hw != cand][:MAX_PRIORS]
                 if pairable(hw))


def pair_levels(model_type: str, family: str | None) -> list[tuple[str, str | None]]:
    """``(level, name)`` of every pair aggregate a job of this model type and family feeds and reads."""
    levels: list[tuple[str, str | None]] = [("model", model_type)]
    if family is not None:
        levels.append(("family", family))
    levels.append(("all", None))
    return levels


def summarise_pairs(want: Wanted, windows: Mapping[str, Mapping[str, Sequence[Observation]]],
                    at: Coordinates) -> dict[str, dict[str, dict[str, PairStat]]]:
    """Per level, candidate and prior hardware, the summary of the pair (candidate, prior).

    Parameters
    ----------
    want
        From :func:`wanted_pairs`.
    windows
        Level -> pair field -> the field's parsed observations.
    at
        The submission's coordinates.
    """
    return summarise_pairs_of([(want, windows, at)])[0]


PairAsk = tuple[Wanted, Mapping[str, Mapping[str, Sequence[Observation]]], Coordinates]


def summarise_pairs_of(asks: Sequence[PairAsk]) -> list[dict[str, dict[str, dict[str, PairStat]]]]:
    """:func:`summarise_pairs` of each ``(want, windows, at)`` (a store's read batch), every window
    summarised in one pass; a window (the same object) seen from one configuration, once."""
    todo: dict[tuple[Any, ...], tuple[Sequence[Observation], Coordinates, float, float]] = {}
    asked: list[list[tuple[str, str, str, tuple[Any, ...], float]]] = []
    for want, windows, at in asks:
        mine: list[tuple[str, str, str, tuple[Any, ...], float]] = []
        for level, fields in windows.items():
            if not fields:
                continue
            sharpness, median_below = SHARPNESS.get(level, 1.0), MEDIAN_BELOW_SPREAD.get(level, 0.0)
            for cand, pairs in want.items():
                for prior_hw, field, sign in pairs:
                    observed = fields.get(field)
                    if not observed:
                        continue
                    # an id is a safe key: the caller's windows outlive this call
                    key = (id(observed), at, sharpness, median_below)
                    todo.setdefault(key, (observed, at, sharpness, median_below))
                    mine.append((level, cand, prior_hw, key, sign))
        asked.append(mine)
    found = dict(zip(todo, _summaries(list(todo.values())), strict=True)) if todo else {}
    return [_by_level(mine, found) for mine in asked]


def _by_level(asked: list[tuple[str, str, str, tuple[Any, ...], float]], found: dict[Any, PairStat | None]
              ) -> dict[str, dict[str, dict[str, PairStat]]]:
    out: dict[str, dict[str, dict[str, PairStat]]] = {}
    for level, cand, prior_hw, key, sign in asked:
        stat = found[key]
        if stat is not None:
            out.setdefault(level, {}).setdefault(cand, {})[prior_hw] = \
                stat if sign > 0 else PairStat(stat.n, stat.weight, -stat.log_ratio)
    return out


def carried(stats: Mapping[str, Mapping[str, Mapping[str, PairStat]]], prior: Mapping[str, PriorStat],
            candidate: str) -> tuple[float, float, float]:
    """The job's priors carried to ``candidate``, each by its most specific paired ratio, combined.

    Returns
    -------
    tuple
        Kernel-weighted mean of ``log(prior) + log ratio`` over the priors that have a ratio,
        their total weight, and the weighted spread of the estimates (NaN with fewer than two).
    """
    estimates: dict[str, tuple[float, float]] = {}
    for level in LEVELS:
        for prior_hw, stat in stats.get(level, {}).get(candidate, {}).items():
            if prior_hw not in estimates and prior_hw in prior and prior[prior_hw].robust > 0:
                estimates[prior_hw] = (math.log(prior[prior_hw].robust) + stat.log_ratio, stat.weight)
    if not estimates:
        return NAN, 0.0, NAN
    values = [v for v, _ in estimates.values()]
    weights = [w for _, w in estimates.values()]
    total = sum(weights)
    if total <= 0.0:
        weights, total = [1.0] * len(values), float(len(values))
    mean = sum(w * v for w, v in zip(weights, values, strict=True)) / total
    spread = math.sqrt(sum(w * (v - mean) ** 2 for w, v in zip(weights, values, strict=True)) / total) \
        if len(values) > 1 else NAN
    return mean, sum(w for _, w in estimates.values()), spread


def parse_window(packed: str | None) -> Observations:
    """A stored pair window's observations, parsed."""
    return Observations(unpack_value(entry[2]) for entry in unpack_window(packed))
