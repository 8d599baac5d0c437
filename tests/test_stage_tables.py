"""The drivers report's stage ablation on measurement tables (:mod:`leap.training.stage_tables`)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from leap.cli import app
from leap.training.stage_tables import cell_deltas, rotation, table_drivers, table_variants

GAVEL = Path(__file__).resolve().parent.parent / "data" / "measurements" / "gavel.csv"


def _cut_table(path: Path, workloads: int) -> Path:
    """The first ``workloads`` workloads of the Gavel table (a table of a few dozen rows)."""
    with GAVEL.open() as f:
        rows = list(csv.DictReader(f))
    keep = list(dict.fromkeys(r["workload"] for r in rows))[:workloads]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(r for r in rows if r["workload"] in keep)
    return path


def test_only_variants_that_change_the_model_apply_to_a_table() -> None:
    keys = [v.key for v in table_variants()]
    assert keys[0] == "default"
    assert {"no_selectors", "no_gate", "no_trust", "transfer_paired"} <= set(keys)
    assert not {"window_7", "weekly"} & set(keys)  # a table has no days
    with pytest.raises(ValueError, match="weekly"):
        table_variants(["weekly"])


def _result() -> dict[str, Any]:
    acc = {"a": (0.5, 0.4), "b": (0.6, 0.7), "c": (0.3, 0.3)}  # table: (default, no_gate)
    return {"cells": [{"table": t, "protocol": p, "seed": 0, "acc": {"default": d, "no_gate": v + (p == "x") * 0.1}}
                      for t, (d, v) in acc.items() for p in ("x", "y")]}


def test_deltas_are_against_the_default_of_the_same_cell() -> None:
    deltas = cell_deltas(_result())
    assert deltas[("a", "x")]["no_gate"] == pytest.approx(0.0)
    assert deltas[("a", "y")]["no_gate"] == pytest.approx(-0.1)
    assert deltas[("b", "y")]["no_gate"] == pytest.approx(0.1)


def test_rotation_chooses_on_two_tables_and_checks_on_the_third() -> None:
    rows = {r["held_out"]: r for r in rotation(_result(), "no_gate")}
    assert set(rows) == {"a", "b", "c"}
    # held out a: chosen on b (+0.2, +0.1) and c (+0.1, 0.0), checked on a (0.0, -0.1)
    assert rows["a"]["choose_delta"] == pytest.approx(0.1)
    assert rows["a"]["check_delta"] == pytest.approx(-0.05)


def test_table_drivers_scores_each_variant_under_both_protocols(tmp_path: Path) -> None:
    table = _cut_table(tmp_path / "few.csv", 3)
    result = table_drivers([table], ["transfer_paired"], seeds=[0])
    assert result["variants"] == ["default", "transfer_paired"]
    assert {c["protocol"] for c in result["cells"]} == {"config_fold", "leave_one_workload_out"}
    for cell in result["cells"]:
        assert set(cell["acc"]) == {"default", "transfer_paired"}
        assert all(0.0 <= a <= 1.0 for a in cell["acc"].values())


def test_cli_refuses_a_missing_table(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["drivers", "--tables", str(tmp_path / "nope.csv")])
    assert res.exit_code != 0
    assert "no such measurement table" in res.output


def test_cli_needs_a_history_or_tables() -> None:
    res = CliRunner().invoke(app, ["drivers"])
    assert res.exit_code != 0
    assert "--history, --tables or both" in res.output
