"""The LightGBM throughput model.

Two stages.

1. A **base model** learns how fast a configuration runs on a hardware type, ignoring the job's
   own history: log per-accelerator throughput from the ``config`` and ``hardware`` groups. Its
   ratio between two hardware types is what moves a job's prior throughput across hardware:
   ``base_transfer_log = prior_other_log + base(h) - base(prior_hw)``.
2. The **main model** predicts the residual ``log(y) - anchor``, where the anchor is the best
   simple estimate the row has (own throughput on this hardware, else the transferred prior,
   else the base model, else lookup medians, else roofline). Trees learn corrections to an
   already good guess, which the drivers report compares with learning ``log(y)`` directly.

The base model's trees are linear in their leaves (``linear_tree``): within a region of
configurations, log throughput moves nearly linearly with log batch, log FLOPs and the roofline
terms, which piecewise-constant leaves approximate in steps.

A random tenth of the training rows is held out (the *calibration* rows), and both stages are
trained on the other nine tenths. On the calibration rows, per evidence level (own history on
this hardware / elsewhere only / none):

- **trust**: how much of the main model's correction to apply, ``anchor + w x correction`` with
  ``w`` in 0, 0.1, ..., 1 chosen for acc@10. The main model learns its corrections against
  anchors the base model computed on its own training rows, where the base is more accurate than
  on new jobs; where that makes the corrections overshoot, the held-out rows say so;
- **band**: split-conformal residual quantiles of the final prediction.
"""

from __future__ import annotations

from typing import Any, ClassVar

import lightgbm as lgb
import numpy as np

from core.accuracy import best_weight
from features.rows import CATEGORICAL, GROUPS, PAIR_COLUMNS, Rows, hardware_table, with_hardware
from predictor.learned_roofline import LearnedRoofline, usable_rows
from predictor.models import BAND_QUANTILES, ThroughputModel, first_finite

#: Anchor candidates in order of preference, each with the feature group it needs.
ANCHOR_CHAIN: tuple[tuple[str, str], ...] = (
    ("prior_same_log", "prior"),
    ("base_transfer_log", "prior"),
    ("base_log", "hardware"),
    ("transfer_log", "prior"),
    ("lookup_model_log", "lookup"),
    ("lookup_family_log", "lookup"),
    ("log_roofline", "hardware"),
)
#: Columns the base model reads: the configuration and the candidate's own hardware.
BASE_GROUPS = ("config", "hardware")
DERIVED = ("base_log", "base_transfer_log", "base_ratio")
#: The base model's column from :class:`predictor.learned_roofline.LearnedRoofline`.
LEARNED_ROOFLINE = "log_learned_roofline"
TARGETS = ("residual", "log", "raw")
EVIDENCE = ("same", "other", "none")


def evidence_level(rows: Rows) -> np.ndarray:
    """0: the job ran on this hardware before; 1: only elsewhere; 2: never."""
    return np.where(rows["prior_same_n"] > 0, 0, np.where(rows["prior_other_n"] > 0, 1, 2))


def _predict_distinct(booster: lgb.Booster, x: np.ndarray, num_threads: int) -> np.ndarray:
    """``booster.predict(x)``, evaluating each distinct row once.

    Every candidate of a submission asks for the same configuration on the job's prior
    hardware, so a serving batch holds each such row once per candidate.
    """
    rows = np.ascontiguousarray(x)
    # Compare rows as raw bytes: NaNs (missing values) then match each other, unlike as floats.
    keys = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    if len(first) == len(keys):
        return np.asarray(booster.predict(rows, num_threads=num_threads))
    return np.asarray(booster.predict(rows[first], num_threads=num_threads))[inverse.ravel()]


def job_effects(residual: np.ndarray, groups: np.ndarray, shrink: float = 1.0) -> np.ndarray:
    """Each row's job effect: the mean residual of its job, shrunk towards 0 for jobs seen once."""
    keys, inverse = np.unique(groups, return_inverse=True)
    sums = np.bincount(inverse, weights=residual, minlength=len(keys))
    counts = np.bincount(inverse, minlength=len(keys))
    return np.asarray((sums / (counts + shrink))[inverse])


