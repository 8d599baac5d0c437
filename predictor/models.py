"""Throughput models behind one interface, in the scikit-learn manner.

Constructors only store parameters; :meth:`ThroughputModel.fit` learns from model rows
(:func:`features.rows.build_rows`) and returns ``self``; learned state ends in ``_``.
Every model predicts **per-accelerator** samples/s and returns NaN where it has nothing to say,
so the ranking can say which fallback it used instead of guessing silently.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Self

import numpy as np

from features.rows import Rows

#: Quantiles of the uncertainty band reported with every prediction.
BAND_QUANTILES = (0.1, 0.9)

#: Which estimate a prediction serves: the one vocabulary of :meth:`ThroughputModel.predict_explained`
#: and of the rankings' ``basis.estimate``.
ESTIMATES: dict[str, str] = {
    "model": "the model's own prediction (its correction applied to its anchor)",
    "measured_here": "the job's own median throughput on this hardware",
    "newest_here": "the job's newest measurement on this hardware",
    "prior_carried": "the job's prior elsewhere carried across by a ratio (of lookup medians, of the base "
                     "model, or blended with the paired ratio)",
    "paired_ratio": "the job's priors carried across by the ratio other jobs showed between the two parts",
    "prior_unchanged": "the job's prior elsewhere, as it was measured",
    "base_model": "the base model's estimate for the configuration on this hardware (no history of the job)",
    "lookup": "the median of the model type (else family) on this hardware",
    "roofline": "the public-spec roofline estimate",
    "cold_start": "the roofline estimate stood in where the model had none",
    "peak_bound": "the part's peak FLOP/s over the configuration's FLOPs per sample, which the estimate exceeded",
    "none": "no estimate",
}
#: The estimate each model-row column is (or, for the LightGBM model's derived columns, carries).
ESTIMATE_OF_COLUMN: dict[str, str] = {
    "prior_same_log": "measured_here",
    "prior_same_last_log": "newest_here",
    "transfer_log": "prior_carried",
    "base_transfer_log": "prior_carried",
    "blended_transfer_log": "prior_carried",
    "transfer_paired_log": "paired_ratio",
    "prior_other_log": "prior_unchanged",
    "base_log": "base_model",
    "lookup_model_log": "lookup",
    "lookup_family_log": "lookup",
    "log_roofline": "roofline",
}
assert set(ESTIMATE_OF_COLUMN.values()) <= set(ESTIMATES)


def residual_band(residual: np.ndarray) -> tuple[float, float]:
    """The band's ends in log space: :data:`BAND_QUANTILES` of the finite residuals (log measured
    minus log predicted); (0, 0) when there are none."""
    finite = residual[np.isfinite(residual)]
    if not finite.size:
        return 0.0, 0.0
    return float(np.quantile(finite, BAND_QUANTILES[0])), float(np.quantile(finite, BAND_QUANTILES[1]))


class ThroughputModel(ABC):
    """Common interface of the baselines and the LightGBM model."""

    kind: ClassVar[str]

    def __init__(self) -> None:
        self.band_: tuple[float, float] | None = None

    @abstractmethod
    def _predict_log(self, rows: Rows) -> np.ndarray:
        """Log per-accelerator throughput, NaN where the model has no estimate."""

    def _predict_log_explained(self, rows: Rows) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_predict_log` and, per row, which estimate it is (:data:`ESTIMATES`), in one pass.

        Models whose prediction is not one of the rows' estimates label every row ``model``.
        """
        log = self._predict_log(rows)
        return log, np.where(np.isnan(log), "none", "model").astype(object)

    def fit(self, rows: Rows, y: np.ndarray) -> Self:
        """Learn from rows and their measured per-accelerator throughput ``y``."""
        self._fit(rows, np.asarray(y, dtype=np.float64))
        self.band_ = residual_band(np.log(y) - self._predict_log(rows))
        return self

    def _fit(self, rows: Rows, y: np.ndarray) -> None:  # noqa: B027 - optional hook
        """Model-specific learning; baselines that only read features learn nothing here."""

    def trained_hardware(self) -> frozenset[str] | None:
        """Hardware types the model learned from (the ``hardware_specs_`` a model that learns per
        type keeps), or None when it learns nothing per type (a baseline's estimate is its
        medians: no median, no estimate). A type outside the set is ranked from its catalogue
        specs alone (:data:`predictor.ranking.SPECS_ONLY`)."""
        specs = getattr(self, "hardware_specs_", None)
        return frozenset(specs) if specs else None

    def predict(self, rows: Rows) -> np.ndarray:
        """Per-accelerator throughput (samples/s); NaN where the model cannot tell."""
        return np.exp(self._predict_log(rows))

    def predict_explained(self, rows: Rows) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`predict` and which estimate each row serves.

        Returns
        -------
        pred
            The same numbers as :meth:`predict`, from the same single pass.
        estimate
            Object array of :data:`ESTIMATES` keys (``none`` where ``pred`` is NaN).
        """
        log, estimate = self._predict_log_explained(rows)
        return np.exp(log), estimate

    def predict_band(self, pred: np.ndarray, rows: Rows | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Lower and upper ends of the band around predictions from :meth:`predict` (``rows``
        lets a model widen the band where it has less evidence)."""
        lo, hi = self.band_ if self.band_ is not None else (0.0, 0.0)
        return pred * np.exp(lo), pred * np.exp(hi)

    def get_params(self) -> dict[str, Any]:
        return {}

    def state(self) -> dict[str, Any]:
        """Learned state as JSON-able data (artifacts never pickle)."""
        return {"band": list(self.band_) if self.band_ is not None else None}

    def load_state(self, state: dict[str, Any]) -> Self:
        band = state.get("band")
        self.band_ = (float(band[0]), float(band[1])) if band else None
        return self


