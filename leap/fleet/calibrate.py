"""Score the simulator's cross-hardware ratios against public measurements, out of sample.

Protocol (``leap fleet calibrate``):

1. Every measured point becomes a simulator configuration (:mod:`leap.fleet.cases`); within a
   comparable group every pair of hardware types gives a measured and a simulated log ratio.
2. The law's constants (:mod:`leap.fleet.law`) are refitted once per *unit* (a source's workload,
   e.g. Lambda's BERT-large in every suite and precision) on all other units, and that unit's
   pairs are predicted with the refit: leave one unit out, never a single pair, so no measurement
   of a held-out workload in that source informs its own prediction.
3. Error of a pair = ``|simulated - measured log ratio|``; the score is the weighted median over
   the held-out pairs, each unit weighing the same. The naive spec-sheet ratios are scored on
   the same pairs with the same weights: ``ratio_1`` (no difference), ``peak`` (datasheet peak
   at the job's precision), ``bandwidth`` and ``sqrt_peak_bandwidth`` (their geometric mean).
4. Dispersion: within one source and hardware pair, the spread (sd) of log ratios across the
   groups that measured it, median over pairs measured in three groups or more. Measured:
   the table's. Simulated: the shipped law's log ratios plus the simulator's random
   per-(model type, architecture) and per-(job, hardware) effects (:mod:`leap.fleet.effects`), each
   group one job, averaged over many draws.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from leap.fleet.arrays import F, hardware_arrays
from leap.fleet.cases import DATA_DIR, Case, all_cases, simulate_cases, spec_logs
from leap.fleet.effects import effect_draws
from leap.fleet.fit import Pairs, fit_law
from leap.fleet.law import fitted_law, write_law

SOURCES = ("gavel", "lambda", "mlperf")
METHODS = ("simulator", "ratio_1", "peak", "bandwidth", "sqrt_peak_bandwidth")
DISPERSION_MIN_GROUPS = 3
DISPERSION_DRAWS = 200


def weighted_median(values: F, weights: F) -> float:
    """The value where the cumulative weight reaches half of the total."""
    order = np.argsort(values)
    cumulative = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cumulative, cumulative[-1] / 2.0)])


def held_out_predictions(cases: list[Case], pairs: Pairs,
                         progress: Callable[[str], None] | None = None) -> F:
    """Simulated log ratio of every pair, from the law refitted without the pair's unit."""
    out = np.full(len(pairs), np.nan)
    for unit in np.unique(pairs.unit):
        test = pairs.unit == unit
        if progress is not None:
            progress(str(unit))
        sim = np.log(simulate_cases(cases, fit_law(cases, pairs, ~test)))
        out[test] = sim[pairs.a[test]] - sim[pairs.b[test]]
    return out


def naive_predictions(cases: list[Case], pairs: Pairs) -> dict[str, F]:
    """Log ratio of every pair under each spec-sheet rule."""
    peak, bw = spec_logs(cases)
    per_case = {"ratio_1": np.zeros(len(cases)), "peak": peak, "bandwidth": bw,
                "sqrt_peak_bandwidth": (peak + bw) / 2.0}
    return {name: v[pairs.a] - v[pairs.b] for name, v in per_case.items()}


def scores(pairs: Pairs, predictions: dict[str, F], mask: NDArray[np.bool_]) -> dict[str, float]:
    """Median |log ratio error| of each method over the masked pairs, units weighing the same."""
    weights = pairs.unit_weights(mask)
    return {name: round(weighted_median(np.abs(p[mask] - pairs.measured[mask]), weights), 4)
            for name, p in predictions.items()}


def _pair_key(cases: list[Case], pairs: Pairs) -> tuple[NDArray[np.str_], F]:
    """Unordered hardware pair of each pair, and the sign that orders its log ratio."""
    names = [(cases[i].hardware, cases[j].hardware) for i, j in zip(pairs.a, pairs.b, strict=True)]
    key = np.array(["/".join(sorted(n)) for n in names])
    sign = np.array([1.0 if x < y else -1.0 for x, y in names])
    return key, sign


def dispersion(log_ratios: F, key: NDArray[np.str_], mask: NDArray[np.bool_]) -> float:
    """Median over hardware pairs (measured in enough groups) of the sd of their log ratios.

    ``log_ratios`` may be (pairs,) or (draws, pairs); with draws, the sd of each pair is the
    root mean square over draws.
    """
    values = np.atleast_2d(log_ratios)
    sds = []
    for k in np.unique(key[mask]):
        m = mask & (key == k)
        if m.sum() >= DISPERSION_MIN_GROUPS:
            sds.append(math.sqrt(float(np.mean(np.var(values[:, m], axis=1, ddof=1)))))
    return float(np.median(sds)) if sds else float("nan")


def simulated_dispersion_draws(cases: list[Case], pairs: Pairs, seed: int = 0, draws: int = DISPERSION_DRAWS,
                               sizes: dict[str, float] | None = None) -> F:
    """(draws x pairs) simulated log ratios: the shipped law plus random effects, one job per group.

    ``sizes`` overrides :mod:`leap.fleet.effects`' sizes (keys ``job_hardware``, ``tuned``, ``other``).
    """
    sim = np.log(simulate_cases(cases))
    hw = hardware_arrays()
    col = {h: i for i, h in enumerate(hw.names)}
    models = sorted({c.model for c in cases})
    groups = sorted({c.group for c in cases})
    effects = effect_draws(
        np.random.default_rng(seed), draws,
        model=np.array([models.index(c.model) for c in cases]),
        job=np.array([groups.index(c.group) for c in cases]),
        hardware=np.array([col[c.hardware] for c in cases]),
        sizes=sizes,
    )
    logs = sim[None, :] + effects
    return np.asarray(logs[:, pairs.a] - logs[:, pairs.b], dtype=np.float64)


