"""``leap alternatives``: every model on the simulator backtest and on every public table.

::

    leap fleet history --out .leap/h21 --days 14 --attempts-per-day 2000 --seed 21
    leap alternatives --history .leap/h21 --days 7 \\
        --json alternatives.json --markdown alternatives.md --plot alternatives.png

``--models ridge,knn`` runs a subset (``all`` by default: :data:`leap.training.alternatives.NAMES`);
``--tables none`` skips the public tables, ``--tables a.csv,b.csv`` runs others. ``--tune 20``
gives every family with knobs (the served model included) 20 settings and reports on each table
the one chosen on the other tables (:mod:`leap.training.alternatives.tuning`); the JSON's ``tuning``
holds every setting's scores and the choices. ``--workers 2`` runs that search in two processes
(each LightGBM fit on one thread), ``--parts-dir D`` saves it part by part so that a stopped search
resumes. Without ``--tune``, ``--parts-dir D`` keeps each model's predictions of each table fold,
and ``--workers 2`` fits the folds in two processes, one model under one protocol a job
(:func:`leap.training.alternatives.tables.fill_checkpoint`; with ``OMP_NUM_THREADS=1``).

``leap alternatives-report a.json b.json ... --markdown out.md --plot out.png`` merges saved
results of the same seed and folds (e.g. cheap models and language models run apart, one table
per run, or simulator backtests of the same history and nights) into one report, without fitting
anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.table import Table

from leap.training.alternatives import ALTERNATIVES, NAMES, AlternativeUnavailable, resolve
from leap.training.alternatives.report import COLUMNS, cell, markdown, merge, plot, report_rows

console = Console(stderr=True)


def _fail(message: str) -> typer.Exit:
    console.print(f"[bold red]error:[/] {message}")
    return typer.Exit(2)


def _tables(spec: str | None) -> list[Path]:
    """The tables to run: every public one by default, none for ``none``, else the listed paths."""
    from leap.training.alternatives.tables import default_tables

    if spec is None:
        return default_tables()
    if spec.strip() == "none":
        return []
    paths = [Path(p.strip()) for p in spec.split(",") if p.strip()]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ValueError(f"no such table(s): {', '.join(missing)}")
    if not paths:
        raise ValueError("--tables names no file (give paths, or 'none')")
    return paths


def _check(names: list[str], seed: int) -> None:
    """Make each model once, so that one that cannot be made fails before hours of work."""
    for name in names:
        ALTERNATIVES[name](seed)


def _print(result: dict[str, Any]) -> None:
    table = Table(title="alternatives (acc on every simulator attempt; on tables, attempts with a prior elsewhere)")
    for header in ("dataset", "model", *(h for h, _, _ in COLUMNS)):
        table.add_column(header, justify="left" if header in ("dataset", "model") else "right")
    for row in report_rows(result):
        table.add_row(row["dataset"], row["model"], *(cell(row.get(k), d) for _, k, d in COLUMNS))
    console.print(table)


def alternatives_cmd(
    history: Annotated[Path | None, typer.Option(
        "--history", help="Simulated history folder (`leap fleet history`); omit to run only the tables.")] = None,
    days: Annotated[int, typer.Option(min=1, help="Nightly retrains at the end of the history.")] = 7,
    window_days: Annotated[int, typer.Option(min=1, help="Training window of each retrain.")] = 30,
    models: Annotated[str, typer.Option(help=f"Comma-separated models, or all. Known: {', '.join(NAMES)}")] = "all",
    tables: Annotated[str | None, typer.Option(
        help="Comma-separated measurement CSVs, or none (default: every table in data/measurements).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of every model, of the tables' folds and attempts' order.")] = 0,
    tune: Annotated[int, typer.Option(
        min=0, help="Settings per model family on the tables, each table's chosen on the other tables "
                    "(0: every model at its defaults).")] = 0,
    tune_history: Annotated[list[Path] | None, typer.Option(
        "--tune-history", help="Simulated history to choose the simulator's settings on (--tune settings per "
                               "family, by mean acc@10 over every one given; seeds used for nothing else).")] = None,
    tune_days: Annotated[int, typer.Option(min=1, help="Nightly retrains of --tune-history to choose on.")] = 3,
    workers: Annotated[int, typer.Option(
        min=1, help="Processes for the --tune searches (each LightGBM fit then takes one thread), or without --tune "
                    "for the tables' folds (one model under one protocol a job; set OMP_NUM_THREADS=1).")] = 1,
    parts_dir: Annotated[Path | None, typer.Option(
        "--parts-dir", help="Save each part of the --tune search here as it ends (without --tune: each model's "
                            "predictions of each table fold); a rerun of the same search and code reads the "
                            "saved parts instead of fitting them again.")] = None,
    pick_sample: Annotated[int, typer.Option(
        min=1, help="Submissions a day ranked in full for top-1 and regret on the simulator.")] = 1500,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the full result as JSON here.")] = None,
    markdown_path: Annotated[Path | None, typer.Option("--markdown", help="Write the Markdown table here.")] = None,
    plot_path: Annotated[Path | None, typer.Option("--plot", help="Write the acc@10 chart (PNG) here.")] = None,
) -> None:
    """Every model on identical rows and splits: the simulator backtest and the public tables."""
    from leap.training.measurements import MeasurementError

    try:
        names = resolve(models)
        paths = _tables(tables)
        _check(names, seed)
    except (ValueError, AlternativeUnavailable) as exc:
        raise _fail(str(exc)) from None
    if history is not None and not history.is_dir():
        raise _fail(f"{history}: no such history folder (make one with `leap fleet history --out {history}`)")
    if history is None and not paths:
        raise _fail("nothing to run: give --history for the simulator backtest, or tables to --tables")
    if plot_path is not None and plot_path.suffix.lower() != ".png":
        raise _fail(f"--plot writes a PNG: give a path ending in .png, not {plot_path.name!r}")
    if tune and len(paths) == 1:
        raise _fail("--tune chooses a table's settings on the other tables: give at least two tables")
    if tune and not paths and not tune_history:
        raise _fail("--tune needs two tables or more, or --tune-history for the simulator")
    if tune_history and (not tune or history is None or not all(h.is_dir() for h in tune_history)):
        raise _fail("--tune-history needs --tune, --history and an existing folder")
    choice = None
    if tune_history:
        from leap.training.alternatives.tuning import CLASSES, tune_on_history

        choice = tune_on_history(tune_history, [n for n in names if n in CLASSES], tune, tune_days, window_days,
                                 seed, console, workers=workers, parts_dir=parts_dir)
    result = _run(history, names, paths, (days, window_days, pick_sample), seed, MeasurementError,
                  (tune, workers, parts_dir), choice)
    _print(result)
    _write(result, json_path, markdown_path, plot_path)


def _run(history: Path | None, names: list[str], paths: list[Path], nights: tuple[int, int, int], seed: int,
         measurement_error: type[Exception], search: tuple[int, int, Path | None] = (0, 1, None),
         choice: dict[str, Any] | None = None) -> dict[str, Any]:
    """The simulator backtest (``nights`` = days, window, pick sample; the families of ``choice``
    at its chosen settings), then the tables (``search`` = settings per family, tuned by
    rotation; workers; parts folder); a bad history or table ends the command."""
    days, window_days, pick_sample = nights
    tune, workers, parts_dir = search
    from leap.training.alternatives.simulated import backtest_alternatives
    from leap.training.alternatives.tables import evaluate_tables

    factories = {n: ALTERNATIVES[n] for n in names}
    if choice is not None:
        from leap.training.alternatives.tuning import SERVED_DEFAULTS, chosen_factories

        factories.update(chosen_factories(choice))
        if "lightgbm" in choice["chosen"]:  # the served model as shipped, beside its tuned draw
            factories[SERVED_DEFAULTS] = ALTERNATIVES["lightgbm"]
    try:
        simulator = None if history is None else backtest_alternatives(
            history, factories, days=days, window_days=window_days, seed=seed, progress=console,
            pick_sample=pick_sample)
        tuning = None
        if tune and paths:
            from leap.training.alternatives.tuning import tuned_tables

            results, tuning = tuned_tables(paths, names, tune, seed, console, workers, parts_dir)
        else:
            results = evaluate_tables(paths, names, seed=seed, progress=console, checkpoint=parts_dir,
                                      workers=workers)
    except (measurement_error, ValueError, AlternativeUnavailable) as exc:
        raise _fail(str(exc)) from None
    out = {"models": names, "seed": seed, "simulator": simulator, "tables": results}
    if choice is not None:
        tuning = {**(tuning or {}), "simulator": choice}
    return {**out, "tuning": tuning} if tuning is not None else out


def _write(result: dict[str, Any], json_path: Path | None, markdown_path: Path | None, plot_path: Path | None) -> None:
    for path in (json_path, markdown_path, plot_path):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
    if json_path is not None:
        json_path.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    if markdown_path is not None:
        markdown_path.write_text(markdown(result) + "\n")
    if plot_path is not None:
        plot(result, plot_path)
    written = [str(p) for p in (json_path, markdown_path, plot_path) if p is not None]
    console.print("written " + ", ".join(written) if written else "nothing written (give --json, --markdown, --plot)")


def alternatives_report_cmd(
    results: Annotated[list[Path], typer.Argument(help="Saved results (`leap alternatives --json`) to merge.")],
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the merged result as JSON here.")] = None,
    markdown_path: Annotated[Path | None, typer.Option("--markdown", help="Write the Markdown table here.")] = None,
    plot_path: Annotated[Path | None, typer.Option("--plot", help="Write the acc@10 chart (PNG) here.")] = None,
) -> None:
    """Merge saved `leap alternatives` results (same seed and folds) into one report and chart."""
    if plot_path is not None and plot_path.suffix.lower() != ".png":
        raise _fail(f"--plot writes a PNG: give a path ending in .png, not {plot_path.name!r}")
    missing = [str(p) for p in results if not p.is_file()]
    if missing:
        raise _fail(f"no such result(s): {', '.join(missing)}")
    try:
        merged = merge([orjson.loads(p.read_bytes()) for p in results])
    except (orjson.JSONDecodeError, ValueError, KeyError, TypeError) as exc:
        raise _fail(f"cannot merge: {exc}") from None
    _print(merged)
    _write(merged, json_path, markdown_path, plot_path)
