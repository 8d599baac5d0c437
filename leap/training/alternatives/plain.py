"""``lightgbm_plain``: LightGBM on five inputs, without the served model's machinery.

The question a plain gradient-boosting model answers: given the job's own throughput on one
hardware type, how fast is it on another? Its inputs are only

- ``log_prior``: the job's own log per-accelerator throughput, on the candidate
  (``prior_same_log``) when it ran there, else on its most-observed other hardware
  (``prior_other_log``); NaN for a job never measured;
- ``hardware``: the candidate (categorical);
- ``prior_hw``: where ``log_prior`` was measured (the candidate itself for ``prior_same_log``;
  categorical; ``none`` without a prior);
- ``log_batch`` and ``log_accelerators``.

No configuration beyond that, no specs, no lookup medians, no base model, no anchor chain, no
trust calibration: what the served model adds over this is what its extra features and stages
are worth. The public-table evaluation's pairwise LightGBM reads the same kind of inputs.

Target (``target``): ``residual`` = ``log(y) - log_prior`` where there is a prior, ``log(y)``
where there is none (the trees tell the two apart by the missing prior, which LightGBM routes on
its own); ``anchor`` = ``log(y) - anchor``, with the anchor (the served model's model-free chain,
:func:`leap.training.alternatives.preprocess.anchor`: own throughput here, else the prior carried by
the paired ratio, else the transferred prior, lookup, roofline) as a sixth input; ``log`` =
``log(y)``. Which one is a setting chosen on tuning data (:mod:`leap.training.alternatives.tuning`).
The band is calibrated on a tenth of the training jobs (:func:`predictor.calibration.job_folds`).

Tuning (``leap fleet history --days 14 --attempts-per-day 2000 --seed 7``, last 3 nightly
retrains, 30-day window, mean acc@10; never a reported run): the residual target scored far above
``log(y)``, and (31 leaves, 300 trees, learning rate 0.05) at least as well as larger, smaller or
slower-learning sizes. Predictions are never NaN.
"""

from __future__ import annotations

from typing import Any, ClassVar, Self

import lightgbm as lgb
import numpy as np

from features.rows import Rows
from leap.training.alternatives.preprocess import anchor
from leap.training.alternatives.sklearn_models import held_out_jobs
from predictor.models import ThroughputModel, residual_band

FEATURES = ("log_prior", "hardware", "prior_hw", "log_batch", "log_accelerators")
TARGETS = ("residual", "anchor", "log")
CATEGORIES = ("hardware", "prior_hw")


def plain_inputs(rows: Rows) -> dict[str, np.ndarray]:
    """The five inputs of :data:`FEATURES` (categoricals as strings)."""
    same = np.asarray(rows["prior_same_log"], dtype=np.float64)
    has_same = np.isfinite(same)
    return {
        "log_prior": np.where(has_same, same, np.asarray(rows["prior_other_log"], dtype=np.float64)),
        "hardware": rows["hardware"].astype(str),
        "prior_hw": np.where(has_same, rows["hardware"].astype(str), rows["prior_hw"].astype(str)),
        "log_batch": np.asarray(rows["log_batch"], dtype=np.float64),
        "log_accelerators": np.asarray(rows["log_accelerators"], dtype=np.float64),
    }


