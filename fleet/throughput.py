"""The throughput law: expected samples/s of a job configuration on each hardware type.

Per accelerator and training step the law adds

* matrix time: FLOPs / (peak at the job's precision x efficiency), efficiency = family base x
  vendor software maturity for the family x hardware generation x architecture x framework;
* memory time: weights, gradients and optimizer state plus activation traffic over HBM
  bandwidth, and random-access gathers (embeddings, neighbour features) at a fraction of it.
  Kernels are either compute- or memory-bound, so their times add up rather than overlap;
* a pipeline bubble for pp > 1;
* communication: gradient all-reduce for dp > 1 (partly hidden behind the backward pass),
  tensor-parallel activation all-reduces, MoE and embedding all-to-all; over the scale-up
  fabric within a node and over the scale-out network beyond it;
* host time per sample (data loading, augmentation) and per-layer launch overhead, which do not
  shrink on faster accelerators.

Everything is vectorised over (jobs x hardware). The persistent per-job factor, input caps,
noise, stragglers and failures are applied by :mod:`fleet.engine`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

from core.hardware import Catalogue, load_catalogue
from fleet.workloads import FAMILIES, model_types
from streams.events import PRECISIONS

FRAMEWORKS: tuple[str, ...] = ("pytorch", "jax", "tensorflow", "pytorch-xla", "pytorch-neuron")
VENDORS: tuple[str, ...] = ("nvidia", "amd", "google", "intel", "aws")

F = NDArray[np.float64]
I = NDArray[np.int64]  # noqa: E741 - short array alias

# Fraction of peak a well-tuned job of the family reaches on mature software.
BASE_EFF = {
    "dense_lm": 0.50,
    "moe": 0.35,
    "vision_cnn": 0.45,
    "vision_vit": 0.50,
    "diffusion": 0.45,
    "recsys": 0.30,
    "speech": 0.35,
    "gnn": 0.15,
}

# Software maturity per vendor and family relative to NVIDIA. Transformers get most vendor
# tuning; irregular workloads (recsys, GNN, RNN-heavy speech) the least.
SW_EFF: dict[str, dict[str, float]] = {
    "nvidia": dict.fromkeys(FAMILIES, 1.0),
    "amd": {
        "dense_lm": 0.55,
        "moe": 0.45,
        "vision_cnn": 0.60,
        "vision_vit": 0.70,
        "diffusion": 0.65,
        "recsys": 0.55,
        "speech": 0.55,
        "gnn": 0.50,
    },
    "google": {
        "dense_lm": 1.00,
        "moe": 0.95,
        "vision_cnn": 0.85,
        "vision_vit": 1.00,
        "diffusion": 0.85,
        "recsys": 0.70,
        "speech": 0.70,
        "gnn": 0.40,
    },
    "intel": {
        "dense_lm": 0.80,
        "moe": 0.55,
        "vision_cnn": 0.75,
        "vision_vit": 0.75,
        "diffusion": 0.70,
        "recsys": 0.50,
        "speech": 0.50,
        "gnn": 0.35,
    },
    "aws": {
        "dense_lm": 0.75,
        "moe": 0.55,
        "vision_cnn": 0.55,
        "vision_vit": 0.65,
        "diffusion": 0.55,
        "recsys": 0.40,
        "speech": 0.45,
        "gnn": 0.30,
    },
}

# Achievable share of datasheet peak by part: old parts lack tuned kernels (Kepler), the newest
# ones outrun everything around them (launch latency, memory-bound ops, host). Set from the Gavel
# and Lambda ratios; 1.0 where there is nothing to compare against.
GEN_EFF = {
    "K80": 0.55,
    "P100": 0.9,
    "A100-40GB": 0.78,
    "A100-80GB": 0.78,
    "H100-PCIe": 0.65,
    "H100-SXM": 0.72,
    "H200": 0.72,
    "B200": 0.62,
    "L4": 0.85,
    "L40S": 0.85,
}

LAUNCH_US = {"nvidia": 10.0, "amd": 15.0, "google": 3.0, "intel": 15.0, "aws": 12.0}
# Host-side work per sample (decode, augment, collate) at the reference input size, in µs.
HOST_US = {
    "dense_lm": 2.0,
    "moe": 2.0,
    "vision_cnn": 100.0,
    "vision_vit": 100.0,
    "diffusion": 300.0,
    "recsys": 1.0,
    "speech": 50.0,
    "gnn": 30.0,
}
# Smallest micro-batch a job of the family runs with (gradient accumulation covers the rest).
MIN_MICRO = {
    "dense_lm": 1,
    "moe": 1,
    "vision_cnn": 8,
    "vision_vit": 8,
    "diffusion": 1,
    "recsys": 256,
    "speech": 4,
    "gnn": 64,
}
# Users pick what they know and can get: relative weights for the default (requested) hardware.
POPULARITY = {
    "H100-SXM": 10.0,
    "A100-80GB": 9.0,
    "A100-40GB": 6.0,
    "H200": 4.0,
    "B200": 2.0,
    "V100-32GB": 3.0,
    "V100-16GB": 2.0,
    "T4": 3.0,
    "L4": 3.0,
    "A10G": 3.0,
    "L40S": 2.0,
    "H100-PCIe": 2.0,
    "K80": 0.3,
    "P100": 0.5,
    "MI250X": 0.5,
    "MI300X": 1.5,
    "MI325X": 0.5,
    "TPU-v4": 2.0,
    "TPU-v5e": 3.0,
    "TPU-v5p": 3.0,
    "TPU-v6e": 2.0,
    "Gaudi2": 0.7,
    "Gaudi3": 0.3,
    "Trainium1": 0.7,
    "Trainium2": 1.0,
}
# Framework efficiency on a vendor's parts (1.0 = the vendor's primary stack).
FRAMEWORK_EFF = {
    ("pytorch-xla", "google"): 0.8,
    ("tensorflow", "nvidia"): 0.95,
    ("jax", "aws"): 0.85,
    ("jax", "amd"): 0.9,
}


@dataclass(frozen=True)
class HardwareArrays:
    """Catalogue specs and simulator assumptions as arrays over hardware types."""

    names: tuple[str, ...]
    vendor: I
    peak: F
    peak32: F
    memory: F
    bw: F
    intra: F
    inter: F
    node: F
    max_n: F
    fp8: NDArray[np.bool_]
    supports: NDArray[np.bool_]  # (framework, hardware)
    fw_eff: F  # (framework, hardware)
    sw_eff: F  # (family, hardware)
    gen_eff: F
    launch_s: F
    popularity: F
    price: F


def hardware_arrays(catalogue: Catalogue | None = None) -> HardwareArrays:
    """Build :class:`HardwareArrays` from a catalogue (the default one, cached, when None)."""
    return _default_hardware() if catalogue is None else _build_hardware(catalogue)


@lru_cache(maxsize=1)
def _default_hardware() -> HardwareArrays:
    return _build_hardware(load_catalogue())


def _build_hardware(cat: Catalogue) -> HardwareArrays:
    hws = list(cat)
    names = tuple(h.name for h in hws)
    vendor = np.array([VENDORS.index(h.vendor) for h in hws], dtype=np.int64)
    supports = np.array([[f in h.frameworks for h in hws] for f in FRAMEWORKS])
    fw_eff = np.array([[FRAMEWORK_EFF.get((f, h.vendor), 1.0) for h in hws] for f in FRAMEWORKS])
    return HardwareArrays(
        names=names,
        vendor=vendor,
        peak=np.array([h.peak_tflops for h in hws]) * 1e12,
        peak32=np.array([h.peak_fp32_tflops or h.peak_tflops / 8 for h in hws]) * 1e12,
        memory=np.array([h.memory_gb for h in hws]) * 1e9,
        bw=np.array([h.memory_bw_gbps for h in hws]) * 1e9,
        # vendors quote both directions; a collective uses one direction's worth at ~70%
        intra=np.array([h.interconnect_gbps for h in hws]) * 1e9 / 2 * 0.7,
        inter=np.array([h.scale_out_gbps for h in hws]) * 1e9 * 0.7,
        node=np.array([h.node_size for h in hws], dtype=np.float64),
        max_n=np.array([h.max_accelerators or 65536 for h in hws], dtype=np.float64),
        fp8=np.array([h.fp8 for h in hws]),
        supports=supports,
        fw_eff=fw_eff,
        sw_eff=np.array([[SW_EFF[h.vendor][fam] for h in hws] for fam in FAMILIES]),
        gen_eff=np.array([GEN_EFF.get(h.name, 1.0) for h in hws]),
        launch_s=np.array([LAUNCH_US[h.vendor] for h in hws]) * 1e-6,
        popularity=np.array([POPULARITY.get(h.name, 1.0) for h in hws]),
        price=np.array([h.price_per_hour for h in hws]),
    )


@dataclass(frozen=True)
class ModelArrays:
    """Model-type attributes as arrays over model types."""

    family: I
    params: F
    dense: F
    expert: F
    emb: F
    active: F
    layers: F
    hidden: F
    seq_ref: F
    seq_exp: F
    flops_lin: F
    flops_quad: F
    act: F
    traffic: F
    gather: F
    arch_eff: F
    experts: F
    popularity: F


@lru_cache(maxsize=1)
def model_arrays() -> ModelArrays:
    """Attributes of :func:`fleet.workloads.model_types` as arrays."""
    ms = model_types()

    def col(attr: str) -> F:
        return np.array([float(getattr(m, attr)) for m in ms])

    return ModelArrays(
        family=np.array([FAMILIES.index(m.family) for m in ms], dtype=np.int64),
        params=col("params"),
        dense=col("dense_params"),
        expert=col("expert_params"),
        emb=col("emb_params"),
        active=col("active_params"),
        layers=col("layers"),
        hidden=col("hidden"),
        seq_ref=col("seq_ref"),
        seq_exp=col("seq_exp"),
        flops_lin=col("flops_lin"),
        flops_quad=col("flops_quad"),
        act=col("act_bytes"),
        traffic=col("traffic_bytes"),
        gather=col("gather_bytes"),
        arch_eff=col("arch_eff"),
        experts=col("num_experts"),
        popularity=col("popularity"),
    )


@lru_cache(maxsize=1)
def model_hw_factor() -> F:
    """Fixed (model type x hardware) quirks: kernels that happen to suit a part or not (sigma 0.08)."""
    rng = np.random.default_rng(7_000_001)
    return np.exp(rng.normal(0.0, 0.08, size=(len(model_types()), len(hardware_arrays().names))))


@dataclass(frozen=True)
class JobConfig:
    """Job configurations as arrays (one entry per job); codes index the module tuples."""

    model: I
    batch: F
    seq: F
    precision: I  # index into streams.events.PRECISIONS
    n: F
    dp: F
    tp: F
    pp: F
    framework: I  # index into FRAMEWORKS


_FP32 = np.array([p in ("fp32", "tf32") for p in PRECISIONS])
_FP8 = np.array([p == "fp8" for p in PRECISIONS])


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


def _state_bytes(cfg: JobConfig, m: ModelArrays) -> tuple[F, F, F]:
    """Replicated params per accelerator, optimizer divisor and sharded embedding bytes."""
    # ZeRO-1 / a distributed optimizer is the norm for billion-parameter models
    opt_div = np.where((cfg.dp > 1) & (m.params[cfg.model] >= 1e9), cfg.dp, 1.0)
    ep = np.minimum(cfg.dp, m.experts[cfg.model])
    rep = (m.dense[cfg.model] + m.expert[cfg.model] / ep) / (cfg.tp * cfg.pp)
    return rep, opt_div, m.emb[cfg.model] / cfg.n


def memory_needed(cfg: JobConfig) -> F:
    """Bytes each accelerator needs: weights, grads, optimizer state, embeddings, one micro-batch."""
    m = model_arrays()
    rep, opt_div, emb = _state_bytes(cfg, m)
    _, act, _, _, _ = _scaled(cfg, m)
    micro = np.minimum(cfg.batch / cfg.dp, np.array([MIN_MICRO[f] for f in FAMILIES])[m.family[cfg.model]])
    # bf16 weights + grads (4 B) and fp32 master/momentum/variance (12 B); row-wise Adagrad
    # embeddings ~5 B per parameter; 1.5 GB for the runtime and workspace.
    return rep * (4.0 + 12.0 / opt_div) + emb * 5.0 + act * micro / cfg.tp + 1.5e9


def eligibility(cfg: JobConfig, hw: HardwareArrays | None = None) -> NDArray[np.bool_]:
    """(jobs x hardware) mask: the job fits in memory and the hardware runs its framework."""
    hw = hw or hardware_arrays()
    fits = memory_needed(cfg)[:, None] <= 0.92 * hw.memory[None, :]
    return fits & hw.supports[cfg.framework] & (cfg.n[:, None] <= hw.max_n[None, :])


def expected_throughput(cfg: JobConfig, hw: HardwareArrays | None = None) -> F:
    """(jobs x hardware) noise-free samples/s of each configuration, before the per-job factor.

    Parameters
    ----------
    cfg
        Job configurations.
    hw
        Hardware arrays; default from the default catalogue.

    Returns
    -------
    ndarray
        Throughput over all accelerators of the job; computed for every pair, eligible or not.
    """
    hw = hw or hardware_arrays()
    m = model_arrays()
    fam = m.family[cfg.model]
    flops, _, traffic, gather, host = (x[:, None] for x in _scaled(cfg, m))
    rep, opt_div, _ = (x[:, None] for x in _state_bytes(cfg, m))
    batch, n, dp, tp, pp = (x[:, None] for x in (cfg.batch, cfg.n, cfg.dp, cfg.tp, cfg.pp))
    fp32 = _FP32[cfg.precision][:, None]

    peak = np.where(fp32, hw.peak32[None, :], hw.peak[None, :])
    peak = np.where(_FP8[cfg.precision][:, None] & hw.fp8[None, :], peak * 1.6, peak)
    eff = (
        np.array([BASE_EFF[f] for f in FAMILIES])[fam][:, None]
        * hw.sw_eff[fam]
        * hw.gen_eff[None, :]
        * m.arch_eff[cfg.model][:, None]
        * hw.fw_eff[cfg.framework]
        * model_hw_factor()[cfg.model]
    )
    per_acc = batch / n
    t_comp = flops * per_acc / (peak * eff)
    weight_bytes = rep * (6.0 + 32.0 / opt_div)  # fwd+bwd reads, grad write, optimizer r/w
    t_mem = (weight_bytes + traffic * per_acc) / (hw.bw[None, :] * 0.75) + gather * per_acc / (
        hw.bw[None, :] * 0.2
    )
    local = batch / dp
    micro = np.clip(local, 1.0, 4.0 * pp)
    t_core = (t_comp + t_mem) * (1.0 + (pp - 1.0) / micro)

    in_node = n <= hw.node[None, :]
    bw_dp = np.where(in_node, hw.intra[None, :], hw.inter[None, :])
    bw_tp = np.where(tp <= hw.node[None, :], hw.intra[None, :], hw.inter[None, :])
    grad = rep * np.where(fp32, 4.0, 2.0)
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
    t_launch = 3.0 * layers / pp * hw.launch_s[None, :] * 4.0
    t_step = t_core + t_dp + t_tp + t_a2a + t_launch + host * per_acc
    return np.asarray(batch / t_step, dtype=np.float64)
