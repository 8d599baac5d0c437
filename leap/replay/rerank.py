"""``rerank``: predict old submissions again with another model and compare (a shadow report).

Each submission is re-ranked with the features its original ranking recorded
(``features_used``), so old and new predictions saw the same, point-in-time inputs. Ranking
goes through :class:`RankingService`, the code the predictor runs, including its cold-start
fill and pricing; only the feature read is replaced by the recorded snapshot.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, cast

import numpy as np

from features.snapshot import FeatureSnapshot
from features.store import FeatureStore
from leap.core.accuracy import summary
from leap.core.hardware import Catalogue
from leap.core.settings import Settings
from leap.replay.decode import decode
from leap.replay.reader import Reader, ReplayError
from predictor.models import BASELINES
from predictor.service import ActiveModel, ModelHolder, RankingService
from streams.events import JobFinish, Ranking, Submission

#: Submissions ranked per call, as the predictor batches them.
BATCH = 500


class RecordedFeatures:
    """Stands in for the feature store: returns the snapshot each old ranking recorded."""

    def __init__(self, snapshots: dict[str, FeatureSnapshot]) -> None:
        self.snapshots = snapshots

    def read(self, submissions: Sequence[Submission]) -> list[FeatureSnapshot]:
        return [self.snapshots[s.event_id] for s in submissions]


def load_model(name: str, settings: Settings) -> ActiveModel:
    """A baseline by kind (``lookup``, ``transfer``) or a registered version.

    Raises
    ------
    ReplayError
        When the registry module is missing or does not know the version.
    """
    if name in BASELINES:
        return ActiveModel(BASELINES[name](), name)
    try:  # imported lazily: the registry is optional for baseline-only replays
        from predictor.registry import Registry
    except ImportError as exc:
        raise ReplayError(
            f"model {name!r}: the model registry (predictor.registry) is not available ({exc}); "
            f"only the baselines can be used: {', '.join(BASELINES)}"
        ) from None
    try:
        model = Registry(settings.registry_dir).load(name)
    except (KeyError, LookupError, FileNotFoundError, ValueError, OSError) as exc:
        raise ReplayError(f"model version {name!r} is not in the registry at {settings.registry_dir}: {exc}") from None
    compile_trees = getattr(model, "compile_trees", None)
    if compile_trees is not None:  # a LightGBM model: rank with its compiled trees, as a predictor does
        compile_trees(settings.compiled_dir)
    return ActiveModel(model, name)


@dataclass
class Joined:
    """Submissions in the range with their old ranking and, when known, their finish."""

    subs: dict[str, Submission] = field(default_factory=dict)
    rankings: dict[str, Ranking] = field(default_factory=dict)
    finishes: dict[str, JobFinish] = field(default_factory=dict)


def collect(reader: Reader, submissions_topic: str, jobs: Sequence[str]) -> Joined:
    """Read submissions, rankings and finishes; keep the newest of each per attempt."""
    out = Joined()
    for msg in reader:
        ev = decode(msg, reader.tally)
        if ev is None:
            continue
        job = getattr(ev, "job_key", "")
        if jobs and not any(fnmatchcase(job, p) for p in jobs):
            continue
        if isinstance(ev, Submission) and msg.topic() == submissions_topic:
            out.subs[ev.attempt_id] = ev
        elif isinstance(ev, Ranking):
            old = out.rankings.get(ev.attempt_id)
            if old is None or ev.event_time >= old.event_time:
                out.rankings[ev.attempt_id] = ev
        elif isinstance(ev, JobFinish):
            prev = out.finishes.get(ev.attempt_id)
            if prev is None or ev.event_time >= prev.event_time:
                out.finishes[ev.attempt_id] = ev
    return out


def _canonical(catalogue: Catalogue, name: str | None) -> str | None:
    if name is None:
        return None
    hw = catalogue.resolve(name)
    return hw.name if hw is not None else name


def _predicted_on(ranking: Ranking, hardware: str, catalogue: Catalogue) -> float | None:
    """Predicted total throughput for the hardware the attempt ran on; None if not a candidate."""
    for c in ranking.candidates:
        if _canonical(catalogue, c["hardware"]) == hardware:
            value = c.get("predicted_throughput")
            return float(value) if value is not None else float("nan")
    return None


def _accuracy(pairs: list[tuple[float, float]]) -> dict[str, Any]:
    pred = np.array([p for p, _ in pairs], dtype=np.float64)
    actual = np.array([a for _, a in pairs], dtype=np.float64)
    return summary(pred, actual)


def _rerank(active: ActiveModel, subs: list[Submission], snaps: dict[str, FeatureSnapshot],
            catalogue: Catalogue) -> dict[str, Ranking]:
    """Rankings of ``subs`` by ``active``, from the recorded snapshots, by attempt id."""
    service = RankingService(cast(FeatureStore, RecordedFeatures(snaps)), catalogue, ModelHolder(active))
    new: dict[str, Ranking] = {}
    for i in range(0, len(subs), BATCH):
        batch = subs[i:i + BATCH]
        for sub, r in zip(batch, service.rank(batch), strict=True):
            new[sub.attempt_id] = r
    return new


def basis_counts(rankings: Iterable[Ranking]) -> dict[str, dict[str, int]]:
    """How many candidates of the rankings had each evidence and each estimate served (their
    ``basis``; candidates of schema-version-1 rankings count under ``unrecorded``)."""
    evidence: Counter[str] = Counter()
    estimate: Counter[str] = Counter()
    for r in rankings:
        for c in r.candidates:
            basis = c.get("basis") or {}
            evidence[basis.get("evidence", "unrecorded")] += 1
            estimate[basis.get("estimate", "unrecorded")] += 1
    return {"evidence": dict(evidence.most_common()), "estimate": dict(estimate.most_common())}


def shadow_report(joined: Joined, models: Sequence[ActiveModel], catalogue: Catalogue) -> dict[str, Any]:
    """Top-1 agreement and accuracy of the old rankings and of each model on the same attempts."""
    ranked: list[tuple[Submission, Ranking, FeatureSnapshot]] = []
    bad_features = 0
    for attempt, sub in joined.subs.items():
        old = joined.rankings.get(attempt)
        if old is None:
            continue
        try:
            ranked.append((sub, old, FeatureSnapshot.from_json(old.features_used)))
        except (KeyError, TypeError, ValueError):
            bad_features += 1
    finished: dict[str, tuple[str, float]] = {}
    for sub, _, _ in ranked:
        fin = joined.finishes.get(sub.attempt_id)
        if fin is not None and fin.throughput is not None:
            finished[sub.attempt_id] = (_canonical(catalogue, fin.hardware) or fin.hardware, fin.throughput)

    def accuracy_of(rankings: dict[str, Ranking]) -> tuple[dict[str, Any], int]:
        pairs, off = [], 0
        for attempt, (hw, actual) in finished.items():
            pred = _predicted_on(rankings[attempt], hw, catalogue)
            if pred is None:
                off += 1
            else:
                pairs.append((pred, actual))
        return _accuracy(pairs), off

    old_by_attempt = {sub.attempt_id: old for sub, old, _ in ranked}
    old_acc, off_candidates = accuracy_of(old_by_attempt)
    report: dict[str, Any] = {
        "submissions": len(joined.subs),
        "ranked": len(ranked),
        "not_ranked": len(joined.subs) - len(ranked) - bad_features,
        "bad_features_used": bad_features,
        "finished": len(finished),
        "finished_off_candidates": off_candidates,
        "old": {"model_versions": dict(Counter(old.model_version for _, old, _ in ranked)), "accuracy": old_acc,
                "basis": basis_counts(old_by_attempt.values())},
        "models": {},
    }
    snaps = {sub.event_id: snap for sub, _, snap in ranked}
    subs = [sub for sub, _, _ in ranked]
    for active in models:
        new = _rerank(active, subs, snaps, catalogue)
        agree = sum(
            _canonical(catalogue, new[a].best_hardware) == _canonical(catalogue, old.best_hardware)
            for a, old in old_by_attempt.items()
        )
        acc, _ = accuracy_of(new)
        report["models"][active.version] = {
            "kind": active.model.kind,
            "top1_agreement": agree / len(ranked) if ranked else None,
            "changed_best": len(ranked) - agree,
            "accuracy": acc,
            "basis": basis_counts(new.values()),
        }
    return report
