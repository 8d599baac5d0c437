"""Score the served model and its rivals on a public measurement table, converted to LEAP history.

A measurement table (CSV) has one row per (workload, configuration, hardware) with the columns
``workload, hardware, num_accelerators, global_batch_size, throughput`` and optionally
``precision, seq_len, params, suite, family, framework``. A *configuration* is workload + global
batch + accelerator count (+ precision when present), whatever the suite; a *job* is a
configuration within one suite (a software release, an MLPerf round).

The table becomes history (:mod:`~leap.training.measurements.history`): one job per configuration and suite,
one completed attempt per measurement, in a seeded random order. The question is the one LEAP
answers at submission time: how fast will this attempt run on each candidate, given the job's own
earlier attempts? Two protocols hold jobs out:

``config_fold``
    configurations in 5 folds (seeded), every suite of one configuration in the same fold;
``leave_one_workload_out``
    each workload (across suites) in turn: fixed folds, the same for every fold seed.

Per fold the models are fitted on the training jobs' point-in-time examples (the rows
``leap train`` fits on) and predict the held-out jobs' attempts, each job seeing only its own
past plus the training jobs' aggregates (:func:`leap.training.held_out.build_held_out_examples`).
The served model (``lightgbm``, :class:`predictor.lgbm.LightGBMThroughput`), the baselines
(``lookup``, ``transfer``) and any registered alternative run on identical rows.

Modules, each importing only those before it:

:mod:`~leap.training.measurements.table`
    reading and validating the CSV (:func:`load_table`, :class:`Table`).
:mod:`~leap.training.measurements.pairs`
    configurations and the protocols' folds.
:mod:`~leap.training.measurements.history`
    the table as history (:func:`to_history`) and as an archive folder (:func:`write_history`).
:mod:`~leap.training.measurements.estimators`
    the estimator contract, the served model's parameters, the registry of models by name.
:mod:`~leap.training.measurements.runner`
    the fold runner and the scores (:func:`run_protocol`).
:mod:`~leap.training.measurements.protocol`
    :func:`evaluate`: the report of one table.
:mod:`~leap.training.measurements.command`
    ``leap evaluate-measurements``.
"""

from leap.training.measurements.command import app, evaluate_measurements_cmd
from leap.training.measurements.estimators import (
    DEFAULT_MODELS,
    REGISTRY,
    Estimator,
    ModelFactory,
    ServedModel,
    register_model,
    resolve_models,
)
from leap.training.measurements.history import TableHistory, to_history, write_history
from leap.training.measurements.pairs import N_FOLDS, PROTOCOLS, configuration_ids, folds, job_ids
from leap.training.measurements.protocol import evaluate, load_history
from leap.training.measurements.runner import PRIMARY, Fold, make_fold, run_protocol, score_model
from leap.training.measurements.table import (
    OPTIONAL_NUMERIC,
    OPTIONAL_TEXT,
    REQUIRED_COLUMNS,
    FloatArray,
    IntArray,
    MeasurementError,
    Table,
    load_table,
)

__all__ = [
    "DEFAULT_MODELS",
    "N_FOLDS",
    "OPTIONAL_NUMERIC",
    "OPTIONAL_TEXT",
    "PRIMARY",
    "PROTOCOLS",
    "REGISTRY",
    "REQUIRED_COLUMNS",
    "Estimator",
    "FloatArray",
    "Fold",
    "IntArray",
    "MeasurementError",
    "ModelFactory",
    "ServedModel",
    "Table",
    "TableHistory",
    "app",
    "configuration_ids",
    "evaluate",
    "evaluate_measurements_cmd",
    "folds",
    "job_ids",
    "load_history",
    "load_table",
    "make_fold",
    "register_model",
    "resolve_models",
    "run_protocol",
    "score_model",
    "to_history",
    "write_history",
]
