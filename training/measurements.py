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
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any

import lightgbm as lgb
import numpy as np
import numpy.typing as npt
import orjson
import typer

from core.accuracy import best_weight, summary
from core.hardware import SPEC_FEATURES, Catalogue, load_catalogue

REQUIRED_COLUMNS = ("workload", "hardware", "num_accelerators", "global_batch_size", "throughput")
OPTIONAL_NUMERIC = ("params", "seq_len")
N_FOLDS = 5
MODELS = ("lightgbm", "lookup", "transfer")
PROTOCOLS = ("config_fold", "leave_one_workload_out")

#: Small and deterministic: the tables have hundreds to a few thousand pairs. Categorical
#: settings are lowered from LightGBM's defaults (min_data_per_group=100, cat_smooth=10), which
#: would otherwise refuse to split on hardware types with a few dozen pairs each.
LGB_PARAMS: dict[str, Any] = {
    "objective": "regression",
    "learning_rate": 0.05,
    "num_leaves": 15,
    "min_data_in_leaf": 5,
    "min_data_per_group": 5,
    "cat_smooth": 1.0,
    "cat_l2": 1.0,
    "max_cat_to_onehot": 8,
    "lambda_l2": 1.0,
    "feature_fraction": 0.9,
    "bagging_fraction": 0.9,
    "bagging_freq": 1,
    "deterministic": True,
    "force_row_wise": True,
    "num_threads": 1,
    "verbose": -1,
}
LGB_ROUNDS = 400

#: ``ratio`` fits log(target / prior), ``log`` fits log(target). See docs/measurements.md for
#: the comparison that picked the default.
TARGETS = ("ratio", "log")
DEFAULT_TARGET = "ratio"

#: Features left out by default. With a ratio target the prior's absolute level mostly encodes
#: the workload's unit (images/s vs tokens/s) and lets trees memorise workloads; leaving it out
#: was better on config_fold for both public tables (ablation in docs/measurements.md).
DEFAULT_EXCLUDE: tuple[str, ...] = ("log_prior",)

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


class MeasurementError(ValueError):
    """A measurement table that cannot be evaluated (missing file, columns or bad values)."""


@dataclass(frozen=True)
class Table:
    """A validated measurement table, column-wise.

    Attributes
    ----------
    workload, hardware, precision, suite
        String columns; ``precision`` and ``suite`` are ``""`` where the file has no such column.
    num_accelerators, batch, throughput, params, seq_len
        Numeric columns; ``params``/``seq_len`` are NaN where absent.
    optional
        Which optional columns the file has.
    """

    workload: list[str]
    hardware: list[str]
    precision: list[str]
    suite: list[str]
    num_accelerators: FloatArray
    batch: FloatArray
    throughput: FloatArray
    params: FloatArray
    seq_len: FloatArray
    optional: frozenset[str]

    def __len__(self) -> int:
        return len(self.workload)

    def with_throughput(self, throughput: FloatArray) -> Table:
        """A copy with other throughputs (used by the leakage test)."""
        return replace(self, throughput=throughput)


def _number(value: str, column: str, line: int, path: Path) -> float:
    try:
        x = float(value)
    except ValueError:
        raise MeasurementError(f"{path}:{line}: column {column!r} is not a number: {value!r}") from None
    return x


