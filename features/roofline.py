"""The public-spec roofline of one training step per accelerator: the only step-time formula.

The row builder (:mod:`features.rows`) turns it into columns and a cold-start estimate; the
learned roofline (:mod:`predictor.learned_roofline`) fits constants to its terms. Both read the
formulas here, so a change to a term or to the link rule reaches both. (The fleet simulator has a
law of its own on purpose: a model that shared the simulator's form would be graded on knowing
the answer.)

Seconds per step per accelerator, from the configuration and the candidate's catalogue specs:

- **compute**: ``6 x params x seq`` FLOPs per sample at the peak for the job's precision;
- **weights**: ~16 bytes of weight, gradient and optimizer traffic per locally held parameter
  over memory bandwidth;
- **all-reduce**: a ring all-reduce of 16-bit gradients when data-parallel;
- **activations**: tokens (or input size) per accelerator over memory bandwidth;
- **tensor**: tokens per tensor-parallel rank over the link that joins the ranks;
- **host**: samples per accelerator (data loading does not speed up with the accelerator);
- **fixed**: one per step (kernel launches).

The public roofline (:func:`roofline_columns`) adds the first three with unit weights; the
learned roofline weighs all seven. Inputs are row columns (see :mod:`features.rows`); every
function works on whole batches and gives NaN where a spec is unknown.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

Columns = Mapping[str, np.ndarray]

#: Fraction of peak FLOP/s a typical training job reaches; only scales the cold-start estimate.
ROOFLINE_MFU = 0.35

#: The columns :func:`roofline_columns` returns.
ROOFLINE_COLUMNS: tuple[str, ...] = (
    "log_peak_at_precision", "log_step_compute", "log_step_memory", "log_step_comm", "log_step_estimate",
    "log_roofline_step",
)

#: The step-time terms of :func:`step_terms`, in that column order.
TERMS: tuple[str, ...] = ("compute", "weights", "activations", "allreduce", "tensor", "host", "fixed")


def roofline_log(peak_tflops: np.ndarray | np.float64, log_flops_per_sample: np.ndarray | np.float64) -> np.ndarray:
    """Log samples/s per accelerator at :data:`ROOFLINE_MFU` of peak: the cold-start estimate.

    Parameters
    ----------
    peak_tflops
        The candidate's quoted (bf16) peak, TFLOP/s.
    log_flops_per_sample
        Log training FLOPs per sample.

    Returns
    -------
    np.ndarray
        NaN where the peak is unknown.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(np.log(peak_tflops * 1e12 * ROOFLINE_MFU) - log_flops_per_sample)


def link_bandwidth(rows: Columns, span: np.ndarray) -> np.ndarray:
    """Bytes/s per accelerator of a collective whose ranks span ``span`` accelerators.

    The one link rule: a collective runs on the scale-up link when every accelerator it spans
    fits in one scale-up domain (``span <= node_size``), else on the scale-out network, which
    the slowest hop decides. The scale-up link is quoted for both directions, so a collective
    gets half of it; the scale-out network is quoted for one.

    Parameters
    ----------
    rows
        Columns ``node_size``, ``interconnect_gbps`` and ``scale_out_gbps``.
    span
        Accelerators the collective's ranks are spread over, per row.
    """
    return np.asarray(
        np.where(span <= rows["node_size"], rows["interconnect_gbps"] * 0.5, rows["scale_out_gbps"]) * 1e9
    )


def peak_at_precision(rows: Columns) -> np.ndarray:
    """FLOP/s at the job's precision: the fp32/TF32 rate for fp32 and tf32 jobs (19 bits and up),
    twice the quoted (bf16) rate for fp8 jobs on parts with FP8 math, else the quoted rate."""
    bits = rows["precision_bits"]
    peak = np.where(bits >= 19.0, rows["peak_fp32_tflops"], rows["peak_tflops"])
    return np.asarray(np.where((bits == 8.0) & (rows["fp8"] == 1.0), 2.0 * peak, peak) * 1e12)


#: Families whose FLOPs per sample are at least ``6 x params x seq``: every parameter works on every
#: token (or input element) of a sample. Mixtures of experts use a fraction of their parameters per
#: token, recommenders' are mostly embedding rows looked up, speech and ViT inputs are counted in
#: units the formula does not see: for those, measured throughputs of the simulated fleet exceed the
#: bound (up to 5x, 18x and 1.7x; recommenders by orders of magnitude), for these never.
BOUNDED_FAMILIES: tuple[str, ...] = ("dense_lm", "vision_cnn", "diffusion", "gnn")


