"""The one function that turns (submission, feature snapshot, candidates) into model rows.

Serving (the predictor agent) and training (``leap train``, backtests) both call
:func:`build_rows`; nothing else builds a model row. Targets and predictions are
**per-accelerator** throughput (samples/s per accelerator); multiply by ``num_accelerators``.

Columns, by group (the drivers report ablates the groups):

- ``config``: the job's training configuration;
- ``hardware``: the candidate's identity and catalogue specs;
- ``prior``: the job's own measured throughput, on the candidate and on other hardware;
- ``lookup``: model-type and family medians per hardware (the lookup table's knowledge).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from core.hardware import SPEC_FEATURES, Catalogue, HardwareType
from features.snapshot import FeatureSnapshot, LookupStat, PriorStat
from streams.events import PRECISIONS, Submission

#: Fraction of peak FLOP/s a typical training job reaches; only scales the cold-start estimate.
ROOFLINE_MFU = 0.35
NAN = float("nan")

CATEGORICAL: tuple[str, ...] = ("hardware", "vendor", "model_type", "family", "framework", "prior_hw")

GROUPS: dict[str, tuple[str, ...]] = {
    "config": (
        "log_params", "log_batch", "log_seq", "log_accelerators", "data_parallel", "tensor_parallel",
        "pipeline_parallel", "precision_bits", "log_flops_per_sample", "model_type", "family", "framework",
    ),
    "hardware": (
        "hardware", "vendor", *SPEC_FEATURES, "peak_fp32_tflops", "scale_out_gbps", "node_size", "fp8",
        "log_roofline", "log_peak_at_precision",
        "log_step_compute", "log_step_memory", "log_step_comm", "log_step_estimate", "log_roofline_step",
        "spec_ratio_peak", "spec_ratio_bw",
    ),
    "prior": (
        "prior_same_log", "prior_same_last_log", "prior_same_n", "prior_same_age_h",
        "prior_other_log", "prior_other_n", "prior_other_age_h", "prior_hw", "prior_any_n",
        "transfer_log", "attempts", "failed", "preempted",
    ),
    "lookup": (
        "lookup_model_log", "lookup_model_n", "lookup_family_log", "lookup_family_n",
        "lookup_model_prior_hw_log",
    ),
}
COLUMNS: tuple[str, ...] = tuple(c for cols in GROUPS.values() for c in cols)
#: Columns that combine the configuration with the candidate's specs: a public-spec roofline of
#: one training step per accelerator. Computed for a whole batch in :func:`to_columns` (and again
#: by a model that swaps in another hardware type's specs), never per row.
ROOFLINE_COLUMNS: tuple[str, ...] = (
    "log_peak_at_precision", "log_step_compute", "log_step_memory", "log_step_comm", "log_step_estimate",
    "log_roofline_step",
)

_PRECISION_BITS = {"fp32": 32.0, "tf32": 19.0, "bf16": 16.0, "fp16": 16.0, "fp8": 8.0}
assert set(_PRECISION_BITS) == set(PRECISIONS)

Rows = dict[str, np.ndarray]


def _log(x: float | None) -> float:
    return math.log(x) if x is not None and x > 0 else NAN


def _spec(hw: HardwareType | None, name: str) -> float:
    return float(getattr(hw, name)) if hw is not None else NAN


def _most_informative(prior: dict[str, PriorStat], exclude: str) -> tuple[str, PriorStat] | None:
    """The job's other hardware with the most observations (newest on ties)."""
    best: tuple[str, PriorStat] | None = None
    for hw, stat in prior.items():
        if hw == exclude:
            continue
        if best is None or (stat.n, stat.last_time, hw) > (best[1].n, best[1].last_time, best[0]):
            best = (hw, stat)
    return best


def _lookup_log(table: dict[str, LookupStat], hw: str) -> float:
    stat = table.get(hw)
    return _log(stat.median) if stat is not None else NAN


