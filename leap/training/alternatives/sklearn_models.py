"""Ridge, k-nearest neighbours, random forest and an MLP, under the estimator contract.

All four read the same matrix (:class:`leap.training.alternatives.preprocess.Preprocessor`: every
column of the model rows, standardised, with missing indicators, categoricals one-hot or, for the
forest, ordinal), the anchor among the columns (the served model's anchor chain,
:func:`leap.training.alternatives.preprocess.anchor`), and learn either ``log(y) - anchor``
(``target="residual"``, the served model's target) or ``log(y)`` (``target="log"``); which one
is a setting chosen on tuning data with the others (:mod:`leap.training.alternatives.tuning`). Each
holds out a tenth of its training **jobs** (:func:`predictor.calibration.job_folds`, as the
served model draws its own), so that no job's attempts sit on both sides, to choose how much of
its correction to trust per anchor source and for a split-conformal band
(:meth:`ThroughputModel.predict_band`); with fewer than 2,000 training rows (the public tables'
folds) nothing is held out: full corrections, band from the training rows. Predictions are
never NaN.

The defaults were chosen on a tuning history, never on a reported run: ``leap fleet history
--days 14 --attempts-per-day 2000 --seed 7``, the last 3 nightly retrains with a 30-day window,
by mean acc@10 (reports use other seeds); ``leap alternatives --tune`` searches them again
(:mod:`leap.training.alternatives.tuning`). Two choices hold for all four: the per-source **trust**
(:meth:`SklearnThroughput._calibrate_trust`) lifted every learner on the tuning history, and the
**residual** target is what makes a linear model usable at all (see :class:`RidgeThroughput`).

Every training row is used (``max_rows=None``, the forest's trees draw as many rows as there
are): the fit times in the reports are what that costs.
"""

from __future__ import annotations

import warnings
from abc import abstractmethod
from typing import Any, ClassVar, Self

import numpy as np

from features.rows import Rows
from leap.core.accuracy import best_weight
from leap.training.alternatives.preprocess import Preprocessor
from predictor.calibration import job_folds
from predictor.models import ThroughputModel, residual_band

#: Share of the training jobs held out for trust and band, as the served model holds out its own.
CALIBRATION_SHARE = 0.1
TARGETS = ("residual", "log")
#: Fewer held-out rows than this (a tenth of the training rows) say too little: nothing is held
#: out, the correction is kept whole and the band comes from the training rows themselves.
MIN_CALIBRATION_ROWS = 200
#: Key of the learner fitted on every row; an anchor source needs this many rows for its own.
POOLED = -1
MIN_SOURCE_ROWS = 50
#: Held-out rows an anchor source needs before its trust is calibrated (else it is 1).
MIN_TRUST_ROWS = 30
#: What the neighbours' distance reads: the numeric configuration, the candidate's specs and
#: roofline, and the job's and its model type's throughputs (the anchor and its source are added).
KNN_COLUMNS: tuple[str, ...] = (
    "log_params", "log_batch", "log_seq", "log_accelerators", "precision_bits", "log_flops_per_sample",
    "peak_tflops", "memory_gb", "memory_bw_gbps", "interconnect_gbps", "log_roofline",
    "prior_other_log", "prior_same_log", "transfer_log", "transfer_paired_log", "paired_model_log",
    "paired_family_log", "paired_all_log", "lookup_model_log", "lookup_family_log", "spec_ratio_peak", "spec_ratio_bw",
)


def _take(rows: Rows, idx: np.ndarray) -> Rows:
    return {c: v[idx] for c, v in rows.items()}


def held_out_jobs(n: int, groups: np.ndarray | None, seed: int) -> np.ndarray:
    """A mask of about :data:`CALIBRATION_SHARE` of ``n`` rows: whole jobs when ``groups`` (job
    keys) is given, so that no job's attempts are on both sides; a random tenth of rows otherwise."""
    if groups is not None:
        return np.asarray(job_folds(np.asarray(groups), round(1 / CALIBRATION_SHARE), seed) == 0)
    return np.random.default_rng(seed).random(n) < CALIBRATION_SHARE


