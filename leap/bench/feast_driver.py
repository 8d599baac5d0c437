"""The Feast side of ``bench feast``, run by an interpreter that has Feast (``python -P feast_driver.py``).

Used as a Feast user would: a feature repo in a temporary folder (Redis online store at the given
URL, a scratch project name, a local registry), one entity and one feature view, the entities'
rows written with ``write_to_online_store``, then ``get_online_features`` in batches. It imports
nothing of LEAP (the interpreter may be another virtualenv's) and talks JSON lines:

- stdin, first line: ``{"redis": {"host", "port", "db", "password", "cluster"}, "project",
  "rows": [{"job_key": ..., <feature>: ...}], "features": {name: "int" | "float"}, "batch"}``;
- then one line per pass, ``"pass"``: one ``get_online_features`` per batch over all entities,
  answered by ``{"batch_s": [...], "entities": n}``; ``"quit"`` tears the project down (its Redis
  keys included) and exits. The first answer is ``{"ready": true, "checked": n}`` after a check
  that Feast returns what was written.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
from feast import Entity, FeatureStore, FeatureView, Field, FileSource, ValueType
from feast.types import Float64, Int64

VIEW = "job_features"


def _repo_yaml(setup: dict[str, Any], folder: Path) -> str:
    r = setup["redis"]
    conn = f"{r['host']}:{r['port']}" + ("" if r.get("cluster") else f",db={r['db']}")  # a cluster has no db
    conn += f",password={r['password']}" if r.get("password") else ""
    return (f"project: {setup['project']}\n"
            f"registry: {folder / 'registry.db'}\n"
            f"provider: local\n"
            f"online_store:\n"
            f"  type: redis\n"
            f"  redis_type: {'redis_cluster' if r.get('cluster') else 'redis'}\n"
            f"  connection_string: \"{conn}\"\n"
            f"entity_key_serialization_version: 3\n")


def _store(setup: dict[str, Any], folder: Path) -> tuple[FeatureStore, list[Any]]:
    (folder / "feature_store.yaml").write_text(_repo_yaml(setup, folder))
    source_path = folder / "source.parquet"  # the offline source a view needs; never read here
    pd.DataFrame({"job_key": ["none"], "event_timestamp": [datetime.now(UTC)]}).to_parquet(source_path)
    job = Entity(name="job", join_keys=["job_key"], value_type=ValueType.STRING)
    types = {"int": Int64, "float": Float64}
    view = FeatureView(name=VIEW, entities=[job], ttl=timedelta(days=3650), online=True,
                       schema=[Field(name=n, dtype=types[t]) for n, t in setup["features"].items()],
                       source=FileSource(path=str(source_path), timestamp_field="event_timestamp"))
    store = FeatureStore(repo_path=str(folder))
    store.apply([job, view])
    return store, [job, view]


def _read(store: FeatureStore, refs: list[str], keys: list[str]) -> dict[str, list[Any]]:
    return store.get_online_features(features=refs, entity_rows=[{"job_key": k} for k in keys]).to_dict()


def _check(store: FeatureStore, refs: list[str], rows: list[dict[str, Any]], names: list[str]) -> int:
    """Feast answers what was written (the first batch's rows, every feature)."""
    sample = rows[:256]
    got = _read(store, refs, [r["job_key"] for r in sample])
    for name in names:
        if got[name] != [r[name] for r in sample]:
            raise RuntimeError(f"feast returned other values of {name} than were written")
    return len(sample)


def _pass(store: FeatureStore, refs: list[str], keys: list[str], batch: int) -> dict[str, Any]:
    times = []
    for i in range(0, len(keys), batch):
        chunk = keys[i : i + batch]
        t0 = time.perf_counter()
        _read(store, refs, chunk)
        times.append(time.perf_counter() - t0)
    return {"batch_s": times, "entities": len(keys)}


def _say(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    setup = json.loads(sys.stdin.readline())
    rows: list[dict[str, Any]] = setup["rows"]
    names = list(setup["features"])
    refs = [f"{VIEW}:{n}" for n in names]
    keys = [r["job_key"] for r in rows]
    with tempfile.TemporaryDirectory(prefix="leap-feast-") as tmp:
        store, objects = _store(setup, Path(tmp))
        try:
            df = pd.DataFrame(rows)
            df["event_timestamp"] = datetime.now(UTC)
            store.write_to_online_store(VIEW, df)
            _say({"ready": True, "checked": _check(store, refs, rows, names)})
            for line in sys.stdin:
                if line.strip() != "pass":
                    break
                _say(_pass(store, refs, keys, setup["batch"]))
        finally:
            store.teardown()  # deletes the project's entity keys from Redis
            del objects


if __name__ == "__main__":
    main()
