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
        "    with spawn_pool(1, 'shared') as pool:\n"
        "        child = pool.submit(os.getpid).result()  # the worker has started\n"
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


def _shared_with(x: int) -> tuple[int, tuple[object, ...]]:
    from leap.training.pool import shared

    return x, shared()


def test_every_task_reads_the_shared_data_here_and_in_workers_and_its_file_is_gone_afterwards() -> None:
    import glob
    import tempfile

    from leap.training.pool import run_shared, shared

    data = ({"rows": [1, 2, 3]}, "catalogue")
    args = [(x,) for x in range(5)]
    here = list(run_shared(_shared_with, args, data, jobs=1))
    before = set(glob.glob(f"{tempfile.gettempdir()}/leap-pool-*"))
    pooled = []
    for i, result in run_shared(_shared_with, args, data, jobs=2):
        assert set(glob.glob(f"{tempfile.gettempdir()}/leap-pool-*")) - before  # while the pool runs
        pooled.append((i, result))
    assert here == pooled == [(x, (x, data)) for x in range(5)]
    assert set(glob.glob(f"{tempfile.gettempdir()}/leap-pool-*")) == before
    unordered = sorted(run_shared(_shared_with, args, data, jobs=2, in_order=False))
    assert unordered == pooled
    assert list(run_shared(_shared_with, [], data, jobs=2)) == []  # no tasks: no pool to start
    try:
        shared()
    except RuntimeError as e:
        assert "run_shared" in str(e)
    else:
        raise AssertionError("shared() outside a task returned data")