def load_table(path: Path) -> Table:
    """Read and validate a measurement CSV.

    Parameters
    ----------
    path
        CSV file in the measurement-table format.

    Returns
    -------
    Table

    Raises
    ------
    MeasurementError
        Missing file, missing required columns, an empty table, or a value that is not a
        positive number where one is required (throughput, accelerators, batch size).
    """
    if not path.is_file():
        raise MeasurementError(f"{path}: no such file")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        header = [h.strip() for h in (reader.fieldnames or [])]
        missing = [c for c in REQUIRED_COLUMNS if c not in header]
        if missing:
            raise MeasurementError(
                f"{path}: missing column(s) {', '.join(missing)}; required: {', '.join(REQUIRED_COLUMNS)}"
            )
        raw = [{k.strip(): (v or "").strip() for k, v in r.items() if k is not None} for r in reader]
    if not raw:
        raise MeasurementError(f"{path}: no data rows")
    optional = frozenset(c for c in (*OPTIONAL_NUMERIC, "precision", "suite") if c in header)
    cols: dict[str, list[float]] = {c: [] for c in (*REQUIRED_COLUMNS[2:], *OPTIONAL_NUMERIC)}
    for line, r in enumerate(raw, start=2):
        for c in ("workload", "hardware"):
            if not r[c]:
                raise MeasurementError(f"{path}:{line}: column {c!r} is empty")
        for c in REQUIRED_COLUMNS[2:]:
            x = _number(r[c], c, line, path)
            if not (math.isfinite(x) and x > 0):
                raise MeasurementError(f"{path}:{line}: {c} must be a positive number, got {r[c]!r}")
            cols[c].append(x)
        for c in OPTIONAL_NUMERIC:
            cols[c].append(_number(r[c], c, line, path) if r.get(c) else math.nan)
    return Table(
        workload=[r["workload"] for r in raw],
        hardware=[r["hardware"] for r in raw],
        precision=[r.get("precision", "") for r in raw],
        suite=[r.get("suite", "") for r in raw],
        num_accelerators=np.array(cols["num_accelerators"]),
        batch=np.array(cols["global_batch_size"]),
        throughput=np.array(cols["throughput"]),
        params=np.array(cols["params"]),
        seq_len=np.array(cols["seq_len"]),
        optional=optional,
    )


def config_ids(t: Table) -> IntArray:
    """Configuration id of each row: (suite, workload, accelerators, batch, precision)."""
    keys = list(zip(t.suite, t.workload, t.num_accelerators, t.batch, t.precision, strict=True))
    index: dict[tuple[Any, ...], int] = {}
    return np.array([index.setdefault(k, len(index)) for k in keys], dtype=np.int64)


@dataclass(frozen=True)
class Pairs:
    """(prior, target) pairs: row ``row`` (on its hardware) predicted from ``prior`` on ``prior_hw``.

    ``prior`` is the median of the configuration's measurements on ``prior_hw`` (a job measured
    several times on one hardware type keeps a robust estimate, as the online store does);
    ``cfg`` is the configuration id of the target row (for grouped splits of pairs).
    """

    row: IntArray
    prior_hw: list[str]
    prior: FloatArray
    cfg: IntArray

    def __len__(self) -> int:
        return len(self.row)


def build_pairs(t: Table, cfg: IntArray) -> Pairs:
    """All (prior, target) pairs of a table; see :class:`Pairs`."""
    by_cfg_hw: dict[tuple[int, str], list[float]] = {}
    for i, (c, h) in enumerate(zip(cfg.tolist(), t.hardware, strict=True)):
        by_cfg_hw.setdefault((c, h), []).append(float(t.throughput[i]))
    hw_of_cfg: dict[int, list[str]] = {}
    for c, h in sorted(by_cfg_hw):
        hw_of_cfg.setdefault(c, []).append(h)
    rows: list[int] = []
    prior_hw: list[str] = []
    prior: list[float] = []
    for i, (c, h) in enumerate(zip(cfg.tolist(), t.hardware, strict=True)):
        for a in hw_of_cfg[c]:
            if a != h:
                rows.append(i)
                prior_hw.append(a)
                prior.append(float(np.median(by_cfg_hw[(c, a)])))
    row = np.array(rows, dtype=np.int64)
    return Pairs(row, prior_hw, np.array(prior, dtype=np.float64), cfg[row])


