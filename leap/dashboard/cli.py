"""``leap dashboard``: serve the live page on the ranking stream."""

from __future__ import annotations

import errno
import socket
import time
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.console import Console

from leap.core.timespec import parse_time

console = Console(stderr=True)

def parse_since(text: str, now: float | None = None) -> float:
    """Start time of ``--from`` (:func:`leap.core.timespec.parse_time`), never in the future.

    Raises
    ------
    ValueError
        With a message meant for the user.
    """
    now = time.time() if now is None else now
    try:
        since = parse_time(text, now)
    except ValueError as exc:
        raise ValueError(f"--from {exc}") from None
    if since > now:
        raise ValueError(f"--from {text!r} is in the future")
    return since


def check_bind(host: str, port: int) -> None:
    """Fail early, with a plain message, if ``host:port`` cannot be listened on."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ValueError(f"--host {host!r}: cannot resolve ({exc.strerror})") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as exc:
            reason = "already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
            raise ValueError(f"cannot listen on {host}:{port}: {reason}") from None


def dashboard_cmd(
    host: Annotated[str, typer.Option(help="Address to listen on (127.0.0.1 = this machine only).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8050,
    since: Annotated[str | None, typer.Option(
        "--from", help="Start from this time instead of now: ISO time, Unix seconds, 'now' or -15m, -2h, -1d.",
    )] = None,
    accuracy_window: Annotated[int, typer.Option(min=10, max=1_000_000,
                                                 help="Finished attempts behind rolling accuracy.")] = 1000,
    pending_limit: Annotated[int, typer.Option(min=100, max=10_000_000,
                                               help="Rankings kept while waiting for their finish.")] = 50_000,
    push_interval: Annotated[float, typer.Option(min=0.1, max=60.0, help="Seconds between page updates.")] = 0.5,
) -> None:
    """Serve the live dashboard of the ranking stream (reads Kafka; commits no offsets)."""
    import uvicorn

    from leap.core.settings import Settings
    from leap.dashboard.aggregator import Aggregator, AggregatorConfig
    from leap.dashboard.app import create_app
    from leap.dashboard.follower import Follower

    try:
        start = parse_since(since) if since is not None else None
        check_bind(host, port)
    except ValueError as exc:
        console.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(2) from None
    settings = Settings.from_env()
    aggregator = Aggregator(AggregatorConfig(accuracy_window=accuracy_window, pending_limit=pending_limit))
    follower = Follower(settings, aggregator, since=start)
    app = create_app(aggregator, follower, push_interval=push_interval)
    shown = f"[{host}]" if ":" in host else host
    console.print(f"LEAP dashboard on http://{shown}:{port}/ (Kafka {settings.kafka_bootstrap}"
                  f"{', from ' + datetime.fromtimestamp(start, UTC).isoformat() if start else ', from now'})")
    # Open pages hold an event stream: do not wait for them for more than 2 s on Ctrl-C.
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=2)


def main() -> None:
    """Run the command on its own (``python -m leap.dashboard.cli``)."""
    typer.run(dashboard_cmd)


if __name__ == "__main__":
    main()
