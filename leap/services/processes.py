"""Process helpers shared by the local services and the worker child processes.

Pid files and the check that a pid is still one of ours, detached start (``spawn``), stop
(SIGTERM, then SIGKILL after a grace period), port probes, log tails for error messages and the
lock that serialises ``leap services up``/``down`` between processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from leap.core.settings import Settings

#: The repository's root: the workers' working directory and the folder of the compose file.
ROOT = Path(__file__).resolve().parents[2]
#: Local services listen on loopback only.
HOST = "127.0.0.1"
STOP_TIMEOUT = 30.0

# Keep the Popen handles of the services started by this process: a handle that is garbage
# collected while its child runs raises a ResourceWarning, and a live handle lets us reap (and
# so tell apart) a child that died during start-up.
_CHILDREN: list[subprocess.Popen[bytes]] = []

#: Progress callback: receives a short description of each slow step.
Step = Callable[[str], None]


class ServiceError(RuntimeError):
    """A service could not be started, reached or stopped; the message says why."""


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, readable and writable by the owner only from its first byte
    (created with mode 0600, not left to the umask; an existing file is made 0600 first)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "w") as fh:
        os.fchmod(fd, 0o600)
        fh.write(text)


def services_dir(settings: Settings) -> Path:
    """Folder holding every local service's files."""
    return settings.home / "services"


@contextlib.contextmanager
def lock(settings: Settings) -> Iterator[None]:
    """Serialise ``up``/``down`` between processes (a test session and a shell, say)."""
    root = services_dir(settings)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def port_open(port: int, host: str = HOST, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def tail(path: Path, lines: int = 25) -> str:
    """The last ``lines`` lines of a text file; empty if it cannot be read."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def log_tail(folder: Path | None, names: tuple[str, ...]) -> str:
    """The tails of a service's log files (``folder / "logs" / name``), for error messages."""
    if folder is None:
        return ""
    parts = []
    for name in names:
        text = tail(folder / "logs" / name)
        if text:
            parts.append(f"--- {folder / 'logs' / name} (tail) ---\n{text}")
    return "\n".join(parts)


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` runs (a zombie counts as dead)."""
    # A child we started but have not reaped is a zombie: it answers kill(0) but is dead.
    for child in _CHILDREN:
        if child.pid == pid:
            return child.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def owned_pid(pidfile: Path, root: Path) -> int | None:
    """The pid in ``pidfile`` if that process is alive and is one of ours.

    A stale pid file can name a recycled pid; the process counts as ours only when its command
    line or working directory lies under ``root`` (Redis rewrites its process title, so the
    working directory is what identifies it). Without ``/proc`` the pid file is trusted.
    """
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None
    if not pid_alive(pid):
        return None
    proc = Path(f"/proc/{pid}")
    if not proc.exists():
        return pid
    marker = str(root)
    try:
        if marker in proc.joinpath("cmdline").read_bytes().decode(errors="replace"):
            return pid
        if os.readlink(proc / "cwd").startswith(marker):
            return pid
    except OSError:
        return None
    return None


def stop_process(target: int | subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT) -> str:
    """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL. Returns how it ended.

    Parameters
    ----------
    target
        A pid, or the Popen handle of a child that ``spawn`` did not start (a worker): polling
        the handle reaps the child, where a bare pid of an exited child would look alive (a
        zombie) on a system without ``/proc``.
    timeout
        Grace period in seconds between SIGTERM and SIGKILL.

    Returns
    -------
    str
        ``stopped``, or ``killed`` if it did not stop within the grace period.
    """
    pid = target if isinstance(target, int) else target.pid

    def alive() -> bool:
        return pid_alive(target) if isinstance(target, int) else target.poll() is None

    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return "stopped"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            return "stopped"
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    return "killed"


def stop_owned(pidfile: Path, root: Path) -> str:
    """Stop the process named by ``pidfile`` if it is ours (see ``owned_pid``); the file goes.

    Returns ``stopped``, ``killed`` or ``not running``.
    """
    pid = owned_pid(pidfile, root)
    pidfile.unlink(missing_ok=True)
    return "not running" if pid is None else stop_process(pid)


def listening_pid(port: int) -> int | None:
    """The process listening on TCP ``port`` of this machine, if this user may see it."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd) in inodes for fd in fd_dir.iterdir()):
                return int(fd_dir.parent.name)
        except OSError:
            continue
    return None


def spawn(cmd: list[str], cwd: Path, out: Path, env: dict[str, str] | None = None) -> int:
    """Start a detached service process whose output goes to ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "ab") as log:
        # start_new_session: the service must survive the CLI (and Ctrl-C in its terminal);
        # stdin/stdout/stderr are never the caller's, so no pipe of a CI runner stays open.
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    _CHILDREN.append(proc)
    return proc.pid


def refuse_taken_ports(ports: tuple[int, ...], pidfile: Path, use_instead: str) -> None:
    """Raise if a port a local service needs is held by a process ``leap services`` did not start.

    Parameters
    ----------
    ports
        Loopback ports the service listens on.
    pidfile
        The service's pid file, named in the message so the user can check it.
    use_instead
        How to use the process that holds the port instead, e.g. ``"set LEAP_REDIS_URL to use that server"``.
    """
    for port in ports:
        if port_open(port):
            raise ServiceError(
                f"port {HOST}:{port} is taken by a process that `leap services` did not start "
                f"(pid file {pidfile}). Stop it, or {use_instead}."
            )
