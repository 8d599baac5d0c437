"""Model types of the simulated fleet, in eight families.

Each model type is described by what the throughput law and the memory check need: parameter
counts (replicated, expert, embedding), training FLOPs per sample, activation memory and HBM
traffic per sample, random-access (gather) bytes per sample, depth and width. Quantities are
given at a reference input size (``seq_ref``: tokens, pixels per side, audio frames, lookups or
sampled neighbours) and scale with ``(seq / seq_ref) ** seq_exp`` (linear terms) or its square
(attention terms).

Named models (``resnet50``, ``bert-large``, ``tacotron2`` ...) use published sizes so that the
calibration can compare them with public measurements; the rest are generated on grids.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

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


def _fmt(p: float) -> str:
    if p >= 1e9:
        return f"{p / 1e9:.3g}b"
    return f"{p / 1e6:.3g}m"


def _transformer(
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
    return ModelType(
        name=name,
        family=family,
        params=params,
        dense_params=params,
        expert_params=0.0,
        emb_params=0.0,
        active_params=params,
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


def _dense_lms(rng: np.random.Generator) -> list[ModelType]:
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
                _transformer(
                    f"{prefix}-{_fmt(p)}",
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
            _transformer(
                name, "dense_lm", p, seq, nseqs, (1, 2, 4, 8, 16, 32), 1.0, 1.0, layers=layers, hidden=hidden
            )
        )
    return out


def _moes(rng: np.random.Generator) -> list[ModelType]:
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
            m = _transformer(
                f"moe-{experts}x{_fmt(base)}",
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
            out.append(
                ModelType(
                    **{
                        **m.__dict__,
                        "dense_params": shared,
                        "expert_params": experts * expert,
                        "active_params": active,
                        "flops_lin": 6.0 * active * seq,
                        "num_experts": experts,
                    }
                )
            )
    return out


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
    return ModelType(
        name=name,
        family="vision_cnn",
        params=mparams * 1e6,
        dense_params=mparams * 1e6,
        expert_params=0.0,
        emb_params=0.0,
        active_params=mparams * 1e6,
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


def _vision_cnns(rng: np.random.Generator) -> list[ModelType]:
    cls = (224, 256, 320)
    table = (
        # name, fwd GFLOPs at size, params (M), size, layers, depthwise
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
        for n, g, p, s, L, dw in table
    ]
    detection = (
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
    for n, g, p, s, sizes, L in detection:
        # detection/segmentation heads add irregular ops: lower efficiency than classifiers
        out.append(_cnn(n, g, p, s, sizes, L, False, 0.5, 0.75, (4, 8, 16, 32)))
    return out


def _vits(rng: np.random.Generator) -> list[ModelType]:
    out = []
    widths = (
        ("ti", 12, 192),
        ("s", 12, 384),
        ("b", 12, 768),
        ("l", 24, 1024),
        ("h", 32, 1280),
        ("g", 40, 1408),
        ("bigg", 48, 1664),
        ("e", 56, 1792),
    )
    for tag, layers, d in widths:
        for patch in (8, 14, 16, 32):
            if tag in ("g", "bigg", "e") and patch in (8, 32):
                continue
            params = 12.0 * layers * d * d
            size = 224
            tokens = (size // patch) ** 2 + 1
            pop = 1.0 if tag in ("b", "l") else 0.5
            out.append(
                ModelType(
                    name=f"vit-{tag}-{patch}",
                    family="vision_vit",
                    params=params,
                    dense_params=params,
                    expert_params=0.0,
                    emb_params=0.0,
                    active_params=params,
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
    for tag, layers, d in (("t", 12, 96 * 4), ("s", 24, 96 * 4), ("b", 24, 128 * 4), ("l", 24, 192 * 4)):
        params = 12.0 * layers * (d / 2) ** 2 * 1.5
        tokens = 3136  # windowed attention: quadratic cost only within 7x7 windows
        out.append(
            ModelType(
                name=f"swin-{tag}",
                family="vision_vit",
                params=params,
                dense_params=params,
                expert_params=0.0,
                emb_params=0.0,
                active_params=params,
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


def _diffusions(rng: np.random.Generator) -> list[ModelType]:
    out = []

    def add(
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
    ) -> None:
        fwd = gflops_fwd * 1e9
        out.append(
            ModelType(
                name=name,
                family="diffusion",
                params=params,
                dense_params=params,
                expert_params=0.0,
                emb_params=0.0,
                active_params=params,
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
        )

    add("sd15-unet", 8.6e8, 400, 512, (256, 512), 70, 1280, 0.2, 0.9, 1.0)
    add("sd2-unet", 8.65e8, 400, 512, (512, 768), 70, 1280, 0.2, 0.9, 1.0)
    add("sdxl-unet", 2.6e9, 1500, 1024, (512, 1024), 70, 1280, 0.25, 0.9, 0.8)
    add("flux-12b", 1.2e10, 12000, 1024, (512, 1024), 57, 3072, 0.3, 1.0, 0.4)
    for ch in (128, 192, 256, 320, 384):
        for depth in (2, 3):
            params = 1.3e8 * (ch / 192) ** 2 * depth / 2
            add(
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
            add(
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
    for frames in (8, 16):
        add(
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
        add(f"video-unet-1.5b-f{frames}", 1.5e9, 800 * frames / 8, 256, (256,), 60, 1280, 0.25, 0.8, 0.3)
    return out


def _recsys(rng: np.random.Generator) -> list[ModelType]:
    out = []
    kinds = (
        # kind, dense params, MLP FLOP multiplier, tables, dim, pooling, efficiency
        ("dlrm", 2.5e6, 1.0, 26, 128, 1, 1.0),
        ("dlrm-dcnv2", 8e6, 3.0, 26, 128, 1, 0.9),
        ("wide-deep", 1e6, 1.0, 40, 32, 1, 0.8),
        ("deepfm", 1.5e6, 1.5, 39, 16, 1, 0.8),
        ("two-tower", 2e7, 2.0, 12, 64, 20, 0.9),
        ("seq-rec", 5e7, 3.0, 8, 128, 50, 0.9),
    )
    for kind, dense, mult, tables, dim, pool, eff in kinds:
        for emb in (1e8, 1e9, 1e10, 5e10, 2e11):
            lookups = tables * pool
            out.append(
                ModelType(
                    name=f"{kind}-{_fmt(emb)}",
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
    # Gavel's autoencoder recommender (ML-20M): dense, no sharded tables.
    out.append(
        ModelType(
            name="autoencoder-rec",
            family="recsys",
            params=2.7e7,
            dense_params=2.7e7,
            expert_params=0.0,
            emb_params=0.0,
            active_params=2.7e7,
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
    )
    return out


def _speech(rng: np.random.Generator) -> list[ModelType]:
    out = []
    table = (
        # name, params, frames, layers, hidden, recurrent
        ("wav2vec2-base", 9.5e7, 500, 12, 768, False),
        ("wav2vec2-large", 3.17e8, 500, 24, 1024, False),
        ("hubert-large", 3.17e8, 500, 24, 1024, False),
        ("hubert-xlarge", 9.6e8, 500, 48, 1280, False),
        ("whisper-tiny", 3.9e7, 1500, 4, 384, False),
        ("whisper-base", 7.4e7, 1500, 6, 512, False),
        ("whisper-small", 2.44e8, 1500, 12, 768, False),
        ("whisper-medium", 7.69e8, 1500, 24, 1024, False),
        ("whisper-large", 1.55e9, 1500, 32, 1280, False),
        ("conformer-s", 1.0e7, 1000, 16, 144, False),
        ("conformer-m", 3.0e7, 1000, 16, 256, False),
        ("conformer-l", 1.2e8, 1000, 17, 512, False),
        ("conformer-xl", 6.0e8, 1000, 24, 1024, False),
        ("rnnt", 1.2e8, 1000, 8, 1024, True),
        ("deepspeech2", 8.6e7, 1000, 7, 1600, True),
        ("quartznet", 1.9e7, 1000, 15, 512, False),
        ("jasper", 3.33e8, 1000, 54, 1024, False),
        ("fastspeech2", 3.5e7, 800, 8, 256, False),
        ("hifigan", 1.4e7, 8192, 12, 512, False),
        ("tacotron2", 2.8e7, 800, 8, 512, True),
        ("waveglow", 8.8e7, 16000, 12, 512, False),
        ("encodec", 1.5e7, 24000, 8, 512, False),
        ("vits-tts", 3.6e7, 800, 12, 192, False),
        ("speecht5", 1.5e8, 800, 12, 768, False),
        ("wavlm-large", 3.17e8, 500, 24, 1024, False),
        ("mms-1b", 9.6e8, 500, 48, 1280, False),
        ("usm-2b", 2.0e9, 500, 32, 1536, False),
        ("seamless-m4t", 2.3e9, 800, 24, 2048, False),
        ("audiolm-1b", 1.0e9, 1500, 24, 1536, False),
        ("musicgen-1.5b", 1.5e9, 1500, 48, 1536, False),
    )
    for name, params, frames, layers, hidden, rnn in table:
        m = _transformer(
            name,
            "speech",
            params,
            frames,
            (frames // 2, frames, frames * 2),
            (4, 8, 16, 32, 64),
            (0.5 if rnn else 0.85) * float(rng.uniform(0.9, 1.1)),
            0.5,
            layers=layers,
            hidden=hidden,
            act_per_token=14.0,
        )
        if frames > 4000:
            # vocoders run convolutions over raw samples: FLOPs and activations per frame are small
            m = ModelType(
                **{
                    **m.__dict__,
                    "flops_lin": 2.0 * params * frames / 20,
                    "flops_quad": 0.0,
                    "act_bytes": m.act_bytes / 20,
                    "traffic_bytes": m.traffic_bytes / 20,
                }
            )
        out.append(m)
    return out


def _gnns(rng: np.random.Generator) -> list[ModelType]:
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
                ModelType(
                    name=f"{arch}-h{hidden}",
                    family="gnn",
                    params=params,
                    dense_params=params,
                    expert_params=0.0,
                    emb_params=0.0,
                    active_params=params,
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


@lru_cache(maxsize=1)
def model_types() -> tuple[ModelType, ...]:
    """Every model type, in a fixed order (independent of any fleet seed)."""
    rng = np.random.default_rng(20240611)
    models: list[ModelType] = []
    for build in (_dense_lms, _moes, _vision_cnns, _vits, _diffusions, _recsys, _speech, _gnns):
        models.extend(build(rng))
    names = [m.name for m in models]
    assert len(names) == len(set(names)), "duplicate model type names"
    return tuple(models)


def model_index() -> dict[str, int]:
    """Model type name -> position in :func:`model_types`."""
    return {m.name: i for i, m in enumerate(model_types())}
