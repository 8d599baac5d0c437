"""Vision models: convolutional networks (``vision_cnn``) and vision transformers (``vision_vit``)."""

from __future__ import annotations

import numpy as np

from leap.fleet.workloads.base import ModelType, dense_model


def _cnn(
    name: str,
    gflops: float,
    mparams: float,
    size: int,
    sizes: tuple[int, ...],
    layers: int,
    depthwise: bool,
    pop: float,
    eff: float,
    batches: tuple[int, ...] = (16, 32, 64, 128, 256),
) -> ModelType:
    fwd = gflops * 1e9
    # CNN training moves a lot of activation bytes per FLOP (BN, ReLU, depthwise convs), which is
    # why measured CNN speed-ups track memory bandwidth more than peak FLOP/s.
    traffic = fwd * (0.45 if depthwise else 0.15)
    return dense_model(
        name=name,
        family="vision_cnn",
        params=mparams * 1e6,
        layers=layers,
        hidden=256,
        seq_ref=size,
        seq_exp=2.0,
        seq_choices=sizes,
        flops_lin=3.0 * fwd,
        flops_quad=0.0,
        act_bytes=fwd * 0.012,
        traffic_bytes=traffic,
        gather_bytes=0.0,
        local_batches=batches,
        arch_eff=eff,
        popularity=pop,
    )

#: Image classifiers: name, forward GFLOPs at size, params (M), size, layers, depthwise.
_CLASSIFIERS: tuple[tuple[str, float, float, int, int, bool], ...] = (
    ("resnet18", 1.82, 11.7, 224, 18, False),
    ("resnet34", 3.67, 21.8, 224, 34, False),
    ("resnet50", 4.1, 25.6, 224, 50, False),
    ("resnet101", 7.8, 44.5, 224, 101, False),
    ("resnet152", 11.5, 60.2, 224, 152, False),
    ("wide-resnet50", 11.4, 68.9, 224, 50, False),
    ("resnext50", 4.3, 25.0, 224, 50, False),
    ("resnext101", 16.5, 88.8, 224, 101, False),
    ("vgg16", 15.5, 138.0, 224, 16, False),
    ("vgg19", 19.6, 143.7, 224, 19, False),
    ("densenet121", 2.9, 8.0, 224, 121, False),
    ("densenet169", 3.4, 14.1, 224, 169, False),
    ("densenet201", 4.3, 20.0, 224, 201, False),
    ("inception-v3", 5.7, 27.2, 299, 48, False),
    ("mobilenet-v2", 0.3, 3.5, 224, 53, True),
    ("mobilenet-v3-large", 0.22, 5.5, 224, 60, True),
    ("efficientnet-b0", 0.39, 5.3, 224, 82, True),
    ("efficientnet-b1", 0.7, 7.8, 240, 116, True),
    ("efficientnet-b2", 1.0, 9.2, 260, 116, True),
    ("efficientnet-b3", 1.8, 12.0, 300, 131, True),
    ("efficientnet-b4", 4.2, 19.0, 380, 161, True),
    ("efficientnet-b5", 9.9, 30.0, 456, 194, True),
    ("efficientnet-b6", 19.0, 43.0, 528, 224, True),
    ("efficientnet-b7", 37.0, 66.0, 600, 271, True),
    ("convnext-tiny", 4.5, 28.6, 224, 18, True),
    ("convnext-small", 8.7, 50.2, 224, 36, True),
    ("convnext-base", 15.4, 88.6, 224, 36, True),
    ("convnext-large", 34.4, 197.8, 224, 36, True),
    ("regnety-4gf", 4.0, 20.6, 224, 22, False),
    ("regnety-16gf", 16.0, 83.6, 224, 18, False),
    ("regnety-32gf", 32.3, 145.0, 224, 20, False),
    ("resnet18-cifar", 0.56, 11.2, 32, 18, False),
    ("resnet50-cifar", 1.3, 23.5, 32, 50, False),
)