def folds(t: Table, cfg: IntArray, protocol: str, seed: int = 0) -> Iterator[npt.NDArray[np.bool_]]:
    """Yield the test-row mask of each fold; every other row is training data.

    Parameters
    ----------
    t, cfg
        The table and its configuration ids.
    protocol
        ``config_fold`` (configurations in :data:`N_FOLDS` seeded folds) or
        ``leave_one_workload_out`` (one fold per workload name, across suites).
    seed
        Seed of the configuration shuffle.
    """
    if protocol == "config_fold":
        n_cfg = int(cfg.max()) + 1
        fold_of_cfg = np.empty(n_cfg, dtype=np.int64)
        fold_of_cfg[np.random.default_rng(seed).permutation(n_cfg)] = np.arange(n_cfg) % N_FOLDS
        fold = fold_of_cfg[cfg]
        for k in range(min(N_FOLDS, n_cfg)):
            yield fold == k
    elif protocol == "leave_one_workload_out":
        wl = np.array(t.workload, dtype=object)
        for w in sorted(set(t.workload)):
            yield wl == w
    else:
        raise ValueError(f"unknown protocol {protocol!r}; one of {PROTOCOLS}")


# --------------------------------------------------------------------------- baselines


def _group(t: Table, i: int) -> tuple[str, str]:
    # Baseline statistics are per (suite, workload): a workload measured with another software
    # stack is a different population.
    return (t.suite[i], t.workload[i])


def predict_lookup(t: Table, pairs: Pairs, train_rows: IntArray, test: IntArray) -> FloatArray:
    """Median throughput of the workload on the target hardware, else the global median there.

    NaN (a miss) when the target hardware has no training row at all.
    """
    by_wh: dict[tuple[tuple[str, str], str], list[float]] = {}
    by_h: dict[str, list[float]] = {}
    for i in train_rows.tolist():
        by_wh.setdefault((_group(t, i), t.hardware[i]), []).append(float(t.throughput[i]))
        by_h.setdefault(t.hardware[i], []).append(float(t.throughput[i]))
    out = np.full(len(test), np.nan)
    for j, p in enumerate(test.tolist()):
        i = int(pairs.row[p])
        vals = by_wh.get((_group(t, i), t.hardware[i])) or by_h.get(t.hardware[i])
        if vals:
            out[j] = float(np.median(vals))
    return out


def transfer_ratios(t: Table, pairs: Pairs, train: IntArray, test: IntArray) -> tuple[FloatArray, FloatArray]:
    """Median training ratio target/prior for each test pair's (prior hw, target hw).

    Returns
    -------
    (within_workload, global)
        Median ratio over training pairs of the same (suite, workload) and hardware pair, and
        over all training pairs of that hardware pair; NaN where no training pair exists.
    """
    by_wah: dict[tuple[tuple[str, str], str, str], list[float]] = {}
    by_ah: dict[tuple[str, str], list[float]] = {}
    for p in train.tolist():
        i = int(pairs.row[p])
        r = float(t.throughput[i] / pairs.prior[p])
        by_wah.setdefault((_group(t, i), pairs.prior_hw[p], t.hardware[i]), []).append(r)
        by_ah.setdefault((pairs.prior_hw[p], t.hardware[i]), []).append(r)
    within = np.full(len(test), np.nan)
    glob = np.full(len(test), np.nan)
    for j, p in enumerate(test.tolist()):
        i = int(pairs.row[p])
        key = (pairs.prior_hw[p], t.hardware[i])
        if (w := by_wah.get((_group(t, i), *key))) is not None:
            within[j] = float(np.median(w))
        if (g := by_ah.get(key)) is not None:
            glob[j] = float(np.median(g))
    return within, glob


def predict_transfer(t: Table, pairs: Pairs, train: IntArray, test: IntArray) -> FloatArray:
    """Prior x median training ratio h/a: within the workload, else global, else 1."""
    within, glob = transfer_ratios(t, pairs, train, test)
    ratio = np.where(np.isfinite(within), within, np.where(np.isfinite(glob), glob, 1.0))
    return np.asarray(pairs.prior[test] * ratio, dtype=np.float64)


# --------------------------------------------------------------------------- LightGBM


