"""Speech and audio models (``speech``): recognisers, synthesisers and vocoders."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from leap.fleet.workloads.base import ModelType, transformer

#: Published models: name, params, frames, layers, hidden, recurrent.
_SPEECH: tuple[tuple[str, float, int, int, int, bool], ...] = (
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


def speech_models(rng: np.random.Generator) -> list[ModelType]:
    """The ``speech`` family: transformer-shaped recognisers and synthesisers; vocoders scaled down."""
    out = []
    for name, params, frames, layers, hidden, rnn in _SPEECH:
        m = transformer(
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
            m = replace(m, flops_lin=2.0 * params * frames / 20, flops_quad=0.0, act_bytes=m.act_bytes / 20,
                        traffic_bytes=m.traffic_bytes / 20)
        out.append(m)
    return out