def calibrate(data_dir: Path = DATA_DIR, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the protocol of the module docstring.

    Returns
    -------
    dict
        ``held_out`` (median |log ratio error| per method, all sources), ``by_source`` (the
        same per source), ``dispersion`` (per source: ``simulated`` and ``measured`` sd), and
        for the record ``in_sample`` (the shipped law on every pair), ``pairs`` and ``units``
        per source.
    """
    cases = all_cases(data_dir)
    pairs = Pairs.of(cases)
    predictions = {"simulator": held_out_predictions(cases, pairs, progress), **naive_predictions(cases, pairs)}
    everything = np.ones(len(pairs), dtype=bool)
    shipped = np.log(simulate_cases(cases))
    key, sign = _pair_key(cases, pairs)
    draws = simulated_dispersion_draws(cases, pairs)
    by_source = {s: pairs.source == s for s in SOURCES}
    return {
        "held_out": scores(pairs, predictions, everything),
        "by_source": {s: scores(pairs, predictions, m) for s, m in by_source.items()},
        "dispersion": {
            s: {"simulated": round(dispersion(draws * sign, key, m), 4),
                "measured": round(dispersion(pairs.measured * sign, key, m), 4)}
            for s, m in by_source.items()
        },
        "in_sample": scores(pairs, {"simulator": shipped[pairs.a] - shipped[pairs.b]}, everything)["simulator"],
        "pairs": {s: int(m.sum()) for s, m in by_source.items()},
        "units": {s: len(np.unique(pairs.unit[m])) for s, m in by_source.items()},
    }


def refit_shipped_law(data_dir: Path = DATA_DIR) -> Path:
    """Fit the law on every measurement and store it as the simulator's (``--write``)."""
    cases = all_cases(data_dir)
    law = fit_law(cases, Pairs.of(cases))
    return write_law(law, {
        "fitted_on": "every pair of data/measurements (gavel, lambda, mlperf); see leap/fleet/fit.py",
        "command": "leap fleet calibrate --write",
    })


__all__ = ["METHODS", "SOURCES", "calibrate", "fitted_law", "refit_shipped_law"]


def derive_effect_sizes(data_dir: Path = DATA_DIR, draws: int = 100) -> dict[str, float]:
    """The effect sizes of :mod:`leap.fleet.effects` as the public tables give them.

    1. ``job_hardware`` (method of moments): for a hardware pair of one architecture measured in
       :data:`DISPERSION_MIN_GROUPS` groups or more, the variance of measured log ratios that
       the shipped law does not produce, ``var(measured) - var(law)``, is ``2 s_job^2``;
       averaged over those pairs (A100 40/80 GB, H100 PCIe/SXM, H100/H200).
    2. ``tuned`` and ``other``: the values on :data:`_SIZE_GRID` whose simulated dispersion
       (:func:`simulated_dispersion_draws`) is closest to the measured one in log: ``tuned`` on
       Lambda and MLPerf (NVIDIA architectures from Volta on), ``other`` on Gavel (K80 and P100),
       alternately, twice.
    """
    from leap.fleet import effects

    cases = all_cases(data_dir)
    pairs = Pairs.of(cases)
    key, sign = _pair_key(cases, pairs)
    sim = np.log(simulate_cases(cases))
    law, measured = (sim[pairs.a] - sim[pairs.b]) * sign, pairs.measured * sign
    hw = hardware_arrays()
    arch = {h: hw.architectures[hw.arch[i]] for i, h in enumerate(hw.names)}
    excess = []
    for k in np.unique(key):
        a, b = (arch[h] for h in str(k).split("/"))
        m = key == k
        if a == b and m.sum() >= DISPERSION_MIN_GROUPS:
            excess.append(max(0.0, float(np.var(measured[m], ddof=1) - np.var(law[m], ddof=1))))
    sizes = {"job_hardware": round(math.sqrt(float(np.mean(excess)) / 2.0), 2),
             "tuned": effects.ARCH_SIGMA["tuned"], "other": effects.ARCH_SIGMA["other"]}
    target = {s: dispersion(measured, key, pairs.source == s) for s in SOURCES}

    def mismatch(trial: dict[str, float], sources: tuple[str, ...]) -> float:
        simulated = simulated_dispersion_draws(cases, pairs, draws=draws, sizes=trial) * sign
        return sum(math.log(dispersion(simulated, key, pairs.source == s) / target[s]) ** 2 for s in sources)

    for _ in range(2):
        for name, sources in (("tuned", ("lambda", "mlperf")), ("other", ("gavel",))):
            sizes[name] = float(min(_SIZE_GRID[name], key=lambda v: mismatch({**sizes, name: v}, sources)))
    return sizes


#: Values :func:`derive_effect_sizes` chooses from.
_SIZE_GRID = {"tuned": tuple(np.round(np.arange(0.02, 0.21, 0.02), 2)),
              "other": tuple(np.round(np.arange(0.3, 0.81, 0.05), 2))}
