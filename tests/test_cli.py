"""leap.cli: the process-wide choices the entry point makes before any command runs, and its errors."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from leap.cli import app
from leap.core.settings import LOCAL_KAFKA_PORT
from leap.services.processes import HOST, port_open

SHOW_POOL = ("from leap.cli import arrow_memory_pool; arrow_memory_pool(); import os, pyarrow as pa; "
             "print(pa.default_memory_pool().backend_name, os.environ['ARROW_DEFAULT_MEMORY_POOL'])")


def _pool_chosen(**env: str) -> list[str]:
    base = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    out = subprocess.run([sys.executable, "-c", SHOW_POOL], env={**base, **env}, capture_output=True, text=True,
                         check=True)
    return out.stdout.split()


def test_arrow_allocates_from_jemalloc_and_worker_processes_inherit_it() -> None:
    try:
        pa.jemalloc_memory_pool()
    except NotImplementedError:
        pytest.skip("this pyarrow has no jemalloc")
    assert _pool_chosen() == ["jemalloc", "jemalloc"]


def test_a_pool_the_environment_chose_is_kept() -> None:
    assert _pool_chosen(ARROW_DEFAULT_MEMORY_POOL="system") == ["system", "system"]


def test_the_demo_names_a_port_another_process_holds_and_exits_1_without_a_traceback(tmp_path: Path) -> None:
    """The broker's port held by a process these services did not start (the session's broker under
    another home, or a bare socket) stops the demo before any work, with one line naming the port."""
    with contextlib.ExitStack() as stack:
        if not port_open(LOCAL_KAFKA_PORT):
            stack.enter_context(socket.create_server((HOST, LOCAL_KAFKA_PORT)))
        res = CliRunner().invoke(app, ["demo", "--duration", "1"], env={"LEAP_HOME": str(tmp_path / "home")})
    assert res.exit_code == 1, res.output
    assert f"port {HOST}:{LOCAL_KAFKA_PORT} is taken" in res.output
    assert isinstance(res.exception, SystemExit)  # the command's own exit, not the ServiceError raised through