#: Detection, segmentation and image-to-image models: name, forward GFLOPs at size, params (M),
#: size, sizes, layers.
_DETECTORS: tuple[tuple[str, float, float, int, tuple[int, ...], int], ...] = (
    ("ssd300", 20.0, 24.0, 300, (300,), 50),
    ("retinanet-r50", 150.0, 34.0, 800, (640, 800), 50),
    ("maskrcnn-r50", 250.0, 44.0, 800, (800, 1024), 50),
    ("fasterrcnn-r50", 180.0, 41.0, 800, (800,), 50),
    ("yolov5s", 16.5, 7.2, 640, (512, 640), 60),
    ("yolov5l", 109.0, 46.0, 640, (640, 1280), 80),
    ("unet-seg", 50.0, 31.0, 256, (256, 512), 23),
    ("deeplabv3-r50", 178.0, 42.0, 512, (512, 768), 50),
    ("cyclegan", 56.0, 28.0, 256, (256,), 24),
)


def vision_cnns(rng: np.random.Generator) -> list[ModelType]:
    """The ``vision_cnn`` family: published classifiers, then detection and segmentation models."""
    cls = (224, 256, 320)
    out = [
        _cnn(
            n,
            g,
            p,
            s,
            (32,) if s == 32 else (s, *(c for c in cls if c != s)),
            L,
            dw,
            1.0 if n.startswith("resnet") else 0.6,
            float(rng.uniform(0.9, 1.1)) if dw is False else 0.8,
        )
        for n, g, p, s, L, dw in _CLASSIFIERS
    ]
    for n, g, p, s, sizes, L in _DETECTORS:
        # detection/segmentation heads add irregular ops: lower efficiency than classifiers
        out.append(_cnn(n, g, p, s, sizes, L, False, 0.5, 0.75, (4, 8, 16, 32)))
    return out

#: ViT sizes: tag, layers, width.
_VIT_WIDTHS: tuple[tuple[str, int, int], ...] = (
    ("ti", 12, 192),
    ("s", 12, 384),
    ("b", 12, 768),
    ("l", 24, 1024),
    ("h", 32, 1280),
    ("g", 40, 1408),
    ("bigg", 48, 1664),
    ("e", 56, 1792),
)


def vits(rng: np.random.Generator) -> list[ModelType]:
    """The ``vision_vit`` family: plain ViTs on a grid of sizes and patches, then Swin."""
    return _plain_vits(rng) + _swins()


def _plain_vits(rng: np.random.Generator) -> list[ModelType]:
    out = []
    for tag, layers, d in _VIT_WIDTHS:
        for patch in (8, 14, 16, 32):
            if tag in ("g", "bigg", "e") and patch in (8, 32):
                continue
            params = 12.0 * layers * d * d
            size = 224
            tokens = (size // patch) ** 2 + 1
            pop = 1.0 if tag in ("b", "l") else 0.5
            out.append(
                dense_model(
                    name=f"vit-{tag}-{patch}",
                    family="vision_vit",
                    params=params,
                    layers=layers,
                    hidden=d,
                    seq_ref=size,
                    seq_exp=2.0,
                    seq_choices=(224, 256, 384),
                    flops_lin=6.0 * params * tokens,
                    flops_quad=12.0 * layers * d * tokens * tokens,
                    act_bytes=12.0 * tokens * d * layers,
                    traffic_bytes=24.0 * tokens * d * layers,
                    gather_bytes=0.0,
                    local_batches=(16, 32, 64, 128, 256),
                    arch_eff=float(rng.uniform(0.9, 1.1)),
                    popularity=pop,
                )
            )
    return out


def _swins() -> list[ModelType]:
    out = []
    for tag, layers, d in (("t", 12, 96 * 4), ("s", 24, 96 * 4), ("b", 24, 128 * 4), ("l", 24, 192 * 4)):
        params = 12.0 * layers * (d / 2) ** 2 * 1.5
        tokens = 3136  # windowed attention: quadratic cost only within 7x7 windows
        out.append(
            dense_model(
                name=f"swin-{tag}",
                family="vision_vit",
                params=params,
                layers=layers,
                hidden=d,
                seq_ref=224,
                seq_exp=2.0,
                seq_choices=(224, 384),
                flops_lin=6.0 * params * tokens / 4,
                flops_quad=12.0 * layers * d * tokens * 49,
                act_bytes=6.0 * tokens * d * layers,
                traffic_bytes=14.0 * tokens * d * layers,
                gather_bytes=0.0,
                local_batches=(16, 32, 64, 128),
                arch_eff=0.8,
                popularity=0.6,
            )
        )
    return out
