"""A roofline of one training step whose efficiencies are learned from measured throughput.

The public-spec roofline (:func:`features.roofline.roofline_columns`) assumes the same share of
peak for every job on every part. Real parts reach different shares (older kernels, software
maturity per vendor and workload family), and model types differ in how much of a step is
spent on matrix math, on memory traffic, on communication and on the host. Trees read those
differences from the model-type and hardware categories only piecewise, which is what limits
how well the base model carries a job's speed from one hardware type to another.

This model keeps the roofline's form and fits its constants. Seconds per step per accelerator:

.. math::

    t = \\sum_k e^{\\theta_{m,k} + \\phi_k} x_k

with terms ``x_k`` from the configuration and the candidate's public specs
(:func:`features.roofline.step_terms`, one per :data:`TERMS`),
``theta`` per model type and term, and efficiencies ``phi``: matrix math per
(hardware, family), memory per hardware, fixed per-step cost per vendor. Log throughput per
accelerator is ``log(batch / accelerators) - log(t)``. Fitted by Adam on the log error (clipped
at 0.5, so outliers weigh like a Huber loss) with a small L2 pull of every parameter towards its
mean. A model type never seen uses the median constants of its family.

The base model reads the result as one more column; alone it carries priors across hardware
about as well as the trees, and together they do better than either (docs/model.md, remove-one).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import sparse

from features.roofline import TERMS, step_terms
from features.rows import Rows
from predictor.boosting import map_values

# Columns of the terms that the per-part efficiencies scale.
_COMPUTE, _WEIGHTS, _ACTIVATIONS, _FIXED = (TERMS.index(t) for t in ("compute", "weights", "activations", "fixed"))


def _usable(terms: np.ndarray, per_acc: np.ndarray) -> np.ndarray:
    """Rows with every step-time term (known specs, configuration)."""
    return np.asarray(np.isfinite(terms).all(axis=1) & (per_acc > 0))


def usable_rows(rows: Rows) -> int:
    """How many rows the roofline can be fitted on."""
    return int(_usable(*step_terms(rows)).sum())


def _codes(values: np.ndarray, vocab: dict[str, int]) -> np.ndarray:
    """Index of each value in ``vocab``, -1 when absent (one dict lookup per distinct value)."""
    return map_values(values, vocab, -1, np.int64)


def _vocab(values: np.ndarray) -> dict[str, int]:
    return {v: i for i, v in enumerate(sorted(set(values.astype(str).tolist())))}


def _pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.char.add(np.char.add(a.astype(str), "|"), b.astype(str))


#: What a gradient step reads of the rows' cells (:func:`cell_layout`).
Grouped = tuple[tuple[np.ndarray, ...], sparse.csr_matrix, sparse.csr_matrix, np.ndarray, np.ndarray]


def cell_layout(codes: np.ndarray, x: np.ndarray) -> Grouped:
    """The cells of rows coded ``codes`` (one column per code: model type first) and the rows'
    scaled terms ``x`` (a row per row, a column per term), laid out for the gradient steps.

    Rows share their weights with every row of the same (model type, part, family, vendor): each
    step takes the exponentials once per such cell, not once per row. Rows of one cell with the
    same terms (a job's attempts on one part, jobs of one configuration) have the same step time:
    it is computed once per such distinct row, and the rows' gradient factors are summed onto it
    before the product with the terms (a history repeats configurations: fewer rows to multiply).
    The distinct rows' terms are held as a sparse design whose row ``r`` has ``x[r, k]`` in column
    ``k * cells + cell(r)``: one product with the (term, cell) weights gives every distinct row's
    step time, and one product of its transpose with a per-row factor every (term, cell)'s sum.

    Returns
    -------
    tuple
        ``((the cells' codes, one array per code), the design, its transpose, each (term, cell)'s
        (model type, term) bin, each row's distinct row)``.
    """
    keys = np.concatenate([codes.astype(np.float64), x], axis=1)
    _, first, row_distinct = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    codes, x = codes[first], x[first]
    cells, row_cell = np.unique(codes, axis=0, return_inverse=True)
    n, k = x.shape
    columns = (np.arange(k) * len(cells) + row_cell.reshape(-1, 1)).ravel()
    design = sparse.csr_matrix((x.ravel(), columns, np.arange(0, n * k + 1, k)), shape=(n, k * len(cells)))
    type_term = (cells[:, 0] * k + np.arange(k)[:, None]).ravel()
    return tuple(cells.T), design, design.T.tocsr(), type_term, row_distinct.ravel()


class LearnedRoofline:
    """Step-time roofline with learned per-model-type constants and per-part efficiencies.

    Parameters
    ----------
    steps
        Adam iterations over the whole training set (full batch).
    learning_rate
        Adam step size in log units.
    l2
        Pull of each parameter towards its mean, so that sparsely seen cells stay near typical.
    max_rows
        Fit on a random sample of at most this many rows: a few thousand constants need far
        fewer rows than a 60-day history holds, and each step costs time per row.
    seed
        Chooses the sample.
    """

    def __init__(self, steps: int = 1000, learning_rate: float = 0.05, l2: float = 1e-3,
                 max_rows: int = 200_000, seed: int = 0) -> None:
        self.steps = steps
        self.learning_rate = learning_rate
        self.l2 = l2
        self.max_rows = max_rows
        self.seed = seed
        self.scale_: np.ndarray = np.ones(len(TERMS))
        self.model_types_: dict[str, int] = {}
        self.theta_: np.ndarray = np.zeros((0, len(TERMS)))
        self.family_theta_: dict[str, np.ndarray] = {}
        self.hardware_family_: dict[str, int] = {}
        self.phi_compute_: np.ndarray = np.zeros(0)
        self.hardware_: dict[str, int] = {}
        self.phi_memory_: np.ndarray = np.zeros(0)
        self.vendors_: dict[str, int] = {}
        self.phi_fixed_: np.ndarray = np.zeros(0)
        self.phi_part_: np.ndarray = np.zeros(0)
        self.loss_: float = float("nan")

    def fit(self, rows: Rows, log_throughput: np.ndarray) -> LearnedRoofline:
        """Fit to log per-accelerator throughput (with the jobs' own speed factors removed).

        Parameters
        ----------
        rows
            Model rows (the ``config`` and ``hardware`` columns are read).
        log_throughput
            Target per row; rows with a non-finite target or term are skipped.
        """
        terms, per_acc = step_terms(rows)
        ok = self._sample(_usable(terms, per_acc) & np.isfinite(log_throughput))
        rows = {c: v[ok] for c, v in rows.items()}
        terms, per_acc, target = terms[ok], per_acc[ok], np.log(per_acc[ok]) - log_throughput[ok]
        # Scale each term to a typical value of 1 so that one step size suits every parameter.
        self.scale_ = np.nan_to_num(np.nanmedian(np.where(terms > 0, terms, np.nan), axis=0), nan=1.0)
        codes = self._encode(rows)
        params = self._initial(codes[0], target)
        total = self._descend(params, codes, terms / self.scale_, target)
        self.loss_ = float(np.mean((np.log(total) - target) ** 2))
        theta, self.phi_compute_, self.phi_memory_, self.phi_fixed_ = params
        self.theta_ = theta
        families = rows["family"].astype(str)
        self.family_theta_ = {
            fam: np.median(theta[np.unique(codes[0][families == fam])], axis=0)
            for fam in sorted(set(families.tolist()))
        }
        self._set_part_means()
        return self

    def _sample(self, ok: np.ndarray) -> np.ndarray:
        """``ok``, or a random :attr:`max_rows` of its rows when it has more."""
        if not ok.any():
            raise ValueError("no rows with finite terms and target to fit the roofline on")
        if ok.sum() <= self.max_rows:
            return ok
        keep = np.random.default_rng(self.seed).choice(np.flatnonzero(ok), self.max_rows, replace=False)
        out = np.zeros(len(ok), dtype=bool)
        out[keep] = True
        return out

    def _encode(self, rows: Rows) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Learn the vocabularies; codes of model type, (hardware, family), hardware and vendor."""
        self.model_types_ = _vocab(rows["model_type"])
        self.hardware_family_ = _vocab(_pair(rows["hardware"], rows["family"]))
        self.hardware_ = _vocab(rows["hardware"])
        self.vendors_ = _vocab(rows["vendor"])
        return (
            _codes(rows["model_type"], self.model_types_),
            _codes(_pair(rows["hardware"], rows["family"]), self.hardware_family_),
            _codes(rows["hardware"], self.hardware_),
            _codes(rows["vendor"], self.vendors_),
        )

    def _initial(self, m: np.ndarray, target: np.ndarray) -> list[np.ndarray]:
        """Starting ``[theta, phi_compute, phi_memory, phi_fixed]``: every term an equal share of
        the model type's mean step time, every efficiency 1."""
        n_types, n_terms = len(self.model_types_), len(TERMS)
        counts = np.bincount(m, minlength=n_types)
        mean_time = np.bincount(m, weights=target, minlength=n_types) / np.maximum(counts, 1)
        theta = np.repeat((mean_time - np.log(n_terms))[:, None], n_terms, axis=1)
        return [theta, np.zeros(len(self.hardware_family_)), np.zeros(len(self.hardware_)),
                np.zeros(len(self.vendors_))]

    def _descend(self, params: list[np.ndarray], codes: tuple[np.ndarray, ...], x: np.ndarray,
                 target: np.ndarray) -> np.ndarray:
        """Adam on ``params`` in place; the step time per row before the last update."""
        first = [np.zeros_like(p) for p in params]
        second = [np.zeros_like(p) for p in params]
        grouped = cell_layout(np.stack(codes, axis=1), x)
        total = np.full(grouped[1].shape[0], np.nan)
        for it in range(1, self.steps + 1):
            grads, total = self._gradients(params, grouped, target)
            for p, g, m1, m2 in zip(params, grads, first, second, strict=True):
                g += self.l2 * (p - p.mean(axis=0)) / max(len(p), 1)
                m1 *= 0.9
                m1 += 0.1 * g
                m2 *= 0.999
                m2 += 0.001 * g * g
                p -= self.learning_rate * (m1 / (1 - 0.9**it)) / (np.sqrt(m2 / (1 - 0.999**it)) + 1e-8)
        return np.asarray(total[grouped[4]])

    def _gradients(self, params: list[np.ndarray], grouped: Grouped, target: np.ndarray
                   ) -> tuple[list[np.ndarray], np.ndarray]:
        """Gradient of the clipped squared log error for each parameter, and the step time of each
        distinct row (a row's is ``times[grouped[4]]``).

        ``grouped``: the rows' cells and terms as :func:`cell_layout` lays them out. A row's
        gradient with respect to its cell's log weight of a term is the weight times the row's term
        times a factor of the row alone, so the rows are summed per cell first and every
        parameter's gradient is then a sum over cells: a few thousand instead of every row.
        """
        theta, phi_c, phi_m, phi_f = params
        (cm, chf, ch, cv), design, design_t, type_term, row_distinct = grouped
        weight = np.exp(self._log_weights(theta[cm], phi_c[chf], phi_m[ch], phi_f[cv])).T  # term x cell
        distinct_total = design @ weight.ravel()
        error = np.clip(np.log(distinct_total)[row_distinct] - target, -0.5, 0.5)
        # d loss / d log weight, over the weight x the term, summed over each distinct row's rows
        factor = np.bincount(row_distinct, error, len(distinct_total)) * (2.0 / len(target)) / distinct_total
        per_cell = weight * (design_t @ factor).reshape(weight.shape)
        grads = [
            np.bincount(type_term, per_cell.ravel(), minlength=theta.size).reshape(theta.shape),
            np.bincount(chf, per_cell[_COMPUTE], minlength=len(phi_c)),
            np.bincount(ch, per_cell[_WEIGHTS] + per_cell[_ACTIVATIONS], minlength=len(phi_m)),
            np.bincount(cv, per_cell[_FIXED], minlength=len(phi_f)),
        ]
        return grads, distinct_total

    def _set_part_means(self) -> None:
        """Each part's mean compute efficiency over the families seen on it."""
        sums, counts = np.zeros(len(self.hardware_)), np.zeros(len(self.hardware_))
        for key, i in self.hardware_family_.items():
            j = self.hardware_[key.split("|")[0]]
            sums[j] += self.phi_compute_[i]
            counts[j] += 1
        self.phi_part_ = sums / np.maximum(counts, 1)

    @staticmethod
    def _log_weights(theta: np.ndarray, phi_c: np.ndarray, phi_m: np.ndarray, phi_f: np.ndarray) -> np.ndarray:
        out = theta.copy()
        out[:, _COMPUTE] += phi_c
        out[:, _WEIGHTS] += phi_m
        out[:, _ACTIVATIONS] += phi_m
        out[:, _FIXED] += phi_f
        return out

    def predict(self, rows: Rows) -> np.ndarray:
        """Log per-accelerator throughput; NaN for unknown hardware, families or specs."""
        if not self.model_types_:
            raise RuntimeError("roofline is not fitted")
        terms, per_acc = step_terms(rows)
        m = _codes(rows["model_type"], self.model_types_)
        items = rows["family"].tolist()
        distinct = {f: i for i, f in enumerate(dict.fromkeys(items))}
        fam_theta = np.array([self.family_theta_.get(str(f), np.full(len(TERMS), np.nan)) for f in distinct])
        fam_theta = fam_theta.reshape(-1, len(TERMS))[np.array([distinct[f] for f in items], dtype=np.intp)]
        theta = np.where((m >= 0)[:, None], self.theta_[np.maximum(m, 0)] if len(self.theta_) else fam_theta, fam_theta)
        # An unseen (hardware, family) pair gets the part's mean compute efficiency.
        hf = self._hardware_family_codes(rows)
        h = _codes(rows["hardware"], self.hardware_)
        phi_c = np.where(hf >= 0, self.phi_compute_[np.maximum(hf, 0)],
                         np.where(h >= 0, self.phi_part_[np.maximum(h, 0)], np.nan))
        phi_m = np.where(h >= 0, self.phi_memory_[np.maximum(h, 0)], np.nan)
        v = _codes(rows["vendor"], self.vendors_)
        phi_f = np.where(v >= 0, self.phi_fixed_[np.maximum(v, 0)], 0.0)
        weights = np.exp(self._log_weights(theta, phi_c, phi_m, phi_f))
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray(np.log(per_acc) - np.log((weights * terms / self.scale_).sum(axis=1)))

    def _hardware_family_codes(self, rows: Rows) -> np.ndarray:
        """Codes of each row's ``hardware|family`` (as :func:`_pair` joins them), -1 when unseen;
        one join per distinct pair rather than per row."""
        items = list(zip(rows["hardware"].tolist(), rows["family"].tolist(), strict=True))
        found = {k: self.hardware_family_.get(f"{k[0]}|{k[1]}", -1) for k in set(items)}
        return np.array([found[k] for k in items], dtype=np.int64)

    # ------------------------------------------------------------------ persistence (JSON)

    def state(self) -> dict[str, Any]:
        return {
            "params": {"steps": self.steps, "learning_rate": self.learning_rate, "l2": self.l2,
                       "max_rows": self.max_rows, "seed": self.seed},
            "scale": self.scale_.tolist(), "loss": self.loss_,
            "model_types": self.model_types_, "theta": self.theta_.tolist(),
            "family_theta": {k: v.tolist() for k, v in self.family_theta_.items()},
            "hardware_family": self.hardware_family_, "phi_compute": self.phi_compute_.tolist(),
            "hardware": self.hardware_, "phi_memory": self.phi_memory_.tolist(),
            "vendors": self.vendors_, "phi_fixed": self.phi_fixed_.tolist(),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> LearnedRoofline:
        model = cls(**state["params"])
        model.scale_ = np.asarray(state["scale"], dtype=np.float64)
        model.loss_ = float(state["loss"])
        model.model_types_ = {k: int(v) for k, v in state["model_types"].items()}
        model.theta_ = np.asarray(state["theta"], dtype=np.float64).reshape(-1, len(TERMS))
        model.family_theta_ = {k: np.asarray(v, dtype=np.float64) for k, v in state["family_theta"].items()}
        model.hardware_family_ = {k: int(v) for k, v in state["hardware_family"].items()}
        model.phi_compute_ = np.asarray(state["phi_compute"], dtype=np.float64)
        model.hardware_ = {k: int(v) for k, v in state["hardware"].items()}
        model.phi_memory_ = np.asarray(state["phi_memory"], dtype=np.float64)
        model.vendors_ = {k: int(v) for k, v in state["vendors"].items()}
        model.phi_fixed_ = np.asarray(state["phi_fixed"], dtype=np.float64)
        model._set_part_means()
        return model
