"""Kafka and Redis in Docker: whether an engine answers, and ``docker compose`` on the repository's
compose file (``docker-compose.yml``, which takes the Kafka image tag from ``KAFKA_VERSION``)."""

from __future__ import annotations

import os
import shutil
import subprocess

from leap.services.kafka import KAFKA_VERSION
from leap.services.processes import ROOT, ServiceError

#: ``docker info`` must answer within this, or the engine counts as absent.
DOCKER_PROBE_TIMEOUT = 5.0
COMPOSE_FILE = ROOT / "docker-compose.yml"


def docker_available() -> bool:
    """True when a Docker engine answers quickly and the compose file is present."""
    if shutil.which("docker") is None or not COMPOSE_FILE.exists():
        return False
    try:
        probe = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            timeout=DOCKER_PROBE_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def compose(*args: str, timeout: float = 600.0) -> None:
    """Run ``docker compose -f docker-compose.yml ARGS``; raises ``ServiceError`` if it fails."""
    cmd = ["docker", "compose", "-f", str(COMPOSE_FILE), *args]
    # The compose file reads the image tag from here, so the version stays pinned in one place.
    env = {**os.environ, "LEAP_KAFKA_VERSION": KAFKA_VERSION}
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env)
    except subprocess.TimeoutExpired as exc:
        raise ServiceError(f"`{' '.join(cmd)}` did not finish within {timeout:.0f} s") from exc
    if run.returncode != 0:
        raise ServiceError(f"`{' '.join(cmd)}` failed:\n{(run.stderr or run.stdout)[-3000:]}")
