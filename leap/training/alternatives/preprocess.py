"""What the scikit-learn alternatives see: one matrix from model rows, and the anchor they correct.

Model rows (:func:`features.rows.build_rows`) hold log throughputs, hardware specs, counts and
ages in their own units, many of them NaN where nothing is known, and categorical columns as
strings. Linear models, nearest neighbours and neural networks need numbers on one scale and no
gaps; trees need neither but take them without harm. :class:`Preprocessor` turns rows into that
matrix, learning its statistics from the training rows only:

- **numeric columns**: counts, ages and raw specs (names without ``log`` or ``ratio``) through
  ``log1p`` so that a job with 80 observations is not 80 times one with 1; then standardised
  with the training mean and standard deviation, missing values set to 0 (the mean) and, for
  every column with a missing value in training, a 0/1 *missing* indicator beside it, so the
  model can tell "average" from "unknown". Columns constant (or all NaN) in training are dropped;
- **categorical columns**: one-hot over the ``max_categories`` most frequent values in training,
  every other value (and one never seen) in one ``other`` column; or, for trees, one ordinal
  code per column (frequency rank, the rare tail sharing the last code);
- **the anchor** (:func:`anchor`): the best simple estimate the row has, as the served model's
  anchor chain defines it (own throughput on this hardware, else the transferred prior, else
  the lookup medians, else the roofline), standardised, and which link of the chain supplied it,
  one-hot.

The models then learn ``log(y) - anchor``: corrections to an already good guess, as the served
model does (:mod:`predictor.lgbm`). Where a row has no anchor at all, the anchor is the training
rows' median log throughput, so these models always answer (never NaN).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from features.rows import CATEGORICAL, Rows
from predictor.lgbm import ANCHOR_CHAIN, DERIVED

#: Anchor columns read from the rows, in order of preference: the served model's chain
#: (:data:`predictor.lgbm.ANCHOR_CHAIN`) with the links its own first stage derives replaced by
#: the rows' nearest equivalent, the prior carried across by paired ratios (``transfer_paired_log``).
#: A column the rows lack is skipped.
ANCHOR_COLUMNS: tuple[str, ...] = tuple(dict.fromkeys(
    ["prior_same_log", "transfer_paired_log", *(c for c, _ in ANCHOR_CHAIN if c not in DERIVED)]))
#: Categories one-hot encoded per column; the rest share one ``other`` column.
MAX_CATEGORIES = 32


def anchor(rows: Rows, fallback: float) -> tuple[np.ndarray, np.ndarray]:
    """The anchor of each row and the index of the chain link that supplied it.

    Parameters
    ----------
    rows
        Model rows; anchor columns they lack are skipped.
    fallback
        Log throughput for rows without any anchor column (their source index is the chain's
        length).

    Returns
    -------
    (anchor, source)
        Log per-accelerator throughput, and the position in :data:`ANCHOR_COLUMNS` it came from.
    """
    n = len(rows["hardware"])
    out = np.full(n, np.nan)
    source = np.full(n, len(ANCHOR_COLUMNS), dtype=np.int64)
    for k, col in enumerate(ANCHOR_COLUMNS):
        if col not in rows:
            continue
        take = np.isnan(out) & np.isfinite(np.asarray(rows[col], dtype=np.float64))
        out[take] = rows[col][take]
        source[take] = k
    out[np.isnan(out)] = fallback
    return out, source


def _is_log_scale(name: str) -> bool:
    # Log throughputs, log configuration values and log spec ratios are already on a log scale.
    return "log" in name or "ratio" in name


def _numeric(rows: Rows, name: str) -> np.ndarray:
    x = np.asarray(rows[name], dtype=np.float64)
    if _is_log_scale(name):
        return x
    # Counts, ages and specs are non-negative and heavy-tailed; the sign keeps a stray negative.
    return np.sign(x) * np.log1p(np.abs(x))


def _category_order(values: np.ndarray) -> list[str]:
    """Distinct values, most frequent first (ties by name, so the order is deterministic)."""
    names, counts = np.unique(values.astype(str), return_counts=True)
    order = sorted(range(len(names)), key=lambda i: (-counts[i], names[i]))
    return [str(names[i]) for i in order]


class Preprocessor:
    """Rows to a dense float matrix; statistics learned by :meth:`fit` on training rows only.

    Parameters
    ----------
    categorical
        ``onehot`` (linear models, neighbours, networks) or ``ordinal`` (trees).
    max_categories
        One-hot columns per categorical column (the rest share an ``other`` column); the number
        of ordinal codes for ``ordinal``.
    columns
        Columns to read; None for every column of the training rows.
    """

    def __init__(self, categorical: str = "onehot", max_categories: int = MAX_CATEGORIES,
                 columns: tuple[str, ...] | None = None) -> None:
        if categorical not in ("onehot", "ordinal"):
            raise ValueError(f"categorical must be 'onehot' or 'ordinal', got {categorical!r}")
        self.categorical = categorical
        self.max_categories = max_categories
        self.columns = columns
        self.numeric_: list[str] = []
        self.mean_: np.ndarray = np.zeros(0)
        self.scale_: np.ndarray = np.zeros(0)
        self.indicators_: list[str] = []
        self.categories_: dict[str, list[str]] = {}
        self.fallback_ = 0.0
        self.anchor_mean_ = 0.0
        self.anchor_scale_ = 1.0

    def fit(self, rows: Rows, log_y: np.ndarray) -> Preprocessor:
        """Learn the columns' statistics from training rows and their log throughput."""
        names = [c for c in (self.columns or tuple(rows)) if c in rows]
        self.numeric_, means, scales, self.indicators_ = [], [], [], []
        for name in names:
            if name in CATEGORICAL:
                continue
            x = _numeric(rows, name)
            ok = np.isfinite(x)
            if ok.sum() < 2 or np.nanstd(x[ok]) <= 1e-12:
                continue  # constant or unknown everywhere in training: nothing to learn from
            self.numeric_.append(name)
            means.append(float(np.mean(x[ok])))
            scales.append(float(np.std(x[ok])))
            if not ok.all():
                self.indicators_.append(name)
        self.mean_, self.scale_ = np.array(means), np.array(scales)
        self.categories_ = {c: _category_order(rows[c])[: self.max_categories] for c in names if c in CATEGORICAL}
        self.fallback_ = float(np.median(log_y)) if len(log_y) else 0.0
        anchored, _ = anchor(rows, self.fallback_)
        if len(anchored):
            self.anchor_mean_ = float(np.mean(anchored))
            self.anchor_scale_ = float(np.std(anchored)) or 1.0
        return self

    def transform(self, rows: Rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The feature matrix of ``rows``, their anchors (log per-accelerator throughput) and the
        anchors' sources (positions in :data:`ANCHOR_COLUMNS`, see :func:`anchor`)."""
        n = len(rows["hardware"])
        parts: list[np.ndarray] = []
        if self.numeric_:
            raw = np.column_stack([_numeric(rows, c) for c in self.numeric_])
            missing = ~np.isfinite(raw)
            parts.append(np.where(missing, 0.0, (raw - self.mean_) / self.scale_))
            if self.indicators_:
                parts.append(missing[:, [self.numeric_.index(c) for c in self.indicators_]].astype(np.float64))
        for col, cats in self.categories_.items():
            parts.append(self._encode(rows[col], cats))
        anchored, source = anchor(rows, self.fallback_)
        parts.append(((anchored - self.anchor_mean_) / self.anchor_scale_)[:, None])
        parts.append(np.eye(len(ANCHOR_COLUMNS) + 1)[source])
        return np.ascontiguousarray(np.column_stack(parts) if parts else np.zeros((n, 0))), anchored, source

    def _encode(self, values: np.ndarray, cats: list[str]) -> np.ndarray:
        """One categorical column: one-hot (last column: other) or its ordinal code."""
        code = {c: k for k, c in enumerate(cats)}
        # One dictionary lookup per distinct value: a batch holds few distinct categories.
        distinct, inverse = np.unique(values.astype(str), return_inverse=True)
        idx = np.array([code.get(v, len(cats)) for v in distinct], dtype=np.int64)[inverse.ravel()]
        if self.categorical == "ordinal":
            return idx[:, None].astype(np.float64)
        return np.eye(len(cats) + 1)[idx]

    def n_features(self) -> int:
        """Width of the matrix :meth:`transform` returns."""
        cats = sum(1 if self.categorical == "ordinal" else len(c) + 1 for c in self.categories_.values())
        return len(self.numeric_) + len(self.indicators_) + cats + 1 + len(ANCHOR_COLUMNS) + 1

    def get_params(self) -> dict[str, Any]:
        return {"categorical": self.categorical, "max_categories": self.max_categories,
                "columns": list(self.columns) if self.columns is not None else None}
