"""Language models: dense transformers (``dense_lm``) and mixtures of experts (``moe``)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from leap.fleet.workloads.base import ModelType, fmt_size, transformer


def dense_lms(rng: np.random.Generator) -> list[ModelType]:
    """The ``dense_lm`` family: four variants on a grid of 25 sizes, then published models."""
    out = []
    sizes = np.geomspace(1e8, 7e10, 25)
    variants = (
        ("gpt", 2048, (1024, 2048, 4096), 1.0, 1.0),
        ("llama", 4096, (2048, 4096, 8192), 1.05, 1.6),
        ("encoder", 512, (128, 256, 512), 0.95, 0.6),
        ("code", 8192, (4096, 8192, 16384), 1.0, 0.7),
    )
    for prefix, seq, seqs, eff, pop in variants:
        for p in sizes:
            p = float(f"{p:.2g}")
            w = pop * float(np.clip(2e9 / p, 0.15, 2.5))  # small models are trained more often
            out.append(
                transformer(
                    f"{prefix}-{fmt_size(p)}",
                    "dense_lm",
                    p,
                    seq,
                    seqs,
                    (1, 2, 4, 8, 16),
                    eff * float(rng.uniform(0.9, 1.1)),
                    w,
                )
            )
    # Named public models used by the calibration.
    named: tuple[tuple[str, float, int, int, int, tuple[int, ...]], ...] = (
        ("bert-base", 1.1e8, 384, 12, 768, (128, 384, 512)),
        ("bert-large", 3.4e8, 384, 24, 1024, (128, 384, 512)),
        ("transformer-base", 6.5e7, 64, 6, 512, (32, 64, 128)),
        ("transformer-xl-base", 1.5e8, 192, 16, 512, (128, 192, 512)),
        ("transformer-xl-large", 2.6e8, 384, 18, 1024, (256, 384, 512)),
        ("gnmt", 1.6e8, 50, 8, 1024, (32, 50, 64)),
        ("llama31-8b", 8.0e9, 8192, 32, 4096, (4096, 8192)),
        ("llama2-70b", 7.0e10, 4096, 80, 8192, (4096, 8192)),
    )
    for name, p, seq, layers, hidden, nseqs in named:
        out.append(
            transformer(
                name, "dense_lm", p, seq, nseqs, (1, 2, 4, 8, 16, 32), 1.0, 1.0, layers=layers, hidden=hidden
            )
        )
    out.append(_lora(out[-1], trainable=0.0006))  # MLPerf's Llama-2-70B LoRA: rank 16, ~44M of 70B
    return out


def _lora(base: ModelType, trainable: float) -> ModelType:
    """LoRA fine-tuning of ``base``: frozen weights, so 4 instead of 6 FLOPs per parameter and token
    (no weight gradients) and no gradients or optimizer state for the frozen parameters."""
    return replace(base, name=f"{base.name}-lora", flops_lin=base.flops_lin * (4.0 + 2.0 * trainable) / 6.0,
                   trainable=trainable)


def moes(rng: np.random.Generator) -> list[ModelType]:
    """The ``moe`` family: base sizes times expert counts (top-2 routing), up to 600b in total."""
    out = []
    for base in np.geomspace(1.25e8, 1.3e10, 10):
        base = float(f"{base:.2g}")
        for experts in (8, 16, 32, 64):
            topk = 2
            shared = base / 3.0  # attention and norms; the FFN (2/3 of a block) becomes experts
            expert = 2.0 * base / 3.0
            total = shared + experts * expert
            if total > 6e11:
                continue
            m = transformer(
                f"moe-{experts}x{fmt_size(base)}",
                "moe",
                total,
                4096,
                (2048, 4096, 8192),
                (1, 2, 4, 8),
                float(rng.uniform(0.85, 1.1)),
                0.8 * float(np.clip(3e9 / base, 0.2, 2.0)),
            )
            active = shared + topk * expert
            seq = m.seq_ref
            out.append(replace(m, dense_params=shared, expert_params=experts * expert, active_params=active,
                               flops_lin=6.0 * active * seq, num_experts=experts))
    return out

