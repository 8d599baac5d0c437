"""``leap replay``: rebuild features, re-rank with another model, copy and inspect topic slices.

Safe by default: nothing live (the live key prefix, a LEAP topic) is written without ``--live``.
Empty ranges, deleted segments and bad events are reported, never fatal. Exit codes: 0 done,
1 rebuild found mismatches (like ``diff``) or a runtime failure, 2 bad arguments.
"""

from __future__ import annotations

import re
import secrets
import sys
import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import orjson
import typer
from rich.console import Console
from rich.table import Table

from features.keys import KeyLayout
from features.store import open_store
from leap.core.hardware import load_catalogue
from leap.core.settings import Settings
from leap.replay.copy import LIVE_TOPICS, copy_slice
from leap.replay.decode import BY_TOPIC, TYPE_NAMES
from leap.replay.explain import find_ranking, story
from leap.replay.inspection import inspect_slice, matcher
from leap.replay.reader import Reader, ReplayError, Tally, TopicRange
from leap.replay.rebuild import compare, replay_events
from leap.replay.rerank import collect, load_model, shadow_report
from leap.replay.timespec import Bound, check_order, parse_bound
from streams.topics import ALL_TOPICS, JOB_FINISHES, JOB_STARTS, RANKINGS, SUBMISSIONS

