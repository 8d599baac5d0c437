"""What the throughput law reads, as arrays: hardware types, model types and job configurations.

Hardware specs come from the catalogue (``leap/core/data/hardware.toml``); what is here on top of them
is the simulator's own assumption about software: how mature each vendor's stack is per model
family, framework penalties, launch latency, and how popular each part is with users. None of it
is a model feature.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

from leap.core.hardware import Catalogue, load_catalogue
from leap.fleet.workloads import FAMILIES, model_types

FRAMEWORKS: tuple[str, ...] = ("pytorch", "jax", "tensorflow", "pytorch-xla", "pytorch-neuron")
VENDORS: tuple[str, ...] = ("nvidia", "amd", "google", "intel", "aws")

F = NDArray[np.float64]
I = NDArray[np.int64]  # noqa: E741 - short array alias

# Fraction of peak a well-tuned job of the family reaches on mature software, in its matrix math.
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

# Software maturity per vendor and family, relative to the vendor's transformer (dense LM)
# software, which gets the most tuning everywhere: irregular workloads (recsys, GNN, RNN-heavy
# speech) get the least. A vendor's overall level is not here: it is each architecture's fitted
# efficiency (leap/fleet/efficiency.py). No public measurement covers these ratios (the non-NVIDIA
# measurements are all transformers), so they are assumptions, not fits.
SW_EFF: dict[str, dict[str, float]] = {
    "nvidia": dict.fromkeys(FAMILIES, 1.0),
    "amd": {
        "dense_lm": 1.00, "moe": 0.80, "vision_cnn": 0.90, "vision_vit": 1.00,
        "diffusion": 0.90, "recsys": 0.75, "speech": 0.75, "gnn": 0.70,
    },
    "google": {
        "dense_lm": 1.00, "moe": 0.95, "vision_cnn": 0.85, "vision_vit": 1.00,
        "diffusion": 0.85, "recsys": 0.70, "speech": 0.70, "gnn": 0.40,
    },
    "intel": {
        "dense_lm": 1.00, "moe": 0.70, "vision_cnn": 0.90, "vision_vit": 0.95,
        "diffusion": 0.85, "recsys": 0.65, "speech": 0.65, "gnn": 0.45,
    },
    "aws": {
        "dense_lm": 1.00, "moe": 0.75, "vision_cnn": 0.75, "vision_vit": 0.85,
        "diffusion": 0.75, "recsys": 0.55, "speech": 0.60, "gnn": 0.40,
    },
}

# CPU-side latency of one kernel launch (or, for XLA, of one fused op dispatch), µs.
LAUNCH_US = {"nvidia": 8.0, "amd": 12.0, "google": 3.0, "intel": 12.0, "aws": 10.0}
# Host-side work per sample (decode, augment, collate) at the reference input size, in CPU-µs
# of one data-loader worker.
HOST_US = {
    "dense_lm": 20.0,
    "moe": 20.0,
    "vision_cnn": 2000.0,
    "vision_vit": 2000.0,
    "diffusion": 4000.0,
    "recsys": 10.0,
    "speech": 600.0,
    "gnn": 300.0,
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
# How users weigh parts when nothing else decides (familiarity, documentation, what colleagues
# use): relative weights for a team's usual hardware.
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
    """Catalogue specs and simulator assumptions as arrays over hardware types.

    ``arch`` indexes ``architectures`` (the catalogue's ``architecture`` of each part, sorted).
    """

    names: tuple[str, ...]
    architectures: tuple[str, ...]
    arch: I
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
    architectures = tuple(sorted({h.architecture or h.name for h in hws}))
    supports = np.array([[f in h.frameworks for h in hws] for f in FRAMEWORKS])
    fw_eff = np.array([[FRAMEWORK_EFF.get((f, h.vendor), 1.0) for h in hws] for f in FRAMEWORKS])
    return HardwareArrays(
        names=names,
        architectures=architectures,
        arch=np.array([architectures.index(h.architecture or h.name) for h in hws], dtype=np.int64),
        vendor=np.array([VENDORS.index(h.vendor) for h in hws], dtype=np.int64),
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
    trainable: F


@lru_cache(maxsize=1)
def model_arrays() -> ModelArrays:
    """Attributes of :func:`leap.fleet.workloads.model_types` as arrays."""
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
        trainable=col("trainable"),
    )


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

    def __len__(self) -> int:
        return len(self.model)

    def subset(self, keep: NDArray[np.bool_] | I) -> JobConfig:
        """The configurations selected by a mask or an index array."""
        return JobConfig(**{k: getattr(self, k)[keep] for k in JobConfig.__dataclass_fields__})

    @staticmethod
    def concat(parts: list[JobConfig]) -> JobConfig:
        """The configurations of ``parts`` one after another."""
        return JobConfig(
            **{k: np.concatenate([getattr(p, k) for p in parts]) for k in JobConfig.__dataclass_fields__}
        )
