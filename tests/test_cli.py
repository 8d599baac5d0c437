"""leap.cli: the process-wide choices the entry point makes before any command runs."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow as pa
import pytest

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
