"""leap.training.dataset: what a replay does to the interpreter around it."""

from __future__ import annotations

import gc

import pytest

from leap.training.dataset import paused_gc


@paused_gc()
def _collector_on() -> bool:
    return gc.isenabled()


@paused_gc()
def _failing() -> None:
    raise ValueError("inside")


def test_the_collector_is_paused_inside_and_as_it_was_after() -> None:
    assert gc.isenabled()
    assert _collector_on() is False and gc.isenabled()
    with pytest.raises(ValueError, match="inside"):
        _failing()
    assert gc.isenabled()
    gc.disable()
    try:
        assert _collector_on() is False
        assert not gc.isenabled()  # a caller that had paused it keeps it paused
    finally:
        gc.enable()
