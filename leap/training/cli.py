"""Command-line surface of the model side: train, models list/promote/rollback, backtest, drivers."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.table import Table

from leap.core.settings import Settings
from predictor.registry import Registry

console = Console(stderr=True)
models_app = typer.Typer(help="The model registry: list, promote, rollback.", no_args_is_help=True)

HistoryOpt = Annotated[Path, typer.Option("--history", help="History folder (day-partitioned Parquet).")]
RegistryOpt = Annotated[Path | None, typer.Option("--registry", help="Registry folder [default: .leap/registry].")]
TreesOpt = Annotated[int | None, typer.Option("--trees", min=1, help="Trees per booster [default: the model's].")]
LeavesOpt = Annotated[int | None, typer.Option("--leaves", min=2, help="Leaves per tree [default: the model's].")]


def _size_params(trees: int | None, leaves: int | None) -> dict[str, Any]:
    """Model parameters for ``--trees``/``--leaves``; what is not given keeps the model's default."""
    given = {"n_estimators": trees, "num_leaves": leaves}
    return {k: v for k, v in given.items() if v is not None}


def _fail(message: str, code: int = 2) -> typer.Exit:
    console.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code)


def _registry(path: Path | None) -> Registry:
    return Registry(path or Settings.from_env().registry_dir)


def _check_history(path: Path) -> None:
    if not path.is_dir():
        raise _fail(f"{path}: no such history folder (make one with `leap fleet history --out {path}`)")


#: ``leap backtest`` and ``leap drivers``: where built rows are kept between runs.
BuiltRowsOpt = Annotated[Path | None, typer.Option(
    "--row-cache", help="Folder keeping the built rows: a later run on the same events, row code and catalogue "
    "reads them instead of building them again (a folder only this user writes).")]


def train_cmd(
    history: HistoryOpt,
    as_of: Annotated[str | None, typer.Option("--as-of", help="Train on what was known before this day (YYYY-MM-DD).")]
    = None,
    registry: RegistryOpt = None,
    window_days: Annotated[int, typer.Option(min=1, help="Days of finished attempts to train on.")] = 30,
    promote: Annotated[bool, typer.Option(help="Promote and announce if not worse than the current model.")] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the training report here.")] = None,
    trees: Annotated[int | None, typer.Option(min=1, help="Trees per stage instead of the served model's "
                                              "(quick checks, e.g. the bench smoke test; never for serving).")]
    = None,
    row_cache: Annotated[Path | None, typer.Option(
        "--row-cache", help="Folder for the rows' checkpoint: the next run on the grown archive resumes there "
        "and replays only the new events (a folder only this trainer writes).")] = None,
) -> None:
    """Fit LightGBM on the history and register a new version."""
    from leap.training.days import parse_day
    from leap.training.train import not_worse, train

    _check_history(history)
    try:
        day = parse_day(as_of) if as_of else None
        reg = _registry(registry)
        record, report = train(history, reg, day, window_days, None if trees is None else {"n_estimators": trees},
                               row_cache=row_cache)
    except (ValueError, PermissionError) as exc:  # PermissionError: a --row-cache folder others can write to
        raise _fail(str(exc)) from None
    _print_metrics(report["metrics"], f"holdout {report['holdout']['day']} ({report['holdout']['rows']} attempts)")
    console.print(f"registered [bold]{record.version}[/] (rows {report['timings_s']['rows']}s, "
                  f"fit {report['timings_s']['fit']}s)")
    if promote:
        current = report.get("current")
        if current is None or not_worse(report["metrics"]["lightgbm"], current["holdout"]):
            _promote(reg, record.version, "trained and not worse on the holdout")
            report["promoted"] = True
        else:
            console.print(f"[yellow]not promoted[/]: acc@10 {report['metrics']['lightgbm']['acc@10']:.4f} < "
                          f"current {current['holdout']['acc@10']:.4f} on the same holdout")
            report["promoted"] = False
    text = orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode()
    if json_out:
        json_out.write_text(text + "\n")
    print(text)


