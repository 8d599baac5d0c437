"""The throughput law: expected samples/s of a job configuration on each hardware type.

Per accelerator and optimizer step:

1. **Memory plan** (:func:`memory_plan`): the job wants ``batch / dp`` samples per micro-batch.
   When their activations do not fit next to the weights, gradients and optimizer state, it
   accumulates gradients over smaller micro-batches, and when even the smallest useful
   micro-batch does not fit it recomputes activations (a third more FLOPs, a fifth of the
   activation memory). A part that cannot hold the smallest micro-batch even then is no
   candidate. Throughput therefore falls in steps as memory shrinks: a capacity cliff.
2. **Matrix time** = FLOPs / (achieved FLOP/s x efficiency x occupancy). Achieved FLOP/s is
   the peak at the job's precision through a fitted power law, efficiency = family base x
   vendor software maturity for the family x model architecture x framework. Occupancy
   ``1 - exp(-w / (peak x tau))`` saturates with the work ``w`` of one layer's kernels on one
   micro-batch: a big part needs big kernels (a batch-size efficiency curve).
3. **Memory time**: weights read on every micro-batch, optimizer state once per step and
   activation traffic over the achieved bandwidth (a fitted power law of the datasheet's),
   random gathers at a fifth of it.
4. Matrix and memory time **overlap partly** (a fitted p-norm: kernels of a model are neither
   all compute- nor all memory-bound); the part's fitted efficiency scales the result.
   The host dispatches every operator; the device runs them asynchronously, so the step takes
   the (soft) maximum of device time and dispatch time, not their sum.
5. A pipeline bubble for pp > 1; communication (gradient all-reduce partly hidden behind the
   backward pass, tensor-parallel all-reduces, MoE and embedding all-to-all) over the scale-up
   fabric within a node and the scale-out network beyond it.
6. Data loading runs in parallel worker processes: the step takes the (soft) maximum of device
   time and the host's time to prepare the batch, not their sum.

The model's learned roofline adds per-term constants times spec-sheet terms; this law shares
none of that form (docs/simulator.md lists what the model's columns can and cannot express).
Everything is vectorised over (jobs x hardware). Per-job and job-by-hardware effects, input
caps, noise, stragglers and failures are applied by :mod:`leap.fleet.jobs` and :mod:`leap.fleet.engine`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from leap.fleet.arrays import (
    BASE_EFF,
    HOST_US,
    MIN_MICRO,
    F,
    HardwareArrays,
    JobConfig,
    ModelArrays,
    hardware_arrays,
    model_arrays,
)
from leap.fleet.law import LawParams, fitted_law
from leap.fleet.workloads import FAMILIES
from streams.events import PRECISIONS

MEMORY_USABLE = 0.92  # of the accelerator's memory; the rest is fragmentation and allocator slack
RUNTIME_BYTES = 1.5e9  # CUDA/ROCm context, workspaces, communication buffers
RECOMPUTE_ACTIVATIONS = 0.2  # keeps one input per layer instead of selective checkpointing's ~5
#: Operators per layer and micro-batch that the host dispatches (forward, backward, optimizer).
OPS_PER_LAYER = 60
#: Host seconds to dispatch one operator, per framework: eager PyTorch pays Python and autograd
#: on every op; compiled graphs (JAX, XLA, Neuron) dispatch fused programs.
DISPATCH_S = np.array([20e-6, 2e-6, 8e-6, 4e-6, 4e-6])  # order of leap.fleet.arrays.FRAMEWORKS
ISSUE_NORM = 2.0  # the host runs ahead of the device, but syncs once per step
LOADER_WORKERS = 8  # data-loader processes per accelerator
HOST_NORM = 4.0  # data loading hides behind the step unless it is the slower of the two
PEAK_REF, BW_REF = 100e12, 1000e9  # where the fitted power laws equal the datasheet
HBM_EFF, GATHER_EFF = 0.75, 0.2  # of peak bandwidth: streaming access and random gathers

_FP32 = np.array([p in ("fp32", "tf32") for p in PRECISIONS])
_FP8 = np.array([p == "fp8" for p in PRECISIONS])
_MIN_MICRO = np.array([MIN_MICRO[f] for f in FAMILIES], dtype=np.float64)


def soft_max(a: F, b: F, norm: float) -> F:
    """``(a^norm + b^norm)^(1/norm)``: between the sum (norm 1) and the maximum (norm -> inf)."""
    big = np.maximum(np.maximum(a, b), 1e-300)
    return np.asarray(big * ((a / big) ** norm + (b / big) ** norm) ** (1.0 / norm), dtype=np.float64)


def _scaled(cfg: JobConfig, m: ModelArrays) -> tuple[F, F, F, F, F]:
    """Per-sample FLOPs, activation bytes, traffic, gathers and host seconds at the job's input size."""
    r = cfg.seq / m.seq_ref[cfg.model]
    lin = r ** m.seq_exp[cfg.model]
    flops = m.flops_lin[cfg.model] * lin + m.flops_quad[cfg.model] * lin * lin
    width = np.where(_FP32[cfg.precision], 2.0, 1.0)
    host = np.array([HOST_US[f] for f in FAMILIES])[m.family[cfg.model]] * 1e-6
    host = host * np.where(m.seq_exp[cfg.model] > 1, lin, 1.0)  # image decode scales with pixels
    return (
        flops,
        m.act[cfg.model] * lin * width,
        m.traffic[cfg.model] * lin * width,
        m.gather[cfg.model] * lin,
        host,
    )


