"""Fit the throughput law's constants (:class:`leap.fleet.law.LawParams`) to measured ratios.

Only ratios between hardware types within a comparable group are fitted, never absolute
speeds: a public table's units, input pipeline and convergence differ from the simulator's, but
they are the same for every hardware type of one group.

The fit minimises, over the pairs of the training units, a Cauchy loss of the log-ratio error
(scale :data:`LOSS_SCALE`, so that a few contradictory measurements - Gavel's recommender is
slower on V100 than on P100, one MI300X BERT submission took 20x the accelerator-hours of the
NVIDIA ones - do not drag the law), each unit's pairs weighing one unit in total, plus Gaussian
priors: the architecture efficiencies follow a line in the log of the architecture's peak,
with deviations of sd :data:`DEVIATION_SD`, and a part's efficiency its architecture's with
deviations of sd :data:`PART_SD`; the global constants stay near the unfitted law unless the
data say otherwise.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from itertools import combinations

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import least_squares

from leap.core.hardware import load_catalogue
from leap.fleet.arrays import F, I
from leap.fleet.cases import Case, case_configs, simulate_configs
from leap.fleet.law import LawParams

LOSS_SCALE = 0.2  # log-ratio error where the loss turns from quadratic to logarithmic
DEVIATION_SD = 0.3  # prior sd of an architecture's efficiency around the line
PART_SD = 0.3  # prior sd of a part's efficiency around its architecture's
#: log10 of peak TFLOP/s where the efficiency line is pinned (K80 ~0.6, B200 ~3.4)
LINE_KNOTS = (0.5, 3.5)
_GLOBALS = ("dispatch_scale", "overlap_norm", "peak_exponent", "bw_exponent", "occupancy_tau_s")
#: Prior sd of each global's log (around the unfitted law).
GLOBAL_SD = {"dispatch_scale": 2.0, "overlap_norm": 2.0, "peak_exponent": 2.0, "bw_exponent": 2.0,
             "occupancy_tau_s": 2.0}


@dataclass(frozen=True)
class Pairs:
    """Every pair of cases of one group on different hardware.

    Attributes
    ----------
    a, b
        Case indices.
    unit, source
        The pair's unit (``source/workload``) and source.
    measured
        ``log(measured a / measured b)``.
    """

    a: I
    b: I
    unit: NDArray[np.str_]
    source: NDArray[np.str_]
    measured: F

    def __len__(self) -> int:
        return len(self.a)

    @classmethod
    def of(cls, cases: list[Case]) -> Pairs:
        """The pairs of ``cases`` (groups in first-seen order, pairs in case order)."""
        groups: dict[str, list[int]] = defaultdict(list)
        for i, c in enumerate(cases):
            groups[c.group].append(i)
        ab = [(i, j) for members in groups.values() for i, j in combinations(members, 2)
              if cases[i].hardware != cases[j].hardware]
        a = np.array([i for i, _ in ab], dtype=np.int64)
        b = np.array([j for _, j in ab], dtype=np.int64)
        log_measured = np.log(np.array([c.measured for c in cases]))
        return cls(
            a=a,
            b=b,
            unit=np.array([cases[i].unit for i in a]),
            source=np.array([cases[i].source for i in a]),
            measured=log_measured[a] - log_measured[b],
        )

    def unit_weights(self, mask: NDArray[np.bool_]) -> F:
        """Weights of the selected pairs: each unit's pairs add up to one."""
        _, inverse, counts = np.unique(self.unit[mask], return_inverse=True, return_counts=True)
        return np.asarray(1.0 / counts[inverse], dtype=np.float64)


def _architecture_peaks(architectures: tuple[str, ...]) -> F:
    """log10 of the largest datasheet peak (TFLOP/s) among each architecture's parts."""
    best: dict[str, float] = {}
    for hw in load_catalogue():
        arch = hw.architecture or hw.name
        best[arch] = max(best.get(arch, 0.0), hw.peak_tflops)
    return np.log10(np.array([best[a] for a in architectures]))


