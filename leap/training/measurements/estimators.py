"""The models a measurement table is scored with, behind one estimator contract, by name.

Contract (what :func:`leap.training.measurements.runner.run_protocol` calls): an object with

- ``fit(rows, y, groups)`` -> ``self``: model rows (:func:`features.rows.build_rows` columns),
  measured per-accelerator throughput and the job key of each row (a
  :class:`~predictor.models.ThroughputModel` whose ``fit`` has no ``groups`` is fitted without);
- ``predict(rows)`` -> per-accelerator samples/s, NaN where the model has no estimate.

The runner takes a mapping ``name -> factory`` (a callable with no arguments returning a fresh,
unfitted estimator), so any model in that shape runs on the same rows and splits.
:data:`REGISTRY` names the ones ``leap evaluate-measurements --models`` knows, each made from
the run's seed; :func:`register_model` adds one (e.g. an alternative of ``leap/training/alternatives``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, Self

import numpy as np

from features.rows import Rows
from leap.training.alternatives import ALTERNATIVES
from predictor.lgbm import LightGBMThroughput
from predictor.models import BASELINES, ThroughputModel


class Estimator(Protocol):
    """What the fold runner fits and asks for predictions."""

    def fit(self, rows: Rows, y: np.ndarray, groups: np.ndarray) -> Self: ...

    def predict(self, rows: Rows) -> np.ndarray: ...


#: A fresh, unfitted model per call. A :class:`~predictor.models.ThroughputModel` whose ``fit``
#: takes no groups (the baselines) is accepted as it is: the runner fits it without them.
ModelFactory = Callable[[], Estimator | ThroughputModel]

class ServedModel:
    """The served model, :class:`predictor.lgbm.LightGBMThroughput`, fitted as ``leap train`` fits it.

    ``fit`` is :func:`leap.training.train.fit_model`'s ``LightGBMThroughput(**params).fit(rows, y,
    job_key)`` with the default parameters and the run's seed; the model itself adapts to a small
    training set (:func:`predictor.boosting.size_for`).
    """

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.params_: dict[str, Any] = {}
        self.model_: LightGBMThroughput | None = None

    def fit(self, rows: Rows, y: np.ndarray, groups: np.ndarray, new_type_rows: Rows | None = None) -> Self:
        self.params_ = {"seed": self.seed}
        self.model_ = LightGBMThroughput(**self.params_).fit(rows, y, groups, new_type_rows=new_type_rows)
        return self

    def predict(self, rows: Rows) -> np.ndarray:
        if self.model_ is None:
            raise RuntimeError("model is not fitted")
        return self.model_.predict(rows)

    def predict_band(self, pred: np.ndarray, rows: Rows) -> tuple[np.ndarray, np.ndarray]:
        """The served model's 80 % band around ``pred`` (:meth:`LightGBMThroughput.predict_band`)."""
        if self.model_ is None:
            raise RuntimeError("model is not fitted")
        return self.model_.predict_band(pred, rows)


def _baseline(cls: type[ThroughputModel]) -> Callable[[int], ThroughputModel]:
    # Baselines learn nothing from a seed; the runner fits them without groups (their fit has none).
    return lambda seed: cls()


#: name -> (seed -> unfitted estimator). ``lightgbm`` is the served model; the baselines are
#: every model of :data:`predictor.models.BASELINES` under its own name; then the old pairwise
#: model and every alternative of :data:`leap.training.alternatives.ALTERNATIVES` (ridge, kNN, ...;
#: a name this registry already has keeps its definition here).
REGISTRY: dict[str, Callable[[int], Estimator | ThroughputModel]] = {
    "lightgbm": ServedModel,
    **{name: _baseline(cls) for name, cls in BASELINES.items()},
}
REGISTRY.update({name: make for name, make in ALTERNATIVES.items() if name not in REGISTRY})
#: What ``--models`` means by default: the served model, every baseline and the old pairwise model.
DEFAULT_MODELS: tuple[str, ...] = ("lightgbm", *BASELINES, "pairwise_lightgbm")


def register_model(name: str, make: Callable[[int], Estimator | ThroughputModel], replace: bool = False) -> None:
    """Add a model to :data:`REGISTRY` (``make`` takes the run's seed and returns an unfitted estimator)."""
    if name in REGISTRY and not replace:
        raise ValueError(f"a model named {name!r} is registered already")
    REGISTRY[name] = make


def resolve_models(names: Sequence[str] | str, seed: int = 0) -> dict[str, ModelFactory]:
    """Factories for the named models, in the order given; ``all`` means every registered model.

    Raises
    ------
    ValueError
        An empty list or a name that is not registered; the message lists the known names.
    """
    wanted = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    if wanted == ["all"]:
        wanted = list(REGISTRY)
    if not wanted:
        raise ValueError(f"no model named; known: {', '.join(REGISTRY)} (or all)")
    unknown = [n for n in wanted if n not in REGISTRY]
    if unknown:
        raise ValueError(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(REGISTRY)} (or all)")
    return {n: _bind(REGISTRY[n], seed) for n in dict.fromkeys(wanted)}


def _bind(make: Callable[[int], Estimator | ThroughputModel], seed: int) -> ModelFactory:
    return lambda: make(seed)

