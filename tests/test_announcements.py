"""Model announcements: every kind the project writes passes its own decoder, and a predictor that
meets a bad one keeps serving and says so once."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import orjson
import pytest

from leap.core.settings import Settings
from predictor.registry import ModelRecord, Registry
from predictor.reload import ModelFollower, announcement
from predictor.service import ModelHolder, lookup_fallback
from streams.events import SCHEMA_VERSION, EventError, ModelAnnouncement


def _record(tmp_path: Path, version: str, metadata: dict[str, object]) -> ModelRecord:
    return ModelRecord(version, "lightgbm", time.time(), tmp_path / version, {"version": version, **metadata})


@pytest.mark.parametrize("kind", ["promotion", "rollback to a version", "rollback to lookup"])
def test_every_kind_of_announcement_round_trips(kind: str, tmp_path: Path) -> None:
    record = {
        "promotion": _record(tmp_path, "lgbm-new", {"metrics": {"acc@10": 0.91}}),
        "rollback to a version": _record(tmp_path, "lgbm-old", {}),  # an older artifact without metrics
        "rollback to lookup": None,
    }[kind]
    event = announcement(record, "lookup" if record is None else None)
    again = ModelAnnouncement.decode(event.encode())
    assert again == event
    if record is None:
        assert (again.model_version, again.kind, again.artifact, again.metrics) == ("lookup", "lookup", None, None)
    else:
        assert (again.model_version, again.artifact) == (record.version, str(record.path))
        assert again.metrics == record.metadata.get("metrics")


def test_an_announcement_its_decoder_would_refuse_is_never_built(tmp_path: Path) -> None:
    with pytest.raises(EventError, match="kind"):
        announcement(ModelRecord("v", "xgboost", time.time(), tmp_path, {}))


def _raw(version: str, **over: object) -> bytes:
    payload = {"schema_version": SCHEMA_VERSION, "event_id": f"model:{version}", "event_time": time.time(),
               "model_version": version, "kind": "lookup", "artifact": None, "metrics": None, **over}
    return orjson.dumps(payload)


def test_a_bad_announcement_is_ignored_and_said_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    holder = ModelHolder(lookup_fallback())
    follower = ModelFollower(Settings(home=tmp_path), Registry(tmp_path / "registry"), holder)
    caplog.set_level(logging.INFO, "leap.reload")
    try:
        for _ in range(3):
            follower._apply(_raw("transfer", kind="xgboost"))
            follower._apply(b"{not json")
        assert holder.active.version == "lookup-0"  # still serving what it served
        bad = [r for r in caplog.records if "bad model announcement" in r.getMessage()]
        assert len(bad) == 1 and "still serving lookup-0" in bad[0].getMessage()
        follower._apply(_raw("transfer"))  # a good one is taken, and the next bad one said again
        assert holder.active.version == "transfer"
        follower._apply(_raw("lookup", metrics="none"))
        assert holder.active.version == "transfer"
        assert len([r for r in caplog.records if "bad model announcement" in r.getMessage()]) == 2
        follower._apply(_raw("lookup"))  # a rollback to the baseline ("metrics": null) is taken
        assert holder.active.version == "lookup"
    finally:
        follower.consumer.close()