class _Problem:
    """The parameter vector of one fit: globals, the two ends of the line, deviations.

    ``fitted`` are the architectures and ``parts`` the parts that the training pairs cover.
    Where an architecture has one measured part, only the sum of its deviation and the part's is
    identified: it is one parameter with the summed prior, of which the architecture's other
    parts inherit the architecture's expected share (the exact Gaussian posterior mean), which
    keeps the fit free of flat directions.
    """

    def __init__(self, names: tuple[str, ...], arch_of: dict[str, str], fitted: list[str], parts: list[str]) -> None:
        architectures = tuple(sorted(set(arch_of.values())))
        self.names, self.arch_of, self.fitted = names, arch_of, fitted
        self.parts = [h for h in parts if sum(arch_of[x] == arch_of[h] for x in parts) > 1]
        self.single = {a: next(h for h in parts if arch_of[h] == a) for a in fitted
                       if sum(arch_of[h] == a for h in parts) == 1}
        line = np.interp(_architecture_peaks(architectures), LINE_KNOTS, [0.0, 1.0])
        self.line = dict(zip(architectures, line, strict=True))
        self.size = len(_GLOBALS) + 2 + len(fitted) + len(self.parts)

    def _deviation(self, h: str, arch_dev: dict[str, float], part_dev: dict[str, float]) -> float:
        a = self.arch_of[h]
        if a not in self.single:
            return arch_dev.get(a, 0.0) + part_dev.get(h, 0.0)
        share = 1.0 if h == self.single[a] else DEVIATION_SD**2 / (DEVIATION_SD**2 + PART_SD**2)
        return arch_dev[a] * share

    def law(self, x: F) -> LawParams:
        k = len(_GLOBALS)
        g = dict(zip(_GLOBALS, x[:k], strict=True))
        low, high = x[k], x[k + 1]
        arch_dev = dict(zip(self.fitted, x[k + 2: k + 2 + len(self.fitted)], strict=True))
        part_dev = dict(zip(self.parts, x[k + 2 + len(self.fitted):], strict=True))
        part = {h: float(low + (high - low) * self.line[self.arch_of[h]] + self._deviation(h, arch_dev, part_dev))
                for h in self.names}
        return LawParams(
            part_log_eff=part,
            dispatch_scale=math.exp(g["dispatch_scale"]),
            overlap_norm=1.0 + math.exp(g["overlap_norm"]),
            peak_exponent=math.exp(g["peak_exponent"]),
            bw_exponent=math.exp(g["bw_exponent"]),
            occupancy_tau_s=LawParams().occupancy_tau_s * math.exp(g["occupancy_tau_s"]),
        )

    def prior(self, x: F) -> F:
        """Prior residuals: globals near 0 (the unfitted law), line level near 0, deviations small."""
        k = len(_GLOBALS)
        level = (x[k] + x[k + 1]) / 2.0
        arch_sd = np.array([math.hypot(DEVIATION_SD, PART_SD) if a in self.single else DEVIATION_SD
                            for a in self.fitted])
        arch_dev = x[k + 2: k + 2 + len(self.fitted)]
        sd = np.array([GLOBAL_SD[g] for g in _GLOBALS])
        return np.concatenate([x[:k] / sd, [level], arch_dev / arch_sd,
                               x[k + 2 + len(self.fitted):] / PART_SD])


def fit_law(cases: list[Case], pairs: Pairs, train: NDArray[np.bool_] | None = None) -> LawParams:
    """Fit the law's constants to the pairs selected by ``train`` (default: all).

    Parameters
    ----------
    cases
        The measured cases the pairs index.
    pairs
        Their pairs, :meth:`Pairs.of`.
    train
        Mask over ``pairs``; architectures that no training pair covers keep the line's value.

    Returns
    -------
    LawParams
        Efficiencies for every part of the catalogue.
    """
    from leap.fleet.arrays import hardware_arrays

    train = np.ones(len(pairs), dtype=bool) if train is None else train
    hw = hardware_arrays()
    a, b, y = pairs.a[train], pairs.b[train], pairs.measured[train]
    arch_of = {h: hw.architectures[hw.arch[i]] for i, h in enumerate(hw.names)}
    parts = sorted({cases[i].hardware for i in np.concatenate([a, b])})
    problem = _Problem(hw.names, arch_of, sorted({arch_of[h] for h in parts}), parts)
    scale = np.sqrt(pairs.unit_weights(train)) / LOSS_SCALE
    cfg, cols = case_configs(cases)

    def residuals(x: F) -> F:
        sim = np.log(simulate_configs(cfg, cols, problem.law(x)))
        r = scale * (sim[a] - sim[b] - y)
        # sum of squares of these = the Cauchy loss sum log(1 + r^2)
        return np.concatenate([np.sign(r) * np.sqrt(np.log1p(r * r)), problem.prior(x)])

    result = least_squares(residuals, np.zeros(problem.size), method="trf", diff_step=1e-4, max_nfev=200)
    return problem.law(result.x)