def _state_bytes(cfg: JobConfig, m: ModelArrays) -> tuple[F, F, F, F]:
    """Replicated params per accelerator, trained share, optimizer divisor and sharded embedding params."""
    # ZeRO-1 / a distributed optimizer is the norm for billion-parameter models
    opt_div = np.where((cfg.dp > 1) & (m.params[cfg.model] >= 1e9), cfg.dp, 1.0)
    ep = np.minimum(cfg.dp, m.experts[cfg.model])
    rep = (m.dense[cfg.model] + m.expert[cfg.model] / ep) / (cfg.tp * cfg.pp)
    return rep, m.trainable[cfg.model], opt_div, m.emb[cfg.model] / cfg.n


@dataclass(frozen=True)
class MemoryPlan:
    """How a job uses each part's memory, (jobs x hardware).

    Attributes
    ----------
    fits
        The smallest useful micro-batch fits (with recomputation if need be).
    micro
        Samples per micro-batch and data-parallel replica.
    recompute
        Activations are recomputed in the backward pass.
    """

    fits: NDArray[np.bool_]
    micro: F
    recompute: NDArray[np.bool_]


def _state_and_activations(cfg: JobConfig) -> tuple[F, F, F, F]:
    """Bytes of state and of one sample's activations per accelerator; wanted and smallest micro-batch."""
    m = model_arrays()
    rep, trained, opt_div, emb = _state_bytes(cfg, m)
    _, act, _, _, _ = _scaled(cfg, m)
    # bf16 weights (2 B), and for trained parameters bf16 grads (2 B) and fp32
    # master/momentum/variance (12 B); row-wise Adagrad embeddings ~5 B per parameter; the
    # runtime's own share.
    state = rep * (2.0 + trained * (2.0 + 12.0 / opt_div)) + emb * 5.0 + RUNTIME_BYTES
    wanted = np.maximum(cfg.batch / cfg.dp, 1.0)
    return state, act / cfg.tp, wanted, np.minimum(wanted, _MIN_MICRO[m.family[cfg.model]])


def memory_needed(cfg: JobConfig) -> F:
    """Bytes each accelerator needs at the least: state plus the smallest micro-batch, recomputed."""
    state, per_sample, _, smallest = _state_and_activations(cfg)
    return np.asarray(state + smallest * per_sample * RECOMPUTE_ACTIVATIONS, dtype=np.float64)


