"""The pairwise LightGBM that ``leap evaluate-measurements`` scored before the served model did.

Kept as one named alternative (``pairwise_lightgbm``), now on the same model rows as every other
model: it learns ``log(y / prior elsewhere)`` from the rows whose job ran on other hardware before
(the prior is the job's robust throughput on its most-observed other hardware, ``prior_other_log``)
and predicts ``prior x exp(trees)``; rows without a prior elsewhere get NaN (no estimate). Its
features are those it had on (prior, target) pairs, as far as rows carry them: both hardware
types and the workload as categories, the target's catalogue specs and its peak-FLOP/s and
bandwidth ratios to the prior's hardware, accelerators, batch, batch per accelerator, precision
and, where known, parameters and sequence length. Its default parameters are unchanged (15
leaves, 400 rounds, learning rate 0.05, one thread); ``leap alternatives --tune`` searches them
(:mod:`leap.training.alternatives.tuning`). With ``reference="anchor"`` it learns ``log(y) - anchor``
instead (the served model's model-free anchor chain,
:func:`leap.training.alternatives.preprocess.anchor`, which for these rows is the prior carried by
the paired ratio where there is one), the anchor one more input. Not carried over: the blend
with the transfer baseline for workloads without training pairs (its inner
leave-one-workload-out).

``leap evaluate-measurements`` runs it by default.
"""

from __future__ import annotations

from typing import Any, Self

import lightgbm as lgb
import numpy as np

from features.rows import Rows
from leap.core.hardware import SPEC_FEATURES
from leap.training.alternatives.preprocess import anchor
from predictor.calibration import job_folds
from predictor.models import residual_band

#: Small and deterministic, as before. Categorical settings are lowered from LightGBM's defaults
#: (min_data_per_group=100, cat_smooth=10), which would refuse to split on hardware types with a
#: few dozen rows each.
LGB_PARAMS: dict[str, Any] = {
    "objective": "regression",
    "learning_rate": 0.05,
    "num_leaves": 15,
    "min_data_in_leaf": 5,
    "min_data_per_group": 5,
    "cat_smooth": 1.0,
    "cat_l2": 1.0,
    "max_cat_to_onehot": 8,
    "lambda_l2": 1.0,
    "feature_fraction": 0.9,
    "bagging_fraction": 0.9,
    "bagging_freq": 1,
    "deterministic": True,
    "force_row_wise": True,
    "num_threads": 1,
    "verbose": -1,
}
LGB_ROUNDS = 400
CATEGORICAL = ("prior_hw", "hardware", "model_type")
NUMERIC = (*SPEC_FEATURES, "spec_ratio_peak", "spec_ratio_bw", "log_accelerators", "log_batch",
           "precision_bits", "log_params", "log_seq")
FEATURES = (*CATEGORICAL, *NUMERIC, "log_batch_per_accelerator")
REFERENCES = ("prior", "anchor")


