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


class ThroughputModel(ABC):
    """Common interface of the baselines and the LightGBM model."""

    kind: ClassVar[str]

    def __init__(self) -> None:
        self.band_: tuple[float, float] | None = None

    @abstractmethod
    def _predict_log(self, rows: Rows) -> np.ndarray:
        """Log per-accelerator throughput, NaN where the model has no estimate."""

    def fit(self, rows: Rows, y: np.ndarray) -> Self:
        """Learn from rows and their measured per-accelerator throughput ``y``."""
        self._fit(rows, np.asarray(y, dtype=np.float64))
        residual = np.log(y) - self._predict_log(rows)
        residual = residual[np.isfinite(residual)]
        self.band_ = (
            (float(np.quantile(residual, BAND_QUANTILES[0])), float(np.quantile(residual, BAND_QUANTILES[1])))
            if residual.size
            else (0.0, 0.0)
        )
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


class LookupTable(ThroughputModel):
    """Median per-accelerator throughput of the model type on the hardware, else of its family.

    The medians are online features (Redis aggregates, or their offline replay), so this model
    needs no training of its own beyond its uncertainty band.
    """

    kind = "lookup"

    def _predict_log(self, rows: Rows) -> np.ndarray:
        return first_finite(rows["lookup_model_log"], rows["lookup_family_log"])


class PriorTransfer(ThroughputModel):
    """The job's own prior throughput, moved across hardware by the lookup ratio; else lookup."""

    kind = "transfer"

    def _predict_log(self, rows: Rows) -> np.ndarray:
        return first_finite(rows["transfer_log"], rows["lookup_model_log"], rows["lookup_family_log"])


#: Columns of :class:`PairedTransfer`, first estimate first: the model-free estimate that the
#: served model falls back to where it has not been shown better (:mod:`predictor.calibration`).
PAIRED_TRANSFER_CHAIN = ("transfer_paired_log", "transfer_log", "lookup_model_log", "lookup_family_log")


def paired_transfer_log(rows: Rows) -> np.ndarray:
    """:class:`PairedTransfer`'s log estimate of each row (NaN: none)."""
    return first_finite(*(rows[c] for c in PAIRED_TRANSFER_CHAIN))


class PairedTransfer(ThroughputModel):
    """The job's own prior throughput, moved across hardware by the ratio other jobs of its model
    type (else family, else any job) showed between the two types near its configuration
    (:mod:`features.pairs`); else the plain transfer; else lookup."""

    kind = "transfer_paired"

    def _predict_log(self, rows: Rows) -> np.ndarray:
        return paired_transfer_log(rows)


BASELINES: dict[str, type[ThroughputModel]] = {m.kind: m for m in (LookupTable, PriorTransfer, PairedTransfer)}
