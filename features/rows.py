"""The one row builder: (submissions, feature snapshots, candidates) to model rows, as columns.

Serving (the predictor, a batch at a time), training (``leap train``, backtests, a batch of
examples at a time) and the fleet simulator (one submission at a time) all call
:func:`build_batch_rows` (:func:`build_rows` is its one-submission form); nothing else builds a
model row. Targets and predictions are **per-accelerator** throughput (samples/s per
accelerator); multiply by ``num_accelerators``. A model that re-evaluates rows on another
hardware type (the base model, on the job's prior hardware) swaps the hardware in with
:func:`with_hardware`, which derives the columns that depend on it by the same step as the
builder.

The rows are built column by column: a submission's configuration and a hardware type's specs
are computed once where they are shared, the columns are filled with their values for a job
without history, and Python visits only what a job's snapshot actually holds. A submission's
rows do not depend on the other submissions of its batch (``tests/test_batch_rows.py``).

Columns, by group (the drivers report ablates the groups):

- ``config``: the job's training configuration;
- ``hardware``: the candidate's identity and catalogue specs (:data:`HARDWARE_COLUMNS`), the
  job's roofline on it (:data:`DERIVED_COLUMNS`, :mod:`features.roofline`) and its specs
  relative to the job's prior hardware (:data:`PAIR_COLUMNS`);
- ``prior``: the job's own measured throughput, on the candidate and on other hardware;
- ``lookup``: model-type and family medians per hardware (the lookup table's knowledge);
- ``paired``: how much faster other jobs that ran on both the candidate and the job's prior
  hardware ran on the candidate, near this configuration, per level (model type, family, all;
  :mod:`features.pairs`), and the job's priors carried across by the most specific of them,
  combined (with their total weight and spread).

Every column is float64 but :data:`CATEGORICAL`, which are object arrays of strings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from features.completion import complete
from features.pairs import LEVELS, PRECISION_BITS, carried, informative_priors
from features.roofline import ROOFLINE_COLUMNS, roofline_columns, roofline_log
from features.snapshot import FeatureSnapshot, LookupStat, PriorStat
from leap.core.hardware import SPEC_FEATURES, Catalogue, HardwareType
from streams.events import PRECISIONS, Submission

NAN = float("nan")

CATEGORICAL: tuple[str, ...] = ("hardware", "vendor", "model_type", "family", "framework", "prior_hw")

#: What a hardware type brings on its own: its identity and catalogue specs. Everything else
#: about the candidate is derived from these and the configuration (:data:`DERIVED_COLUMNS`) or
#: compares it with the job's prior hardware (:data:`PAIR_COLUMNS`).
HARDWARE_COLUMNS: tuple[str, ...] = (
    "hardware", "vendor", *SPEC_FEATURES, "peak_fp32_tflops", "scale_out_gbps", "node_size", "fp8",
)
#: Columns that combine the configuration with the candidate's specs: the cold-start estimate and
#: the public-spec roofline of one step (:mod:`features.roofline`). Computed for a whole batch by
#: :func:`build_batch_rows` and :func:`with_hardware`, never per row.
DERIVED_COLUMNS: tuple[str, ...] = ("log_roofline", *ROOFLINE_COLUMNS)
#: The candidate's specs relative to the job's most-observed other hardware.
PAIR_COLUMNS: tuple[str, ...] = ("spec_ratio_peak", "spec_ratio_bw")

GROUPS: dict[str, tuple[str, ...]] = {
    "config": (
        "log_params", "log_batch", "log_seq", "log_accelerators", "data_parallel", "tensor_parallel",
        "pipeline_parallel", "precision_bits", "log_flops_per_sample", "model_type", "family", "framework",
    ),
    "hardware": (*HARDWARE_COLUMNS, *DERIVED_COLUMNS, *PAIR_COLUMNS),
    "prior": (
        "prior_same_log", "prior_same_last_log", "prior_same_n", "prior_same_age_h",
        "prior_other_log", "prior_other_n", "prior_other_age_h", "prior_hw", "prior_any_n",
        "transfer_log", "attempts", "failed", "preempted",
    ),
    "lookup": (
        "lookup_model_log", "lookup_model_n", "lookup_family_log", "lookup_family_n",
        "lookup_model_prior_hw_log",
    ),
    "paired": (
        "paired_model_log", "paired_model_weight", "paired_model_n", "paired_family_log", "paired_family_weight",
        "paired_all_log", "paired_all_weight", "transfer_paired_log", "transfer_paired_weight",
        "transfer_paired_spread",
    ),
}
COLUMNS: tuple[str, ...] = tuple(c for cols in GROUPS.values() for c in cols)

assert set(PRECISION_BITS) == set(PRECISIONS)

Rows = dict[str, np.ndarray]


def _log(x: float | None) -> float:
    return math.log(x) if x is not None and x > 0 else NAN


def _spec(hw: HardwareType | None, name: str) -> float:
    return float(getattr(hw, name)) if hw is not None else NAN


def flops_per_sample(sub: Submission) -> float:
    """Training FLOPs per sample, ~6 x parameters x tokens (input size for non-token models);
    NaN when the submission does not say its parameter count or sequence length."""
    if sub.params is None or sub.seq_len is None:
        return NAN
    return 6.0 * sub.params * sub.seq_len


def _number(value: float | None) -> float:
    return NAN if value is None else float(value)


#: Category of a configuration field the submission leaves out (unknown is a value, not a guess).
UNKNOWN = "unknown"


# ---------------------------------------------------------------------- columns of a whole batch


def _derive(rows: Rows) -> Rows:
    """:data:`DERIVED_COLUMNS` from the configuration and hardware columns of a batch."""
    return {
        "log_roofline": roofline_log(rows["peak_tflops"], rows["log_flops_per_sample"]),
        **roofline_columns(rows),
    }


def _array(col: str, values: Any) -> np.ndarray:
    """One column's values as its array: object for :data:`CATEGORICAL`, float64 otherwise."""
    return np.array(values, dtype=object if col in CATEGORICAL else np.float64)