def _write_json(path: Path, result: dict[str, Any]) -> None:
    """A report as indented JSON (NumPy numbers included)."""
    path.write_text(orjson.dumps(result, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode())


def _print_metrics(metrics: dict[str, dict[str, float]], title: str) -> None:
    table = Table(title=title)
    for col in ("model", "acc@10", "acc@20", "mape"):
        table.add_column(col)
    for name, m in metrics.items():
        table.add_row(name, f"{m['acc@10']:.3f}", f"{m['acc@20']:.3f}", f"{m['mape']:.3f}")
    console.print(table)


def _promote(reg: Registry, version: str, reason: str) -> None:
    from leap.training.nightly import promote_and_announce

    promote_and_announce(reg, version, reason, Settings.from_env())
    console.print(f"promoted and announced [bold]{version}[/]")


@models_app.command("list")
def models_list(registry: RegistryOpt = None,
                json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Registered versions with their holdout metrics; * marks the current one."""
    reg = _registry(registry)
    current = reg.current()
    rows = [{"version": r.version, "current": r.version == current, "as_of": r.metadata.get("as_of"),
             "holdout_acc@10": r.metadata.get("metrics", {}).get("lightgbm", {}).get("acc@10")} for r in reg.versions()]
    if json_out:
        print(orjson.dumps({"current": current, "models": rows}).decode())
        return
    table = Table()
    for col in ("", "version", "as of", "holdout acc@10"):
        table.add_column(col)
    for r in rows:
        acc = r["holdout_acc@10"]
        table.add_row("*" if r["current"] else "", r["version"], str(r["as_of"]), f"{acc:.4f}" if acc else "-")
    console.print(table if rows else "no models registered")


@models_app.command("promote")
def models_promote(
    version: Annotated[str, typer.Argument(help="Version to make current.")],
    history: Annotated[Path | None, typer.Option("--history", help="Re-check on its holdout with this history.")]
    = None,
    force: Annotated[bool, typer.Option(help="Skip the not-worse check.")] = False,
    registry: RegistryOpt = None,
) -> None:
    """Make a version current and announce it, if it is not worse than the current one."""
    from leap.training.train import compare_on_holdout
    from predictor.models import BASELINES
    from predictor.registry import RegistryError

    reg = _registry(registry)
    try:
        reg.record(version) if version not in BASELINES else None
        if not force:
            if history is None:
                raise _fail("give --history to compare with the current model on the same holdout, or --force")
            _check_history(history)
            result = compare_on_holdout(reg, version, history)
            console.print(orjson.dumps(result).decode())
            if not result["not_worse"]:
                raise _fail(f"{version} is worse than the current model on its holdout; not promoted", code=1)
        _promote(reg, version, "forced" if force else "not worse on the holdout")
    except RegistryError as exc:
        raise _fail(str(exc)) from None


@models_app.command("rollback")
def models_rollback(registry: RegistryOpt = None) -> None:
    """Go back to the version that was current before this one, and announce it."""
    reg = _registry(registry)
    previous = reg.previous()
    if previous is None:
        raise _fail("nothing to roll back to (no earlier promotion)")
    _promote(reg, previous, f"rollback from {reg.current()}")


def backtest_cmd(
    history: HistoryOpt,
    days: Annotated[int, typer.Option(min=1, help="Nightly retrains to simulate.")] = 30,
    json_path: Annotated[Path, typer.Option("--json", help="Where to write the JSON results.")] = Path("backtest.json"),
    report: Annotated[Path | None, typer.Option("--report", help="Folder for PNG plots.")] = None,
    window_days: Annotated[int, typer.Option(min=1, help="Training window of each retrain.")] = 30,
    trees: TreesOpt = None,
    leaves: LeavesOpt = None,
    drop_field: Annotated[str | None, typer.Option(
        "--drop-field", help="Leave this optional field out of every submission from the first test day on, as a "
                             "scheduler that stops sending it would: params, framework or layout.")] = None,
    drop_everywhere: Annotated[bool, typer.Option(
        help="With --drop-field: leave it out of the whole history (nothing to derive it from).")] = False,
    jobs: Annotated[int, typer.Option(
        min=1, help="Worker processes scoring nights side by side, one thread a fit (1: here, OpenMP's threads); "
                    "each holds the rows and oracle tables.",
    )] = 2,
    row_cache: BuiltRowsOpt = None,
) -> None:
    """Nightly retrains over the last DAYS days: train on everything before, score the day."""
    from leap.core.hardware import load_catalogue
    from leap.training.backtest import backtest
    from leap.training.backtest_plots import plot_report
    from leap.training.partial import examples_without

    _check_history(history)
    if drop_everywhere and drop_field is None:
        raise _fail("--drop-everywhere needs --drop-field")
    try:
        examples = None if drop_field is None else examples_without(
            history, days, drop_field, load_catalogue(), console, drop_everywhere, window_days)
        result = backtest(history, days=days, window_days=window_days, params=_size_params(trees, leaves),
                          progress=console, examples=examples, jobs=jobs, row_cache=row_cache)
    except (ValueError, PermissionError) as exc:  # PermissionError: a --row-cache folder others can write to
        raise _fail(str(exc)) from None
    result["dropped_field"] = drop_field
    result["dropped_everywhere"] = drop_everywhere
    _write_json(json_path, result)
    if report is not None:
        plot_report(result, report)
    _print_metrics(result["mean"], f"mean over {result['days']} nightly retrains")
    _print_by_evidence(result["by_evidence"])
    console.print(f"written {json_path}" + (f" and plots in {report}" if report else ""))


def _print_by_evidence(by_evidence: dict[str, dict[str, float]]) -> None:
    table = Table(title="acc@10 by what the job's history holds for the candidate")
    names = [n for n in next(iter(by_evidence.values())) if n != "share"]
    for col in ("history", "share", *names):
        table.add_column(col)
    labels = {"same": "ran on this hardware", "other": "ran elsewhere only", "none": "no history"}
    for level, values in by_evidence.items():
        table.add_row(labels.get(level, level), f"{values['share']:.2f}", *(f"{values[n]:.3f}" for n in names))
    console.print(table)


def drivers_cmd(
    history: Annotated[Path | None, typer.Option("--history", help="History folder (day-partitioned Parquet).")]
    = None,
    json_path: Annotated[Path, typer.Option("--json", help="Where to write the JSON results.")] = Path("drivers.json"),
    report: Annotated[Path | None, typer.Option("--report", help="Folder for the PNG plot.")] = None,
    days: Annotated[int, typer.Option(min=2, help="Evaluation days per variant.")] = 7,
    variants: Annotated[str | None, typer.Option(
        help="Comma-separated variant keys to run (the default model always runs); all by default.",
    )] = None,
    jobs: Annotated[int, typer.Option(min=1, help="Worker processes fitting models in parallel.")] = 2,
    tables: Annotated[str | None, typer.Option(
        help="Comma-separated measurement CSVs: score the variants that apply to a table on each, under both "
             "protocols, with the rotation (choose on two tables, check on the third).",
    )] = None,
    seeds: Annotated[str, typer.Option(help="Fold seeds of the tables (comma-separated).")] = "0,2",
    drop_fields: Annotated[str | None, typer.Option(
        help="With --history: the backtest of the same days with each of these optional fields (params, "
             "framework, layout; comma-separated) left out of every submission, beside the complete run.",
    )] = None,
    row_cache: BuiltRowsOpt = None,
) -> None:
    """What moves accuracy: feature groups, window, cadence, model size, target transform, the model's stages,
    and (--drop-fields) the submission fields a scheduler may leave out."""
    from leap.training.drivers import VARIANTS, drivers, plot_drivers

    chosen = [k.strip() for k in variants.split(",") if k.strip()] if variants is not None else None
    unknown = sorted(set(chosen or ()) - {v.key for v in VARIANTS})
    if unknown:
        raise _fail(f"unknown variants {unknown}; known: {', '.join(v.key for v in VARIANTS)}")
    if history is None and tables is None:
        raise _fail("give --history, --tables or both")
    fields = _fields(drop_fields)
    if fields and history is None:
        raise _fail("--drop-fields needs --history")
    result: dict[str, Any] = {}
    if history is not None:
        _check_history(history)
        try:
            result = drivers(history, days=days, progress=console, variants=chosen, jobs=jobs, row_cache=row_cache)
            if fields:
                result["missing_fields"] = _missing_fields(history, days, fields)
        except (ValueError, PermissionError) as exc:  # PermissionError: a --row-cache folder others can write to
            raise _fail(str(exc)) from None
    if tables is not None:
        result["tables"] = _table_drivers(tables, seeds, chosen)
    _write_json(json_path, result)
    if report is not None and "variants" in result:
        plot_drivers(result, report)
    if "variants" in result:
        _print_variants(result["variants"])


def _print_variants(variants: list[dict[str, Any]]) -> None:
    table = Table(title="change in mean acc@10 against the default model")
    for col in ("variant", "acc@10", "delta", "spread (sd of daily delta)"):
        table.add_column(col)
    for row in variants:
        table.add_row(row["name"], f"{row['acc@10']:.3f}", f"{row['delta']:+.3f}", f"{row['delta_sd']:.3f}")
    console.print(table)


def _fields(drop_fields: str | None) -> list[str]:
    """``--drop-fields``, checked before anything is read."""
    from leap.training.partial import check_fields

    if drop_fields is None:
        return []
    fields = [f.strip() for f in drop_fields.split(",") if f.strip()]
    try:
        check_fields(fields)
    except ValueError as exc:
        raise _fail(f"--drop-fields: {exc}") from None
    return fields


def _missing_fields(history: Path, days: int, fields: list[str]) -> list[dict[str, Any]]:
    """``leap drivers --drop-fields``: the robustness table, printed and returned for the JSON."""
    from leap.core.hardware import load_catalogue
    from leap.training.partial import missing_fields

    rows = missing_fields(history, days, fields, load_catalogue(), progress=console)
    table = Table(title=f"submissions with a field left out: mean of {days} nightly retrains")
    for col in ("submissions", "acc@10", "top-1", "transfer", "transfer_paired", "band per day",
                "days below transfer"):
        table.add_column(col)
    for row in rows:
        low, high = row["band_coverage_range"]
        table.add_row("complete" if row["dropped"] is None else f"without {row['dropped']}",
                      f"{row['acc@10']:.3f}", f"{row['top1']:.3f}", f"{row['transfer']:.3f}",
                      f"{row['transfer_paired']:.3f}", f"{low:.1%}-{high:.1%}", str(row["below_transfer_days"]))
    console.print(table)
    return rows


def _table_drivers(tables: str, seeds: str, chosen: list[str] | None) -> dict[str, Any]:
    """``leap drivers --tables``: the variants on each table, and per variant the rotation."""
    from leap.training.measurements.table import MeasurementError
    from leap.training.stage_tables import rotation, table_drivers, table_variants

    paths = [Path(p.strip()) for p in tables.split(",") if p.strip()]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise _fail(f"no such measurement table: {', '.join(missing)}")
    try:
        fold_seeds = [int(s) for s in seeds.split(",") if s.strip()]
        keys = [v.key for v in table_variants([k for k in chosen or () if k != "default"] or None)]
        result = table_drivers(paths, keys, fold_seeds, progress=console)
    except (ValueError, MeasurementError) as exc:
        raise _fail(str(exc)) from None
    result["rotation"] = {k: rotation(result, k) for k in result["variants"] if k != "default"}
    table = Table(title="tables: change in acc@10 (ran elsewhere) against the default model, mean over seeds")
    held_out = [r["held_out"] for r in next(iter(result["rotation"].values()), [])]
    for col in ("variant", *(f"{name} held out: choose / check" for name in held_out)):
        table.add_column(col)
    for key, rows in result["rotation"].items():
        table.add_row(key, *(f"{r['choose_delta']:+.3f} / {r['check_delta']:+.3f}" for r in rows))
    console.print(table)
    return result