@dataclass(frozen=True)
class FeatureSpace:
    """Fixed encodings for one table: category codes are built from names only (never values)."""

    hw_codes: dict[str, int]
    workload_codes: dict[str, int]
    precision_codes: dict[str, int]
    suite_codes: dict[str, int]
    specs: dict[str, FloatArray]
    names: list[str]
    categorical: list[str]

    @classmethod
    def build(cls, t: Table, catalogue: Catalogue | None = None) -> FeatureSpace:
        """Category vocabularies and catalogue specs (NaN where the catalogue lacks a type)."""
        cat = catalogue if catalogue is not None else load_catalogue()
        hws = sorted(set(t.hardware))
        specs: dict[str, FloatArray] = {}
        for h in hws:
            hw = cat.resolve(h)
            specs[h] = np.array([float(getattr(hw, k)) if hw else np.nan for k in SPEC_FEATURES])
        names = ["log_prior", "prior_hw", "target_hw", "workload"]
        names += [f"prior_{k}" for k in SPEC_FEATURES] + [f"target_{k}" for k in SPEC_FEATURES]
        names += [f"log_ratio_{k}" for k in SPEC_FEATURES]
        names += ["num_accelerators", "log_batch", "log_batch_per_accelerator"]
        categorical = ["prior_hw", "target_hw", "workload"]
        for c in ("precision", "suite"):
            if c in t.optional:
                names.append(c)
                categorical.append(c)
        names += [f"log_{c}" for c in OPTIONAL_NUMERIC if c in t.optional]
        return cls(
            hw_codes={h: k for k, h in enumerate(hws)},
            workload_codes={w: k for k, w in enumerate(sorted(set(t.workload)))},
            precision_codes={p: k for k, p in enumerate(sorted(set(t.precision)))},
            suite_codes={s: k for k, s in enumerate(sorted(set(t.suite)))},
            specs=specs,
            names=names,
            categorical=categorical,
        )

    def matrix(self, t: Table, pairs: Pairs, idx: IntArray) -> FloatArray:
        """Feature rows of the pairs ``idx``. The target row's own throughput is never read."""
        rows = pairs.row[idx]
        prior_hw = [pairs.prior_hw[p] for p in idx.tolist()]
        target_hw = [t.hardware[i] for i in rows.tolist()]
        ps = np.array([self.specs[h] for h in prior_hw]).reshape(len(idx), len(SPEC_FEATURES))
        ts = np.array([self.specs[h] for h in target_hw]).reshape(len(idx), len(SPEC_FEATURES))
        cols: list[FloatArray] = [
            np.log(pairs.prior[idx]),
            np.array([self.hw_codes[h] for h in prior_hw], dtype=np.float64),
            np.array([self.hw_codes[h] for h in target_hw], dtype=np.float64),
            np.array([self.workload_codes[t.workload[i]] for i in rows.tolist()], dtype=np.float64),
            *ps.T,
            *ts.T,
            *np.log(ts / ps).T,
            t.num_accelerators[rows],
            np.log(t.batch[rows]),
            np.log(t.batch[rows] / t.num_accelerators[rows]),
        ]
        if "precision" in self.categorical:
            cols.append(np.array([self.precision_codes[t.precision[i]] for i in rows.tolist()], dtype=float))
        if "suite" in self.categorical:
            cols.append(np.array([self.suite_codes[t.suite[i]] for i in rows.tolist()], dtype=float))
        for c in OPTIONAL_NUMERIC:
            if c in t.optional:
                cols.append(np.log(getattr(t, c)[rows]))
        return np.column_stack(cols)


