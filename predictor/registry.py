"""Model registry: versioned artifacts on disk, the current pointer, promotion history.

An artifact is a folder ``<root>/<version>/`` with LightGBM text models (``main.txt``,
``base.txt``) and ``metadata.json`` (parameters, learned state, feature list, training window,
data hash, metrics). Nothing is pickled. Baselines need no artifact: ``lookup`` and
``transfer`` always load.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from predictor.lgbm import LightGBMThroughput
from predictor.models import BASELINES, ThroughputModel

CURRENT = "CURRENT"
PROMOTIONS = "promotions.jsonl"


class RegistryError(LookupError):
    """Unknown version, or a registry operation that cannot be done."""


@dataclass(frozen=True)
class ModelRecord:
    version: str
    kind: str
    created_at: float
    path: Path
    metadata: dict[str, Any]


class Registry:
    """Versioned models under one folder.

    Parameters
    ----------
    root
        The registry folder (``Settings.registry_dir`` by default in the CLI).
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    # ------------------------------------------------------------------ artifacts

    def save(self, model: LightGBMThroughput, metadata: dict[str, Any], version: str | None = None) -> ModelRecord:
        """Write a fitted model as a new version (atomically: a half-written folder never shows)."""
        self.root.mkdir(parents=True, exist_ok=True)
        version = version or time.strftime("lgbm-%Y%m%d-%H%M%S", time.gmtime()) + f"-{os.getpid() % 1000:03d}"
        final = self.root / version
        if final.exists():
            raise RegistryError(f"version {version} already exists")
        tmp = Path(tempfile.mkdtemp(prefix=f".{version}.", dir=self.root))
        try:
            for name, text in model.model_texts().items():
                (tmp / f"{name}.txt").write_text(text)
            meta = {"version": version, "kind": model.kind, "created_at": time.time(), "state": model.state(),
                    **metadata}
            (tmp / "metadata.json").write_text(json.dumps(meta, indent=2, sort_keys=True, default=float))
            tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return self.record(version)

    def record(self, version: str) -> ModelRecord:
        path = self.root / version
        meta_path = path / "metadata.json"
        if not meta_path.is_file():
            known = ", ".join(r.version for r in self.versions()) or "none"
            raise RegistryError(f"unknown model version {version!r} in {self.root} (known: {known})")
        meta = json.loads(meta_path.read_text())
        return ModelRecord(version, meta["kind"], float(meta["created_at"]), path, meta)

    def versions(self) -> list[ModelRecord]:
        if not self.root.is_dir():
            return []
        out = [self.record(p.name) for p in self.root.iterdir()
               if p.is_dir() and not p.name.startswith(".") and (p / "metadata.json").is_file()]
        return sorted(out, key=lambda r: r.created_at)

    def load(self, version: str, path: Path | None = None) -> ThroughputModel:
        """A ready-to-predict model: a baseline by kind name, or a registered version."""
        if version in BASELINES:
            return BASELINES[version]()
        folder = Path(path) if path is not None and (Path(path) / "metadata.json").is_file() else self.root / version
        meta = self.record(version).metadata if folder == self.root / version else \
            json.loads((folder / "metadata.json").read_text())
        texts = {p.stem: p.read_text() for p in folder.glob("*.txt")}
        return LightGBMThroughput.from_artifact(meta["state"], texts)

    # ------------------------------------------------------------------ current pointer

    def current(self) -> str | None:
        path = self.root / CURRENT
        return path.read_text().strip() or None if path.is_file() else None

    def set_current(self, version: str, reason: str) -> None:
        """Point CURRENT at ``version`` (atomic rename) and log the promotion."""
        if version not in BASELINES:
            self.record(version)  # raises for an unknown version
        self.root.mkdir(parents=True, exist_ok=True)
        previous = self.current()
        tmp = self.root / f".{CURRENT}.tmp"
        tmp.write_text(version + "\n")
        tmp.replace(self.root / CURRENT)
        with (self.root / PROMOTIONS).open("a") as log:
            log.write(json.dumps({"time": time.time(), "version": version, "previous": previous,
                                  "reason": reason}) + "\n")

    def promotions(self) -> list[dict[str, Any]]:
        path = self.root / PROMOTIONS
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def previous(self) -> str | None:
        """The version that was current before the current one (for rollback)."""
        log = self.promotions()
        return log[-1]["previous"] if log else None