def peak_bound_log(rows: Columns) -> np.ndarray:
    """Log of the most samples/s one accelerator can physically deliver: its fastest math (the
    quoted peak, twice that for fp8 jobs on parts with FP8 math) over the configuration's FLOPs
    per sample. NaN where either is unknown: no parameter count or sequence length, a part without
    specs, or a family whose FLOPs the parameter count does not bound (:data:`BOUNDED_FAMILIES`).
    The quoted peak, not the one at the job's precision: an fp32 job may run on math faster than
    the fp32 rate the catalogue lists (TF32, mixed precision), never faster than the part's fastest."""
    with np.errstate(divide="ignore", invalid="ignore"):
        fp8 = (rows["precision_bits"] == 8.0) & (rows["fp8"] == 1.0)
        peak = np.where(fp8, 2.0, 1.0) * rows["peak_tflops"] * 1e12
        bound = np.log(peak) - rows["log_flops_per_sample"]
    return np.asarray(np.where(np.isin(rows["family"], BOUNDED_FAMILIES), bound, np.nan))


def roofline_columns(rows: Columns) -> dict[str, np.ndarray]:
    """The public-spec roofline of one step per accelerator as :data:`ROOFLINE_COLUMNS`.

    Compute, weights and all-reduce time (see the module docstring), added with unit weights.
    The all-reduce's ring holds one rank of every model replica, with the replicas' tensor ranks
    between its members, so it is taken to span all ``n`` accelerators (:func:`link_bandwidth`);
    with pipeline stages laid out outermost it would span ``n / pp``, a refinement not made.
    Trees read these as the regime (compute-, memory- or communication-bound) a job is in on
    each hardware type, which decides how its speed moves between types.

    Parameters
    ----------
    rows
        The ``config`` columns (logs of params, batch, seq and accelerators; parallelism;
        precision bits) and the candidate's spec columns.

    Returns
    -------
    dict[str, np.ndarray]
        :data:`ROOFLINE_COLUMNS`; ``log_step_comm`` is NaN for jobs without data parallelism.
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        params, batch, seq, n = (np.exp(rows[c]) for c in ("log_params", "log_batch", "log_seq", "log_accelerators"))
        dp, tp, pp = rows["data_parallel"], rows["tensor_parallel"], rows["pipeline_parallel"]
        peak = peak_at_precision(rows)
        local_params = params / (tp * pp)
        compute = 6.0 * params * seq * (batch / n) / peak
        memory = 16.0 * local_params / (rows["memory_bw_gbps"] * 1e9)
        comm = np.where(dp > 1, 2.0 * (dp - 1.0) / dp * 2.0 * local_params / link_bandwidth(rows, n), 0.0)
        step = compute + memory + comm
        return {
            "log_peak_at_precision": np.log(peak / 1e12),
            "log_step_compute": np.log(compute),
            "log_step_memory": np.log(memory),
            "log_step_comm": np.where(dp > 1, np.log(comm), np.nan),
            "log_step_estimate": np.log(step),
            "log_roofline_step": np.log(batch / n) - np.log(step),
        }


def step_terms(rows: Columns) -> tuple[np.ndarray, np.ndarray]:
    """``(rows x TERMS)`` step-time terms and the per-accelerator batch.

    Compute, weights and all-reduce are read back from the :data:`ROOFLINE_COLUMNS` the rows
    carry (every row already has them, from :func:`roofline_columns`), so both rooflines see the
    same numbers. The tensor exchange joins the ``tp`` ranks of one model replica, so it spans
    ``tp`` accelerators (:func:`link_bandwidth`).

    Parameters
    ----------
    rows
        Model rows with their roofline columns.

    Returns
    -------
    tuple[np.ndarray, np.ndarray]
        The terms, in seconds up to a constant per term, and samples per accelerator per step.
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        per_acc = np.exp(rows["log_batch"] - rows["log_accelerators"])
        tokens = per_acc * np.exp(rows["log_seq"])
        bandwidth = rows["memory_bw_gbps"] * 1e9
        tp = rows["tensor_parallel"]
        terms = np.column_stack([
            np.exp(rows["log_step_compute"]),
            np.exp(rows["log_step_memory"]),
            tokens / bandwidth,
            np.where(rows["data_parallel"] > 1, np.exp(rows["log_step_comm"]), 0.0),
            np.where(tp > 1, tokens / tp / link_bandwidth(rows, tp), 0.0),
            per_acc,
            np.ones(len(per_acc)),
        ])
    return terms, per_acc
