"""The measurement table: reading and validating a measurement CSV into columns."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

REQUIRED_COLUMNS = ("workload", "hardware", "num_accelerators", "global_batch_size", "throughput")
#: The required columns that must hold positive numbers.
POSITIVE_COLUMNS = REQUIRED_COLUMNS[2:]
OPTIONAL_NUMERIC = ("params", "seq_len")
#: Optional labels: ``precision`` and ``suite`` are part of a configuration; ``family`` and
#: ``framework`` describe the workload (used only when the source itself states them).
OPTIONAL_TEXT = ("precision", "suite", "family", "framework")

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


class MeasurementError(ValueError):
    """A measurement table that cannot be evaluated (missing file, columns or bad values)."""


@dataclass(frozen=True)
class Table:
    """A validated measurement table, column-wise.

    Attributes
    ----------
    workload, hardware, precision, suite, family, framework
        String columns; the optional ones (:data:`OPTIONAL_TEXT`) are ``""`` where the file has no
        such column or leaves the cell empty.
    num_accelerators, batch, throughput, params, seq_len
        Numeric columns; ``params``/``seq_len`` are NaN where absent.
    optional
        Which optional columns the file has.
    """

    workload: list[str]
    hardware: list[str]
    precision: list[str]
    suite: list[str]
    family: list[str]
    framework: list[str]
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
    header, raw = _read_rows(path)
    cols = _numeric_columns(raw, path)
    return Table(
        workload=[r["workload"] for r in raw],
        hardware=[r["hardware"] for r in raw],
        precision=[r.get("precision", "") for r in raw],
        suite=[r.get("suite", "") for r in raw],
        family=[r.get("family", "") for r in raw],
        framework=[r.get("framework", "") for r in raw],
        num_accelerators=np.array(cols["num_accelerators"]),
        batch=np.array(cols["global_batch_size"]),
        throughput=np.array(cols["throughput"]),
        params=np.array(cols["params"]),
        seq_len=np.array(cols["seq_len"]),
        optional=frozenset(c for c in (*OPTIONAL_NUMERIC, *OPTIONAL_TEXT) if c in header),
    )


def _read_rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """The header and the data rows (stripped strings), after checking the file and its columns."""
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
        # A short row leaves None values and a long one a None key; neither is a column.
        raw = [{k.strip(): (v or "").strip() for k, v in r.items() if k is not None} for r in reader]
    if not raw:
        raise MeasurementError(f"{path}: no data rows")
    return header, raw


def _numeric_columns(raw: list[dict[str, str]], path: Path) -> dict[str, list[float]]:
    """Validated numeric columns by header name; an absent optional value is NaN."""
    cols: dict[str, list[float]] = {c: [] for c in (*POSITIVE_COLUMNS, *OPTIONAL_NUMERIC)}
    for line, r in enumerate(raw, start=2):  # line 1 is the header
        for c in ("workload", "hardware"):
            if not r[c]:
                raise MeasurementError(f"{path}:{line}: column {c!r} is empty")
        for c in POSITIVE_COLUMNS:
            x = _number(r[c], c, line, path)
            if not (math.isfinite(x) and x > 0):
                raise MeasurementError(f"{path}:{line}: {c} must be a positive number, got {r[c]!r}")
            cols[c].append(x)
        for c in OPTIONAL_NUMERIC:
            cols[c].append(_number(r[c], c, line, path) if r.get(c) else math.nan)
    return cols


def _number(value: str, column: str, line: int, path: Path) -> float:
    """``value`` as a float, or a :class:`MeasurementError` naming the file, line and column."""
    try:
        x = float(value)
    except ValueError:
        raise MeasurementError(f"{path}:{line}: column {column!r} is not a number: {value!r}") from None
    return x
