"""``leap worker ROLE`` as a child process: started with the parent's settings, stopped with
SIGTERM (so it commits its offsets, as in production), its output kept in a log file.

The demo, the end-to-end benchmark and the tests all run workers this way.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from leap.core.settings import Settings
from leap.services.processes import ROOT, stop_process, tail


def worker_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment a child worker needs to see what ``settings`` describes."""
    env = dict(os.environ)
    env.update(settings.to_env())
    env.update(extra)
    return env


class WorkerProcess:
    """One worker child process.

    Parameters
    ----------
    settings
        Connections, home and key prefix passed to the child through its environment.
    role
        ``features``, ``predictor``, ``all``, ...
    log_path
        Where the child's stdout and stderr go (appended).
    metrics_port
        Prometheus port of the child (0 = none).
    env
        Extra environment variables.
    """

    def __init__(self, settings: Settings, role: str, log_path: Path, metrics_port: int = 0, **env: str) -> None:
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "leap.cli", "worker", role, "--metrics-port", str(metrics_port)],
            cwd=ROOT, env=worker_env(settings, **env), stdout=self._log, stderr=subprocess.STDOUT,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL; returns the exit code."""
        if self.proc.poll() is None:
            stop_process(self.proc, timeout)
        self.proc.wait(10)
        self._log.close()
        return self.proc.returncode

    def log_tail(self, n: int = 40) -> str:
        return tail(self.log_path, n)
