"""What the predictor knows about one submission at the moment it ranks it.

A :class:`FeatureSnapshot` is produced by the online store (Redis) for serving and by
:mod:`features.offline` for training; the row builder only ever sees this type, which is
what makes served rows and training rows the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class PriorStat:
    """A job's measured per-accelerator throughput on one hardware type."""

    n: int
    last_time: float
    last: float
    robust: float  # median of the newest observations


@dataclass(frozen=True, slots=True)
class LookupStat:
    """Median per-accelerator throughput of a model type (or family) on one hardware type."""

    n: int
    median: float


@dataclass(frozen=True, slots=True)
class PairStat:
    """Observed log ratio of a candidate's throughput over the job's prior hardware's, from other jobs
    that ran on both (:mod:`features.pairs`), weighted towards the submission's configuration."""

    n: int  # observations in the window
    weight: float  # their total kernel weight: how many of them sit near this configuration
    log_ratio: float


@dataclass(frozen=True, slots=True)
class FeatureSnapshot:
    """Everything known about a job and its model type, keyed by canonical hardware name."""

    prior: dict[str, PriorStat] = field(default_factory=dict)
    lookup_model: dict[str, LookupStat] = field(default_factory=dict)
    lookup_family: dict[str, LookupStat] = field(default_factory=dict)
    #: level (``model``, ``family``, ``all``) -> candidate -> prior hardware -> paired ratio
    pairs: dict[str, dict[str, dict[str, PairStat]]] = field(default_factory=dict)
    #: Configuration aggregates of the model type and family (:mod:`features.completion`), read
    #: only for a submission that leaves out a field they stand in for (empty otherwise).
    config_model: dict[str, LookupStat] = field(default_factory=dict)
    config_family: dict[str, LookupStat] = field(default_factory=dict)
    starts: int = 0
    completed: int = 0
    failed: int = 0
    preempted: int = 0
    #: Why the job's own features are missing although it may have some (e.g. its stored hash
    #: could not be read): the ranking reports it as a fallback. Not part of :meth:`to_json`.
    fallback: str | None = None

    @classmethod
    def of(
        cls,
        prior: dict[str, PriorStat],
        lookup_model: dict[str, LookupStat],
        lookup_family: dict[str, LookupStat],
        counts: Mapping[str, int],
        pairs: dict[str, dict[str, dict[str, PairStat]]] | None = None,
        config: tuple[dict[str, LookupStat], dict[str, LookupStat]] = ({}, {}),
    ) -> FeatureSnapshot:
        """A snapshot whose attempt counters come from ``counts`` (name -> count, absent = 0).

        The names are :data:`features.layout.COUNTERS`, which are this class's counter fields, so
        a counter the store declares but this class lacks fails here instead of being dropped.
        """
        # counts holds ints for the int counters only (mypy cannot tell them from ``fallback``)
        return cls(prior=prior, lookup_model=lookup_model, lookup_family=lookup_family, pairs=pairs or {},
                   config_model=config[0], config_family=config[1], **counts)  # type: ignore[arg-type]

    def to_json(self) -> dict[str, Any]:
        """Compact form recorded in rankings (``features_used``); ``config`` only when read."""
        out: dict[str, Any] = {
            "prior": {h: [p.n, p.last_time, p.last, p.robust] for h, p in self.prior.items()},
            "lookup_model": {h: [s.n, s.median] for h, s in self.lookup_model.items()},
            "lookup_family": {h: [s.n, s.median] for h, s in self.lookup_family.items()},
            "pairs": {level: {h: {p: [s.n, s.weight, s.log_ratio] for p, s in by_prior.items()}
                              for h, by_prior in stats.items()}
                      for level, stats in self.pairs.items()},
            "attempts": [self.starts, self.completed, self.failed, self.preempted],
        }
        if self.config_model or self.config_family:
            out["config"] = {level: {f: [s.n, s.median] for f, s in table.items()}
                             for level, table in (("model", self.config_model), ("family", self.config_family))}
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FeatureSnapshot:
        """Inverse of :meth:`to_json`; training joins recorded rankings to outcomes with it."""
        starts, completed, failed, preempted = data.get("attempts", [0, 0, 0, 0])
        config = data.get("config", {})
        return cls(
            prior={h: PriorStat(int(v[0]), float(v[1]), float(v[2]), float(v[3]))
                   for h, v in data.get("prior", {}).items()},
            lookup_model={h: LookupStat(int(v[0]), float(v[1])) for h, v in data.get("lookup_model", {}).items()},
            lookup_family={h: LookupStat(int(v[0]), float(v[1])) for h, v in data.get("lookup_family", {}).items()},
            pairs={level: {h: {p: PairStat(int(v[0]), float(v[1]), float(v[2])) for p, v in by_prior.items()}
                           for h, by_prior in stats.items()}
                   for level, stats in data.get("pairs", {}).items()},
            config_model={f: LookupStat(int(v[0]), float(v[1])) for f, v in config.get("model", {}).items()},
            config_family={f: LookupStat(int(v[0]), float(v[1])) for f, v in config.get("family", {}).items()},
            starts=int(starts),
            completed=int(completed),
            failed=int(failed),
            preempted=int(preempted),
        )
