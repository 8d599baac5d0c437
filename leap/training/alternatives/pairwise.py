"""The pairwise LightGBM that ``leap evaluate-measurements`` scored before the served model did.

One named alternative (``pairwise_lightgbm``): the served model's pair-ratio stage
(:class:`predictor.pair_ratio.PairRatioModel`) alone, on the same model rows as every other
model, so it has no estimate for a row without a prior elsewhere. Its default parameters are the
stage's (15 leaves, 400 rounds, learning rate 0.05, one thread); ``leap alternatives --tune``
searches them (:mod:`leap.training.alternatives.tuning`). With ``reference="anchor"`` it learns
``log(y) - anchor`` instead (the served model's model-free anchor chain,
:func:`leap.training.alternatives.preprocess.anchor`, which for these rows is the prior carried by
the paired ratio where there is one), the anchor one more input.

``leap evaluate-measurements`` runs it by default.
"""

from __future__ import annotations

from typing import Any, Self

import numpy as np

from features.rows import Rows
from leap.training.alternatives.preprocess import anchor
from predictor.pair_ratio import FEATURES, LGB_ROUNDS, PairRatioModel

REFERENCES = ("prior", "anchor")


class PairwiseLightGBM(PairRatioModel):
    """:class:`predictor.pair_ratio.PairRatioModel` with a choice of what its trees correct.

    Parameters
    ----------
    num_leaves, n_estimators, learning_rate, min_data_in_leaf, seed
        As :class:`predictor.pair_ratio.PairRatioModel`.
    reference
        ``prior`` (``log(y / prior elsewhere)``) or ``anchor`` (``log(y) - anchor``).
    """

    def __init__(self, num_leaves: int = 15, n_estimators: int = LGB_ROUNDS, learning_rate: float = 0.05,
                 min_data_in_leaf: int = 5, reference: str = "prior", seed: int = 0) -> None:
        super().__init__(num_leaves, n_estimators, learning_rate, min_data_in_leaf, seed)
        self.reference = reference

    def get_params(self) -> dict[str, Any]:
        return {**super().get_params(), "reference": self.reference}

    def _features(self) -> tuple[str, ...]:
        return (*FEATURES, "anchor") if self.reference == "anchor" else FEATURES

    def _offset(self, rows: Rows) -> np.ndarray:
        """The prior elsewhere, or the anchor where there is such a prior."""
        prior = super()._offset(rows)
        if self.reference == "prior":
            return prior
        # Only rows with a prior elsewhere are this model's (others stay NaN).
        return np.where(np.isfinite(prior), anchor(rows, np.nan)[0], np.nan)

    def _matrix(self, rows: Rows) -> np.ndarray:
        x = super()._matrix(rows)
        return np.column_stack([x, self._offset(rows)]) if self.reference == "anchor" else x

    def _fit_booster(self, rows: Rows, y: np.ndarray) -> Self:
        if self.reference not in REFERENCES:
            raise ValueError(f"reference must be one of {REFERENCES}, got {self.reference!r}")
        super()._fit_booster(rows, y)
        return self