def memory_plan(cfg: JobConfig, hw: HardwareArrays | None = None) -> MemoryPlan:
    """Micro-batch and recomputation of every (job, hardware) pair: see the module docstring."""
    hw = hw or hardware_arrays()
    state, per_sample, wanted, smallest = (x[:, None] for x in _state_and_activations(cfg))
    free = MEMORY_USABLE * hw.memory[None, :] - state
    plain = np.floor(free / per_sample)  # micro-batch that fits without recomputation
    recomputed = np.floor(free / (per_sample * RECOMPUTE_ACTIVATIONS))
    recompute = plain < smallest
    micro = np.where(recompute, np.minimum(wanted, recomputed), np.minimum(wanted, plain))
    return MemoryPlan(fits=recomputed >= smallest, micro=np.maximum(micro, 1.0), recompute=recompute)


def eligibility(cfg: JobConfig, hw: HardwareArrays | None = None) -> NDArray[np.bool_]:
    """(jobs x hardware) mask: the job fits in memory and the hardware runs its framework."""
    hw = hw or hardware_arrays()
    fits = memory_needed(cfg)[:, None] <= MEMORY_USABLE * hw.memory[None, :]
    return fits & hw.supports[cfg.framework] & (cfg.n[:, None] <= hw.max_n[None, :])


def _peak(cfg: JobConfig, hw: HardwareArrays) -> F:
    """(jobs x hardware) datasheet FLOP/s at the job's precision (x1.6 for fp8 on parts with fp8 math)."""
    fp32 = _FP32[cfg.precision][:, None]
    peak = np.where(fp32, hw.peak32[None, :], hw.peak[None, :])
    return np.asarray(np.where(_FP8[cfg.precision][:, None] & hw.fp8[None, :], peak * 1.6, peak))


def _device_time(cfg: JobConfig, hw: HardwareArrays, plan: MemoryPlan, law: LawParams) -> F:
    """(jobs x hardware) seconds of compute and memory work per step, before communication."""
    m = model_arrays()
    fam = m.family[cfg.model]
    flops, _, traffic, gather, _ = (x[:, None] for x in _scaled(cfg, m))
    rep, trained, opt_div, _ = (x[:, None] for x in _state_bytes(cfg, m))
    per_acc = (cfg.batch / cfg.n)[:, None]
    tp, pp, layers = cfg.tp[:, None], cfg.pp[:, None], m.layers[cfg.model][:, None]
    peak = _peak(cfg, hw)
    achieved = PEAK_REF * (peak / PEAK_REF) ** law.peak_exponent
    eff = (
        np.array([BASE_EFF[f] for f in FAMILIES])[fam][:, None]
        * hw.sw_eff[fam]
        * m.arch_eff[cfg.model][:, None]
        * hw.fw_eff[cfg.framework]
    )
    layer_work = flops * plan.micro / (tp * layers)
    occupancy = -np.expm1(-layer_work / (peak * law.occupancy_tau_s))
    # recomputation reruns the forward pass: 2 of the 4 + 2 x trained FLOPs per parameter
    recompute = np.where(plan.recompute, 1.0 + 2.0 / (4.0 + 2.0 * trained), 1.0)
    t_comp = flops * per_acc * recompute / (achieved * eff * occupancy)
    micro_steps = np.ceil(np.maximum(cfg.batch / cfg.dp, 1.0)[:, None] / plan.micro)
    # weights read forward and backward on every micro-batch, trained ones' gradients written;
    # optimizer state read and written once per step
    weight_bytes = rep * ((4.0 + 2.0 * trained) * micro_steps + 32.0 * trained / opt_div)
    bw = BW_REF * (hw.bw[None, :] / BW_REF) ** law.bw_exponent
    t_mem = (weight_bytes + traffic * per_acc) / (bw * HBM_EFF) + gather * per_acc / (bw * GATHER_EFF)
    part_eff = np.exp(np.array(law.part_efficiency(hw.names)))[None, :]
    t_dev = soft_max(t_comp, t_mem, law.overlap_norm) / part_eff
    # The host issues every operator of the step (framework dispatch plus the driver's launch);
    # the device runs them asynchronously, so the slower of the two sets the pace.
    ops = OPS_PER_LAYER * layers / pp * micro_steps
    t_issue = ops * (DISPATCH_S[cfg.framework][:, None] * law.dispatch_scale + hw.launch_s[None, :])
    return soft_max(t_dev, t_issue, ISSUE_NORM)