class LightGBMThroughput(ThroughputModel):
    """Gradient-boosted trees on model rows.

    Parameters
    ----------
    num_leaves, n_estimators, learning_rate, min_child_samples
        LightGBM's own.
    target
        ``residual`` (default), ``log`` or ``raw`` (per-accelerator samples/s).
    feature_groups
        Which groups of :data:`features.rows.GROUPS` the model may use (ablations).
    num_threads
        Set once here: passing it on every predict call costs ~100 µs per call.
    base_linear
        Linear models in the base model's leaves.
    learned_roofline
        Fit a :class:`predictor.learned_roofline.LearnedRoofline` (after the jobs' speed factors are
        estimated) and give the base model its estimate as a column.
    seed
        Makes training deterministic.
    """

    kind: ClassVar[str] = "lightgbm"

    def __init__(
        self,
        num_leaves: int = 63,
        n_estimators: int = 300,
        learning_rate: float = 0.08,
        min_child_samples: int = 30,
        target: str = "residual",
        feature_groups: tuple[str, ...] = ("config", "hardware", "prior", "lookup"),
        num_threads: int = 2,
        base_linear: bool = True,
        learned_roofline: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.num_leaves = num_leaves
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.min_child_samples = min_child_samples
        self.target = target
        self.feature_groups = tuple(feature_groups)
        self.num_threads = num_threads
        self.base_linear = base_linear
        self.learned_roofline = learned_roofline
        self.seed = seed
        # Serving predicts a batch of a few hundred rows: one thread avoids OpenMP start-up and
        # contention with the rest of the worker; the ~100 µs it costs per call is per batch.
        self.predict_threads = 1
        self.booster_: lgb.Booster | None = None
        self.base_: lgb.Booster | None = None
        self.roofline_: LearnedRoofline | None = None
        self.base_features_: list[str] = []
        self.hardware_specs_: dict[str, dict[str, Any]] = {}
        self.features_: list[str] = []
        self.vocab_: dict[str, dict[str, int]] = {}
        self.band_by_evidence_: dict[str, tuple[float, float]] = {}
        self.trust_by_evidence_: dict[str, float] = {}

    def get_params(self) -> dict[str, Any]:
        return {
            "num_leaves": self.num_leaves, "n_estimators": self.n_estimators,
            "learning_rate": self.learning_rate, "min_child_samples": self.min_child_samples,
            "target": self.target, "feature_groups": list(self.feature_groups),
            "num_threads": self.num_threads, "base_linear": self.base_linear,
            "learned_roofline": self.learned_roofline, "seed": self.seed,
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
                codes = self.vocab_[col]
                values, inverse = np.unique(rows[col].astype(str), return_inverse=True)
                out[:, j] = np.array([codes.get(v, np.nan) for v in values], dtype=np.float64)[inverse]
            else:
                out[:, j] = rows[col]
        return out

    def _params(self, min_child_samples: int, leaves: int | None = None) -> dict[str, Any]:
        return {
            "objective": "regression", "num_leaves": leaves or self.num_leaves, "learning_rate": self.learning_rate,
            "min_child_samples": min_child_samples, "num_threads": self.num_threads,
            "seed": self.seed, "deterministic": True, "force_col_wise": True, "verbose": -1,
            "feature_fraction": 0.9, "bagging_fraction": 0.9, "bagging_freq": 1, "lambda_l2": 1.0,
            "max_cat_to_onehot": 8, "cat_smooth": 10.0,
        }

    def _uses_base(self) -> bool:
        return "hardware" in self.feature_groups

    def _base_matrix(self, rows: Rows) -> np.ndarray:
        """The base model's input: its columns, with the learned roofline's when it has one."""
        if self.roofline_ is not None:
            rows = {**rows, LEARNED_ROOFLINE: self.roofline_.predict(rows)}
        return self._matrix(rows, self.base_features_)

    def _with_base(self, rows: Rows) -> Rows:
        """Rows plus the base model's columns (:data:`DERIVED`)."""
        n = len(rows["hardware"])
        if self.base_ is None:
            nan = np.full(n, np.nan)
            return {**rows, "base_log": nan, "base_transfer_log": nan, "base_ratio": nan}
        base = self.base_.predict(self._base_matrix(rows), num_threads=self.predict_threads)
        # The same configuration on the job's prior hardware (a type seen in training).
        prior_hw = rows["prior_hw"]
        has_prior = np.array([h in self.hardware_specs_ for h in prior_hw])
        base_prior = np.full(n, np.nan)
        if has_prior.any():
            swapped = with_hardware({c: v[has_prior] for c, v in rows.items()}, self.hardware_specs_,
                                    prior_hw[has_prior])
            base_prior[has_prior] = _predict_distinct(self.base_, self._base_matrix(swapped), self.predict_threads)
        ratio = base - base_prior
        return {**rows, "base_log": base, "base_transfer_log": rows["prior_other_log"] + ratio, "base_ratio": ratio}

    def _to_target(self, y: np.ndarray, anchor: np.ndarray) -> np.ndarray:
        if self.target == "raw":
            return y
        return np.log(y) - anchor

    def _from_target(self, pred: np.ndarray, anchor: np.ndarray) -> np.ndarray:
        if self.target == "raw":
            return np.log(np.maximum(pred, 1e-9))
        return pred + anchor

    # ------------------------------------------------------------------ estimator

    def fit(self, rows: Rows, y: np.ndarray, groups: np.ndarray | None = None) -> LightGBMThroughput:
        """Fit both stages.

        Parameters
        ----------
        rows, y
            Model rows and measured per-accelerator throughput.
        groups
            Job key of each row. When given, the base model is refitted once on targets with
            each job's own speed factor removed, so that it learns the hardware, not the jobs.
        """
        self._check_params()
        y = np.asarray(y, dtype=np.float64)
        calibrate = np.random.default_rng(self.seed).random(len(y)) < 0.1
        self.vocab_ = {c: {v: i for i, v in enumerate(sorted(set(rows[c].tolist())))} for c in CATEGORICAL}
        fit_rows = {c: v[~calibrate] for c, v in rows.items()}
        fit_y = y[~calibrate]
        self.base_ = None
        self.roofline_ = None
        if self._uses_base():
            self._fit_base(fit_rows, fit_y, None if groups is None else np.asarray(groups)[~calibrate])
        self._fit_main(fit_rows, fit_y)
        held_rows, held_y = {c: v[calibrate] for c, v in rows.items()}, y[calibrate]
        self._calibrate_trust(held_rows, held_y)
        self._calibrate_band(held_rows, held_y)
        return self

    def _check_params(self) -> None:
        if self.target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {self.target!r}")
        unknown = set(self.feature_groups) - set(GROUPS)
        if unknown:
            raise ValueError(f"unknown feature groups {sorted(unknown)}; known: {sorted(GROUPS)}")

    def _fit_base(self, rows: Rows, y: np.ndarray, groups: np.ndarray | None) -> None:
        """Fit the base model (and the learned roofline it reads) on log throughput.

        Parameters
        ----------
        rows, y
            The training rows (calibration rows removed) and their throughput.
        groups
            Job key of each row, or None not to remove the jobs' own speed factors.
        """
        self.base_features_ = [c for g in BASE_GROUPS if g in self.feature_groups for c in GROUPS[g]
                               if c not in PAIR_COLUMNS]
        self.hardware_specs_ = hardware_table(rows)
        # Linear leaves need fewer of them: twice the leaves, as constant leaves wanted, fit
        # 60% slower and scored lower in the 30-day backtest (acc@10 0.662 against 0.666).
        leaves = self.num_leaves if self.base_linear else 2 * self.num_leaves
        params = self._params(max(50, self.min_child_samples), leaves=leaves)
        if self.base_linear:
            params.update(linear_tree=True, linear_lambda=0.1)

        def train_base(target: np.ndarray) -> lgb.Booster:
            data = lgb.Dataset(
                self._base_matrix(rows), label=target, feature_name=self.base_features_,
                categorical_feature=[c for c in self.base_features_ if c in CATEGORICAL],
            )
            return lgb.train(params, data, num_boost_round=self.n_estimators)

        target = np.log(y)
        self.base_ = train_base(target)
        if groups is not None:
            # Refit on targets with each job's own speed factor removed, so that the base
            # learns the hardware, not the jobs.
            target = target - job_effects(target - self.base_.predict(self._base_matrix(rows)), groups)
        # The roofline reads the configuration; fitting one to a handful of rows says nothing.
        if self.learned_roofline and "config" in self.feature_groups and usable_rows(rows) >= 1000:
            self.roofline_ = LearnedRoofline(seed=self.seed).fit(rows, target)
            self.base_features_.append(LEARNED_ROOFLINE)
        if groups is not None or self.roofline_ is not None:
            self.base_ = train_base(target)

    def _fit_main(self, rows: Rows, y: np.ndarray) -> None:
        """Fit the main model on its target against the anchors (after the base model)."""
        self.features_ = [c for g in self.feature_groups for c in GROUPS[g]]
        if self._uses_base():
            self.features_ += [c for c in DERIVED if "prior" in self.feature_groups or c == "base_log"]
        rows = self._with_base(rows)
        anchor = self._anchor(rows)
        usable = np.isfinite(anchor) & (y > 0)
        data = lgb.Dataset(
            self._matrix(rows)[usable], label=self._to_target(y[usable], anchor[usable]),
            feature_name=self.features_, categorical_feature=[c for c in self.features_ if c in CATEGORICAL],
        )
        self.booster_ = lgb.train(self._params(self.min_child_samples), data, num_boost_round=self.n_estimators)

    def _calibrate_trust(self, rows: Rows, y: np.ndarray) -> None:
        self.trust_by_evidence_ = {}
        anchor, correction = self._anchor_and_correction(rows)
        level = evidence_level(rows)
        for k, name in enumerate(EVIDENCE):
            sel = (level == k) & np.isfinite(anchor) & (y > 0)
            if sel.sum() < 100 or self.target != "residual":
                continue
            self.trust_by_evidence_[name] = best_weight(anchor[sel], correction[sel], y[sel])

    def _calibrate_band(self, rows: Rows, y: np.ndarray) -> None:
        residual = np.log(y) - self._predict_log(rows)
        level = evidence_level(rows)
        ok = np.isfinite(residual)
        q = BAND_QUANTILES
        overall = (float(np.quantile(residual[ok], q[0])), float(np.quantile(residual[ok], q[1]))) if ok.any() \
            else (0.0, 0.0)
        self.band_ = overall
        self.band_by_evidence_ = {}
        for k, name in enumerate(EVIDENCE):
            sel = ok & (level == k)
            self.band_by_evidence_[name] = (
                (float(np.quantile(residual[sel], q[0])), float(np.quantile(residual[sel], q[1])))
                if sel.sum() >= 30 else overall
            )

    def _anchor_and_correction(self, rows: Rows) -> tuple[np.ndarray, np.ndarray]:
        """The anchor and the main model's raw output (its correction, for the residual target)."""
        if self.booster_ is None:
            raise RuntimeError("model is not fitted")
        rows = self._with_base(rows)
        raw = np.asarray(self.booster_.predict(self._matrix(rows), num_threads=self.predict_threads))
        return self._anchor(rows), raw

    def _predict_log(self, rows: Rows) -> np.ndarray:
        anchor, raw = self._anchor_and_correction(rows)
        if self.trust_by_evidence_:
            trust = np.array([self.trust_by_evidence_.get(name, 1.0) for name in EVIDENCE])
            raw = raw * trust[evidence_level(rows)]
        out = self._from_target(raw, anchor)
        return np.where(np.isfinite(anchor), out, np.nan)

    def predict_band(self, pred: np.ndarray, rows: Rows | None = None) -> tuple[np.ndarray, np.ndarray]:
        if rows is None or not self.band_by_evidence_:
            return super().predict_band(pred)
        level = evidence_level(rows)
        lo = np.array([self.band_by_evidence_[EVIDENCE[k]][0] for k in level])
        hi = np.array([self.band_by_evidence_[EVIDENCE[k]][1] for k in level])
        return pred * np.exp(lo), pred * np.exp(hi)

    # ------------------------------------------------------------------ persistence (no pickle)

    def state(self) -> dict[str, Any]:
        return {
            **super().state(), "params": self.get_params(), "features": self.features_, "vocab": self.vocab_,
            "band_by_evidence": {k: list(v) for k, v in self.band_by_evidence_.items()},
            "trust_by_evidence": dict(self.trust_by_evidence_),
            "base_features": self.base_features_, "hardware_specs": self.hardware_specs_,
            "roofline": self.roofline_.state() if self.roofline_ is not None else None,
        }

    def model_texts(self) -> dict[str, str]:
        """LightGBM text models by name (``main``, and ``base`` when there is one)."""
        if self.booster_ is None:
            raise RuntimeError("model is not fitted")
        texts = {"main": str(self.booster_.model_to_string())}
        if self.base_ is not None:
            texts["base"] = str(self.base_.model_to_string())
        return texts

    @classmethod
    def from_artifact(cls, state: dict[str, Any], texts: dict[str, str]) -> LightGBMThroughput:
        params = dict(state["params"])
        params["feature_groups"] = tuple(params["feature_groups"])
        model = cls(**params)
        model.load_state(state)
        model.features_ = list(state["features"])
        model.vocab_ = {c: dict(v) for c, v in state["vocab"].items()}
        model.band_by_evidence_ = {k: (float(v[0]), float(v[1])) for k, v in state["band_by_evidence"].items()}
        model.trust_by_evidence_ = {k: float(v) for k, v in state.get("trust_by_evidence", {}).items()}
        model.base_features_ = list(state.get("base_features", []))
        model.hardware_specs_ = {h: dict(v) for h, v in state.get("hardware_specs", {}).items()}
        model.booster_ = lgb.Booster(model_str=texts["main"])
        model.base_ = lgb.Booster(model_str=texts["base"]) if "base" in texts else None
        roofline = state.get("roofline")
        model.roofline_ = LearnedRoofline.from_state(roofline) if roofline else None
        return model