class PairwiseLightGBM:
    """LightGBM on ``log(y / prior elsewhere)``; see the module docstring.

    Parameters
    ----------
    num_leaves, n_estimators, learning_rate, min_data_in_leaf
        LightGBM's own.
    reference
        ``prior`` (``log(y / prior elsewhere)``) or ``anchor`` (``log(y) - anchor``).
    seed
        LightGBM's seed.
    """

    def __init__(self, num_leaves: int = 15, n_estimators: int = LGB_ROUNDS, learning_rate: float = 0.05,
                 min_data_in_leaf: int = 5, reference: str = "prior", seed: int = 0) -> None:
        self.num_leaves = num_leaves
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.min_data_in_leaf = min_data_in_leaf
        self.reference = reference
        self.seed = seed
        self.band_: tuple[float, float] = (0.0, 0.0)
        self.vocab_: dict[str, dict[str, int]] = {}
        self.booster_: lgb.Booster | None = None

    def get_params(self) -> dict[str, Any]:
        return {"num_leaves": self.num_leaves, "n_estimators": self.n_estimators,
                "learning_rate": self.learning_rate, "min_data_in_leaf": self.min_data_in_leaf,
                "reference": self.reference, "seed": self.seed}

    def _features(self) -> tuple[str, ...]:
        return (*FEATURES, "anchor") if self.reference == "anchor" else FEATURES

    def _offset(self, rows: Rows) -> np.ndarray:
        """What the trees correct: the prior elsewhere, or the anchor where there is such a prior."""
        prior = np.asarray(rows["prior_other_log"], dtype=np.float64)
        if self.reference == "prior":
            return prior
        # Only rows with a prior elsewhere are this model's (others stay NaN, as before).
        return np.where(np.isfinite(prior), anchor(rows, np.nan)[0], np.nan)

    def _matrix(self, rows: Rows) -> np.ndarray:
        cols = [np.array([self.vocab_[c].get(v, np.nan) for v in rows[c].astype(str).tolist()], dtype=np.float64)
                for c in CATEGORICAL]
        cols += [np.asarray(rows[c], dtype=np.float64) for c in NUMERIC]
        cols.append(np.asarray(rows["log_batch"] - rows["log_accelerators"], dtype=np.float64))
        if self.reference == "anchor":
            cols.append(self._offset(rows))
        return np.column_stack(cols)

    def fit(self, rows: Rows, y: np.ndarray, groups: np.ndarray | None = None) -> Self:
        """Fit on the rows with a prior elsewhere; with ``groups`` (job keys), the band comes from a
        tenth of the jobs held out of a first fit, as the other models' bands do."""
        self.band_ = (0.0, 0.0)
        if groups is not None:
            held = job_folds(np.asarray(groups), 10, self.seed) == 0
            if held.any() and not held.all():
                self._fit_booster({c: v[~held] for c, v in rows.items()}, np.asarray(y)[~held])
                held_rows = {c: v[held] for c, v in rows.items()}
                measured = np.log(np.asarray(y, dtype=np.float64)[held])
                self.band_ = residual_band(measured - np.log(self.predict(held_rows)))
        return self._fit_booster(rows, y)

    def predict_band(self, pred: np.ndarray, rows: Rows | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The band around predictions from :meth:`predict`: the held-out log residual's quantiles."""
        return pred * np.exp(self.band_[0]), pred * np.exp(self.band_[1])

    def _fit_booster(self, rows: Rows, y: np.ndarray) -> Self:
        if self.reference not in REFERENCES:
            raise ValueError(f"reference must be one of {REFERENCES}, got {self.reference!r}")
        prior = self._offset(rows)
        use = np.isfinite(prior) & (np.asarray(y) > 0)
        self.vocab_ = {c: {v: i for i, v in enumerate(sorted(set(rows[c].astype(str).tolist())))}
                       for c in CATEGORICAL}
        self.booster_ = None
        if use.sum() < 2:  # nothing to learn a ratio from: every prediction will be NaN
            return self
        x = self._matrix({c: v[use] for c, v in rows.items()})
        target = np.log(np.asarray(y, dtype=np.float64)[use]) - prior[use]
        data = lgb.Dataset(x, label=target, feature_name=list(self._features()), categorical_feature=list(CATEGORICAL))
        params = {**LGB_PARAMS, "num_leaves": self.num_leaves, "learning_rate": self.learning_rate,
                  "min_data_in_leaf": self.min_data_in_leaf, "seed": self.seed}
        self.booster_ = lgb.train(params, data, num_boost_round=self.n_estimators)
        return self

    def predict(self, rows: Rows) -> np.ndarray:
        """Per-accelerator throughput; NaN for rows without a prior elsewhere."""
        prior = self._offset(rows)
        if self.booster_ is None:
            return np.full(len(prior), np.nan)
        return np.asarray(np.exp(prior + self.booster_.predict(self._matrix(rows))), dtype=np.float64)
