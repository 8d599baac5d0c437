"""Worker processes for side-by-side fits: they end with the process that started them."""

from __future__ import annotations

from pathlib import Path


def test_pool_workers_end_with_the_process_that_started_them(tmp_path: Path) -> None:
    """A killed `leap drivers` or `leap backtest` must not leave its fitters running (they did, for over an hour)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    parent = tmp_path / "parent.py"
    parent.write_text(
        "import os, time\n"
        "from leap.training.pool import spawn_pool\n"
        "if __name__ == '__main__':\n"
        "    with spawn_pool(1, os.getpid) as pool:\n"
        "        child = pool.submit(os.getpid).result()  # the initializer has run in the child\n"
        "        pool.submit(time.sleep, 600)\n"
        "        print(child, flush=True)\n"
        "        time.sleep(600)\n"
    )
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, str(parent)], cwd=root, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.stdout is not None
    child = int(proc.stdout.readline().split()[0])
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and Path(f"/proc/{child}").exists():
        time.sleep(0.2)
    alive = Path(f"/proc/{child}").exists()
    if alive:
        os.kill(child, signal.SIGKILL)
    assert not alive, "the pool worker outlived its parent"


def _remember(*shared: object) -> None:
    global _SHARED
    _SHARED = shared


_SHARED: tuple[object, ...] = ()


def _shared() -> tuple[object, ...]:
    return _SHARED


def test_every_worker_starts_with_the_shared_data_and_its_file_is_gone_afterwards() -> None:
    import glob
    import tempfile

    from leap.training.pool import spawn_pool

    before = set(glob.glob(f"{tempfile.gettempdir()}/leap-pool-*"))
    with spawn_pool(2, _remember, {"rows": [1, 2, 3]}, "catalogue") as pool:
        got = [pool.submit(_shared).result() for _ in range(4)]
        assert set(glob.glob(f"{tempfile.gettempdir()}/leap-pool-*")) - before  # while the pool runs
    assert got == [({"rows": [1, 2, 3]}, "catalogue")] * 4
    assert set(glob.glob(f"{tempfile.gettempdir()}/leap-pool-*")) == before