class PlainLightGBM(ThroughputModel):
    """Gradient-boosted trees on :data:`FEATURES` only.

    Parameters
    ----------
    num_leaves, n_estimators, learning_rate, min_child_samples
        LightGBM's own; ``min_child_samples`` shrinks on small training sets (public tables).
    target
        ``residual`` (``log(y) - log_prior`` where there is a prior), ``anchor`` (``log(y) -
        anchor``, the anchor also an input) or ``log``.
    num_threads
        Threads for fitting and predicting; 0 (default) is OpenMP's choice, as the served model's.
    seed
        Makes training deterministic.
    """

    kind: ClassVar[str] = "lightgbm_plain"

    def __init__(self, num_leaves: int = 31, n_estimators: int = 300, learning_rate: float = 0.05,
                 min_child_samples: int = 20, target: str = "residual", num_threads: int = 0, seed: int = 0) -> None:
        super().__init__()
        self.num_leaves = num_leaves
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.min_child_samples = min_child_samples
        self.target = target
        self.num_threads = num_threads
        self.seed = seed
        self.booster_: lgb.Booster | None = None
        self.vocab_: dict[str, dict[str, int]] = {}
        self.fallback_ = 0.0

    def get_params(self) -> dict[str, Any]:
        return {"num_leaves": self.num_leaves, "n_estimators": self.n_estimators,
                "learning_rate": self.learning_rate, "min_child_samples": self.min_child_samples,
                "target": self.target, "num_threads": self.num_threads, "seed": self.seed}

    def _features(self) -> tuple[str, ...]:
        return (*FEATURES, "anchor") if self.target == "anchor" else FEATURES

    def _matrix(self, rows: Rows) -> tuple[np.ndarray, np.ndarray]:
        """The feature matrix (categories as codes, NaN if unseen) and each row's offset."""
        inputs = plain_inputs(rows)
        if self.target == "anchor":
            inputs["anchor"], _ = anchor(rows, self.fallback_)
        cols = []
        for name in self._features():
            if name in CATEGORIES:
                codes = self.vocab_[name]
                distinct, inverse = np.unique(inputs[name], return_inverse=True)
                cols.append(np.array([codes.get(v, np.nan) for v in distinct], dtype=np.float64)[inverse.ravel()])
            else:
                cols.append(inputs[name])
        prior = inputs["log_prior"]
        if self.target == "residual":
            offset = np.where(np.isfinite(prior), prior, 0.0)
        else:
            offset = inputs["anchor"] if self.target == "anchor" else np.zeros(len(prior))
        return np.column_stack(cols) if cols[0].size else np.zeros((0, len(self._features()))), offset

    def fit(self, rows: Rows, y: np.ndarray, groups: np.ndarray | None = None) -> Self:
        """Fit on rows and their per-accelerator throughput; ``groups`` (job keys) draw the band's
        held-out tenth by job."""
        if self.target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {self.target!r}")
        y = np.asarray(y, dtype=np.float64)
        if len(y) == 0:
            raise ValueError(f"{self.kind}: no training rows")
        inputs = plain_inputs(rows)
        self.vocab_ = {c: {v: i for i, v in enumerate(sorted(set(inputs[c].tolist())))} for c in CATEGORIES}
        self.fallback_ = float(np.median(np.log(y)))
        calibrate = held_out_jobs(len(y), groups, self.seed)
        if calibrate.sum() < 30:
            calibrate[:] = False  # too few rows to hold any out: band from the training rows
        x, offset = self._matrix(rows)
        fit = ~calibrate
        # Public tables have a few hundred rows: leaves of 20 would leave few splits to make.
        min_child = max(2, min(self.min_child_samples, int(fit.sum()) // 50))
        params = {
            "objective": "regression", "num_leaves": self.num_leaves, "learning_rate": self.learning_rate,
            "min_child_samples": min_child, "min_data_per_group": min_child, "cat_smooth": 1.0,
            "max_cat_to_onehot": 8, "lambda_l2": 1.0, "num_threads": self.num_threads, "seed": self.seed,
            "deterministic": True, "force_col_wise": True, "verbose": -1,
        }
        data = lgb.Dataset(x[fit], label=np.log(y[fit]) - offset[fit], feature_name=list(self._features()),
                           categorical_feature=list(CATEGORIES))
        self.booster_ = lgb.train(params, data, num_boost_round=self.n_estimators)
        held = calibrate if calibrate.any() else fit
        residual = np.log(y[held]) - self._predict_log({c: v[held] for c, v in rows.items()})
        self.band_ = residual_band(residual)
        return self

    def _predict_log(self, rows: Rows) -> np.ndarray:
        if self.booster_ is None:
            raise RuntimeError(f"{self.kind}: model is not fitted")
        if len(rows["hardware"]) == 0:
            return np.zeros(0)
        x, offset = self._matrix(rows)
        return np.asarray(self.booster_.predict(x, num_threads=self.num_threads), dtype=np.float64) + offset