app = typer.Typer(
    help="Replay LEAP topics: rebuild features, re-rank with another model, copy a slice, inspect events.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True, soft_wrap=True)  # soft wrap: messages stay one line in logs and pipes
TopicName = Enum("TopicName", {t.name: t.name for t in ALL_TOPICS}, type=str)  # type: ignore[misc]
_PREFIX_OK = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")

FromOpt = Annotated[str | None, typer.Option(
    "--from", help="Start (inclusive): ISO time, Unix seconds, 'now', a look-back (-2h, -30m, -1d) or offset:N. "
    "Default: the log start.")]
ToOpt = Annotated[str | None, typer.Option(
    "--to", help="End (exclusive), same forms as --from. Default: the end of each partition when the replay starts.")]
TopicOpt = Annotated[list[TopicName] | None, typer.Option("--topic", help="LEAP topic to read (repeatable).")]
ExtraTopicOpt = Annotated[list[str] | None, typer.Option(
    "--extra-topic", help="Another topic to read, e.g. one written by `copy` (repeatable).")]
PartitionOpt = Annotated[list[int] | None, typer.Option("--partition", min=0, help="Only these partitions.")]
JobOpt = Annotated[list[str] | None, typer.Option("--job", help="Only these job keys (glob, repeatable).")]
RateOpt = Annotated[float | None, typer.Option("--rate-limit", min=0.001, help="At most N events per second.")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Read, decode and count; write nothing.")]
LiveOpt = Annotated[bool, typer.Option("--live", help="Allow writing to live state (key prefix or LEAP topic).")]
ProgressOpt = Annotated[bool, typer.Option("--progress/--no-progress", help="Progress bar on stderr (terminals).")]


def _fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def _bounds(from_: str | None, to: str | None) -> tuple[Bound, Bound]:
    try:
        start = parse_bound(from_)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--from'") from None
    try:
        end = parse_bound(to)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--to'") from None
    try:
        check_order(start, end)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--from' / '--to'") from None
    return start, end


def _topics(topic: list[TopicName] | None, extra: list[str] | None, default: list[str]) -> list[str]:
    chosen = [t.value for t in topic or []] + list(extra or [])
    return list(dict.fromkeys(chosen or default))


def _open(settings: Settings, ranges: list[TopicRange], partition: list[int] | None, rate_limit: float | None,
          progress: bool) -> Reader:
    """A reader over the ranges, with the plan summarised on stderr."""
    try:
        reader = Reader(settings, ranges, set(partition) if partition else None, rate_limit, progress, err)
    except ReplayError as exc:
        _fail(str(exc))
    per_topic: dict[str, list[int]] = {}
    for pl in reader.plan:
        per_topic.setdefault(pl.topic, []).append(pl.size)
    for name, sizes in per_topic.items():
        err.print(f"{name}: {len(sizes)} partition(s), {sum(sizes):,} message(s) in range", highlight=False)
    return reader


def _report_tally(tally: Tally) -> None:
    bad = sum(tally.bad.values())
    if bad:
        reasons = ", ".join(f"{r}={n}" for r, n in tally.bad.most_common())
        err.print(f"[yellow]bad events: {bad}[/] ({reasons}); first: {tally.bad_examples[0]}", highlight=False)
    for gap in tally.gaps:
        err.print(f"[yellow]gap:[/] {gap['topic']}[{gap['partition']}] offsets {gap['from']}..{gap['to']}: "
                  f"{gap['reason']}", highlight=False)
    for note in tally.notes:
        err.print(f"[yellow]note:[/] {note}", highlight=False)


def _print_json(data: Any) -> None:
    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode() + "\n")


@app.command("rebuild-features")
def rebuild_features(
    from_: FromOpt = None, to: ToOpt = None, topic: TopicOpt = None, extra_topic: ExtraTopicOpt = None,
    partition: PartitionOpt = None, job: JobOpt = None, rate_limit: RateOpt = None, dry_run: DryRunOpt = False,
    live: LiveOpt = False, progress: ProgressOpt = True,
    prefix: Annotated[str | None, typer.Option(
        help="Key prefix to rebuild into. Default: <live prefix>-replay-<UTC time>-<random>.")] = None,
    live_prefix: Annotated[str | None, typer.Option(
        help="Prefix of the state to compare with (default: LEAP_KEY_PREFIX).")] = None,
    keep: Annotated[bool, typer.Option("--keep", help="Keep the rebuilt prefix instead of deleting it.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")] = False,
) -> None:
    """Replay job starts/finishes into a fresh key prefix and diff it against the live state."""
    start, end = _bounds(from_, to)
    settings = Settings.from_env()
    allowed = {JOB_STARTS.name, JOB_FINISHES.name}
    if topic and any(t.value not in allowed for t in topic):
        raise typer.BadParameter(f"rebuild-features reads only {', '.join(sorted(allowed))}", param_hint="'--topic'")
    live_prefix = live_prefix or settings.key_prefix
    if live and prefix:
        raise typer.BadParameter("--live rebuilds into the live prefix; drop --prefix", param_hint="'--prefix'")
    target = live_prefix if live else prefix or (
        f"{live_prefix}-replay-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(2)}")
    if not _PREFIX_OK.match(target):
        # ':' or glob characters would make the clean-up pattern reach into other keyspaces.
        raise typer.BadParameter(f"{target!r}: use letters, digits, '_', '.', '-' only", param_hint="'--prefix'")
    if not live and target == live_prefix:
        raise typer.BadParameter(f"{target!r} is the live prefix; pass --live to rebuild into it",
                                 param_hint="'--prefix'")
    catalogue = load_catalogue()
    store = None if dry_run else open_store(settings, catalogue, prefix=target)
    if store is not None and not live and next(store.client.scan_iter(match=store.layout.pattern(), count=1000), None):
        _fail(f"prefix {target!r} already holds keys; choose another --prefix (or delete it first)", 2)
    topics = _topics(topic, extra_topic, [JOB_STARTS.name, JOB_FINISHES.name])
    reader = _open(settings, [TopicRange(t, start, end) for t in topics], partition, rate_limit, progress)
    try:
        result, jobs, models, families = replay_events(reader, store, job or [])
        if store is not None and not live:
            compare(store.client, store.layout, KeyLayout(live_prefix), jobs, models, families, result)
    except ReplayError as exc:
        _fail(str(exc))
    finally:
        if store is not None and not live and not keep:
            store.delete_all()
    _report_tally(reader.tally)
    out = {**result.to_json(), "prefix": target, "live_prefix": live_prefix, "live": live, "dry_run": dry_run,
           "kept": keep and not live and not dry_run, "range": {"from": start.describe(), "to": end.describe()},
           "read": reader.tally.to_json()}
    if json_out:
        _print_json(out)
    else:
        _rebuild_table(out)
    if result.mismatches:
        raise typer.Exit(1)


def _rebuild_table(out: dict[str, Any]) -> None:
    table = Table(title="rebuild-features", show_header=False)
    for name in ("events", "applied", "duplicates", "jobs", "model_types", "families", "keys", "mismatches",
                 "order_dependent", "events_per_s", "prefix", "live_prefix", "kept"):
        value = out[name]
        text = "-" if value is None else str(value).lower() if isinstance(value, bool) else (
            f"{value:,}" if isinstance(value, int) else str(value))
        table.add_row(name, text)
    bad = out["read"]["bad_events"]
    table.add_row("bad events", f"{bad:,}")
    Console().print(table)
    if out["details"]:
        detail = Table(title=f"first {len(out['details'])} mismatches")
        for col in ("kind", "name", "field", "live", "replay"):
            detail.add_column(col, overflow="fold")
        for d in out["details"]:
            detail.add_row(d["kind"], d["name"], d["field"], str(d["live"]), str(d["replay"]))
        Console().print(detail)


@app.command()
def rerank(
    model: Annotated[list[str], typer.Option(
        "--model", help="lookup, transfer, or a registered version (repeatable).")],
    from_: FromOpt = None, to: ToOpt = None, partition: PartitionOpt = None, job: JobOpt = None,
    rate_limit: RateOpt = None, dry_run: DryRunOpt = False, progress: ProgressOpt = True,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the shadow report here as JSON.")] = None,
) -> None:
    """Re-rank the submissions in the range with other models; compare with the rankings emitted then."""
    start, end = _bounds(from_, to)
    if json_path is not None and not json_path.parent.is_dir():
        raise typer.BadParameter(f"{json_path.parent}: folder does not exist", param_hint="'--json'")
    settings = Settings.from_env()
    try:
        actives = [load_model(name, settings) for name in dict.fromkeys(model)]
    except ReplayError as exc:
        _fail(str(exc), 2)
    # Rankings and finishes come after their submission: read them from the same start to the end.
    later = start if start.kind == "time" else Bound("open")
    ranges = [TopicRange(SUBMISSIONS.name, start, end), TopicRange(RANKINGS.name, later, Bound("open")),
              TopicRange(JOB_FINISHES.name, later, Bound("open"))]
    reader = _open(settings, ranges, partition, rate_limit, progress)
    try:
        joined = collect(reader, SUBMISSIONS.name, job or [])
    except ReplayError as exc:
        _fail(str(exc))
    _report_tally(reader.tally)
    if dry_run:
        _print_json({"submissions": len(joined.subs), "rankings": len(joined.rankings),
                     "finishes": len(joined.finishes), "read": reader.tally.to_json()})
        return
    catalogue = load_catalogue()
    report = shadow_report(joined, actives, catalogue)
    report["range"] = {"from": start.describe(), "to": end.describe()}
    report["read"] = reader.tally.to_json()
    if json_path is not None:
        json_path.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS) + b"\n")
    _rerank_table(report)


