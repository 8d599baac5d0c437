"""What every family builds on: the :class:`ModelType` record, the family names, and the
dense-transformer shape shared by language, MoE and speech models."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FAMILIES: tuple[str, ...] = (
    "dense_lm",
    "moe",
    "vision_cnn",
    "vision_vit",
    "diffusion",
    "recsys",
    "speech",
    "gnn",
)


@dataclass(frozen=True)
class ModelType:
    """One model type.

    Attributes
    ----------
    name, family
        Identifier and family (one of :data:`FAMILIES`).
    params
        Total parameter count (what a submission reports).
    dense_params
        Parameters replicated on every data-parallel rank (sharded only by tp/pp).
    expert_params
        MoE expert parameters, additionally sharded by expert parallelism.
    emb_params
        Embedding-table parameters sharded over all accelerators (recsys).
    active_params
        Parameters touched per sample (FLOP count basis).
    layers, hidden
        Depth and width, for tensor-parallel and all-to-all traffic.
    seq_ref, seq_exp, seq_choices
        Reference input size, scaling exponent, and sizes jobs pick from.
    flops_lin, flops_quad
        Training FLOPs per sample at ``seq_ref``: the part linear in tokens/pixels and the
        attention part (quadratic).
    act_bytes
        Activation memory per sample at ``seq_ref`` (16-bit, typical checkpointing).
    traffic_bytes
        HBM bytes moved per sample at ``seq_ref`` besides weights (activations, norms).
    gather_bytes
        Random-access bytes per sample (embedding lookups, neighbour features).
    local_batches
        Per-replica batch sizes jobs pick from.
    arch_eff
        Fixed efficiency of this architecture relative to its family (kernel mix).
    popularity
        Relative frequency of jobs of this type.
    num_experts
        MoE experts (1: dense).
    trainable
        Share of the parameters that are trained (LoRA fine-tuning trains ~0.1 %): frozen ones
        need no gradients, optimizer state or weight-gradient FLOPs.
    """

    name: str
    family: str
    params: float
    dense_params: float
    expert_params: float
    emb_params: float
    active_params: float
    layers: int
    hidden: int
    seq_ref: int
    seq_exp: float
    seq_choices: tuple[int, ...]
    flops_lin: float
    flops_quad: float
    act_bytes: float
    traffic_bytes: float
    gather_bytes: float
    local_batches: tuple[int, ...]
    arch_eff: float
    popularity: float
    num_experts: int = 1
    trainable: float = 1.0


def dense_model(name: str, family: str, params: float, **fields: Any) -> ModelType:
    """A model type whose parameters are all dense and all active: no experts, no embedding tables."""
    return ModelType(name=name, family=family, params=params, dense_params=params, expert_params=0.0,
                     emb_params=0.0, active_params=params, **fields)


def fmt_size(p: float) -> str:
    """A parameter count as a name suffix: ``1.3b``, ``590m``."""
    if p >= 1e9:
        return f"{p / 1e9:.3g}b"
    return f"{p / 1e6:.3g}m"


def transformer(
    name: str,
    family: str,
    params: float,
    seq: int,
    seqs: tuple[int, ...],
    batches: tuple[int, ...],
    arch_eff: float,
    pop: float,
    layers: int | None = None,
    hidden: int | None = None,
    act_per_token: float = 10.0,
) -> ModelType:
    """A dense transformer over ``seq`` tokens: 6·P·s linear FLOPs plus 12·L·d·s² attention."""
    if layers is None:
        layers = max(4, round(12 * (params / 1.25e8) ** 0.30))
    if hidden is None:
        hidden = max(128, int(round((params / (12 * layers)) ** 0.5 / 64) * 64))
    return dense_model(
        name=name,
        family=family,
        params=params,
        layers=layers,
        hidden=hidden,
        seq_ref=seq,
        seq_exp=1.0,
        seq_choices=seqs,
        flops_lin=6.0 * params * seq,
        flops_quad=12.0 * layers * hidden * seq * seq,
        # bytes per token per layer per unit width: ~10 with selective recomputation (Korthikanti
        # et al. 2022 give 34 without any); HBM traffic is a few passes over those activations.
        act_bytes=act_per_token * seq * hidden * layers,
        traffic_bytes=2.0 * act_per_token * seq * hidden * layers,
        gather_bytes=0.0,
        local_batches=batches,
        arch_eff=arch_eff,
        popularity=pop,
    )

