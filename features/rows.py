"""The one function that turns (submission, feature snapshot, candidates) into model rows.

Serving (the predictor) and training (``leap train``, backtests) both call
:func:`build_rows`; nothing else builds a model row. Targets and predictions are
**per-accelerator** throughput (samples/s per accelerator); multiply by ``num_accelerators``.
A model that re-evaluates rows on another hardware type (the base model, on the job's prior
hardware) swaps the hardware in with :func:`with_hardware`, which derives the columns that
depend on it the way :func:`to_columns` does.

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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from core.hardware import SPEC_FEATURES, Catalogue, HardwareType
from features.completion import complete
from features.pairs import LEVELS, carried, most_informative
from features.roofline import ROOFLINE_COLUMNS, roofline_columns, roofline_log
from features.snapshot import FeatureSnapshot, LookupStat, PriorStat
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
#: :func:`to_columns` and :func:`with_hardware`, never per row.
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

_PRECISION_BITS = {"fp32": 32.0, "tf32": 19.0, "bf16": 16.0, "fp16": 16.0, "fp8": 8.0}
assert set(_PRECISION_BITS) == set(PRECISIONS)

Rows = dict[str, np.ndarray]


def _log(x: float | None) -> float:
    return math.log(x) if x is not None and x > 0 else NAN


def _spec(hw: HardwareType | None, name: str) -> float:
    return float(getattr(hw, name)) if hw is not None else NAN


def _lookup_log(table: dict[str, LookupStat], hw: str) -> float:
    stat = table.get(hw)
    return _log(stat.median) if stat is not None else NAN


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


def to_columns(rows: Sequence[dict[str, Any]]) -> Rows:
    """Row dicts (from :func:`row_dicts`) to columns, with the derived columns added.

    Object arrays for :data:`CATEGORICAL`, float64 otherwise; :data:`DERIVED_COLUMNS` are
    computed for the whole batch at once, by the same step as :func:`with_hardware`'s.
    """
    cols = {
        c: np.array([r[c] for r in rows], dtype=object if c in CATEGORICAL else np.float64)
        for c in COLUMNS if c not in DERIVED_COLUMNS
    }
    cols.update(_derive(cols))
    return {c: cols[c] for c in COLUMNS}


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
    :func:`to_columns` computes them. :data:`PAIR_COLUMNS` and the ``prior`` and ``lookup``
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
        values = np.array([table[h][col] for h in distinct], dtype=object if col in CATEGORICAL else np.float64)
        out[col] = values[inverse.ravel()]
    out.update(_derive(out))
    return out


# ---------------------------------------------------------------------- one submission's rows


def build_rows(
    sub: Submission,
    snap: FeatureSnapshot,
    candidates: Sequence[str],
    catalogue: Catalogue,
    now: float | None = None,
) -> Rows:
    """Model rows for one submission, one per candidate, as columns (see :func:`row_dicts`)."""
    return to_columns(row_dicts(sub, snap, candidates, catalogue, now))


def row_dicts(
    sub: Submission,
    snap: FeatureSnapshot,
    candidates: Sequence[str],
    catalogue: Catalogue,
    now: float | None = None,
) -> list[dict[str, Any]]:
    """Model rows for one submission, one per candidate (hardware names as canonical or alias).

    Parameters
    ----------
    sub
        The submission; its ``event_time`` is "now" unless ``now`` is given.
    snap
        What the online store (or the offline replay) held for this job at submission time.
    candidates
        Hardware names to build rows for; unknown names get NaN specs.
    catalogue
        Hardware catalogue for specs.

    Returns
    -------
    One dict per candidate with every column of :data:`COLUMNS` except :data:`DERIVED_COLUMNS`,
    which :func:`to_columns` adds.
    """
    now = sub.event_time if now is None else now
    config = _config_columns(sub, snap)
    out: list[dict[str, Any]] = []
    for name in candidates:
        row = {**config, **hardware_columns(name, catalogue)}
        hw = row["hardware"]
        same = snap.prior.get(hw)
        row.update(_same_columns(same, now))
        row.update(_other_columns(snap, row, catalogue, now))
        row.update(_lookup_columns(snap, hw))
        row.update(_paired_columns(snap, hw, row["prior_hw"]))
        if same is not None:
            # the job's own speed here beats any transfer
            row["transfer_log"] = row["transfer_paired_log"] = row["prior_same_log"]
        out.append(row)
    return out


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
        "precision_bits": _PRECISION_BITS[sub.precision] if sub.precision is not None else NAN,
        "log_flops_per_sample": _log(flops_per_sample(sub)),
        "model_type": sub.model_type,
        "family": sub.family if sub.family is not None else UNKNOWN,
        "framework": sub.framework if sub.framework is not None else UNKNOWN,
        "prior_any_n": float(sum(p.n for p in snap.prior.values())),
        "attempts": float(snap.starts),
        "failed": float(snap.failed),
        "preempted": float(snap.preempted),
    }


def hardware_columns(name: str, catalogue: Catalogue) -> dict[str, Any]:
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


def _same_columns(same: PriorStat | None, now: float) -> dict[str, Any]:
    """The job's own history on the candidate."""
    return {
        "prior_same_log": _log(same.robust) if same else NAN,
        "prior_same_last_log": _log(same.last) if same else NAN,
        "prior_same_n": float(same.n) if same else 0.0,
        "prior_same_age_h": (now - same.last_time) / 3600.0 if same else NAN,
    }


