"""Alternative throughput models, each under the estimator contract, scored side by side.

Every model here follows :class:`predictor.models.ThroughputModel`'s contract: constructors only
store parameters, ``fit(rows, y[, groups])`` returns ``self``, learned state ends in ``_``, and
``predict(rows)`` gives per-accelerator samples/s (NaN where the model has no estimate).
``leap alternatives`` (:mod:`leap.training.alternatives.command`) runs them on identical rows and
splits: the simulator backtest and every public measurement table.

:data:`ALTERNATIVES` maps each name to a factory ``(seed=0) -> unfitted model``:

``lightgbm``
    the served model, :class:`predictor.lgbm.LightGBMThroughput` with ``leap train``'s parameters
    (:func:`leap.training.train.fit_model`: the class defaults, fitted with the job keys as groups);
``lookup``, ``transfer`` (and every other baseline of :data:`predictor.models.BASELINES`)
    the baselines, which learn nothing but their band;
``ridge``, ``knn``, ``random_forest``, ``mlp``
    scikit-learn learners of the correction to the served model's anchor
    (:mod:`leap.training.alternatives.sklearn_models`, preprocessing in
    :mod:`leap.training.alternatives.preprocess`); scikit-learn comes with the ``eval`` extra;
``lightgbm_plain``
    LightGBM on the log prior, both hardware identities, log batch and log accelerators only
    (:mod:`leap.training.alternatives.plain`);
``pairwise_lightgbm``
    the pairwise LightGBM ``leap evaluate-measurements`` scored before the served model
    (:mod:`leap.training.alternatives.pairwise`; no estimate for a row without a prior elsewhere);
``lm_frozen``, ``lm_finetuned``
    MiniLM regressors on the configuration rendered as text
    (:mod:`leap.training.alternatives.language`, imported only when one is made).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from features.rows import Rows
from leap.training.alternatives.pairwise import PairwiseLightGBM
from leap.training.alternatives.plain import PlainLightGBM
from leap.training.alternatives.sklearn_models import ForestThroughput, KNNThroughput, MLPThroughput, RidgeThroughput
from predictor.lgbm import LightGBMThroughput
from predictor.models import BASELINES, ThroughputModel

#: ``(seed) -> unfitted model``; the seed defaults to 0, so ``factory()`` works too.
Factory = Callable[..., ThroughputModel | PairwiseLightGBM]


class AlternativeUnavailable(RuntimeError):
    """A registered model that cannot be made here (its module or its dependencies are missing)."""


def _language(class_name: str, name: str) -> Factory:
    """A factory of a language-model regressor, importing its module only when called.

    The module needs the ``lm`` extra's packages; the registry must import without them.
    """

    def make(seed: int = 0) -> ThroughputModel:
        try:
            module = importlib.import_module("leap.training.alternatives.language")
        except ImportError as exc:
            missing = getattr(exc, "name", None) or str(exc)
            if missing == "leap.training.alternatives.language":
                raise AlternativeUnavailable(
                    f"{name}: leap/training/alternatives/language.py is not there yet (the language-model "
                    "regressors are built separately); run the other models with --models") from None
            raise AlternativeUnavailable(
                f"{name}: the language-model regressors need the 'lm' extra ({missing} is missing); "
                "install it with: .venv/bin/pip install -e '.[lm]'") from exc
        cls = getattr(module, class_name, None)
        if cls is None:
            raise AlternativeUnavailable(f"{name}: leap.training.alternatives.language has no {class_name}")
        model: ThroughputModel = cls(seed=seed)
        return model

    return make


def _baseline(cls: type[ThroughputModel]) -> Factory:
    # Baselines learn nothing from a seed; the factory takes one so every factory is called alike.
    return lambda seed=0: cls()


ALTERNATIVES: dict[str, Factory] = {
    "lightgbm": lambda seed=0: LightGBMThroughput(seed=seed),
    **{name: _baseline(cls) for name, cls in BASELINES.items()},
    "ridge": lambda seed=0: RidgeThroughput(seed=seed),
    "knn": lambda seed=0: KNNThroughput(seed=seed),
    "random_forest": lambda seed=0: ForestThroughput(seed=seed),
    "mlp": lambda seed=0: MLPThroughput(seed=seed),
    "lightgbm_plain": lambda seed=0: PlainLightGBM(seed=seed),
    "pairwise_lightgbm": lambda seed=0: PairwiseLightGBM(seed=seed),
    "lm_frozen": _language("FrozenMiniLM", "lm_frozen"),
    "lm_finetuned": _language("FineTunedMiniLM", "lm_finetuned"),
}
#: The names ``--models all`` runs, in report order (the served model first).
NAMES: tuple[str, ...] = tuple(ALTERNATIVES)


def resolve(names: str | None) -> list[str]:
    """Model names from a comma-separated list (None or ``all``: every one), checked.

    Raises
    ------
    ValueError
        An empty list or an unknown name; the message lists the known ones.
    """
    if names is None or names.strip() == "all":
        return list(NAMES)
    wanted = list(dict.fromkeys(n.strip() for n in names.split(",") if n.strip()))
    if not wanted:
        raise ValueError(f"no model named; known: {', '.join(NAMES)} (or all)")
    unknown = [n for n in wanted if n not in ALTERNATIVES]
    if unknown:
        raise ValueError(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(NAMES)} (or all)")
    return wanted


def fit(model: Any, rows: Rows, y: np.ndarray, groups: np.ndarray | None) -> Any:
    """``model.fit(rows, y, groups)``, or ``model.fit(rows, y)`` for a model that takes no groups.

    The contract's ``groups`` (job keys) is optional: the served model uses them, the baselines
    do not accept them.
    """
    if groups is not None and "groups" in inspect.signature(model.fit).parameters:
        return model.fit(rows, y, groups)
    return model.fit(rows, y)


__all__ = [
    "ALTERNATIVES",
    "NAMES",
    "AlternativeUnavailable",
    "Factory",
    "ForestThroughput",
    "KNNThroughput",
    "MLPThroughput",
    "PairwiseLightGBM",
    "PlainLightGBM",
    "RidgeThroughput",
    "fit",
    "resolve",
]