def predict_lightgbm(
    t: Table,
    pairs: Pairs,
    train: IntArray,
    test: IntArray,
    space: FeatureSpace,
    target: str = DEFAULT_TARGET,
    seed: int = 0,
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE,
) -> FloatArray:
    """Fit on the training pairs and predict the test pairs' throughput.

    Parameters
    ----------
    target
        ``ratio``: fit log(target / prior) and return prior x exp(prediction); ``log``: fit
        log(target) directly.
    exclude
        Feature names to leave out (ablations).
    """
    if len(train) == 0:
        return np.full(len(test), np.nan)
    keep = [k for k, n in enumerate(space.names) if n not in exclude]
    names = [space.names[k] for k in keep]
    x_train = space.matrix(t, pairs, train)[:, keep]
    x_test = space.matrix(t, pairs, test)[:, keep]
    y = np.log(t.throughput[pairs.row[train]])
    if target == "ratio":
        y = y - np.log(pairs.prior[train])
    elif target != "log":
        raise ValueError(f"unknown target {target!r}; one of {TARGETS}")
    categorical = [n for n in space.categorical if n in names]
    offset = np.log(pairs.prior) if target == "ratio" else np.zeros(len(pairs))
    pred = _fit_predict(x_train, y, x_test, names, categorical, seed) + offset[test]
    train_wl = {t.workload[i] for i in pairs.row[train].tolist()}
    new = np.array([t.workload[i] not in train_wl for i in pairs.row[test].tolist()], dtype=bool)
    if new.any():
        trust = new_workload_trust(t, pairs, train, x_train, y, offset[train], names, categorical, seed)
        base = np.log(predict_transfer(t, pairs, train, test[new]))
        pred[new] = base + trust * (pred[new] - base)
    return np.asarray(np.exp(pred), dtype=np.float64)


def _fit_predict(x_train: FloatArray, y: FloatArray, x_test: FloatArray, names: list[str],
                 categorical: list[str], seed: int) -> FloatArray:
    ds = lgb.Dataset(x_train, label=y, feature_name=names, categorical_feature=categorical, free_raw_data=True)
    booster = lgb.train({**LGB_PARAMS, "seed": seed}, ds, num_boost_round=LGB_ROUNDS)
    return np.asarray(booster.predict(x_test), dtype=np.float64)


def new_workload_trust(t: Table, pairs: Pairs, train: IntArray, x_train: FloatArray, y: FloatArray,
                       offset: FloatArray, names: list[str], categorical: list[str], seed: int) -> float:
    """How much of the trees' departure from the transfer estimate to keep for a new workload.

    For a workload without training pairs, the trees can only generalise from other workloads,
    and the transfer baseline's median speed-up of the hardware pair is a strong rival. Inner
    leave-one-workload-out over the training pairs decides: each training workload in turn is
    predicted by trees fitted on the others, and the weight ``w`` in ``transfer x (trees /
    transfer) ** w`` (``w`` in 0, 0.1, ..., 1) with the best acc@10 over all of them is kept.
    Only folds with new workloads pay for the inner fits.
    """
    wl = np.array([t.workload[i] for i in pairs.row[train].tolist()], dtype=object)
    trees, base, actual = [], [], []
    for w in sorted(set(wl.tolist())):
        inner = wl == w
        if inner.all():
            return 1.0
        trees.append(_fit_predict(x_train[~inner], y[~inner], x_train[inner], names, categorical, seed)
                     + offset[inner])
        base.append(np.log(predict_transfer(t, pairs, train[~inner], train[inner])))
        actual.append(np.log(t.throughput[pairs.row[train[inner]]]))
    tr, ba, ac = np.concatenate(trees), np.concatenate(base), np.concatenate(actual)
    return best_weight(ba, tr - ba, np.exp(ac))


# --------------------------------------------------------------------------- protocol


def fold_predictions(
    t: Table,
    pairs: Pairs,
    test_rows: npt.NDArray[np.bool_],
    space: FeatureSpace,
    target: str = DEFAULT_TARGET,
    seed: int = 0,
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE,
) -> tuple[IntArray, dict[str, FloatArray]]:
    """Predictions of every model for the pairs whose target row is a test row.

    Training uses only rows outside ``test_rows`` and the pairs formed among them; both
    protocols hold out whole configurations, so a training pair's prior is never a test row.

    Returns
    -------
    (test_pair_indices, {model: predictions})
    """
    in_test = test_rows[pairs.row]
    # A pair is usable for training only if its target and its prior's configuration are both
    # outside the test fold; configurations never straddle folds, so the target row decides.
    train = np.flatnonzero(~in_test)
    test = np.flatnonzero(in_test)
    train_rows = np.flatnonzero(~test_rows)
    preds = {
        "lightgbm": predict_lightgbm(t, pairs, train, test, space, target, seed, exclude),
        "lookup": predict_lookup(t, pairs, train_rows, test),
        "transfer": predict_transfer(t, pairs, train, test),
    }
    return test, preds


