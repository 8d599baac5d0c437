"""Diffusion models (``diffusion``): U-Nets, diffusion transformers and video models."""

from __future__ import annotations

import numpy as np

from leap.fleet.workloads.base import ModelType, dense_model


def _diffusion(
    name: str,
    params: float,
    gflops_fwd: float,
    size: int,
    sizes: tuple[int, ...],
    layers: int,
    hidden: int,
    attn_share: float,
    eff: float,
    pop: float,
) -> ModelType:
    """A denoiser with ``gflops_fwd`` forward GFLOPs per image at ``size``, ``attn_share`` of them
    in attention (quadratic in the latent's side)."""
    fwd = gflops_fwd * 1e9
    return dense_model(
        name=name,
        family="diffusion",
        params=params,
        layers=layers,
        hidden=hidden,
        seq_ref=size,
        seq_exp=2.0,
        seq_choices=sizes,
        flops_lin=3.0 * fwd * (1 - attn_share),
        flops_quad=3.0 * fwd * attn_share,
        act_bytes=fwd * 0.02,
        traffic_bytes=fwd * 0.08,
        gather_bytes=0.0,
        local_batches=(1, 2, 4, 8, 16, 32),
        arch_eff=eff,
        popularity=pop,
    )


def diffusions(rng: np.random.Generator) -> list[ModelType]:
    """The ``diffusion`` family: published U-Nets, a U-Net grid, DiTs, then video models."""
    return _published() + _unet_grid(rng) + _dits(rng) + _videos()


def _published() -> list[ModelType]:
    return [
        _diffusion("sd15-unet", 8.6e8, 400, 512, (256, 512), 70, 1280, 0.2, 0.9, 1.0),
        _diffusion("sd2-unet", 8.65e8, 400, 512, (512, 768), 70, 1280, 0.2, 0.9, 1.0),
        _diffusion("sdxl-unet", 2.6e9, 1500, 1024, (512, 1024), 70, 1280, 0.25, 0.9, 0.8),
        _diffusion("flux-12b", 1.2e10, 12000, 1024, (512, 1024), 57, 3072, 0.3, 1.0, 0.4),
    ]


def _unet_grid(rng: np.random.Generator) -> list[ModelType]:
    out = []
    for ch in (128, 192, 256, 320, 384):
        for depth in (2, 3):
            params = 1.3e8 * (ch / 192) ** 2 * depth / 2
            out.append(
                _diffusion(
                    f"unet-c{ch}-d{depth}",
                    params,
                    params * 450 / 8.6e8 * 1.2,
                    256,
                    (128, 256, 512),
                    20 * depth,
                    ch * 4,
                    0.15,
                    float(rng.uniform(0.8, 1.0)),
                    0.5,
                )
            )
    return out


def _dits(rng: np.random.Generator) -> list[ModelType]:
    out = []
    for tag, layers, d in (
        ("s", 12, 384),
        ("b", 12, 768),
        ("l", 24, 1024),
        ("xl", 28, 1152),
        ("xxl", 40, 2048),
        ("3b", 32, 2816),
        ("8b", 40, 4096),
    ):
        for patch in (2, 4):
            params = 12.0 * layers * d * d
            tokens = (256 // 8 // patch) ** 2
            fwd = (2 * params * tokens + 4 * layers * d * tokens * tokens) / 1e9
            out.append(
                _diffusion(
                    f"dit-{tag}-{patch}",
                    params,
                    fwd,
                    256,
                    (256, 512),
                    layers,
                    d,
                    (4 * layers * d * tokens * tokens / 1e9) / fwd,
                    float(rng.uniform(0.9, 1.1)),
                    0.4,
                )
            )
    return out


def _videos() -> list[ModelType]:
    out = []
    for frames in (8, 16):
        out.append(
            _diffusion(
                f"video-dit-2b-f{frames}",
                2e9,
                2 * 2e9 * 1024 * frames / 1e9,
                256,
                (256,),
                32,
                2048,
                0.35,
                0.85,
                0.3,
            )
        )
        out.append(
            _diffusion(f"video-unet-1.5b-f{frames}", 1.5e9, 800 * frames / 8, 256, (256,), 60, 1280, 0.25, 0.8, 0.3)
        )
    return out