class SklearnThroughput(ThroughputModel):
    """A scikit-learn regressor of ``log(y) - anchor`` on the shared preprocessed matrix.

    Parameters
    ----------
    max_rows
        Fit the learner on a seeded sample of at most this many rows (None: all).
    by_source
        Also fit one learner per anchor source (see :meth:`_fit_learners`).
    trust
        Scale the correction per anchor source by a weight chosen on held-out rows
        (:meth:`_calibrate_trust`; ``residual`` target only).
    target
        ``residual`` (``log(y) - anchor``) or ``log`` (``log(y)``, the anchor one input).
    seed
        Seeds the calibration split, the sample and the learner.
    """

    kind: ClassVar[str] = "sklearn"
    #: Categorical encoding of :class:`Preprocessor` this learner wants.
    encoding: ClassVar[str] = "onehot"

    def __init__(self, max_rows: int | None = None, by_source: bool = False, trust: bool = True,
                 target: str = "residual", seed: int = 0) -> None:
        super().__init__()
        self.max_rows = max_rows
        self.by_source = by_source
        self.trust = trust
        self.target = target
        self.seed = seed
        self.preprocessor_: Preprocessor | None = None
        self.estimator_: dict[int, Any] = {}
        self.clip_: tuple[float, float] = (-np.inf, np.inf)
        self.trust_: dict[int, float] = {}

    @abstractmethod
    def _estimator(self, n_rows: int) -> Any:
        """A fresh scikit-learn regressor for ``n_rows`` training rows."""

    def _columns(self) -> tuple[str, ...] | None:
        """Row columns the preprocessor reads; None for all of them."""
        return None

    def get_params(self) -> dict[str, Any]:
        return {"max_rows": self.max_rows, "by_source": self.by_source, "trust": self.trust, "target": self.target,
                "seed": self.seed}

    def fit(self, rows: Rows, y: np.ndarray, groups: np.ndarray | None = None) -> Self:
        """Fit on rows and their per-accelerator throughput; ``groups`` (job keys) draw the held-out
        tenth by job (without them, by row)."""
        if self.target not in TARGETS:
            raise ValueError(f"{self.kind}: target must be one of {TARGETS}, got {self.target!r}")
        y = np.asarray(y, dtype=np.float64)
        n = len(y)
        if n == 0:
            raise ValueError(f"{self.kind}: no training rows")
        rng = np.random.default_rng(self.seed)
        calibrate = held_out_jobs(n, groups, self.seed) if n >= MIN_CALIBRATION_ROWS / CALIBRATION_SHARE \
            else np.zeros(n, dtype=bool)
        fit_idx = np.flatnonzero(~calibrate)
        if self.max_rows is not None and len(fit_idx) > self.max_rows:
            fit_idx = np.sort(rng.choice(fit_idx, size=self.max_rows, replace=False))
        fit_rows, log_y = _take(rows, fit_idx), np.log(y[fit_idx])
        self.preprocessor_ = Preprocessor(categorical=self.encoding, columns=self._columns()).fit(fit_rows, log_y)
        x, base, source = self.preprocessor_.transform(fit_rows)
        target = log_y - base if self.target == "residual" else log_y
        # A learner extrapolating far outside the corrections it saw (a network on an unseen
        # configuration) is clipped to their range: no correction was ever larger.
        self.clip_ = (float(target.min()), float(target.max()))
        self.estimator_ = self._fit_learners(x, target, source)
        held = np.flatnonzero(calibrate)
        trusted = self.trust and self.target == "residual" and len(held) > 0
        self.trust_ = self._calibrate_trust(_take(rows, held), y[held]) if trusted else {}
        held = held if len(held) else fit_idx
        residual = np.log(y[held]) - self._predict_log(_take(rows, held))
        self.band_ = residual_band(residual)
        return self

    def _anchor_and_correction(self, rows: Rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each row's anchor, the learners' clipped correction to it, and the anchor's source."""
        if self.preprocessor_ is None or not self.estimator_:
            raise RuntimeError(f"{self.kind}: model is not fitted")
        x, base, source = self.preprocessor_.transform(rows)
        if self.target == "log":
            base = np.zeros(len(base))  # the learners' output is the whole log throughput
        correction = np.zeros(len(base))
        for k in np.unique(source).tolist():
            at = source == k
            learner = self.estimator_.get(k, self.estimator_[POOLED])
            correction[at] = learner.predict(x[at])
        return base, np.clip(correction, *self.clip_), source

    def _predict_log(self, rows: Rows) -> np.ndarray:
        if len(rows["hardware"]) == 0:
            return np.zeros(0)
        base, correction, source = self._anchor_and_correction(rows)
        if self.trust_:
            weight = np.array([self.trust_.get(k, 1.0) for k in range(int(source.max()) + 1)])
            correction = correction * weight[source]
        return base + correction

    def _calibrate_trust(self, rows: Rows, y: np.ndarray) -> dict[int, float]:
        """How much of the correction to keep per anchor source, chosen on the held-out rows.

        The served model's trust step (:mod:`predictor.lgbm`): where a learner's corrections do
        not beat its anchor on rows it never saw, they are scaled down, up to dropping them.
        """
        base, correction, source = self._anchor_and_correction(rows)
        trust: dict[int, float] = {}
        for k in np.unique(source).tolist():
            at = source == k
            if at.sum() >= MIN_TRUST_ROWS:
                trust[int(k)] = best_weight(base[at], correction[at], y[at])
        return trust

    def _fit_learners(self, x: np.ndarray, target: np.ndarray, source: np.ndarray) -> dict[int, Any]:
        """One learner on all rows (:data:`POOLED`) and, if :attr:`by_source`, one per anchor source.

        How good the anchor already is depends on where it came from (the job's own throughput
        here is nearly exact, a transfer is not), and a linear model or a neighbour average
        applies one correction everywhere; fitted per source, each learns its own.
        """
        with warnings.catch_warnings():
            # A network stopped at max_iter is what max_iter asks for, not a fault to report.
            warnings.filterwarnings("ignore", message=".*[Mm]aximum iterations.*")
            learners = {POOLED: self._estimator(len(target)).fit(x, target)}
            if self.by_source:
                for k in np.unique(source).tolist():
                    at = source == k
                    if at.sum() >= MIN_SOURCE_ROWS and not at.all():
                        learners[int(k)] = self._estimator(int(at.sum())).fit(x[at], target[at])
        return learners


class RidgeThroughput(SklearnThroughput):
    """Ridge regression (L2-penalised least squares) of the correction to the anchor, one per
    anchor source.

    Tuning (seed 7): ``alpha`` 1 scored best of 1, 10 and 100. One pooled ridge scored far below
    its own anchor: a linear correction learned mostly on transferred priors was applied to rows
    whose anchor is the job's own throughput on the candidate, which need none; one ridge per
    anchor source (``by_source``) fixed that.

    Parameters
    ----------
    alpha
        L2 penalty on the standardised features.
    """

    kind: ClassVar[str] = "ridge"

    def __init__(self, alpha: float = 1.0, max_rows: int | None = None, by_source: bool = True, trust: bool = True,
                 target: str = "residual", seed: int = 0) -> None:
        super().__init__(max_rows, by_source, trust, target, seed)
        self.alpha = alpha

    def get_params(self) -> dict[str, Any]:
        return {**super().get_params(), "alpha": self.alpha}

    def _estimator(self, n_rows: int) -> Any:
        from sklearn.linear_model import Ridge

        return Ridge(alpha=self.alpha)


class KNNThroughput(SklearnThroughput):
    """Distance-weighted mean correction of the ``n_neighbors`` nearest training rows.

    Distances are taken over :data:`KNN_COLUMNS` only (standardised): with every column, the
    one-hot categories and counts outnumber what makes two rows alike and neighbours fit worse.

    Tuning (seed 7): :data:`KNN_COLUMNS` scored above every column and above these columns with
    the hardware, prior hardware and family one-hot; 10 neighbours above 5 and 20; per source or
    pooled made no difference.

    Parameters
    ----------
    n_neighbors
        Neighbours averaged (fewer when there are fewer training rows).
    max_rows
        Rows kept as neighbours (None: all): a query's cost grows with them.
    columns
        Row columns the distance reads.
    """

    kind: ClassVar[str] = "knn"

    def __init__(self, n_neighbors: int = 10, max_rows: int | None = None, columns: tuple[str, ...] = KNN_COLUMNS,
                 by_source: bool = True, trust: bool = True, target: str = "residual", seed: int = 0) -> None:
        super().__init__(max_rows, by_source, trust, target, seed)
        self.n_neighbors = n_neighbors
        self.columns = tuple(columns)

    def get_params(self) -> dict[str, Any]:
        return {**super().get_params(), "n_neighbors": self.n_neighbors, "columns": list(self.columns)}

    def _columns(self) -> tuple[str, ...] | None:
        return self.columns

    def _estimator(self, n_rows: int) -> Any:
        from sklearn.neighbors import KNeighborsRegressor

        return KNeighborsRegressor(n_neighbors=max(1, min(self.n_neighbors, n_rows)), weights="distance", n_jobs=2)


class ForestThroughput(SklearnThroughput):
    """A random forest of the correction, on ordinal-coded categories (trees need no one-hot).

    Tuning (seed 7): ``min_samples_leaf`` 3 with ``max_features`` 0.5 scored best of 3 or 10 and
    0.5 or 0.3 (then on 20,000-row samples per tree; now every tree draws as many rows as there
    are).

    Parameters
    ----------
    n_estimators, min_samples_leaf, max_features
        scikit-learn's own.
    max_samples
        Rows drawn (with replacement) for each tree; None: as many as there are.
    """

    kind: ClassVar[str] = "random_forest"
    encoding: ClassVar[str] = "ordinal"

    def __init__(self, n_estimators: int = 60, min_samples_leaf: int = 3, max_features: float = 0.5,
                 max_samples: int | None = None, max_rows: int | None = None, by_source: bool = False,
                 trust: bool = True, target: str = "residual", seed: int = 0) -> None:
        super().__init__(max_rows, by_source, trust, target, seed)
        self.n_estimators = n_estimators
        self.min_samples_leaf = min_samples_leaf
        self.max_features = max_features
        self.max_samples = max_samples

    def get_params(self) -> dict[str, Any]:
        return {**super().get_params(), "n_estimators": self.n_estimators, "min_samples_leaf": self.min_samples_leaf,
                "max_features": self.max_features, "max_samples": self.max_samples}

    def _estimator(self, n_rows: int) -> Any:
        from sklearn.ensemble import RandomForestRegressor

        return RandomForestRegressor(
            n_estimators=self.n_estimators, min_samples_leaf=self.min_samples_leaf, max_features=self.max_features,
            max_samples=None if self.max_samples is None else min(self.max_samples, n_rows), n_jobs=2,
            random_state=self.seed,
        )

    def _fit_learners(self, x: np.ndarray, target: np.ndarray, source: np.ndarray) -> dict[int, Any]:
        learners = super()._fit_learners(x, target, source)
        for forest in learners.values():
            # Trees fit in two threads; predicting in one: starting the thread pool costs more
            # than a serving batch of a few rows takes.
            forest.n_jobs = 1
        return learners


class MLPThroughput(SklearnThroughput):
    """A two-layer perceptron (ReLU, Adam) of the correction, stopped early on a held-out tenth.

    Tuning (seed 7), acc@10 and fit time of (128, 64) and (64, 32) at several ``alpha``: (64, 32)
    with 1e-4 was about as accurate as the best at two thirds of its fit time, so it is the
    default. It trains on every row.

    Parameters
    ----------
    hidden
        Widths of the hidden layers.
    alpha
        L2 penalty.
    max_iter
        Epochs at most (early stopping usually ends sooner).
    max_rows
        Rows trained on (None: all): each epoch's cost grows with them.
    """

    kind: ClassVar[str] = "mlp"

    def __init__(self, hidden: tuple[int, ...] = (64, 32), alpha: float = 1e-4, max_iter: int = 60,
                 max_rows: int | None = None, by_source: bool = False, trust: bool = True, target: str = "residual",
                 seed: int = 0) -> None:
        super().__init__(max_rows, by_source, trust, target, seed)
        self.hidden = tuple(hidden)
        self.alpha = alpha
        self.max_iter = max_iter

    def get_params(self) -> dict[str, Any]:
        return {**super().get_params(), "hidden": list(self.hidden), "alpha": self.alpha, "max_iter": self.max_iter}

    def _estimator(self, n_rows: int) -> Any:
        from sklearn.neural_network import MLPRegressor

        # Early stopping needs a validation split of a few rows at least; tiny tables go without.
        early = n_rows >= 100
        # Batches of 256, or the whole training part (less the validation tenth) when it is smaller.
        batch = min(256, n_rows - int(np.ceil(0.1 * n_rows)) if early else n_rows)
        return MLPRegressor(
            hidden_layer_sizes=self.hidden, alpha=self.alpha, batch_size=max(1, batch), learning_rate_init=1e-3,
            max_iter=self.max_iter, early_stopping=early, validation_fraction=0.1, n_iter_no_change=6,
            random_state=self.seed,
        )