def explain_cmd(
    attempt_id: Annotated[str, typer.Argument(help="The attempt whose ranking to tell.")],
    from_: FromOpt = None, to: ToOpt = None, progress: ProgressOpt = True,
    json_out: Annotated[bool, typer.Option("--json", help="Print the ranking itself as JSON after the story.")]
    = False,
) -> None:
    """Tell one attempt's ranking in a few plain lines: what won and why, and per candidate the
    evidence, the estimate served, the prior and ratio, the band and the price (from the rankings topic)."""
    start, end = _bounds(from_, to)
    reader = _open(Settings.from_env(), [TopicRange(RANKINGS.name, start, end)], None, None, progress)
    try:
        ranking = find_ranking(reader, attempt_id)
    except ReplayError as exc:
        _fail(str(exc))
    _report_tally(reader.tally)
    if ranking is None:
        _fail(f"no ranking of attempt {attempt_id!r} in {RANKINGS.name} ({start.describe()} to {end.describe()})")
    for line in story(ranking):
        print(line)
    if json_out:
        _print_json(ranking.to_dict())


def _fmt(value: Any, pct: bool = True) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    return f"{value:.1%}" if pct else f"{value:,}"


def _rerank_table(report: dict[str, Any]) -> None:
    table = Table(title=f"rerank: {report['ranked']:,} ranked submissions, {report['finished']:,} finished")
    for col in ("model", "top-1 agreement", "changed best", "acc@10", "acc@20", "MAPE", "n", "no estimate"):
        table.add_column(col, justify="left" if col == "model" else "right")
    versions = ", ".join(report["old"]["model_versions"])
    rows = [(f"old ({versions})" if versions else "old", None, None, report["old"]["accuracy"])]
    rows += [(name, m["top1_agreement"], m["changed_best"], m["accuracy"]) for name, m in report["models"].items()]
    for name, agree, changed, acc in rows:
        table.add_row(name, _fmt(agree), _fmt(changed, False), _fmt(acc["acc@10"]), _fmt(acc["acc@20"]),
                      _fmt(acc["mape"]), _fmt(acc["n"], False), _fmt(acc["n_missing"], False))
    Console().print(table)
    _basis_table(report, rows[0][0])


