"""Model types of the simulated fleet, in eight families.

Each model type is described by what the throughput law and the memory check need: parameter
counts (replicated, expert, embedding), training FLOPs per sample, activation memory and HBM
traffic per sample, random-access (gather) bytes per sample, depth and width. Quantities are
given at a reference input size (``seq_ref``: tokens, pixels per side, audio frames, lookups or
sampled neighbours) and scale with ``(seq / seq_ref) ** seq_exp`` (linear terms) or its square
(attention terms).

Named models (``resnet50``, ``bert-large``, ``tacotron2`` ...) use published sizes so that the
calibration can compare them with public measurements; the rest are generated on grids.

Each family is built in its own module (:mod:`leap.fleet.workloads.language`, ``vision``,
``diffusion``, ``recsys``, ``speech``, ``gnn``) on :mod:`leap.fleet.workloads.base`. They draw their
random efficiencies from one generator in the order of :data:`FAMILIES`, so the list (and every
number in it) depends on that order.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from leap.fleet.workloads.base import FAMILIES, ModelType
from leap.fleet.workloads.diffusion import diffusions
from leap.fleet.workloads.gnn import gnns
from leap.fleet.workloads.language import dense_lms, moes
from leap.fleet.workloads.recsys import recsys_models
from leap.fleet.workloads.speech import speech_models
from leap.fleet.workloads.vision import vision_cnns, vits

__all__ = ["FAMILIES", "ModelType", "model_index", "model_types"]

#: One builder per family, in the order of FAMILIES (the order of the random draws).
_BUILDERS = (dense_lms, moes, vision_cnns, vits, diffusions, recsys_models, speech_models, gnns)


@lru_cache(maxsize=1)
def model_types() -> tuple[ModelType, ...]:
    """Every model type, in a fixed order (independent of any fleet seed)."""
    rng = np.random.default_rng(20240611)
    models: list[ModelType] = []
    for build in _BUILDERS:
        models.extend(build(rng))
    names = [m.name for m in models]
    assert len(names) == len(set(names)), "duplicate model type names"
    return tuple(models)


def model_index() -> dict[str, int]:
    """Model type name -> position in :func:`model_types`."""
    return {m.name: i for i, m in enumerate(model_types())}