def roofline_log(peak_tflops: np.ndarray | np.float64, log_flops_per_sample: np.ndarray | np.float64) -> np.ndarray:
    """Log samples/s per accelerator at :data:`ROOFLINE_MFU` of peak: the cold-start estimate."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(np.log(peak_tflops * 1e12 * ROOFLINE_MFU) - log_flops_per_sample)


def roofline_columns(rows: Rows) -> Rows:
    """A roofline of one training step per accelerator from the configuration and public specs.

    Seconds per step: compute ``6 x params x seq`` FLOPs per sample at the peak for the job's
    precision (the fp32/TF32 rate for fp32 and tf32 jobs, twice the bf16 rate for fp8 jobs on
    parts with FP8 math); memory: ~16 bytes of weight, gradient and optimizer traffic per
    locally held parameter; communication: a ring all-reduce of 16-bit gradients when
    data-parallel, over the scale-up link within one domain and the scale-out network beyond.
    Trees read these as the regime (compute-, memory- or communication-bound) a job is in on
    each hardware type, which decides how its speed moves between types. NaN where a spec is
    unknown.
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        params, batch, seq, n = (np.exp(rows[c]) for c in ("log_params", "log_batch", "log_seq", "log_accelerators"))
        dp, tp, pp = rows["data_parallel"], rows["tensor_parallel"], rows["pipeline_parallel"]
        bits = rows["precision_bits"]
        peak = np.where(bits >= 19.0, rows["peak_fp32_tflops"], rows["peak_tflops"])
        peak = np.where((bits == 8.0) & (rows["fp8"] == 1.0), 2.0 * peak, peak) * 1e12
        local_params = params / (tp * pp)
        compute = 6.0 * params * seq * (batch / n) / peak
        memory = 16.0 * local_params / (rows["memory_bw_gbps"] * 1e9)
        # The scale-up link is quoted for both directions; the scale-out network for one.
        link = np.where(n <= rows["node_size"], rows["interconnect_gbps"] * 0.5, rows["scale_out_gbps"]) * 1e9
        comm = np.where(dp > 1, 2.0 * (dp - 1.0) / dp * 2.0 * local_params / link, 0.0)
        step = compute + memory + comm
        return {
            "log_peak_at_precision": np.log(peak / 1e12),
            "log_step_compute": np.log(compute),
            "log_step_memory": np.log(memory),
            "log_step_comm": np.where(dp > 1, np.log(comm), np.nan),
            "log_step_estimate": np.log(step),
            "log_roofline_step": np.log(batch / n) - np.log(step),
        }


def flops_per_sample(sub: Submission) -> float:
    """Training FLOPs per sample, ~6 x parameters x tokens (input size for non-token models)."""
    return 6.0 * sub.params * sub.seq_len


def build_rows(
    sub: Submission,
    snap: FeatureSnapshot,
    candidates: Sequence[str],
    catalogue: Catalogue,
    now: float | None = None,
) -> Rows:
    """Model rows for one submission, one per candidate, as columns (see :func:`row_dicts`)."""
    return to_columns(row_dicts(sub, snap, candidates, catalogue, now))


