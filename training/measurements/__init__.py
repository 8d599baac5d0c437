"""Evaluate LEAP's predictor and its baselines on a public measurement table.

A measurement table (CSV) has one row per (workload, configuration, hardware) with the columns
``workload, hardware, num_accelerators, global_batch_size, throughput`` and optionally
``precision, seq_len, params, suite``. A *configuration* is workload + global batch +
accelerator count (+ precision, + suite when present); rows of different suites (software
stacks) are never paired.

The question asked is the one LEAP answers at submission time: a job measured on hardware *a*
(its prior throughput) -- how fast will it run on hardware *h*? Every row on *h* whose
configuration was also measured on another hardware *a* yields one (prior, target) pair per *a*.
Two protocols hold data out:

``config_fold``
    configurations in 5 folds (seeded); a fold's pairs are predicted by models fitted on the pairs
    and rows of the other folds.
``leave_one_workload_out``
    the same with each workload (across suites) held out in turn.

Three models run on the same pairs: ``lightgbm``, ``lookup`` (median of the workload on *h*) and
``transfer`` (prior x median ratio *h*/*a*). Metrics come from :mod:`core.accuracy`.

Modules, each importing only those before it:

:mod:`~training.measurements.table`
    reading and validating the CSV (:func:`load_table`, :class:`Table`).
:mod:`~training.measurements.pairs`
    configurations, (prior, target) pairs and the protocols' folds.
:mod:`~training.measurements.baselines`
    the ``lookup`` and ``transfer`` baselines.
:mod:`~training.measurements.feature_space`
    the pairwise LightGBM's features.
:mod:`~training.measurements.lgbm`
    the pairwise LightGBM and its blend with ``transfer`` for workloads it has not seen.
:mod:`~training.measurements.protocol`
    every model on every fold, and :func:`evaluate` (the report of one table).
:mod:`~training.measurements.command`
    ``leap evaluate-measurements``.
"""

from training.measurements.baselines import predict_lookup, predict_transfer, transfer_ratios
from training.measurements.command import app, evaluate_measurements_cmd
from training.measurements.feature_space import FeatureSpace
from training.measurements.lgbm import (
    DEFAULT_EXCLUDE,
    DEFAULT_TARGET,
    LGB_PARAMS,
    LGB_ROUNDS,
    TARGETS,
    fit_predict,
    new_workload_trust,
    predict_lightgbm,
)
from training.measurements.pairs import N_FOLDS, PROTOCOLS, Pairs, build_pairs, config_ids, folds
from training.measurements.protocol import MODELS, evaluate, fold_predictions, run_protocol
from training.measurements.table import (
    OPTIONAL_NUMERIC,
    REQUIRED_COLUMNS,
    FloatArray,
    IntArray,
    MeasurementError,
    Table,
    load_table,
)

__all__ = [
    "DEFAULT_EXCLUDE",
    "DEFAULT_TARGET",
    "LGB_PARAMS",
    "LGB_ROUNDS",
    "MODELS",
    "N_FOLDS",
    "OPTIONAL_NUMERIC",
    "PROTOCOLS",
    "REQUIRED_COLUMNS",
    "TARGETS",
    "FeatureSpace",
    "FloatArray",
    "IntArray",
    "MeasurementError",
    "Pairs",
    "Table",
    "app",
    "build_pairs",
    "config_ids",
    "evaluate",
    "evaluate_measurements_cmd",
    "fit_predict",
    "fold_predictions",
    "folds",
    "load_table",
    "new_workload_trust",
    "predict_lightgbm",
    "predict_lookup",
    "predict_transfer",
    "run_protocol",
    "transfer_ratios",
]
