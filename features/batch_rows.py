"""Model rows of a whole serving batch, built column by column.

:func:`features.rows.build_rows` makes one dict per candidate and turns the dicts into columns;
at 500 submissions of ~17 candidates that is ~600,000 dict entries per batch, most of them the
same configuration repeated per candidate, the same catalogue specs repeated per hardware type,
or a default for a job with no history. :func:`build_batch_rows` computes each thing once where
it is shared (a submission's configuration, a hardware type's specs), fills the columns with
their defaults and only visits, in Python, what a job's snapshot actually holds.

The result equals :func:`features.rows.concat_rows` of :func:`features.rows.build_rows` per
submission bit for bit (``tests/test_batch_rows.py``): every value is computed by the same
expressions (``math.log`` where the row builder takes logs; numpy only for the subtractions and
additions the row builder also does on floats, which IEEE makes identical). Training keeps the
row builder; serving and the benchmarks use this.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from core.hardware import Catalogue
from features.pairs import LEVELS, carried, informative_priors
from features.rows import (
    CATEGORICAL,
    COLUMNS,
    DERIVED_COLUMNS,
    HARDWARE_COLUMNS,
    NAN,
    Rows,
    _config_columns,
    _derive,
    _log,
    _spec,
    hardware_columns,
    to_columns,
)
from features.snapshot import FeatureSnapshot, LookupStat, PriorStat
from streams.events import Submission

#: Columns of the ``config`` group and attempt counts: one value per submission.
_CONFIG = tuple(c for c in COLUMNS if c in {
    "log_params", "log_batch", "log_seq", "log_accelerators", "data_parallel", "tensor_parallel",
    "pipeline_parallel", "precision_bits", "log_flops_per_sample", "model_type", "family", "framework",
    "prior_any_n", "attempts", "failed", "preempted"})
#: Columns that depend on the job's snapshot and the candidate, and their value without history.
_DEFAULTS: dict[str, Any] = {
    "prior_same_log": NAN, "prior_same_last_log": NAN, "prior_same_n": 0.0, "prior_same_age_h": NAN,
    "prior_other_log": NAN, "prior_other_n": 0.0, "prior_other_age_h": NAN, "prior_hw": "none",
    "spec_ratio_peak": NAN, "spec_ratio_bw": NAN, "lookup_model_prior_hw_log": NAN, "transfer_log": NAN,
    "lookup_model_log": NAN, "lookup_model_n": 0.0, "lookup_family_log": NAN, "lookup_family_n": 0.0,
    **{f"paired_{level}_log": NAN for level in LEVELS}, **{f"paired_{level}_weight": 0.0 for level in LEVELS},
    "paired_model_n": 0.0, "transfer_paired_log": NAN, "transfer_paired_weight": 0.0, "transfer_paired_spread": NAN,
}
assert set(_CONFIG) | set(_DEFAULTS) | set(HARDWARE_COLUMNS) | set(DERIVED_COLUMNS) == set(COLUMNS)


def _new(n: int, col: str, value: Any) -> np.ndarray:
    if col in CATEGORICAL:
        out = np.empty(n, dtype=object)
        out[:] = value
        return out
    return np.full(n, value, dtype=np.float64)


def build_batch_rows(subs: Sequence[Submission], snaps: Sequence[FeatureSnapshot], catalogue: Catalogue) -> Rows:
    """Rows of every candidate of every submission, in order, as :func:`features.rows.build_rows`
    would build them one submission at a time (each submission's ``event_time`` is its "now").

    Parameters
    ----------
    subs, snaps
        The batch and what the store read for each submission.
    catalogue
        Hardware specs.
    """
    counts = [len(s.candidates) for s in subs]
    n = sum(counts)
    if n == 0:
        return to_columns([])
    names = [name for s in subs for name in s.candidates]
    distinct: dict[str, int] = {}
    index = np.fromiter((distinct.setdefault(name, len(distinct)) for name in names), dtype=np.intp, count=n)
    specs = [hardware_columns(name, catalogue) for name in distinct]
    cols: dict[str, np.ndarray] = {}
    for col in HARDWARE_COLUMNS:
        cols[col] = np.array([h[col] for h in specs], dtype=object if col in CATEGORICAL else np.float64)[index]
    configs = [_config_columns(sub, snap) for sub, snap in zip(subs, snaps, strict=True)]
    repeat = np.asarray(counts)
    for col in _CONFIG:
        cols[col] = np.repeat(np.array([c[col] for c in configs], dtype=object if col in CATEGORICAL else np.float64),
                              repeat)
    cols.update({col: _new(n, col, value) for col, value in _DEFAULTS.items()})
    # the family median on each row's other hardware (only to carry the family ratio), and which
    # rows have another hardware at all
    family_prior, has_other = np.full(n, NAN), np.zeros(n, dtype=bool)
    canonical = cols["hardware"].tolist()
    same_rows: list[int] = []
    start = 0
    for sub, snap, k in zip(subs, snaps, counts, strict=True):
        hws = canonical[start:start + k]
        _fill_lookups(cols, snap.lookup_model, "lookup_model", hws, start)
        _fill_lookups(cols, snap.lookup_family, "lookup_family", hws, start)
        if snap.prior:
            same_rows += _fill_priors(cols, family_prior, has_other, snap, catalogue, hws, start, sub.event_time)
        if snap.pairs:
            _fill_pairs(cols, snap, hws, start)
        start += k
    if has_other.any():
        _transfer(cols, family_prior, has_other)
    if same_rows:
        # the job's own speed here beats any transfer
        rows = np.asarray(same_rows)
        cols["transfer_log"][rows] = cols["transfer_paired_log"][rows] = cols["prior_same_log"][rows]
    cols.update(_derive(cols))
    return {c: cols[c] for c in COLUMNS}


def _fill_lookups(cols: Rows, table: dict[str, LookupStat], name: str, hws: list[str], start: int) -> None:
    """Model-type (or family) medians and counts on each candidate that has one."""
    if not table:
        return
    logs, ns = cols[f"{name}_log"], cols[f"{name}_n"]
    for j, hw in enumerate(hws):
        stat = table.get(hw)
        if stat is not None:
            logs[start + j] = _log(stat.median)
            ns[start + j] = float(stat.n)


def _fill_priors(cols: Rows, family_prior: np.ndarray, has_other: np.ndarray, snap: FeatureSnapshot,
                 catalogue: Catalogue, hws: list[str], start: int, now: float) -> list[int]:
    """The job's history on each candidate and on its most-observed other hardware (the ``prior``
    group but ``transfer_log``, and the pair columns); returns the rows the job ran on before."""
    prior = snap.prior
    ranked = informative_priors(prior, "", 2)  # a candidate's own hardware is skipped below
    same_rows = []
    for j, hw in enumerate(hws):
        i = start + j
        same = prior.get(hw)
        if same is not None:
            same_rows.append(i)
            cols["prior_same_log"][i] = _log(same.robust)
            cols["prior_same_last_log"][i] = _log(same.last)
            cols["prior_same_n"][i] = float(same.n)
            cols["prior_same_age_h"][i] = (now - same.last_time) / 3600.0
        other = [h for h in ranked if h != hw]
        if other:
            has_other[i] = True
            family = snap.lookup_family.get(other[0])
            family_prior[i] = _log(family.median) if family is not None else NAN
            _fill_other(cols, i, other[0], prior[other[0]], snap, catalogue, now)
    return same_rows


def _fill_other(cols: Rows, i: int, other_hw: str, stat: PriorStat, snap: FeatureSnapshot, catalogue: Catalogue,
                now: float) -> None:
    """Row ``i``'s columns of the job's most-observed other hardware (as ``features.rows._other_columns``)."""
    other_type = catalogue.resolve(other_hw)
    cols["prior_other_log"][i] = _log(stat.robust)
    cols["prior_other_n"][i] = float(stat.n)
    cols["prior_other_age_h"][i] = (now - stat.last_time) / 3600.0
    cols["prior_hw"][i] = other_hw
    cols["spec_ratio_peak"][i] = _log(float(cols["peak_tflops"][i]) / _spec(other_type, "peak_tflops"))
    cols["spec_ratio_bw"][i] = _log(float(cols["memory_bw_gbps"][i]) / _spec(other_type, "memory_bw_gbps"))
    model = snap.lookup_model.get(other_hw)
    cols["lookup_model_prior_hw_log"][i] = _log(model.median) if model is not None else NAN


def _fill_pairs(cols: Rows, snap: FeatureSnapshot, hws: list[str], start: int) -> None:
    """Paired ratios over each row's prior hardware, and the priors carried across by them."""
    pairs, prior_hw = snap.pairs, cols["prior_hw"]
    for j, hw in enumerate(hws):
        i = start + j
        for level in LEVELS:
            stat = pairs.get(level, {}).get(hw, {}).get(prior_hw[i])
            if stat is not None:
                cols[f"paired_{level}_log"][i] = stat.log_ratio
                cols[f"paired_{level}_weight"][i] = stat.weight
                if level == "model":
                    cols["paired_model_n"][i] = float(stat.n)
        carried_log, weight, spread = carried(pairs, snap.prior, hw)
        cols["transfer_paired_log"][i] = carried_log
        cols["transfer_paired_weight"][i] = weight
        cols["transfer_paired_spread"][i] = spread


def _transfer(cols: Rows, family_prior: np.ndarray, has_other: np.ndarray) -> None:
    """``transfer_log``: the prior elsewhere times the model-type ratio, else the family's, else the
    raw peak's (rows without another prior keep NaN)."""
    ratio = cols["lookup_model_log"] - cols["lookup_model_prior_hw_log"]
    ratio = np.where(np.isnan(ratio), cols["lookup_family_log"] - family_prior, ratio)
    ratio = np.where(np.isnan(ratio), cols["spec_ratio_peak"], ratio)
    cols["transfer_log"] = np.where(has_other, cols["prior_other_log"] + ratio, NAN)