def first_finite(*columns: np.ndarray) -> np.ndarray:
    out = np.array(columns[0], dtype=np.float64, copy=True)
    for col in columns[1:]:
        missing = np.isnan(out)
        out[missing] = col[missing]
    return out


def first_finite_source(*columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`first_finite` and, per row, the index of the column that answered (-1: none did)."""
    out = np.array(columns[0], dtype=np.float64, copy=True)
    source = np.where(np.isnan(out), -1, 0)
    for k, col in enumerate(columns[1:], start=1):
        missing = np.isnan(out)
        out[missing] = col[missing]
        source[missing & ~np.isnan(out)] = k
    return out, source


def estimates_of(names: tuple[str, ...], source: np.ndarray) -> np.ndarray:
    """The :data:`ESTIMATES` key of each row from the index of the column that answered
    (:func:`first_finite_source`; -1: ``none``)."""
    labels = np.array([ESTIMATE_OF_COLUMN[c] for c in names] + ["none"], dtype=object)
    return labels[source]  # -1 picks the last: "none"


#: Transfer columns that hold the job's own measurement on the candidate when it ran there
#: (:func:`features.rows.build_batch_rows`: its speed here beats any transfer).
HOLD_MEASURED_HERE = ("transfer_log", "transfer_paired_log")


def chain_estimates(rows: Rows, names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`first_finite` of the columns ``names`` and, per row, the estimate that answered."""
    log, source = first_finite_source(*(rows[c] for c in names))
    labels = estimates_of(names, source)
    here = np.asarray(rows.get("prior_same_n", np.zeros(len(log)))) > 0
    holds = np.array([c in HOLD_MEASURED_HERE for c in names] + [False])[source]
    return log, np.where(here & holds, "measured_here", labels).astype(object)


class FirstFinite(ThroughputModel):
    """A baseline that serves the first of its :attr:`columns` a row has."""

    columns: ClassVar[tuple[str, ...]]

    def _predict_log(self, rows: Rows) -> np.ndarray:
        return first_finite(*(rows[c] for c in self.columns))

    def _predict_log_explained(self, rows: Rows) -> tuple[np.ndarray, np.ndarray]:
        return chain_estimates(rows, self.columns)


class LookupTable(FirstFinite):
    """Median per-accelerator throughput of the model type on the hardware, else of its family.

    The medians are online features (Redis aggregates, or their offline replay), so this model
    needs no training of its own beyond its uncertainty band.
    """

    kind = "lookup"
    columns = ("lookup_model_log", "lookup_family_log")


class PriorTransfer(FirstFinite):
    """The job's own prior throughput, moved across hardware by the lookup ratio; else lookup."""

    kind = "transfer"
    columns = ("transfer_log", "lookup_model_log", "lookup_family_log")


#: Columns of :class:`PairedTransfer`, first estimate first: the model-free estimate that the
#: served model falls back to where it has not been shown better (:mod:`predictor.calibration`).
PAIRED_TRANSFER_CHAIN = ("transfer_paired_log", "transfer_log", "lookup_model_log", "lookup_family_log")


def paired_transfer_log(rows: Rows) -> np.ndarray:
    """:class:`PairedTransfer`'s log estimate of each row (NaN: none)."""
    return first_finite(*(rows[c] for c in PAIRED_TRANSFER_CHAIN))


class PairedTransfer(FirstFinite):
    """The job's own prior throughput, moved across hardware by the ratio other jobs of its model
    type (else family, else any job) showed between the two types near its configuration
    (:mod:`features.pairs`); else the plain transfer; else lookup."""

    kind = "transfer_paired"
    columns = PAIRED_TRANSFER_CHAIN


BASELINES: dict[str, type[ThroughputModel]] = {m.kind: m for m in (LookupTable, PriorTransfer, PairedTransfer)}
