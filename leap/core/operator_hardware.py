"""The fleet's own catalogue file (``LEAP_HARDWARE_FILE``): parts and aliases the package lacks.

A fleet gets parts before a release of LEAP knows them, and its scheduler names parts the way
its drivers do ("NVIDIA H100 80GB HBM3"). This file adds both without editing the package::

    [[hardware]]                # a part: the fields of leap/core/data/hardware.toml
    name = "H20"
    vendor = "nvidia"
    peak_tflops = 148
    memory_gb = 96
    memory_bw_gbps = 4000
    interconnect_gbps = 900
    frameworks = ["pytorch", "jax"]
    price_per_hour = 3.10       # spec_source and price_source are optional here

    [[alias]]                   # other names of a part of the catalogue or of this file
    hardware = "H100-SXM"
    names = ["NVIDIA H100 80GB HBM3"]

Every error names the file, the line and the field, so an operator can fix it from the message.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REQUIRED = ("name", "vendor", "peak_tflops", "memory_gb", "memory_bw_gbps", "interconnect_gbps",
            "frameworks", "price_per_hour")
NUMBERS = ("peak_tflops", "memory_gb", "memory_bw_gbps", "interconnect_gbps", "price_per_hour",
           "peak_fp32_tflops", "scale_out_gbps", "node_size", "max_accelerators")
TEXTS = ("name", "vendor", "architecture", "spec_source", "price_source")
ALIAS_FIELDS = ("hardware", "names")


@dataclass(frozen=True)
class OperatorFile:
    """What the file adds: raw part entries (checked, ready for the catalogue's parser) and aliases."""

    parts: list[dict[str, Any]]
    aliases: list[tuple[str, tuple[str, ...], int]]  # (part, names, line)


class Lines:
    """Where each table of a TOML file and each of its keys starts (tomllib keeps no positions)."""

    def __init__(self, text: str) -> None:
        self.tables: dict[tuple[str, int], int] = {}
        self.keys: dict[tuple[str, int, str], int] = {}
        counts: dict[str, int] = {}
        current: tuple[str, int] | None = None
        for number, line in enumerate(text.splitlines(), start=1):
            header = re.match(r"\s*\[\[\s*([A-Za-z_]+)\s*\]\]", line)
            if header:
                name = header.group(1)
                current = (name, counts.get(name, 0))
                counts[name] = current[1] + 1
                self.tables[current] = number
                continue
            key = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=", line)
            if key and current is not None:
                self.keys.setdefault((*current, key.group(1)), number)

    def of(self, table: str, index: int, key: str | None = None) -> int:
        """Line of ``key`` in the ``index``-th ``[[table]]`` (its header when the key is absent)."""
        header = self.tables.get((table, index), 0)
        return self.keys.get((table, index, key), header) if key else header


def _fail(path: Path, line: int, table: str, index: int, field: str, problem: str) -> ValueError:
    return ValueError(f"{path}:{line}: [[{table}]] #{index + 1} field {field!r}: {problem}")


def _check_part(raw: dict[str, Any], index: int, path: Path, lines: Lines, known: Collection[str]) -> dict[str, Any]:
    for key in raw:
        if key not in known:
            raise _fail(path, lines.of("hardware", index, key), "hardware", index, key,
                        f"unknown field; the fields are {', '.join(sorted(known))}")
    for key in REQUIRED:
        if key not in raw:
            raise _fail(path, lines.of("hardware", index), "hardware", index, key, "missing")
    for key in NUMBERS:
        value = raw.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise _fail(path, lines.of("hardware", index, key), "hardware", index, key,
                        f"must be a positive number, got {value!r}")
    for key in TEXTS:
        if key in raw and (not isinstance(raw[key], str) or not raw[key].strip()):
            raise _fail(path, lines.of("hardware", index, key), "hardware", index, key, "must be a non-empty string")
    frameworks = raw["frameworks"]
    if not isinstance(frameworks, list) or not frameworks or not all(isinstance(f, str) and f for f in frameworks):
        raise _fail(path, lines.of("hardware", index, "frameworks"), "hardware", index, "frameworks",
                    "must be a non-empty list of framework names")
    for key in ("aliases",):
        if key in raw and (not isinstance(raw[key], list) or not all(isinstance(a, str) and a for a in raw[key])):
            raise _fail(path, lines.of("hardware", index, key), "hardware", index, key, "must be a list of names")
    source = f"operator file {path.name}"
    return {"spec_source": source, "price_source": source, **raw}


def read_operator_file(path: Path, known: Collection[str]) -> OperatorFile:
    """Read and check an operator hardware file.

    Parameters
    ----------
    path
        TOML with ``[[hardware]]`` and ``[[alias]]`` tables (module docstring).
    known
        The fields a part may have (those of :class:`leap.core.hardware.HardwareType`).

    Returns
    -------
    OperatorFile

    Raises
    ------
    ValueError
        ``FILE:LINE: [[table]] #N field 'F': problem`` for a bad field; TOML syntax errors with
        tomllib's line and column. Whether names clash with the catalogue is checked when the
        catalogue merges the file (:meth:`leap.core.hardware.Catalogue.load`).
    """
    text = path.read_text()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from None
    lines = Lines(text)
    for key in data:
        if key not in ("hardware", "alias"):
            raise ValueError(f"{path}: unknown table {key!r}; the file holds [[hardware]] and [[alias]] tables")
    parts = [_check_part(raw, i, path, lines, known) for i, raw in enumerate(data.get("hardware", []))]
    aliases = []
    for i, raw in enumerate(data.get("alias", [])):
        for key in raw:
            if key not in ALIAS_FIELDS:
                raise _fail(path, lines.of("alias", i, key), "alias", i, key, "unknown field; the fields are "
                            "hardware, names")
        if not isinstance(raw.get("hardware"), str) or not raw["hardware"]:
            raise _fail(path, lines.of("alias", i, "hardware"), "alias", i, "hardware", "must name a part")
        names = raw.get("names")
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
            raise _fail(path, lines.of("alias", i, "names"), "alias", i, "names", "must be a non-empty list of names")
        aliases.append((raw["hardware"], tuple(names), lines.of("alias", i, "names")))
    return OperatorFile(parts, aliases)
