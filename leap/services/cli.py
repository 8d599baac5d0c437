"""``leap services up|down|status``: the command line of ``leap.services.stack``."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from leap.core.settings import Settings, redact
from leap.services.processes import ServiceError, lock
from leap.services.secure import new_stack, secure_home, secure_pids, start_secure_stack, stop_secure_stack
from leap.services.stack import down, require_services, status, up

app = typer.Typer(help="Local Apache Kafka (KRaft) and redis-server.", no_args_is_help=True)
_console = Console(stderr=True)


def _fail(exc: ServiceError | ValueError) -> NoReturn:
    # soft_wrap: log tails in the message stay one line per log line; escape: "[Errno 111]" is text
    _console.print(f"[bold red]error:[/] {escape(str(exc))}", markup=True, highlight=False, soft_wrap=True)
    raise typer.Exit(1)


def services_needed(*, kafka: bool = True, redis: bool = True) -> Settings:
    """The settings, once the services a command needs answer; else one error line saying which
    do not and how to start them, and exit code 1 (before the command does any work)."""
    try:
        return require_services(Settings.from_env(), kafka=kafka, redis=redis)
    except ServiceError as exc:
        _fail(exc)


@app.command("up")
def up_command(
    redis_cluster: bool = typer.Option(
        False, "--redis-cluster",
        help="Also start a local three-master Redis Cluster (clients use it with LEAP_REDIS_CLUSTER=1).",
    ),
    kafka_brokers: int = typer.Option(
        0, "--kafka-brokers", min=0, max=3,
        help="1 or 3 local brokers (default: LEAP_KAFKA_BROKERS, else 1). Clients of a three-broker "
             "cluster need LEAP_KAFKA_BROKERS=3 too.",
    ),
    secure: bool = typer.Option(
        False, "--secure",
        help="Instead, start a secured stack beside the plain one: Kafka with a SASL_SSL (SCRAM) listener and "
             "Redis with TLS and an ACL user, new certificates and passwords; its LEAP_* settings go to a file.",
    ),
) -> None:
    """Start Kafka and Redis (or find them running) and wait until both answer."""
    if secure:
        _up_secure()
        return
    env = dict(os.environ)
    if kafka_brokers:
        env["LEAP_KAFKA_BROKERS"] = str(kafka_brokers)
    try:
        settings = Settings.from_env(env)
    except ValueError as exc:
        _fail(exc)
        return
    try:
        with _console.status("starting services") as spinner:
            result = up(settings, step=lambda msg: spinner.update(msg), redis_cluster=redis_cluster)
    except ServiceError as exc:
        _fail(exc)
        return
    table = Table("service", "backend", "state", "address", "version", "seconds")
    for name in ("kafka", "redis", "redis_cluster"):
        if name in result:
            row = result[name]
            address = row["bootstrap"] if name == "kafka" else row["url"]
            table.add_row(name, row["backend"], row["action"], address, row["version"], f"{row['seconds']:.1f}")
    Console().print(table)


def _up_secure() -> None:
    """``up --secure``: the stack of :mod:`leap.services.secure` on its fixed local ports."""
    base = Settings.from_env()
    folder = secure_home(base)
    t0 = time.monotonic()
    with lock(base):  # two `up --secure` at once: one starts it, the other finds it running
        if any(pid is not None for pid in secure_pids(base, folder)):
            action = "running"
            settings = Settings.from_env({**os.environ, **_read_env_file(new_stack(folder).env_file)})
        else:
            try:
                with _console.status("starting the secured services") as spinner:
                    settings = start_secure_stack(base, new_stack(folder), step=lambda msg: spinner.update(msg))
            except ServiceError as exc:
                _fail(exc)
                return
            action = "started"
    table = Table("service", "security", "state", "address", "seconds")
    table.add_row("kafka", "SASL_SSL, SCRAM-SHA-512", action, settings.kafka_bootstrap, f"{time.monotonic() - t0:.1f}")
    table.add_row("redis", "TLS, ACL user", action, redact(settings.redis_url), "")
    Console().print(table)
    Console().print(f"settings (passwords included, mode 0600): set -a; . {new_stack(folder).env_file}; set +a")


def _read_env_file(path: Path) -> dict[str, str]:
    lines = path.read_text().splitlines() if path.exists() else []
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


@app.command("down")
def down_command(
    purge: bool = typer.Option(False, "--purge", help="Also delete the services' data and logs."),
    secure: bool = typer.Option(False, "--secure", help="Stop only the secured stack of `up --secure`."),
) -> None:
    """Stop the services that `up` started (SIGTERM, then SIGKILL after a grace period)."""
    base = Settings.from_env()
    folder = secure_home(base)
    if secure or any(pid is not None for pid in secure_pids(base, folder)):
        Console().print(f"secure: {stop_secure_stack(base, folder)}")
    if secure:
        return
    try:
        result = down(base, purge=purge)
    except ServiceError as exc:
        _fail(exc)
        return
    for name, state in result.items():
        Console().print(f"{name}: {state}")


@app.command("status")
def status_command(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Whether Kafka and Redis answer; exits 1 if either does not."""
    result = status(Settings.from_env())
    if as_json:
        typer.echo(json.dumps(result))
    else:
        table = Table("service", "ok", "address", "version", "error")
        for name, address_key in (("kafka", "bootstrap"), ("redis", "url")):
            row = result[name]
            table.add_row(
                name,
                "[green]yes[/]" if row["ok"] else "[red]no[/]",
                str(row[address_key]),
                str(row["version"] or "-"),
                str(row.get("error", "")),
            )
        Console().print(table)
    if not (result["kafka"]["ok"] and result["redis"]["ok"]):
        raise typer.Exit(1)


if __name__ == "__main__":
    app()
