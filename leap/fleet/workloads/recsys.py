"""Recommendation models (``recsys``): sharded embedding tables under a small dense network."""

from __future__ import annotations

import numpy as np

from leap.fleet.workloads.base import ModelType, dense_model, fmt_size

#: Architectures: kind, dense params, MLP FLOP multiplier, tables, dim, pooling, efficiency.
_KINDS: tuple[tuple[str, float, float, int, int, int, float], ...] = (
    ("dlrm", 2.5e6, 1.0, 26, 128, 1, 1.0),
    ("dlrm-dcnv2", 8e6, 3.0, 26, 128, 1, 0.9),
    ("wide-deep", 1e6, 1.0, 40, 32, 1, 0.8),
    ("deepfm", 1.5e6, 1.5, 39, 16, 1, 0.8),
    ("two-tower", 2e7, 2.0, 12, 64, 20, 0.9),
    ("seq-rec", 5e7, 3.0, 8, 128, 50, 0.9),
)

# Gavel's autoencoder recommender (ML-20M): dense, no sharded tables.
_AUTOENCODER = dense_model(
    name="autoencoder-rec",
    family="recsys",
    params=2.7e7,
    layers=6,
    hidden=512,
    seq_ref=1,
    seq_exp=1.0,
    seq_choices=(1,),
    flops_lin=6.0 * 2.7e7,
    flops_quad=0.0,
    act_bytes=4e4,
    traffic_bytes=6.0 * 2.7e7 * 4 / 64,
    gather_bytes=2e5,
    local_batches=(512, 1024, 2048, 4096, 8192),
    arch_eff=0.6,
    popularity=0.3,
)


def recsys_models(rng: np.random.Generator) -> list[ModelType]:
    """The ``recsys`` family: each architecture at five embedding sizes, then the autoencoder."""
    out = []
    for kind, dense, mult, tables, dim, pool, eff in _KINDS:
        for emb in (1e8, 1e9, 1e10, 5e10, 2e11):
            lookups = tables * pool
            out.append(
                ModelType(
                    name=f"{kind}-{fmt_size(emb)}",
                    family="recsys",
                    params=emb + dense,
                    dense_params=dense,
                    expert_params=0.0,
                    emb_params=emb,
                    active_params=dense,
                    layers=8,
                    hidden=dim,
                    seq_ref=lookups,
                    seq_exp=1.0,
                    seq_choices=(lookups, 2 * lookups),
                    flops_lin=6.0 * dense * mult,
                    flops_quad=0.0,
                    act_bytes=4.0 * lookups * dim * 6,
                    traffic_bytes=4.0 * lookups * dim * 4,
                    # gather fwd, scatter-add grads, row-wise optimizer update: ~3 random passes
                    gather_bytes=3.0 * 4.0 * lookups * dim,
                    local_batches=(512, 1024, 2048, 4096, 8192),
                    arch_eff=eff * float(rng.uniform(0.9, 1.1)),
                    popularity=0.8,
                )
            )
    out.append(_AUTOENCODER)
    return out
