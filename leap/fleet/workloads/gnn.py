"""Graph neural networks (``gnn``) trained on sampled neighbourhoods."""

from __future__ import annotations

import numpy as np

from leap.fleet.workloads.base import ModelType, dense_model


def gnns(rng: np.random.Generator) -> list[ModelType]:
    """The ``gnn`` family: eight architectures at three widths."""
    out = []
    for arch, eff in (
        ("gcn", 0.9),
        ("graphsage", 1.0),
        ("gat", 0.7),
        ("gin", 0.9),
        ("rgat", 0.7),
        ("schnet", 0.6),
        ("mpnn", 0.6),
        ("meshgraphnet", 0.7),
    ):
        for hidden in (128, 512, 1024):
            layers = 3
            fanout = 512 if arch in ("graphsage", "gcn", "gat", "rgat", "gin") else 64
            params = layers * 2 * hidden * hidden * (4 if arch in ("rgat", "gat") else 1)
            out.append(
                dense_model(
                    name=f"{arch}-h{hidden}",
                    family="gnn",
                    params=params,
                    layers=layers,
                    hidden=hidden,
                    seq_ref=fanout,
                    seq_exp=1.0,
                    seq_choices=(fanout // 2, fanout, fanout * 2),
                    flops_lin=6.0 * params * fanout / 4,
                    flops_quad=0.0,
                    act_bytes=4.0 * fanout * hidden * layers * 4,
                    traffic_bytes=4.0 * fanout * hidden * layers * 6,
                    # neighbour feature gathers dominate sampled-subgraph training
                    gather_bytes=4.0 * fanout * 1024 * 2,
                    local_batches=(256, 512, 1024, 2048),
                    arch_eff=eff * float(rng.uniform(0.9, 1.1)),
                    popularity=0.5,
                )
            )
    return out

