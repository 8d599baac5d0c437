"""The pairwise LightGBM's features: category codes, catalogue specs and the feature matrix."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from core.hardware import SPEC_FEATURES, Catalogue, load_catalogue
from training.measurements.pairs import Pairs
from training.measurements.table import OPTIONAL_NUMERIC, FloatArray, IntArray, Table

#: String columns encoded as categories when the table has them (in feature order).
OPTIONAL_CATEGORICAL = ("precision", "suite")


@dataclass(frozen=True)
class FeatureSpace:
    """Fixed encodings for one table: category codes are built from names only (never values)."""

    hw_codes: dict[str, int]
    workload_codes: dict[str, int]
    precision_codes: dict[str, int]
    suite_codes: dict[str, int]
    specs: dict[str, FloatArray]
    names: list[str]
    categorical: list[str]

    @classmethod
    def build(cls, t: Table, catalogue: Catalogue | None = None) -> FeatureSpace:
        """Category vocabularies and catalogue specs (NaN where the catalogue lacks a type)."""
        cat = catalogue if catalogue is not None else load_catalogue()
        hws = sorted(set(t.hardware))
        specs: dict[str, FloatArray] = {}
        for h in hws:
            hw = cat.resolve(h)
            specs[h] = np.array([float(getattr(hw, k)) if hw else np.nan for k in SPEC_FEATURES])
        names, categorical = _feature_names(t)
        return cls(
            hw_codes={h: k for k, h in enumerate(hws)},
            workload_codes={w: k for k, w in enumerate(sorted(set(t.workload)))},
            precision_codes={p: k for k, p in enumerate(sorted(set(t.precision)))},
            suite_codes={s: k for k, s in enumerate(sorted(set(t.suite)))},
            specs=specs,
            names=names,
            categorical=categorical,
        )

    def matrix(self, t: Table, pairs: Pairs, idx: IntArray) -> FloatArray:
        """Feature rows of the pairs ``idx``. The target row's own throughput is never read."""
        rows = pairs.row[idx]
        prior_hw = [pairs.prior_hw[p] for p in idx.tolist()]
        target_hw = [t.hardware[i] for i in rows.tolist()]
        ps = np.array([self.specs[h] for h in prior_hw]).reshape(len(idx), len(SPEC_FEATURES))
        ts = np.array([self.specs[h] for h in target_hw]).reshape(len(idx), len(SPEC_FEATURES))
        cols: list[FloatArray] = [
            np.log(pairs.prior[idx]),
            np.array([self.hw_codes[h] for h in prior_hw], dtype=np.float64),
            np.array([self.hw_codes[h] for h in target_hw], dtype=np.float64),
            np.array([self.workload_codes[t.workload[i]] for i in rows.tolist()], dtype=np.float64),
            *ps.T,
            *ts.T,
            *np.log(ts / ps).T,
            t.num_accelerators[rows],
            np.log(t.batch[rows]),
            np.log(t.batch[rows] / t.num_accelerators[rows]),
        ]
        if "precision" in self.categorical:
            cols.append(np.array([self.precision_codes[t.precision[i]] for i in rows.tolist()], dtype=float))
        if "suite" in self.categorical:
            cols.append(np.array([self.suite_codes[t.suite[i]] for i in rows.tolist()], dtype=float))
        for c in OPTIONAL_NUMERIC:
            if c in t.optional:
                cols.append(np.log(getattr(t, c)[rows]))
        return np.column_stack(cols)


def _feature_names(t: Table) -> tuple[list[str], list[str]]:
    """All feature names in matrix column order, and the categorical ones among them."""
    names = ["log_prior", "prior_hw", "target_hw", "workload"]
    names += [f"prior_{k}" for k in SPEC_FEATURES] + [f"target_{k}" for k in SPEC_FEATURES]
    names += [f"log_ratio_{k}" for k in SPEC_FEATURES]
    names += ["num_accelerators", "log_batch", "log_batch_per_accelerator"]
    categorical = ["prior_hw", "target_hw", "workload"]
    for c in OPTIONAL_CATEGORICAL:
        if c in t.optional:
            names.append(c)
            categorical.append(c)
    names += [f"log_{c}" for c in OPTIONAL_NUMERIC if c in t.optional]
    return names, categorical