def _other_columns(snap: FeatureSnapshot, row: dict[str, Any], catalogue: Catalogue, now: float) -> dict[str, Any]:
    """The job's history on its most-observed other hardware, transferred to the candidate.

    ``row`` holds the candidate's :data:`HARDWARE_COLUMNS`.
    """
    hw = row["hardware"]
    other = most_informative(snap.prior, hw)
    if other is None:
        return {
            "prior_other_log": NAN, "prior_other_n": 0.0, "prior_other_age_h": NAN, "prior_hw": "none",
            "spec_ratio_peak": NAN, "spec_ratio_bw": NAN, "lookup_model_prior_hw_log": NAN, "transfer_log": NAN,
        }
    other_hw, other_stat = other
    other_type = catalogue.resolve(other_hw)
    cols: dict[str, Any] = {
        "prior_other_log": _log(other_stat.robust),
        "prior_other_n": float(other_stat.n),
        "prior_other_age_h": (now - other_stat.last_time) / 3600.0,
        "prior_hw": other_hw,
        "spec_ratio_peak": _log(row["peak_tflops"] / _spec(other_type, "peak_tflops")),
        "spec_ratio_bw": _log(row["memory_bw_gbps"] / _spec(other_type, "memory_bw_gbps")),
        "lookup_model_prior_hw_log": _lookup_log(snap.lookup_model, other_hw),
    }
    # Transfer: the job's speed elsewhere times how much faster its model type (else family,
    # else raw peak FLOP/s) runs here than there.
    ratio = _lookup_log(snap.lookup_model, hw) - cols["lookup_model_prior_hw_log"]
    if math.isnan(ratio):
        ratio = _lookup_log(snap.lookup_family, hw) - _lookup_log(snap.lookup_family, other_hw)
    if math.isnan(ratio):
        ratio = cols["spec_ratio_peak"]
    cols["transfer_log"] = cols["prior_other_log"] + ratio
    return cols


def _lookup_columns(snap: FeatureSnapshot, hw: str) -> dict[str, Any]:
    """Model-type and family medians on the candidate."""
    return {
        "lookup_model_log": _lookup_log(snap.lookup_model, hw),
        "lookup_model_n": float(snap.lookup_model[hw].n) if hw in snap.lookup_model else 0.0,
        "lookup_family_log": _lookup_log(snap.lookup_family, hw),
        "lookup_family_n": float(snap.lookup_family[hw].n) if hw in snap.lookup_family else 0.0,
    }


def _paired_columns(snap: FeatureSnapshot, hw: str, prior_hw: str) -> dict[str, Any]:
    """Paired ratios of the candidate over the row's prior hardware per level, and the job's priors
    carried across by their most specific paired ratios, combined (:func:`features.pairs.carried`)."""
    cols: dict[str, Any] = {}
    for level in LEVELS:
        stat = snap.pairs.get(level, {}).get(hw, {}).get(prior_hw)
        cols[f"paired_{level}_log"] = stat.log_ratio if stat is not None else NAN
        cols[f"paired_{level}_weight"] = stat.weight if stat is not None else 0.0
        if level == "model":
            cols["paired_model_n"] = float(stat.n) if stat is not None else 0.0
    cols["transfer_paired_log"], cols["transfer_paired_weight"], cols["transfer_paired_spread"] = \
        carried(snap.pairs, snap.prior, hw)
    return cols


def concat_rows(parts: Sequence[Rows]) -> Rows:
    """Stack the rows of many submissions into one batch."""
    if not parts:
        return to_columns([])
    return {c: np.concatenate([p[c] for p in parts]) for c in COLUMNS}