def run_protocol(
    t: Table,
    cfg: IntArray,
    pairs: Pairs,
    protocol: str,
    space: FeatureSpace,
    seed: int = 0,
    target: str = DEFAULT_TARGET,
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE,
) -> dict[str, dict[str, Any]]:
    """Metrics of each model over all folds of ``protocol`` (every pair predicted once)."""
    pred = {m: np.full(len(pairs), np.nan) for m in MODELS}
    for test_rows in folds(t, cfg, protocol, seed):
        test, fold_pred = fold_predictions(t, pairs, test_rows, space, target, seed, exclude)
        for m in MODELS:
            pred[m][test] = fold_pred[m]
    actual = t.throughput[pairs.row]
    return {m: summary(pred[m], actual) for m in MODELS}


def evaluate(
    csv_path: Path | str,
    seed: int = 0,
    target: str = DEFAULT_TARGET,
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE,
    catalogue: Catalogue | None = None,
) -> dict[str, Any]:
    """Evaluate LightGBM and both baselines on a measurement table under both protocols.

    Parameters
    ----------
    csv_path
        Measurement CSV (see module docstring).
    seed
        Seed of the configuration folds and of LightGBM.
    target
        LightGBM target transform, ``ratio`` (default) or ``log``.
    exclude
        LightGBM feature names to leave out (ablations).
    catalogue
        Hardware catalogue for the spec features; default :func:`core.hardware.load_catalogue`.

    Returns
    -------
    dict
        ``{"rows", "pairs", "protocols": {protocol: {model: {"acc@10", "acc@20", "mape", "n",
        "n_missing"}}}, "lightgbm_target", "seed", "hardware_in_catalogue"}``.

    Raises
    ------
    MeasurementError
        If the file is missing or invalid, or no configuration was measured on two hardware types.
    """
    path = Path(csv_path)
    t = load_table(path)
    cfg = config_ids(t)
    pairs = build_pairs(t, cfg)
    if len(pairs) == 0:
        raise MeasurementError(f"{path}: no configuration is measured on two hardware types; nothing to pair")
    space = FeatureSpace.build(t, catalogue)
    return {
        "file": str(path),
        "rows": len(t),
        "pairs": len(pairs),
        "seed": seed,
        "lightgbm_target": target,
        "lightgbm_excluded_features": list(exclude),
        "hardware_in_catalogue": sorted(h for h, s in space.specs.items() if not np.isnan(s).all()),
        "protocols": {p: run_protocol(t, cfg, pairs, p, space, seed, target, exclude) for p in PROTOCOLS},
    }


# --------------------------------------------------------------------------- CLI


def _render(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table as RichTable

    tab = RichTable(title=f"{result['file']}: {result['rows']} rows, {result['pairs']} pairs")
    for c in ("protocol", "model", "acc@10", "acc@20", "MAPE", "n"):
        tab.add_column(c, justify="left" if c in ("protocol", "model") else "right")
    for proto, models in result["protocols"].items():
        for m, s in models.items():
            tab.add_row(proto, m, f"{s['acc@10']:.3f}", f"{s['acc@20']:.3f}", f"{s['mape']:.3f}", str(s["n"]))
    Console().print(tab)


def evaluate_measurements_cmd(
    file: Annotated[Path, typer.Argument(help="Measurement CSV (workload, hardware, ... throughput)")],
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the result as JSON here")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the folds and of LightGBM")] = 0,
) -> None:
    """Evaluate LightGBM against the lookup and transfer baselines on a measurement table."""
    try:
        result = evaluate(file, seed=seed)
    except MeasurementError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    _render(result)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))


#: ``leap evaluate-measurements`` as a one-command Typer app (mount with ``add_typer`` or call
#: :func:`evaluate_measurements_cmd` from an existing app's ``command()``).
app = typer.Typer(add_completion=False)
app.command("evaluate-measurements")(evaluate_measurements_cmd)
