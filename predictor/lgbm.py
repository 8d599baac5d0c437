"""The LightGBM throughput model.

Two stages.

1. A **base model** learns how fast a configuration runs on a hardware type, ignoring the job's
   own history: log per-accelerator throughput from the ``config`` and ``hardware`` groups. Its
   ratio between two hardware types is what moves a job's prior throughput across hardware:
   ``base_transfer_log = prior_other_log + base(h) - base(prior_hw)``.
2. The **main model** predicts the residual ``log(y) - anchor``, where the anchor is the best
   simple estimate the row has (own throughput on this hardware; else the prior carried across
   by the paired ratio other jobs showed between the two types, :mod:`features.pairs`, or where
   there is none by the base model's ratio; else the base model, else lookup medians, else
   roofline). Trees learn corrections to an already good guess, which the drivers report
   compares with learning ``log(y)`` directly.

The base model's trees are linear in their leaves (``linear_tree``): within a region of
configurations, log throughput moves nearly linearly with log batch, log FLOPs and the roofline
terms, which piecewise-constant leaves approximate in steps.

Some of it is chosen on rows the stages were not fitted on (:mod:`predictor.calibration`): per
evidence level (own history here / elsewhere only / none) the **trust** in the main model's
correction (``anchor + w x correction``: corrections learned against anchors the base model
computed on its own training rows can overshoot), the **gate** and the split-conformal **band**;
all of it apart for model types the training data lacks. From
:data:`HOLDOUT_FROM` training rows on, a tenth of the jobs is held out for this; below, every row
is scored out of fold (by job, and by model type) and the stages are then fitted on all rows,
with LightGBM's category settings for few rows and, unless the size is given, small slow trees
below :data:`SMALL_ROWS` (:mod:`predictor.boosting`).

With the held-out tenth, **selectors** are fitted on it too (:mod:`predictor.selector`): per
evidence level with history, which of the row's estimates (the prediction, the carried priors, the
prior itself, the job's median or newest measurement here) is likeliest to land within 10%; the
row serves that one. Rows without history, and models fitted out of fold, keep the prediction.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, cast

import lightgbm as lgb
import numpy as np

from features.rows import CATEGORICAL, GROUPS, PAIR_COLUMNS, Rows, hardware_table, with_hardware
from predictor.boosting import (
    CATEGORY_SETTINGS,
    FEW_ROWS_CATEGORY_SETTINGS,
    HOLDOUT_FROM,
    JOB_EFFECT_COARSENING,
    SMALL_ROWS,
    SMALL_SIZE,
    job_effects,
    map_values,
    predict_distinct,
    predict_together,
    size_for,
    train_and_score,
    train_stopping_early,
)
from predictor.calibration import (
    EVIDENCE,
    as_new_type,
    band_by_evidence,
    blend,
    evidence_level,
    gate_by_evidence,
    gated,
    job_folds,
    paired_transfer,
    restore,
    subset,
    trust_by_evidence,
)
from predictor.compiled import TreePredictor, compile_boosters
from predictor.learned_roofline import LearnedRoofline, usable_rows
from predictor.models import (
    ESTIMATE_OF_COLUMN,
    PAIRED_TRANSFER_CHAIN,
    ThroughputModel,
    chain_estimates,
    first_finite,
)
from predictor.selector import PREFIX, SELECTOR_GROUPS, fit_selectors, select, select_explained

__all__ = ["ANCHOR_CHAIN", "DERIVED", "EVIDENCE", "LightGBMThroughput", "evidence_level"]

#: Anchor candidates in order of preference, each with the feature group it needs.
ANCHOR_CHAIN: tuple[tuple[str, str], ...] = (
    ("prior_same_log", "prior"), ("blended_transfer_log", "prior"), ("base_log", "hardware"), ("transfer_log", "prior"),
    ("lookup_model_log", "lookup"), ("lookup_family_log", "lookup"), ("log_roofline", "hardware"),
)
#: Columns the base model reads: the configuration and the candidate's own hardware.
BASE_GROUPS = ("config", "hardware")
DERIVED = ("base_log", "base_transfer_log", "base_ratio", "blended_transfer_log")
HOLDOUT_SHARE = 0.1
FOLDS = 5
#: The base model's column from :class:`predictor.learned_roofline.LearnedRoofline`.
LEARNED_ROOFLINE = "log_learned_roofline"
TARGETS = ("residual", "log", "raw")
#: The feature groups each column of the gate's fallback is made from.
FALLBACK_GROUPS: dict[str, tuple[str, ...]] = {
    "transfer_paired_log": ("prior", "paired"), "transfer_log": ("prior", "lookup"),
    "lookup_model_log": ("lookup",), "lookup_family_log": ("lookup",),
}
#: Out-of-fold rows: anchor, correction, measured throughput, evidence level, fallback estimate.
_Outcome = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
_Part = tuple["LightGBMThroughput", np.ndarray, tuple[np.ndarray, np.ndarray] | None]  # see _fold_bases
BLENDS = ("paired", "base")


class LightGBMThroughput(ThroughputModel):
    """Gradient-boosted trees on model rows.

    Parameters
    ----------
    num_leaves, n_estimators, learning_rate, min_child_samples
        LightGBM's own; ``n_estimators`` is the most the main model grows. None (default): by the
        training set's size (:func:`predictor.boosting.size_for`, small slow trees below
        :data:`predictor.boosting.SMALL_ROWS` rows); a value given applies at any size.
    early_stopping_rounds
        With a held-out tenth, the main model stops when this many trees did not improve it there (0: never).
    target
        ``residual`` (default), ``log`` or ``raw`` (per-accelerator samples/s).
    feature_groups
        Which groups of :data:`features.rows.GROUPS` the model may use (ablations).
    num_threads
        Threads per fit; 0 (default) is OpenMP's choice (``OMP_NUM_THREADS``, else every core). Give a
        trainer only the cores it owns: LightGBM's threads spin while they wait. Figures move a
        little with the count. Serving predicts on one thread.
    base_linear
        Linear models in the base model's leaves.
    learned_roofline
        Fit a :class:`predictor.learned_roofline.LearnedRoofline` (after the jobs' speed factors are
        estimated) and give the base model its estimate as a column.
    job_effects
        Refit the base model on targets with each job's own speed factor removed.
    blend
        How a job's prior is carried across hardware for the anchor: ``paired`` (the paired ratio
        wherever other jobs showed one, else the base model's ratio) or ``base`` (the base model's
        ratio alone, an ablation). Artifacts saved with a share chosen on held-out rows keep it.
    trust
        Scale the main model's correction per evidence level by a weight chosen on held-out rows;
        False applies it whole (model types the training rows lack still get none).
    correction
        Apply the main model's correction at all; False serves the anchor (an ablation).
    selectors
        Fit the selectors (:mod:`predictor.selector`) with a held-out tenth and all their feature groups.
    gate
        Serve the model's estimate only where held-out rows show it better than the model-free
        fallback (:func:`predictor.calibration.gate_by_evidence`); False serves it everywhere.
    seed
        Makes training deterministic.
    """

    kind: ClassVar[str] = "lightgbm"

    def __init__(
        self,
        num_leaves: int | None = None,
        n_estimators: int | None = None,
        learning_rate: float | None = None,
        min_child_samples: int | None = None,
        early_stopping_rounds: int = 20,
        target: str = "residual",
        feature_groups: tuple[str, ...] = ("config", "hardware", "prior", "lookup", "paired"),
        num_threads: int = 0,
        base_linear: bool = True,
        learned_roofline: bool = True,
        job_effects: bool = True,
        blend: str = "paired",
        trust: bool = True,
        correction: bool = True,
        selectors: bool = True,
        gate: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.num_leaves, self.n_estimators, self.learning_rate = num_leaves, n_estimators, learning_rate
        self.min_child_samples, self.early_stopping_rounds = min_child_samples, early_stopping_rounds
        self.target = target
        self.feature_groups = tuple(feature_groups)
        self.num_threads = num_threads
        self.base_linear = base_linear
        self.learned_roofline = learned_roofline
        # the stages' switches (docs/model.md): each has a remove-one variant in the drivers report
        self.job_effects, self.blend, self.trust = job_effects, blend, trust
        self.correction, self.selectors, self.gate = correction, selectors, gate
        self.seed = seed
        # A served batch is a few hundred rows: one thread, no OpenMP start-up or contention with the worker.
        self.predict_threads = 1
        self.booster_: lgb.Booster | None = None
        self.base_: lgb.Booster | None = None
        self.roofline_: LearnedRoofline | None = None
        self.base_ratio_span_: tuple[float, float] | None = None  # base log ratios on its training rows
        self.trees_: dict[str, TreePredictor] = {}  # compiled boosters by name (compile_trees); absent: LightGBM
        self.selectors_: dict[str, lgb.Booster] = {}  # by name: which estimate a row serves (predictor.selector)
        self.base_features_: list[str] = []
        self.hardware_specs_: dict[str, dict[str, Any]] = {}
        self.features_: list[str] = []
        self.vocab_: dict[str, dict[str, int]] = {}
        self.band_by_evidence_: dict[str, tuple[float, float]] = {}
        self.trust_by_evidence_: dict[str, float] = {}
        #: the same for rows of a model type the training data lacked (no entry: no correction)
        self.trust_new_type_: dict[str, float] = {}
        self.band_new_type_: dict[str, tuple[float, float]] = {}
        #: per evidence level, whether the model's estimate is served rather than the fallback
        #: (:func:`predictor.calibration.gate_by_evidence`); the same for model types the training rows lacked
        self.gate_: dict[str, bool] = {}
        self.gate_new_type_: dict[str, bool] = {}
        self.blend_k_: float = float("inf")
        #: the blend for rows of a model type the training data lacked (its pairs are other types')
        self.blend_k_new_type_: float = float("inf")
        self.model_types_: set[str] = set()
        self.size_: dict[str, float] = {}
        self.categories_: dict[str, float] = dict(CATEGORY_SETTINGS)

    def get_params(self) -> dict[str, Any]:
        return {
            "num_leaves": self.num_leaves, "n_estimators": self.n_estimators,
            "learning_rate": self.learning_rate, "min_child_samples": self.min_child_samples,
            "early_stopping_rounds": self.early_stopping_rounds, "target": self.target,
            "feature_groups": list(self.feature_groups), "num_threads": self.num_threads,
            "base_linear": self.base_linear, "learned_roofline": self.learned_roofline,
            "job_effects": self.job_effects, "blend": self.blend,
            "trust": self.trust, "correction": self.correction, "selectors": self.selectors, "gate": self.gate,
            "seed": self.seed,
        }

    # ------------------------------------------------------------------ data

    def _anchor(self, rows: Rows) -> np.ndarray:
        cols = [rows[c] for c, group in ANCHOR_CHAIN if group in self.feature_groups and c in rows]
        if self.target != "residual" or not cols:
            return np.zeros(len(rows["hardware"]))
        return first_finite(*cols)

    def _matrix(self, rows: Rows, features: list[str] | None = None) -> np.ndarray:
        features = self.features_ if features is None else features
        out = np.empty((len(rows["hardware"]), len(features)), dtype=np.float64)
        for j, col in enumerate(features):
            if col in CATEGORICAL:
                out[:, j] = map_values(rows[col], self.vocab_[col], np.nan, np.float64)
            else:
                out[:, j] = rows[col]
        return out

    def _params(self, min_child_samples: int, leaves: int | None = None) -> dict[str, Any]:
        return {
            "objective": "regression", "num_leaves": leaves or int(self.size_["num_leaves"]),
            "learning_rate": self.size_["learning_rate"], "min_child_samples": min_child_samples,
            "num_threads": self.num_threads, "seed": self.seed, "deterministic": True, "force_col_wise": True,
            "verbose": -1, "feature_fraction": 0.9, "bagging_fraction": 0.9, "bagging_freq": 1, "lambda_l2": 1.0,
            "max_cat_to_onehot": 8, **self.categories_,
        }

    def _given_size(self) -> dict[str, float | None]:
        return {name: getattr(self, name) for name in SMALL_SIZE}

    def _uses_base(self) -> bool:
        return "hardware" in self.feature_groups

    def _base_matrix(self, rows: Rows) -> np.ndarray:
        """The base model's input: its columns, with the learned roofline's when it has one."""
        if self.roofline_ is not None:
            rows = {**rows, LEARNED_ROOFLINE: self.roofline_.predict(rows)}
        return self._matrix(rows, self.base_features_)

    def _base_estimates(self, rows: Rows, threads: int, fitted: np.ndarray | None = None
                        ) -> tuple[np.ndarray, np.ndarray]:
        """The base model's log throughput of each row (``fitted`` when given: its estimates of its
        training rows), and its log ratio from the row's prior hardware to the row's (NaN without a
        prior on a type seen in training), unclipped."""
        n = len(rows["hardware"])
        base, base_prior = np.full(n, np.nan), np.full(n, np.nan)
        if self.base_ is None:
            return base, base_prior
        trees, prior_hw = self.trees_.get("base", self.base_), rows["prior_hw"]
        has_prior = map_values(prior_hw, dict.fromkeys(self.hardware_specs_, True), False, bool)
        if not has_prior.any():  # a new job's candidates: no swapped rows to build
            if fitted is None:
                fitted = np.asarray(trees.predict(self._base_matrix(rows), num_threads=threads))
            return fitted, fitted - base_prior
        # the same configuration on the job's prior hardware (a type seen in training)
        swapped = self._base_matrix(with_hardware(subset(rows, has_prior), self.hardware_specs_, prior_hw[has_prior]))
        if fitted is None:  # one call for both: compiled trees walk all their code once a call
            base, base_prior[has_prior] = predict_together(trees, self._base_matrix(rows), swapped, threads)
        else:
            base, base_prior[has_prior] = fitted, predict_distinct(trees, swapped, threads)
        return base, base - base_prior

    def _with_base(self, rows: Rows, estimates: tuple[np.ndarray, np.ndarray] | None = None) -> Rows:
        """Rows plus the base model's columns and the blended transfer (:data:`DERIVED`)."""
        base, ratio = self._base_estimates(rows, self.predict_threads) if estimates is None else estimates
        if self.base_ratio_span_ is not None:
            ratio = np.clip(ratio, *self.base_ratio_span_)  # NaN stays NaN
        base_transfer = rows["prior_other_log"] + ratio
        blended = base_transfer
        if "paired" in self.feature_groups:
            paired, weight = paired_transfer(rows)
            new = self._is_new_type(rows)
            blended = np.where(new, blend(base_transfer, paired, weight, self.blend_k_new_type_),
                               blend(base_transfer, paired, weight, self.blend_k_))
        return {**rows, "base_log": base, "base_transfer_log": base_transfer, "base_ratio": ratio,
                "blended_transfer_log": blended}

    def _to_target(self, y: np.ndarray, anchor: np.ndarray) -> np.ndarray:
        if self.target == "raw":
            return y
        return np.log(y) - anchor

    def _from_target(self, pred: np.ndarray, anchor: np.ndarray) -> np.ndarray:
        if self.target == "raw":
            return np.log(np.maximum(pred, 1e-9))
        return pred + anchor

    # ------------------------------------------------------------------ estimator

    def fit(self, rows: Rows, y: np.ndarray, groups: np.ndarray | None = None,
            new_type_rows: Rows | None = None) -> LightGBMThroughput:
        """Fit both stages and calibrate the blend, the trust and the band.

        Parameters
        ----------
        rows, y
            Model rows and measured per-accelerator throughput.
        groups
            Job key of each row. When given, the base model is refitted once on targets with
            each job's own speed factor removed, so that it learns the hardware, not the jobs,
            and out-of-fold calibration keeps a job's rows together.
        new_type_rows
            The same rows as a model type never seen has them (built without the aggregates their
            own type fed; :func:`leap.training.measurements.runner.with_new_type_rows`). Out of fold, rows of
            held-out model types are taken from them; without them, from
            :func:`predictor.calibration.as_new_type`.
        """
        self._check_params()
        self.blend_k_ = self.blend_k_new_type_ = 0.0 if self.blend == "paired" else float("inf")
        self.trees_, self.selectors_ = {}, {}  # compiled from the boosters a refit replaces
        y = np.asarray(y, dtype=np.float64)
        self.vocab_ = {c: {v: i for i, v in enumerate(sorted(set(rows[c].tolist())))} for c in CATEGORICAL}
        self.size_ = size_for(len(y), self._given_size())
        self.categories_ = dict(CATEGORY_SETTINGS if len(y) >= HOLDOUT_FROM else FEW_ROWS_CATEGORY_SETTINGS)
        if len(y) >= HOLDOUT_FROM:
            self._fit_with_holdout(rows, y, groups)
        else:
            self._fit_out_of_fold(rows, y, groups, new_type_rows)
        return self

    def _fit_with_holdout(self, rows: Rows, y: np.ndarray, groups: np.ndarray | None) -> None:
        """Fit on nine tenths of the jobs, calibrate on the rest.

        Model types the training data lacks are not calibrated here (a tenth of the jobs holds few
        of them): they are served the fallback, with the widest band of the known ones.
        """
        held = (job_folds(groups, round(1 / HOLDOUT_SHARE), self.seed) == 0) if groups is not None \
            else np.random.default_rng(self.seed).random(len(y)) < HOLDOUT_SHARE
        fit_rows, fit_y = subset(rows, ~held), y[~held]
        estimates = self._fit_base(fit_rows, fit_y, None if groups is None else np.asarray(groups)[~held])
        held_rows, held_y = subset(rows, held), y[held]
        level = evidence_level(held_rows)
        based = self._with_base(held_rows, self._base_estimates(held_rows, self.num_threads))
        self._fit_main(fit_rows, fit_y, estimates, stop_on=(based, held_y))
        anchor, correction = self._anchor_and_correction(based)
        held_groups = np.asarray(groups)[held] if groups is not None else np.arange(int(held.sum()))
        # the selectors read every feature group: an ablation without one has none
        selects = self.selectors and set(SELECTOR_GROUPS) <= set(self.feature_groups)
        select_fn = (lambda served: self._cross_selected(based, served, held_y, level, held_groups)) \
            if selects else None
        calibration = self._calibration(anchor, correction, held_y, level, self._fallback(based), select_fn)
        self.trust_by_evidence_, self.gate_, self.band_, self.band_by_evidence_, served = calibration
        widest = max(self.band_by_evidence_.values(), key=lambda b: b[1] - b[0])
        self.trust_new_type_, self.gate_new_type_, self.band_new_type_ = {}, {}, dict.fromkeys(EVIDENCE, widest)
        if selects:
            self.selectors_ = fit_selectors(based, served, held_y, level, self.num_threads, self.seed)

    def _cross_selected(self, based: Rows, served: np.ndarray, y: np.ndarray, level: np.ndarray,
                        groups: np.ndarray) -> np.ndarray:
        """What the selectors serve on held-out rows, each half by selectors fitted on the other half
        of the jobs: the gate and the band judge what is served, not what the selectors were fitted on."""
        halves = job_folds(groups, 2, self.seed)
        out = served.copy()
        for half in (0, 1):
            fit, apply = halves != half, halves == half
            selectors = fit_selectors(subset(based, fit), served[fit], y[fit], level[fit], self.num_threads, self.seed)
            if selectors and apply.any():
                out[apply] = select(dict(selectors), subset(based, apply), served[apply], level[apply],
                                    self.num_threads)
        return out

    def _fit_out_of_fold(self, rows: Rows, y: np.ndarray, groups: np.ndarray | None,
                         new_type_rows: Rows | None = None) -> None:
        """Score every row with stages fitted on the other folds, calibrate on that, then fit on all.

        Twice: with folds of jobs, for rows of a model type the training data has, and with folds
        of model types, for rows of a type it lacks (a new workload): corrections learned from other
        configurations of a workload need not hold for a workload never seen.
        """
        keys = np.arange(len(y)) if groups is None else np.asarray(groups)
        parts = self._fold_bases(rows, y, groups, job_folds(keys, FOLDS, self.seed))
        known = self._fold_outcome(rows, y, parts)
        types = np.asarray(rows["model_type"]).astype(str)
        n_types = len(np.unique(types))
        new, new_clusters = None, None
        if n_types >= 2:
            by_type = self._fold_bases(rows, y, groups, job_folds(types, min(FOLDS, n_types), self.seed))
            # Each fold's own model types are new to its sibling, so its rows blend as a new type's,
            # and they are seen as a new type's are at serving (new_type_rows, else as_new_type).
            def view(held: np.ndarray) -> Rows:
                return subset(new_type_rows, held) if new_type_rows is not None else as_new_type(subset(rows, held))

            new = self._fold_outcome(rows, y, by_type, view)
            # held-out rows of one type are not independent: the new-type gates judge by types
            new_clusters = np.concatenate([types[held] for _, held, _ in by_type]) if by_type else types[:0]
        self._fit_main(rows, y, self._fit_base(rows, y, groups))
        if known is not None:
            self.trust_by_evidence_, self.gate_, self.band_, self.band_by_evidence_, _ = self._calibration(*known)
        if new is not None:
            self.trust_new_type_, self.gate_new_type_, _, self.band_new_type_, _ = self._calibration(
                *new, clusters=new_clusters)

    def _fold_bases(self, rows: Rows, y: np.ndarray, groups: np.ndarray | None, folds: np.ndarray
                    ) -> list[_Part]:
        """Per fold: a sibling with its base fitted on the other folds, the fold's mask, its estimates of them."""
        parts = []
        for f in np.unique(folds):
            held = folds == f
            if held.any() and not held.all():
                part = self._sibling()
                keys = None if groups is None else np.asarray(groups)[~held]
                parts.append((part, held, part._fit_base(subset(rows, ~held), y[~held], keys)))
        return parts

    def _fold_outcome(self, rows: Rows, y: np.ndarray, parts: list[_Part],
                      view: Callable[[np.ndarray], Rows] | None = None) -> _Outcome | None:
        """Each fold's main model fitted on the other folds; every row's anchor, correction, y, level and
        fallback estimate (of the held-out rows as ``view`` of the fold's mask shows them, as they are
        without)."""
        outcome: list[_Outcome] = []
        for part, held, estimates in parts:
            part.blend_k_, part.blend_k_new_type_ = self.blend_k_, self.blend_k_new_type_
            part._fit_main(subset(rows, ~held), y[~held], estimates)
            held_rows = subset(rows, held) if view is None else view(held)
            based = part._with_base(held_rows)
            outcome.append((*part._anchor_and_correction(based), y[held], evidence_level(held_rows),
                            part._fallback(based)))
        if not outcome:
            return None
        return cast(_Outcome, tuple(np.concatenate(p) for p in zip(*outcome, strict=True)))

    def _sibling(self) -> LightGBMThroughput:
        """An unfitted model with these parameters, vocabularies and tree sizes (for one fold)."""
        model = type(self)(**{**self.get_params(), "feature_groups": self.feature_groups})
        model.vocab_, model.size_, model.categories_ = self.vocab_, self.size_, self.categories_
        return model

    def _check_params(self) -> None:
        for name, value, known in (("target", self.target, TARGETS), ("blend", self.blend, BLENDS)):
            if value not in known:
                raise ValueError(f"{name} must be one of {known}, got {value!r}")
        if unknown := set(self.feature_groups) - set(GROUPS):
            raise ValueError(f"unknown feature groups {sorted(unknown)}; known: {sorted(GROUPS)}")

    def _fit_base(self, rows: Rows, y: np.ndarray, groups: np.ndarray | None) -> tuple[np.ndarray, np.ndarray] | None:
        """Fit the base model (and the learned roofline it reads) on log throughput of ``rows``;
        ``groups`` (job keys, or None) is used to remove each job's own speed factor. Returns its
        :meth:`_base_estimates` of ``rows`` (None without a base model) for :meth:`_fit_main`."""
        self.base_ = self.roofline_ = self.base_ratio_span_ = None
        self.model_types_ = set(rows["model_type"].astype(str).tolist())
        if not self._uses_base():
            return None
        self.base_features_ = [c for g in BASE_GROUPS if g in self.feature_groups for c in GROUPS[g]
                               if c not in PAIR_COLUMNS]
        self.hardware_specs_ = hardware_table(rows)
        # Linear leaves need fewer of them: twice the leaves, as constant leaves wanted, fit
        # markedly slower and scored lower in the 30-day backtest.
        leaves = int(self.size_["num_leaves"]) * (1 if self.base_linear else 2)
        min_child = int(self.size_["min_child_samples"])
        params = self._params(max(50, min_child) if len(y) >= SMALL_ROWS else min_child, leaves=leaves)
        if self.base_linear:
            params.update(linear_tree=True, linear_lambda=0.1)

        def train_base(target: np.ndarray, coarsen: int = 1) -> tuple[lgb.Booster, np.ndarray]:
            data = lgb.Dataset(
                self._base_matrix(rows), label=target, feature_name=self.base_features_,
                categorical_feature=[c for c in self.base_features_ if c in CATEGORICAL],
            )
            rate, rounds = params["learning_rate"] * coarsen, max(1, int(self.size_["n_estimators"]) // coarsen)
            return train_and_score({**params, "learning_rate": rate}, data, rounds)

        target = np.log(y)
        if groups is not None and self.job_effects:
            # Fitted on targets with each job's own speed factor removed, so that the base learns
            # the hardware, not the jobs; a first, coarser fit estimates the factors (its residuals' means).
            _, fitted = train_base(target, JOB_EFFECT_COARSENING if len(y) >= HOLDOUT_FROM else 1)
            target = target - job_effects(target - fitted, groups)
        # The roofline reads the configuration; fitting one to a handful of rows says nothing.
        if self.learned_roofline and "config" in self.feature_groups and usable_rows(rows) >= 1000:
            self.roofline_ = LearnedRoofline(seed=self.seed).fit(rows, target)
            self.base_features_.append(LEARNED_ROOFLINE)
        self.base_, fitted = train_base(target)
        # Linear leaves extrapolate: for a configuration far from those it was fitted on, the ratio
        # between two parts can take any size (e^19 on one simulator row). Ratios are kept within
        # the span the base model gives its own training rows.
        estimates = self._base_estimates(rows, self.num_threads, fitted)
        finite = estimates[1][np.isfinite(estimates[1])]
        self.base_ratio_span_ = (float(finite.min()), float(finite.max())) if finite.size else None
        return estimates

    def _fit_main(self, rows: Rows, y: np.ndarray, estimates: tuple[np.ndarray, np.ndarray] | None,
                  stop_on: tuple[Rows, np.ndarray] | None = None) -> None:
        """Fit the main model on its target against the anchors, after the base model, whose
        :meth:`_fit_base` gave ``estimates`` of the same rows; ``stop_on``: held-out rows (with the
        base model's columns) and their throughput, to stop adding trees once they stop helping."""
        self.features_ = [c for g in self.feature_groups for c in GROUPS[g]]
        if self._uses_base():
            self.features_ += [c for c in DERIVED if "prior" in self.feature_groups or c == "base_log"]
        data = self._main_data(self._with_base(rows, estimates), y)
        self.booster_ = train_stopping_early(
            self._params(int(self.size_["min_child_samples"])), data, int(self.size_["n_estimators"]),
            None if stop_on is None else self._main_data(*stop_on, reference=data), self.early_stopping_rounds)

    def _main_data(self, based: Rows, y: np.ndarray, reference: lgb.Dataset | None = None) -> lgb.Dataset:
        """The main model's rows (those with an anchor and a measurement) and targets."""
        anchor = self._anchor(based)
        usable = np.isfinite(anchor) & (y > 0)
        return lgb.Dataset(self._matrix(based)[usable], label=self._to_target(y[usable], anchor[usable]),
                           feature_name=self.features_, reference=reference,
                           categorical_feature=[c for c in self.features_ if c in CATEGORICAL])

    def _calibration(self, anchor: np.ndarray, correction: np.ndarray, y: np.ndarray, level: np.ndarray,
                     fallback: np.ndarray, select_fn: Callable[[np.ndarray], np.ndarray] | None = None,
                     clusters: np.ndarray | None = None,
                     ) -> tuple[dict[str, float], dict[str, bool], tuple[float, float],
                                dict[str, tuple[float, float]], np.ndarray]:
        """On held-out rows: trust per evidence level; then the gate, judged on what the selectors
        (``select_fn``) serve; then the band (overall, per level) of what the gate serves. Also
        returns the prediction before any selector, which the selectors are fitted on. ``clusters``
        label rows that are not independent (:func:`predictor.calibration.gate_by_evidence`)."""
        trust = {} if self.target != "residual" or not self.trust else trust_by_evidence(anchor, correction, y, level)
        if not self.correction:
            trust = dict.fromkeys(EVIDENCE, 0.0)
        pred = np.where(np.isfinite(anchor), self._from_target(correction * restore(trust)[level], anchor), np.nan)
        served = select_fn(pred) if select_fn is not None else pred
        gate = gate_by_evidence(served, fallback, y, level, clusters) if self.gate else dict.fromkeys(EVIDENCE, True)
        served = gated(served, fallback, restore(gate, default=False)[level])
        overall, by_level = band_by_evidence(np.log(y) - served, level)
        return trust, gate, overall, by_level, pred

    def _is_new_type(self, rows: Rows) -> np.ndarray:
        """Rows of a model type the stages' training rows lacked (a fold's own types, for its sibling)."""
        return map_values(rows["model_type"], dict.fromkeys(self.model_types_, False), True, bool)

    def _anchor_and_correction(self, rows: Rows) -> tuple[np.ndarray, np.ndarray]:
        """The anchor and the main model's raw output (its correction, for the residual target) of
        rows with the base model's columns (:meth:`_with_base`)."""
        if self.booster_ is None:
            raise RuntimeError("model is not fitted")
        trees = self.trees_.get("main", self.booster_)
        return self._anchor(rows), np.asarray(trees.predict(self._matrix(rows), num_threads=self.predict_threads))

    def _predict_log(self, rows: Rows) -> np.ndarray:
        return self._predict_based(self._with_base(rows), evidence_level(rows))

    def _predict_log_explained(self, rows: Rows) -> tuple[np.ndarray, np.ndarray]:
        served = self._serve(self._with_base(rows), evidence_level(rows), explain=True)
        return cast(tuple[np.ndarray, np.ndarray], served)  # with explain, _serve labels every row

    def _predict_based(self, based: Rows, level: np.ndarray) -> np.ndarray:
        """:meth:`_predict_log` of rows that already have the base model's columns."""
        return self._serve(based, level)[0]

    def _serve(self, based: Rows, level: np.ndarray, explain: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        """:meth:`_predict_based` and, when ``explain``, which estimate each row serves (the same pass)."""
        anchor, raw = self._anchor_and_correction(based)
        corrected = np.full(len(raw), self.target != "residual")
        if self.target == "residual":
            new = self._is_new_type(based)
            trust = np.where(new, restore(self.trust_new_type_, default=0.0)[level],
                             restore(self.trust_by_evidence_)[level])
            raw, corrected = raw * trust, trust != 0
        out = np.where(np.isfinite(anchor), self._from_target(raw, anchor), np.nan)
        estimate = self._estimates(based, out, corrected) if explain else None
        if self.selectors_:
            trees = {name: self.trees_.get(name, booster) for name, booster in self.selectors_.items()}
            out, chosen = select_explained(trees, based, out, level, self.predict_threads)
            if estimate is not None:
                picked = np.flatnonzero(chosen != None)  # noqa: E711 - elementwise on an object array
                estimate[picked] = [ESTIMATE_OF_COLUMN[c] for c in chosen[picked]]
        keep = np.where(self._is_new_type(based), restore(self.gate_new_type_, default=False)[level],
                        restore(self.gate_, default=False)[level])
        if estimate is None:
            return gated(out, self._fallback(based), keep), None
        if not self._fallback_chain():
            return out, estimate
        fallback, fallback_estimate = chain_estimates(based, self._fallback_chain())
        # gated()'s rule, for the labels: the fallback's estimate where it is served
        return gated(out, fallback, keep), np.where(keep | np.isnan(fallback), estimate, fallback_estimate)

    def _fallback_chain(self) -> tuple[str, ...]:
        """The paired transfer's columns that the model's feature groups allow (an ablation that
        drops the job's prior must not be served it through the gate)."""
        return tuple(c for c in PAIRED_TRANSFER_CHAIN if set(FALLBACK_GROUPS[c]) <= set(self.feature_groups))

    def _fallback(self, rows: Rows) -> np.ndarray:
        """The gate's fallback estimate (:data:`predictor.models.PAIRED_TRANSFER_CHAIN`), NaN where none."""
        chain = self._fallback_chain()
        return first_finite(*(rows[c] for c in chain)) if chain else np.full(len(rows["hardware"]), np.nan)

    def _estimates(self, based: Rows, out: np.ndarray, corrected: np.ndarray) -> np.ndarray:
        """Before any selector: ``model`` where the correction was applied (trust may be 0), else
        the estimate of the anchor chain's column that answered; ``none`` where ``out`` is NaN."""
        names = tuple(c for c, group in ANCHOR_CHAIN if group in self.feature_groups and c in based)
        if not names:
            return np.where(np.isnan(out), "none", "model").astype(object)
        served = np.where(corrected, "model", chain_estimates(based, names)[1])
        return np.where(np.isnan(out), "none", served).astype(object)  # object: a selector writes longer names

    def compile_trees(self, cache_dir: Path, compiler: str | None = None) -> None:
        """Predict with C compiled from the boosters' trees from now on (:mod:`predictor.compiled`): same output."""
        self.trees_ = compile_boosters(self._boosters(), cache_dir, compiler)

    def _boosters(self) -> dict[str, lgb.Booster | None]:
        """Every booster by name: what is compiled and saved."""
        return {"main": self.booster_, "base": self.base_, **self.selectors_}

    def predict_band(self, pred: np.ndarray, rows: Rows | None = None) -> tuple[np.ndarray, np.ndarray]:
        if rows is None or not self.band_by_evidence_:
            return super().predict_band(pred)
        level, new = evidence_level(rows), self._is_new_type(rows)
        # per evidence level, the band of known and of new model types; each row takes its own
        known = np.array([self.band_by_evidence_[k] for k in EVIDENCE])
        fresh = np.array([(self.band_new_type_ or self.band_by_evidence_)[k] for k in EVIDENCE])
        lo, hi = (np.where(new, fresh[level, i], known[level, i]) for i in (0, 1))
        return pred * np.exp(lo), pred * np.exp(hi)

    # ------------------------------------------------------------------ persistence (no pickle)
    # The boosters travel as LightGBM's text models beside the state (``model_texts``, saved by
    # :class:`predictor.registry.Registry`); everything else the model learned is in ``state``.
    # Keys added later are read with defaults, so artifacts saved before them still load.

    def state(self) -> dict[str, Any]:
        """What the model learned besides its boosters, as JSON-able data."""
        return {**super().state(), **self._learned_state()}

    def _learned_state(self) -> dict[str, Any]:
        return {
            "params": self.get_params(), "features": self.features_, "vocab": self.vocab_,
            "band_by_evidence": {k: list(v) for k, v in self.band_by_evidence_.items()},
            "trust_by_evidence": dict(self.trust_by_evidence_), "size": self.size_,
            "trust_new_type": dict(self.trust_new_type_), "gate": dict(self.gate_),
            "gate_new_type": dict(self.gate_new_type_), "model_types": sorted(self.model_types_),
            "band_new_type": {k: list(v) for k, v in self.band_new_type_.items()}, "categories": self.categories_,
            # JSON has no infinity: None means the base model's ratio alone
            "blend_k": self.blend_k_ if np.isfinite(self.blend_k_) else None,
            "blend_k_new_type": self.blend_k_new_type_ if np.isfinite(self.blend_k_new_type_) else None,
            "base_features": self.base_features_, "hardware_specs": self.hardware_specs_,
            "base_ratio_span": list(self.base_ratio_span_) if self.base_ratio_span_ is not None else None,
            "roofline": self.roofline_.state() if self.roofline_ is not None else None,
        }

    def model_texts(self) -> dict[str, str]:
        """LightGBM text models by name (``main``; ``base`` and the selectors when there are some)."""
        if self.booster_ is None:
            raise RuntimeError("model is not fitted")
        return {name: str(b.model_to_string()) for name, b in self._boosters().items() if b is not None}

    @classmethod
    def from_artifact(cls, state: dict[str, Any], texts: dict[str, str]) -> LightGBMThroughput:
        params = {**state["params"], "feature_groups": tuple(state["params"]["feature_groups"])}
        return cls(**params).load_state(state)._put_back(state, texts)

    def _put_back(self, state: dict[str, Any], texts: dict[str, str]) -> LightGBMThroughput:
        """This model (constructed with the state's parameters) with its learned state and boosters."""
        self.features_ = list(state["features"])
        self.vocab_ = {c: dict(v) for c, v in state["vocab"].items()}
        self.band_by_evidence_ = {k: (float(v[0]), float(v[1])) for k, v in state["band_by_evidence"].items()}
        self.trust_by_evidence_ = {k: float(v) for k, v in state.get("trust_by_evidence", {}).items()}
        self.blend_k_, self.blend_k_new_type_ = (float(state[k]) if state.get(k) is not None else float("inf")
                                                 for k in ("blend_k", "blend_k_new_type"))
        self.trust_new_type_ = {k: float(v) for k, v in state.get("trust_new_type", {}).items()}
        # Artifacts from before the gate served the model everywhere.
        self.gate_ = {k: bool(v) for k, v in state.get("gate", dict.fromkeys(EVIDENCE, True)).items()}
        self.gate_new_type_ = {k: bool(v) for k, v in state.get("gate_new_type", dict.fromkeys(EVIDENCE, True)).items()}
        self.model_types_ = set(state.get("model_types", self.vocab_.get("model_type", {})))
        self.band_new_type_ = {k: (float(v[0]), float(v[1])) for k, v in state.get("band_new_type", {}).items()}
        self.size_ = dict(state.get("size", {})) or size_for(SMALL_ROWS, self._given_size())
        self.categories_ = dict(state.get("categories", CATEGORY_SETTINGS))
        self.base_features_ = list(state.get("base_features", []))
        self.hardware_specs_ = {h: dict(v) for h, v in state.get("hardware_specs", {}).items()}
        span = state.get("base_ratio_span")  # artifacts from before it: unbounded
        self.base_ratio_span_ = (float(span[0]), float(span[1])) if span is not None else None
        boosters = {name: lgb.Booster(model_str=text) for name, text in texts.items()}
        self.booster_, self.base_ = boosters["main"], boosters.get("base")
        self.selectors_ = {name: b for name, b in boosters.items() if name.startswith(PREFIX)}
        roofline = state.get("roofline")
        self.roofline_ = LearnedRoofline.from_state(roofline) if roofline else None
        return self