def to_columns(rows: Sequence[dict[str, Any]]) -> Rows:
    """Row dicts to columns: object arrays for :data:`CATEGORICAL`, float64 otherwise, plus
    :data:`ROOFLINE_COLUMNS` computed for the whole batch at once."""
    cols = {
        c: np.array([r[c] for r in rows], dtype=object if c in CATEGORICAL else np.float64)
        for c in COLUMNS if c not in ROOFLINE_COLUMNS
    }
    cols.update(roofline_columns(cols))
    return {c: cols[c] for c in COLUMNS}


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
    One dict per candidate with every column of :data:`COLUMNS` except :data:`ROOFLINE_COLUMNS`,
    which :func:`to_columns` adds.
    """
    now = sub.event_time if now is None else now
    base: dict[str, Any] = {
        "log_params": math.log(sub.params),
        "log_batch": math.log(sub.global_batch_size),
        "log_seq": math.log(sub.seq_len),
        "log_accelerators": math.log(sub.num_accelerators),
        "data_parallel": float(sub.data_parallel),
        "tensor_parallel": float(sub.tensor_parallel),
        "pipeline_parallel": float(sub.pipeline_parallel),
        "precision_bits": _PRECISION_BITS[sub.precision],
        "log_flops_per_sample": math.log(flops_per_sample(sub)),
        "model_type": sub.model_type,
        "family": sub.family,
        "framework": sub.framework,
        "prior_any_n": float(sum(p.n for p in snap.prior.values())),
        "attempts": float(snap.starts),
        "failed": float(snap.failed),
        "preempted": float(snap.preempted),
    }
    out: list[dict[str, Any]] = []
    for name in candidates:
        hw_type = catalogue.resolve(name)
        hw = hw_type.name if hw_type is not None else name
        row = dict(base)
        row["hardware"] = hw
        row["vendor"] = hw_type.vendor if hw_type is not None else "unknown"
        for spec in SPEC_FEATURES:
            row[spec] = _spec(hw_type, spec)
        row["peak_fp32_tflops"] = _spec(hw_type, "peak_fp32_tflops") or NAN  # 0: not in the catalogue
        row["scale_out_gbps"] = _spec(hw_type, "scale_out_gbps")
        row["node_size"] = _spec(hw_type, "node_size")
        row["fp8"] = _spec(hw_type, "fp8")
        peak = _spec(hw_type, "peak_tflops")
        row["log_roofline"] = float(roofline_log(np.float64(peak), np.float64(base["log_flops_per_sample"])))

        same = snap.prior.get(hw)
        row["prior_same_log"] = _log(same.robust) if same else NAN
        row["prior_same_last_log"] = _log(same.last) if same else NAN
        row["prior_same_n"] = float(same.n) if same else 0.0
        row["prior_same_age_h"] = (now - same.last_time) / 3600.0 if same else NAN

        other = _most_informative(snap.prior, hw)
        lookup_model_log = _lookup_log(snap.lookup_model, hw)
        lookup_family_log = _lookup_log(snap.lookup_family, hw)
        if other is not None:
            other_hw, other_stat = other
            other_type = catalogue.resolve(other_hw)
            row["prior_other_log"] = _log(other_stat.robust)
            row["prior_other_n"] = float(other_stat.n)
            row["prior_other_age_h"] = (now - other_stat.last_time) / 3600.0
            row["prior_hw"] = other_hw
            row["spec_ratio_peak"] = _log(peak / _spec(other_type, "peak_tflops"))
            row["spec_ratio_bw"] = _log(_spec(hw_type, "memory_bw_gbps") / _spec(other_type, "memory_bw_gbps"))
            row["lookup_model_prior_hw_log"] = _lookup_log(snap.lookup_model, other_hw)
            # Transfer: the job's speed elsewhere times how much faster its model type (else
            # family, else raw peak FLOP/s) runs here than there.
            ratio = lookup_model_log - row["lookup_model_prior_hw_log"]
            if math.isnan(ratio):
                ratio = lookup_family_log - _lookup_log(snap.lookup_family, other_hw)
            if math.isnan(ratio):
                ratio = row["spec_ratio_peak"]
            row["transfer_log"] = row["prior_other_log"] + ratio
        else:
            for c in ("prior_other_log", "prior_other_age_h", "spec_ratio_peak", "spec_ratio_bw",
                      "lookup_model_prior_hw_log", "transfer_log"):
                row[c] = NAN
            row["prior_other_n"] = 0.0
            row["prior_hw"] = "none"
        if same is not None:
            row["transfer_log"] = row["prior_same_log"]

        row["lookup_model_log"] = lookup_model_log
        row["lookup_model_n"] = float(snap.lookup_model[hw].n) if hw in snap.lookup_model else 0.0
        row["lookup_family_log"] = lookup_family_log
        row["lookup_family_n"] = float(snap.lookup_family[hw].n) if hw in snap.lookup_family else 0.0
        out.append(row)
    return out


def concat_rows(parts: Sequence[Rows]) -> Rows:
    """Stack the rows of many submissions into one batch."""
    if not parts:
        return to_columns([])
    return {c: np.concatenate([p[c] for p in parts]) for c in COLUMNS}
