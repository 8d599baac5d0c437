"""``leap evaluate-measurements``: evaluate models on a measurement table, print a table, write JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import orjson
import typer

from leap.core.hardware import load_catalogue
from leap.training.measurements.estimators import DEFAULT_MODELS, resolve_models
from leap.training.measurements.history import write_history
from leap.training.measurements.protocol import evaluate, load_history
from leap.training.measurements.table import MeasurementError


def _fmt(x: Any, digits: int = 3) -> str:
    return "-" if x is None or x != x else f"{x:.{digits}f}"  # x != x: NaN


def _render(result: dict[str, Any]) -> None:
    """Print one line per (protocol, model): primary figures, all rows, ranking, cost."""
    # Imported here: rich is only needed when the command runs, not when the API is imported.
    from rich.console import Console
    from rich.table import Table as RichTable

    tab = RichTable(title=f"{result['file']}: {result['rows']} measurements, {result['jobs']} jobs "
                          f"(acc/MAPE on rows whose job ran elsewhere before; 'all' = every attempt)")
    cols = ("protocol", "model", "acc@10", "acc@20", "MAPE", "n", "acc@10 all", "top-1", "regret", "band", "fit s",
            "µs/row")
    for c in cols:
        tab.add_column(c, justify="left" if c in ("protocol", "model") else "right")
    for proto, block in result["protocols"].items():
        for m, s in block["models"].items():
            tab.add_row(proto, m, _fmt(s["acc@10"]), _fmt(s["acc@20"]), _fmt(s["mape"]), str(s["n"]),
                        _fmt(s["all"]["acc@10"]), _fmt(s["top1"]), _fmt(s["regret"]),
                        _fmt(s.get("band_coverage")), _fmt(s["fit_s"], 1),
                        _fmt(s["predict_us_per_row"], 1))
    Console().print(tab)


def evaluate_measurements_cmd(
    file: Annotated[Path, typer.Argument(help="Measurement CSV (workload, hardware, ... throughput)")],
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the result as JSON here")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the folds, the attempts' order and the models")] = 0,
    models: Annotated[str, typer.Option(
        help="Comma-separated registered models, or 'all' (an unknown name lists the known ones)")]
    = ",".join(DEFAULT_MODELS),
    out: Annotated[Path | None, typer.Option(
        "--out", help="Also write the table as a LEAP history archive here (for `leap train --history`)")] = None,
    convert_only: Annotated[bool, typer.Option(help="With --out: write the history and stop")] = False,
    checkpoint: Annotated[Path | None, typer.Option(
        help="Folder keeping each model's predictions of each fold as it ends; run again with the same "
             "folder to resume a stopped run at the next fold")] = None,
) -> None:
    """Score the served model and its rivals on a measurement table converted to LEAP history."""
    try:
        if convert_only and out is None:
            raise ValueError("--convert-only needs --out DIR")
        resolve_models(models)  # a bad --models fails before anything is written
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    try:
        if out is not None:
            _, th = load_history(file, seed, load_catalogue())
            counts = write_history(th.history, out)
            typer.echo(f"wrote {out}: " + ", ".join(f"{n} {k}" for k, n in counts.items()), err=True)
            if convert_only:
                return
        result = evaluate(file, seed=seed, models=models, checkpoint=checkpoint)
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