def empty_rows() -> Rows:
    """Rows of no candidate: every column, empty, with its dtype."""
    cols = {c: _array(c, []) for c in COLUMNS if c not in DERIVED_COLUMNS}
    cols.update(_derive(cols))
    return {c: cols[c] for c in COLUMNS}


def concat_rows(parts: Sequence[Rows]) -> Rows:
    """Stack the rows of many batches into one."""
    if not parts:
        return empty_rows()
    return {c: np.concatenate([p[c] for p in parts]) for c in COLUMNS}


def hardware_table(rows: Rows) -> dict[str, dict[str, Any]]:
    """:data:`HARDWARE_COLUMNS` of every hardware type in ``rows``, by name (first row of each).

    What a model keeps to re-evaluate rows on another hardware type with :func:`with_hardware`.
    """
    names, first = np.unique(rows["hardware"].astype(str), return_index=True)
    order = np.argsort(first, kind="stable")  # in order of appearance, as the rows list them
    return {str(names[k]): {c: rows[c][first[k]] for c in HARDWARE_COLUMNS} for k in order}


def with_hardware(rows: Rows, table: dict[str, dict[str, Any]], names: np.ndarray) -> Rows:
    """The same rows on other hardware: each row's hardware columns swapped for ``names[i]``'s.

    Puts :data:`HARDWARE_COLUMNS` from ``table`` into the rows and recomputes
    :data:`DERIVED_COLUMNS` (the cold-start estimate and the roofline), the way
    :func:`build_batch_rows` computes them. :data:`PAIR_COLUMNS` and the ``prior`` and ``lookup``
    groups come from the job's history on the rows' original hardware, which columns alone
    cannot redo: they are left as they were, so only the ``config`` and ``hardware`` columns
    (less the pair columns) of the result describe the new hardware.

    Parameters
    ----------
    rows
        Model rows.
    table
        Hardware columns by name, e.g. from :func:`hardware_table`.
    names
        Hardware for each row; every name must be in ``table``.

    Returns
    -------
    Rows
        New rows; ``rows`` is not modified.

    Raises
    ------
    KeyError
        A name not in ``table``.
    """
    # One table lookup per distinct name: a serving batch asks for few hardware types.
    distinct, inverse = np.unique(np.asarray(names).astype(str), return_inverse=True)
    out = dict(rows)
    for col in HARDWARE_COLUMNS:
        out[col] = _array(col, [table[h][col] for h in distinct])[inverse.ravel()]
    out.update(_derive(out))
    return out


# ---------------------------------------------------------------------- the builder

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


def build_rows(
    sub: Submission,
    snap: FeatureSnapshot,
    candidates: Sequence[str],
    catalogue: Catalogue,
) -> Rows:
    """Model rows for one submission, one per candidate: :func:`build_batch_rows` of one."""
    return build_batch_rows([sub], [snap], catalogue, [candidates])


