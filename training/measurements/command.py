"""``leap evaluate-measurements``: evaluate a measurement table, print the table, write JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import orjson
import typer

from training.measurements.protocol import evaluate
from training.measurements.table import MeasurementError


def _render(result: dict[str, Any]) -> None:
    """Print one line per (protocol, model) with its accuracy figures."""
    # Imported here: rich is only needed when the command runs, not when the API is imported.
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
