"""Which estimate to serve, row by row.

A row has several estimates of its log throughput besides the model's own: the job's prior
carried across by the base model's ratio, by the blend, by the paired ratios, or not at all
(an input-bound job runs as fast on a faster part); the job's newest measurement here rather
than its median; the model-type median. Where they disagree, the measured throughput often sits
near one of them rather than between them, so the model's own prediction, which minimises a
squared log error and lands between, misses the 10% band that acc@10 counts.

A **selector** per evidence level is a small LightGBM model that estimates, from where the
estimates sit relative to the model's prediction and from how much evidence stands behind each
(paired counts and weights, ages, observation counts), how likely each one is to land within
10% of the measured throughput; the row takes the likeliest. It is fitted on rows the stages
were not fitted on (the held-out tenth of jobs, :mod:`predictor.calibration`), on one stacked
row per (row, estimate): the estimate's index, its offset from the model's prediction, every
estimate's offset, and :data:`CONTEXT`. It fits on the 0/1 hit label with a squared loss, so
its raw output is the estimated hit rate and the compiled trees (:mod:`predictor.compiled`) can
evaluate it.
"""

from __future__ import annotations

from typing import Any

import lightgbm as lgb
import numpy as np

from features.rows import Rows
from leap.core.accuracy import hits
from predictor.calibration import EVIDENCE
from predictor.compiled import TreePredictor

#: Estimates each evidence level chooses from, after the model's own prediction (index 0). Rows
#: without history keep the prediction: choosing among the base model and the lookup medians
#: there scored lower on both tuning histories (docs/model.md).
CANDIDATES: dict[str, tuple[str, ...]] = {
    "same": ("prior_same_log", "prior_same_last_log", "blended_transfer_log"),
    "other": ("base_transfer_log", "blended_transfer_log", "transfer_paired_log", "prior_other_log"),
}
#: How much evidence stands behind the estimates: read by every selector.
CONTEXT: tuple[str, ...] = (
    "base_ratio", "transfer_paired_weight", "transfer_paired_spread", "paired_model_n", "paired_model_weight",
    "prior_other_n", "prior_other_age_h", "prior_same_n", "prior_same_age_h", "lookup_model_n", "spec_ratio_peak",
    "spec_ratio_bw", "log_accelerators", "log_batch", "precision_bits", "log_params", "prior_any_n", "attempts",
)
#: The feature groups the candidates and the context are made from: a model without one of them
#: (an ablation) fits no selectors, which would otherwise serve what the ablation removed (the
#: job's prior, most of all).
SELECTOR_GROUPS: tuple[str, ...] = ("config", "hardware", "prior", "lookup", "paired")
#: Fewest held-out rows of a level to fit its selector on; fewer: the model's prediction stands.
MIN_ROWS = 300
#: The band a hit lands in (acc@10's).
TOLERANCE = 0.10
PARAMS: dict[str, Any] = {
    "objective": "regression", "num_leaves": 15, "learning_rate": 0.05, "min_child_samples": 40,
    "lambda_l2": 5.0, "feature_fraction": 0.8, "bagging_fraction": 0.8, "bagging_freq": 1,
    "deterministic": True, "force_col_wise": True, "verbose": -1,
}
ROUNDS = 150
#: Name prefix of the selectors among a model's boosters (``select_same``, ...).
PREFIX = "select_"


def _needed(rows: Rows, mask: np.ndarray, level: str) -> Rows:
    """The masked rows' columns that a level's selector reads (a full subset copies every column)."""
    return {c: np.asarray(rows[c])[mask] for c in (*CANDIDATES[level], *CONTEXT)}


def stacked(rows: Rows, served: np.ndarray, level: str) -> tuple[np.ndarray, np.ndarray]:
    """A level's estimates (rows x estimates, the prediction first) and the selector's input, one
    row per (row, estimate), row-major."""
    values = np.column_stack([served, *(np.asarray(rows[c], dtype=np.float64) for c in CANDIDATES[level])])
    n, k = values.shape
    offsets = values - served[:, None]
    context = np.column_stack([np.asarray(rows[c], dtype=np.float64) for c in CONTEXT])
    x = np.hstack([np.tile(np.arange(k, dtype=np.float64), n)[:, None], offsets.reshape(-1, 1),
                   np.repeat(offsets, k, axis=0), np.repeat(context, k, axis=0)])
    return values, x


def fit_selectors(rows: Rows, served: np.ndarray, y: np.ndarray, level: np.ndarray, num_threads: int, seed: int
                  ) -> dict[str, lgb.Booster]:
    """A selector per evidence level with :data:`MIN_ROWS` held-out rows, by booster name.

    Parameters
    ----------
    rows
        Held-out rows with the base model's columns.
    served, y
        The model's log prediction for them (NaN: none) and their measured throughput.
    level
        Their evidence level (index into :data:`EVIDENCE`).
    """
    out = {}
    for k, name in enumerate(EVIDENCE):
        sel = (level == k) & np.isfinite(served) & (y > 0)
        if name not in CANDIDATES or sel.sum() < MIN_ROWS:
            continue
        values, x = stacked(_needed(rows, sel, name), served[sel], name)
        hit = hits(np.exp(values), y[sel][:, None], TOLERANCE)
        known = np.isfinite(values).ravel()
        data = lgb.Dataset(x[known], label=hit.ravel()[known].astype(np.float64), categorical_feature=[0])
        params = {**PARAMS, "num_threads": num_threads, "seed": seed}
        out[PREFIX + name] = lgb.train(params, data, num_boost_round=ROUNDS)
    return out


def select(selectors: dict[str, TreePredictor], rows: Rows, served: np.ndarray, level: np.ndarray,
           num_threads: int) -> np.ndarray:
    """Each row's likeliest estimate by its level's selector (the prediction where it has none)."""
    return select_explained(selectors, rows, served, level, num_threads)[0]


def select_explained(selectors: dict[str, TreePredictor], rows: Rows, served: np.ndarray, level: np.ndarray,
                     num_threads: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`select` and, per row, the column of :data:`CANDIDATES` it serves (None: the prediction)."""
    out = served.copy()
    chosen = np.full(len(served), None, dtype=object)
    for k, name in enumerate(EVIDENCE):
        trees = selectors.get(PREFIX + name)
        sel = (level == k) & np.isfinite(served)
        if trees is None or not sel.any():
            continue
        values, x = stacked(_needed(rows, sel, name), served[sel], name)
        score = np.asarray(trees.predict(x, num_threads=num_threads)).reshape(values.shape)
        score = np.where(np.isfinite(values), score, -np.inf)
        pick = np.argmax(score, axis=1)
        out[sel] = values[np.arange(len(values)), pick]
        chosen[sel] = np.array([None, *CANDIDATES[name]], dtype=object)[pick]
    return out, chosen
