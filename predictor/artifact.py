"""A fitted :class:`predictor.lgbm.LightGBMThroughput` as JSON-able state and back (no pickle).

The boosters travel as LightGBM's text models beside the state (``model_texts``, saved by
:class:`predictor.registry.Registry`); everything else the model learned is here. Keys added
later are read with defaults, so artifacts saved before them still load.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import lightgbm as lgb
import numpy as np

from predictor.boosting import CATEGORY_SETTINGS, SMALL_SIZE
from predictor.calibration import EVIDENCE
from predictor.learned_roofline import LearnedRoofline
from predictor.selector import PREFIX

if TYPE_CHECKING:
    from predictor.lgbm import LightGBMThroughput


def artifact_state(model: LightGBMThroughput) -> dict[str, Any]:
    """What the model learned besides its boosters, as JSON-able data."""
    return {
        "params": model.get_params(), "features": model.features_, "vocab": model.vocab_,
        "band_by_evidence": {k: list(v) for k, v in model.band_by_evidence_.items()},
        "trust_by_evidence": dict(model.trust_by_evidence_), "size": model.size_,
        "trust_new_type": dict(model.trust_new_type_), "gate": dict(model.gate_),
        "gate_new_type": dict(model.gate_new_type_), "model_types": sorted(model.model_types_),
        "band_new_type": {k: list(v) for k, v in model.band_new_type_.items()}, "categories": model.categories_,
        # JSON has no infinity: None means the base model's ratio alone
        "blend_k": model.blend_k_ if np.isfinite(model.blend_k_) else None,
        "blend_k_new_type": model.blend_k_new_type_ if np.isfinite(model.blend_k_new_type_) else None,
        "base_features": model.base_features_, "hardware_specs": model.hardware_specs_,
        "roofline": model.roofline_.state() if model.roofline_ is not None else None,
    }


def load_artifact(model: LightGBMThroughput, state: dict[str, Any], texts: dict[str, str]) -> LightGBMThroughput:
    """``model`` (constructed with the state's parameters) with the learned state and boosters put back."""
    model.features_ = list(state["features"])
    model.vocab_ = {c: dict(v) for c, v in state["vocab"].items()}
    model.band_by_evidence_ = {k: (float(v[0]), float(v[1])) for k, v in state["band_by_evidence"].items()}
    model.trust_by_evidence_ = {k: float(v) for k, v in state.get("trust_by_evidence", {}).items()}
    model.blend_k_ = float(state["blend_k"]) if state.get("blend_k") is not None else float("inf")
    model.blend_k_new_type_ = float(state["blend_k_new_type"]) if state.get("blend_k_new_type") is not None \
        else float("inf")
    model.trust_new_type_ = {k: float(v) for k, v in state.get("trust_new_type", {}).items()}
    # Artifacts from before the gate served the model everywhere.
    model.gate_ = {k: bool(v) for k, v in state.get("gate", dict.fromkeys(EVIDENCE, True)).items()}
    model.gate_new_type_ = {k: bool(v) for k, v in state.get("gate_new_type", dict.fromkeys(EVIDENCE, True)).items()}
    model.model_types_ = set(state.get("model_types", model.vocab_.get("model_type", {})))
    model.band_new_type_ = {k: (float(v[0]), float(v[1])) for k, v in state.get("band_new_type", {}).items()}
    model.size_ = dict(state.get("size", {})) or {name: getattr(model, name) for name in SMALL_SIZE}
    model.categories_ = dict(state.get("categories", CATEGORY_SETTINGS))
    model.base_features_ = list(state.get("base_features", []))
    model.hardware_specs_ = {h: dict(v) for h, v in state.get("hardware_specs", {}).items()}
    boosters = {name: lgb.Booster(model_str=text) for name, text in texts.items()}
    model.booster_, model.base_ = boosters["main"], boosters.get("base")
    model.selectors_ = {name: b for name, b in boosters.items() if name.startswith(PREFIX)}
    roofline = state.get("roofline")
    model.roofline_ = LearnedRoofline.from_state(roofline) if roofline else None
    return model
