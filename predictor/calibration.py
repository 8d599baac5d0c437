"""What the served model learns about itself on rows it was not fitted on.

Three things are chosen on held-out rows (a random tenth of a large training set, or every row
out of fold when the set is small, :func:`job_folds`), each by the accuracy it gives there:

- **trust**: how much of the main model's correction to apply per evidence level
  (:func:`leap.core.accuracy.best_weight`);
- **gate**: per evidence level, whether the model's estimate is served at all, or the model-free
  fallback (the prior carried by paired ratios, :class:`predictor.models.PairedTransfer`): the
  model is served only where held-out rows show it better than the fallback by more than chance
  (:func:`gate_by_evidence`). A level with too few held-out rows, and a model type the
  training rows lacked unless rows of types held out whole show otherwise, get the fallback;
- **band**: split-conformal quantiles of the log residual of what is served (after the
  selectors and the gate), per evidence level.

A correction is trusted only when the held-out rows show it better than none by more than chance
(:data:`MARGIN`): on a public table's few hundred rows, picking the best of eleven weights by raw
hit counts mostly picks noise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from features.rows import Rows
from leap.core.accuracy import best_weight, clear_winner, hits
from predictor.models import BAND_QUANTILES

#: Evidence levels of a row: the job ran on this hardware before / only elsewhere / never.
EVIDENCE = ("same", "other", "none")
#: Standard errors by which a correction must beat none on held-out rows to be trusted
#: (:func:`leap.core.accuracy.clear_winner`).
MARGIN = 1.0
#: Standard errors by which the model must beat the fallback on held-out rows to be served
#: (:func:`gate_by_evidence`). Stricter than :data:`MARGIN`: a fit takes up to six gate decisions
#: (three evidence levels, known and new model types), and on a small table each opened by chance
#: serves a correction below the fallback it replaced.
GATE_MARGIN = 2.0
#: Fewest held-out rows of an evidence level that decide its trust or band; fewer keep the defaults.
MIN_ROWS = 30
#: The band a hit lands in (acc@10's): what the gate compares.
TOLERANCE = 0.10


def evidence_level(rows: Rows) -> np.ndarray:
    """0: the job ran on this hardware before; 1: only elsewhere; 2: never."""
    return np.where(rows["prior_same_n"] > 0, 0, np.where(rows["prior_other_n"] > 0, 1, 2))


def paired_transfer(rows: Rows) -> tuple[np.ndarray, np.ndarray]:
    """The job's priors carried across by paired ratios (combined), and the ratios' total weight."""
    return rows["transfer_paired_log"], rows["transfer_paired_weight"]


def blend(base_transfer: np.ndarray, paired: np.ndarray, weight: np.ndarray, k: float) -> np.ndarray:
    """``base + w / (w + k) x (paired - base)``; either one alone where the other is missing.

    The served model takes ``k = 0`` (the paired ratio wherever it has weight) or, as an ablation,
    ``inf`` (the base model's ratio); artifacts saved when ``k`` was chosen on held-out rows
    (from a grid of 0 to 10) keep theirs."""
    if not math.isfinite(k):
        share = np.zeros(len(weight))
    else:
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(weight + k > 0, weight / (weight + k), 0.0)
    both = base_transfer + share * (paired - base_transfer)
    return np.where(np.isnan(paired), base_transfer, np.where(np.isnan(base_transfer), paired, both))


def trust_by_evidence(anchor: np.ndarray, correction: np.ndarray, y: np.ndarray, level: np.ndarray
                      ) -> dict[str, float]:
    """Per evidence level with enough held-out rows, the share of the correction to apply."""
    out = {}
    for k, name in enumerate(EVIDENCE):
        sel = (level == k) & np.isfinite(anchor) & np.isfinite(correction) & (y > 0)
        if sel.sum() >= MIN_ROWS:
            out[name] = best_weight(anchor[sel], correction[sel], y[sel], margin=MARGIN)
    return out


def band_by_evidence(residual: np.ndarray, level: np.ndarray
                     ) -> tuple[tuple[float, float], dict[str, tuple[float, float]]]:
    """The overall band and one per evidence level (the overall one where a level has few rows)."""
    ok = np.isfinite(residual)
    q = BAND_QUANTILES

    def band(sel: np.ndarray) -> tuple[float, float]:
        return float(np.quantile(residual[sel], q[0])), float(np.quantile(residual[sel], q[1]))

    overall = band(ok) if ok.any() else (0.0, 0.0)
    return overall, {name: band(ok & (level == k)) if (ok & (level == k)).sum() >= MIN_ROWS else overall
                     for k, name in enumerate(EVIDENCE)}


def gate_by_evidence(served: np.ndarray, fallback: np.ndarray, y: np.ndarray, level: np.ndarray,
                     clusters: np.ndarray | None = None) -> dict[str, bool]:
    """Per evidence level, whether the model's log estimate is served (True) or the fallback's.

    The model is kept only where it beats the fallback on held-out rows by more than
    :data:`GATE_MARGIN` standard errors (:func:`leap.core.accuracy.clear_winner`, with the rows'
    ``clusters``, e.g. their model types when whole types were held out); a level with fewer than
    :data:`MIN_ROWS` rows where both have an estimate keeps the fallback, which learns nothing.
    """
    out = {}
    for k, name in enumerate(EVIDENCE):
        sel = (level == k) & np.isfinite(served) & np.isfinite(fallback) & (y > 0)
        if sel.sum() < MIN_ROWS:
            out[name] = False
            continue
        hit = np.column_stack([hits(np.exp(fallback[sel]), y[sel], TOLERANCE),
                               hits(np.exp(served[sel]), y[sel], TOLERANCE)])
        out[name] = clear_winner(hit, 0, GATE_MARGIN, None if clusters is None else clusters[sel]) == 1
    return out


def gated(served: np.ndarray, fallback: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """The model's estimate where ``keep`` holds or the fallback has none, else the fallback's."""
    return np.where(keep | np.isnan(fallback), served, fallback)


def as_new_type(rows: Rows) -> Rows:
    """Rows of a model type held out of a fit, as a type the training data lacks has them at serving.

    The rows were built from the whole history, so they carry what the type's other jobs taught:
    its medians on hardware the job never ran on, its own paired ratios. A job of a type nobody ran
    before has neither (its type's medians are its own), and calibrating new types on rows that have
    them made their band too narrow and their correction look safer than it is. Here, on rows where
    the job did not run on the candidate: no type median there, no paired ratio of the type; the
    prior is carried by the family's paired ratio (else every job's), else by the spec ratio where
    the type's lookup ratio carried it. One prior is carried, not up to
    :data:`features.pairs.MAX_PRIORS`: the rows hold the pair columns of the first one only.
    """
    out = dict(rows)
    elsewhere = rows["prior_same_n"] <= 0
    out["lookup_model_log"] = np.where(elsewhere, np.nan, rows["prior_same_log"])
    out["lookup_model_n"] = np.where(elsewhere, 0.0, rows["prior_same_n"])
    out["lookup_model_prior_hw_log"] = rows["prior_other_log"]  # its own median there
    for column, empty in (("paired_model_log", np.nan), ("paired_model_weight", 0.0), ("paired_model_n", 0.0)):
        out[column] = np.where(elsewhere, empty, rows[column])
    by_type = np.isfinite(rows["lookup_model_log"]) & np.isfinite(rows["lookup_model_prior_hw_log"])
    out["transfer_log"] = np.where(elsewhere & by_type, rows["prior_other_log"] + rows["spec_ratio_peak"],
                                   rows["transfer_log"])
    family = np.isfinite(rows["paired_family_log"])
    ratio = np.where(family, rows["paired_family_log"], rows["paired_all_log"])
    weight = np.where(family, rows["paired_family_weight"], rows["paired_all_weight"])
    out["transfer_paired_log"] = np.where(elsewhere, rows["prior_other_log"] + ratio, rows["transfer_paired_log"])
    out["transfer_paired_weight"] = np.where(elsewhere, np.where(np.isfinite(ratio), weight, 0.0),
                                             rows["transfer_paired_weight"])
    out["transfer_paired_spread"] = np.where(elsewhere, np.nan, rows["transfer_paired_spread"])
    return out


def job_folds(groups: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """A fold number per row, every row of one job in the same fold (seeded)."""
    keys, inverse = np.unique(np.asarray(groups).astype(str), return_inverse=True)
    fold_of_job = np.random.default_rng(seed).permutation(len(keys)) % folds
    return np.asarray(fold_of_job[inverse.ravel()])


def subset(rows: Rows, mask: np.ndarray) -> Rows:
    """The rows where ``mask`` holds."""
    return {c: v[mask] for c, v in rows.items()}


def restore(values: Mapping[str, float], names: tuple[str, ...] = EVIDENCE, default: float = 1.0) -> np.ndarray:
    """Per evidence level (in :data:`EVIDENCE` order) the value, ``default`` where none was chosen."""
    return np.array([values.get(name, default) for name in names])