def _basis_table(report: dict[str, Any], old_name: str) -> None:
    """Share of candidates per evidence and per estimate served (the rankings' basis), per model."""
    bases = {old_name: report["old"]["basis"], **{name: m["basis"] for name, m in report["models"].items()}}
    columns = [(part, key) for part in ("evidence", "estimate")
               for key in dict.fromkeys(k for b in bases.values() for k in b[part])]
    table = Table(title="basis: share of candidates by evidence (ran here / elsewhere / no history) and by "
                        "estimate served")
    table.add_column("model")
    for part, key in columns:
        table.add_column("no history" if (part, key) == ("evidence", "none") else key, justify="right")
    for name, b in bases.items():
        total = sum(b["evidence"].values())
        table.add_row(name, *(_fmt(b[part].get(key, 0) / total if total else None) for part, key in columns))
    Console().print(table)


@app.command()
def copy(
    to_topic: Annotated[str, typer.Option("--to-topic", help="Topic to republish into (created if missing).")],
    from_: FromOpt = None, to: ToOpt = None, topic: TopicOpt = None, extra_topic: ExtraTopicOpt = None,
    partition: PartitionOpt = None, job: JobOpt = None, rate_limit: RateOpt = None, dry_run: DryRunOpt = False,
    live: LiveOpt = False, progress: ProgressOpt = True,
    skip_bad: Annotated[bool, typer.Option("--skip-bad", help="Leave out events that fail validation.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")] = False,
) -> None:
    """Republish a slice to another topic, keeping keys, headers, timestamps (and partitions)."""
    start, end = _bounds(from_, to)
    sources = _topics(topic, extra_topic, [])
    if not sources:
        raise typer.BadParameter("name at least one source with --topic or --extra-topic", param_hint="'--topic'")
    if to_topic in LIVE_TOPICS and not live:
        raise typer.BadParameter(f"{to_topic} is a live LEAP topic; pass --live to write to it",
                                 param_hint="'--to-topic'")
    settings = Settings.from_env()
    reader = _open(settings, [TopicRange(t, start, end) for t in sources], partition, rate_limit, progress)
    try:
        result = copy_slice(reader, settings, to_topic, job or [], skip_bad, dry_run)
    except ReplayError as exc:
        _fail(str(exc))
    _report_tally(reader.tally)
    out = {**result.to_json(), "to_topic": to_topic, "dry_run": dry_run, "read": reader.tally.to_json()}
    if json_out:
        _print_json(out)
    else:
        verb = "would copy" if dry_run else "copied"
        err.print(f"{verb} {result.copied:,} of {result.read:,} message(s) to {to_topic}", highlight=False)


@app.command()
def inspect(
    from_: FromOpt = None, to: ToOpt = None, topic: TopicOpt = None, extra_topic: ExtraTopicOpt = None,
    partition: PartitionOpt = None, job: JobOpt = None, rate_limit: RateOpt = None, dry_run: DryRunOpt = False,
    progress: ProgressOpt = True,
    type_: Annotated[list[str] | None, typer.Option(
        "--type", help=f"Event type (repeatable): {', '.join(TYPE_NAMES)}.")] = None,
    hardware: Annotated[list[str] | None, typer.Option(
        "--hardware", help="Events that name this hardware (placed on, candidate); aliases resolve.")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="Stop after N matching events.")] = None,
) -> None:
    """Print events as JSON lines with topic, partition and offset (--dry-run: count only)."""
    start, end = _bounds(from_, to)
    types = list(type_ or [])
    unknown = [t for t in types if t not in TYPE_NAMES]
    if unknown:
        raise typer.BadParameter(f"{', '.join(unknown)}: choose from {', '.join(TYPE_NAMES)}", param_hint="'--type'")
    wanted_topics = [name for name, cls in BY_TOPIC.items() if not types or cls.NAME in types]
    sources = _topics(topic, extra_topic, wanted_topics)
    settings = Settings.from_env()
    reader = _open(settings, [TopicRange(t, start, end) for t in sources], partition, rate_limit, progress)
    match = matcher(job or [], types, hardware or [], load_catalogue())

    def write(data: bytes) -> None:
        sys.stdout.write(data.decode())

    try:
        shown = inspect_slice(reader, match, limit, None if dry_run else write)
    except ReplayError as exc:
        _fail(str(exc))
    sys.stdout.flush()
    _report_tally(reader.tally)
    err.print(f"{shown:,} matching event(s) of {reader.tally.messages:,} read", highlight=False)