def _communication(cfg: JobConfig, hw: HardwareArrays, t_core: F) -> F:
    """(jobs x hardware) exposed communication seconds per step."""
    m = model_arrays()
    fam = m.family[cfg.model]
    _, _, _, gather, _ = (x[:, None] for x in _scaled(cfg, m))
    rep, trained, _, _ = (x[:, None] for x in _state_bytes(cfg, m))
    batch, n, dp, tp, pp = (x[:, None] for x in (cfg.batch, cfg.n, cfg.dp, cfg.tp, cfg.pp))
    per_acc, local = batch / n, batch / dp
    bw_dp = np.where(n <= hw.node[None, :], hw.intra[None, :], hw.inter[None, :])
    bw_tp = np.where(tp <= hw.node[None, :], hw.intra[None, :], hw.inter[None, :])
    grad = rep * trained * np.where(_FP32[cfg.precision][:, None], 4.0, 2.0)
    t_dp = np.where(dp > 1, 2.0 * (dp - 1.0) / dp * grad / bw_dp, 0.0)
    t_dp = np.maximum(t_dp - 0.7 * t_core, 0.15 * t_dp)  # overlapped with the backward pass
    layers, hidden, seq = m.layers[cfg.model][:, None], m.hidden[cfg.model][:, None], cfg.seq[:, None]
    act_msg = local / tp * seq * hidden * 2.0 * layers / pp  # one activation tensor per layer
    t_tp = np.where(tp > 1, 4.0 * 2.0 * (tp - 1.0) / tp * act_msg / bw_tp, 0.0)
    ep = np.minimum(dp, m.experts[cfg.model][:, None])
    t_a2a = np.where(ep > 1, 4.0 * act_msg / 2.0 * (ep - 1.0) / ep / bw_dp, 0.0)
    is_rec = (fam == FAMILIES.index("recsys"))[:, None]
    emb_msg = per_acc * gather / 3.0 * 2.0  # pooled embeddings out and their gradients back
    t_a2a = t_a2a + np.where(is_rec & (n > 1), emb_msg * (n - 1.0) / n / bw_dp, 0.0)
    return np.asarray(t_dp + t_tp + t_a2a, dtype=np.float64)


def expected_throughput(cfg: JobConfig, hw: HardwareArrays | None = None, law: LawParams | None = None) -> F:
    """(jobs x hardware) noise-free samples/s of each configuration, before any per-job effect.

    Parameters
    ----------
    cfg
        Job configurations.
    hw
        Hardware arrays; default from the default catalogue.
    law
        The law's fitted constants; default :func:`leap.fleet.law.fitted_law` (the calibration
        passes its own).

    Returns
    -------
    ndarray
        Throughput over all accelerators of the job; computed for every pair, eligible or not
        (with the memory plan of the smallest micro-batch where nothing fits).
    """
    hw = hw or hardware_arrays()
    plan = memory_plan(cfg, hw)
    t_dev = _device_time(cfg, hw, plan, law or fitted_law())
    pp = cfg.pp[:, None]
    in_flight = np.clip(cfg.batch / cfg.dp, 1.0, 4.0 * cfg.pp)[:, None]
    t_core = t_dev * (1.0 + (pp - 1.0) / in_flight)
    t_device = t_core + _communication(cfg, hw, t_core)
    _, _, _, _, host = _scaled(cfg, model_arrays())
    t_host = (host * cfg.batch / cfg.n / LOADER_WORKERS)[:, None]
    t_step = soft_max(t_device, np.broadcast_to(t_host, t_device.shape), HOST_NORM)
    return np.asarray(cfg.batch[:, None] / t_step, dtype=np.float64)