def build_batch_rows(
    subs: Sequence[Submission],
    snaps: Sequence[FeatureSnapshot],
    catalogue: Catalogue,
    candidates: Sequence[Sequence[str]] | None = None,
) -> Rows:
    """Model rows of every candidate of every submission, in order, as columns.

    Parameters
    ----------
    subs
        The submissions; each one's ``event_time`` is its "now" (the ages of its priors).
    snaps
        What the online store (or the offline replay) held for each job at its submission.
    catalogue
        Hardware catalogue for specs.
    candidates
        Hardware names to build each submission's rows for, as canonical names or aliases (unknown
        names keep their spelling and get NaN specs); default: each submission's own candidates.

    Returns
    -------
    Rows
        Every column of :data:`COLUMNS`, one row per candidate, submission after submission.
    """
    wanted = [s.candidates for s in subs] if candidates is None else candidates
    counts = [len(c) for c in wanted]
    n = sum(counts)
    if n == 0:
        return empty_rows()
    cols = _shared_columns(subs, snaps, wanted, counts, catalogue)
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


def _shared_columns(subs: Sequence[Submission], snaps: Sequence[FeatureSnapshot], wanted: Sequence[Sequence[str]],
                    counts: list[int], catalogue: Catalogue) -> Rows:
    """:data:`HARDWARE_COLUMNS`, computed once per hardware type, and the configuration columns,
    once per submission, for every row."""
    distinct: dict[str, int] = {}
    index = np.fromiter((distinct.setdefault(name, len(distinct)) for names in wanted for name in names),
                        dtype=np.intp, count=sum(counts))
    specs = [_hardware_columns(name, catalogue) for name in distinct]
    cols = {col: _array(col, [h[col] for h in specs])[index] for col in HARDWARE_COLUMNS}
    configs = [_config_columns(sub, snap) for sub, snap in zip(subs, snaps, strict=True)]
    repeat = np.asarray(counts)
    for col in _CONFIG:
        cols[col] = np.repeat(_array(col, [c[col] for c in configs]), repeat)
    return cols


def _new(n: int, col: str, value: Any) -> np.ndarray:
    """A column of ``n`` rows, each ``value``."""
    if col in CATEGORICAL:
        out = np.empty(n, dtype=object)
        out[:] = value
        return out
    return np.full(n, value, dtype=np.float64)


def _config_columns(sub: Submission, snap: FeatureSnapshot) -> dict[str, Any]:
    """The columns every candidate of a submission shares: its configuration and attempt counts.

    A field the submission leaves out is the stand-in :func:`features.completion.complete` derives
    from the snapshot's configuration aggregates (the row of a complete submission is unchanged).
    """
    sub = complete(sub, snap.config_model, snap.config_family)[0]
    return {
        "log_params": _log(sub.params),
        "log_batch": math.log(sub.global_batch_size),
        "log_seq": _log(sub.seq_len),
        "log_accelerators": math.log(sub.num_accelerators),
        "data_parallel": _number(sub.data_parallel),
        "tensor_parallel": _number(sub.tensor_parallel),
        "pipeline_parallel": _number(sub.pipeline_parallel),
        "precision_bits": PRECISION_BITS[sub.precision] if sub.precision is not None else NAN,
        "log_flops_per_sample": _log(flops_per_sample(sub)),
        "model_type": sub.model_type,
        "family": sub.family if sub.family is not None else UNKNOWN,
        "framework": sub.framework if sub.framework is not None else UNKNOWN,
        "prior_any_n": float(sum(p.n for p in snap.prior.values())),
        "attempts": float(snap.starts),
        "failed": float(snap.failed),
        "preempted": float(snap.preempted),
    }


def _hardware_columns(name: str, catalogue: Catalogue) -> dict[str, Any]:
    """:data:`HARDWARE_COLUMNS` of one candidate: its canonical name, vendor and specs.

    A name the catalogue does not know keeps its spelling, with vendor ``unknown`` and NaN specs.
    """
    hw_type = catalogue.resolve(name)
    cols: dict[str, Any] = {
        "hardware": hw_type.name if hw_type is not None else name,
        "vendor": hw_type.vendor if hw_type is not None else "unknown",
    }
    for spec in SPEC_FEATURES:
        cols[spec] = _spec(hw_type, spec)
    cols["peak_fp32_tflops"] = _spec(hw_type, "peak_fp32_tflops") or NAN  # 0: not in the catalogue
    for spec in ("scale_out_gbps", "node_size", "fp8"):
        cols[spec] = _spec(hw_type, spec)
    return cols


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
    """Row ``i``'s columns of the job's most-observed other hardware: its prior, its name, the
    candidate's specs relative to it and its model-type median."""
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
    """``transfer_log``: the job's speed elsewhere times how much faster its model type runs here
    than there, else its family, else the raw peak FLOP/s (rows without another prior keep NaN)."""
    ratio = cols["lookup_model_log"] - cols["lookup_model_prior_hw_log"]
    ratio = np.where(np.isnan(ratio), cols["lookup_family_log"] - family_prior, ratio)
    ratio = np.where(np.isnan(ratio), cols["spec_ratio_peak"], ratio)
    cols["transfer_log"] = np.where(has_other, cols["prior_other_log"] + ratio, NAN)
