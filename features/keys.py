"""Redis key layout of the online store: the one place that spells a key.

What is stored under the keys (field values, counters, packed windows) is declared in
:mod:`features.layout`.

Every key of one job carries the ``{job_key}`` hash tag, so a job's keys share one Redis
Cluster slot and one Lua script can update them atomically. Lookup aggregates are tagged by
their model type (or family) for the same reason.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Newest observations kept per (job, hardware) for the robust estimate (median).
JOB_WINDOW = 8
#: Newest observations kept per (model type or family, hardware) for the lookup median.
LOOKUP_WINDOW = 64
#: Newest paired-ratio observations kept per (level, hardware pair).
PAIR_WINDOW = 32
#: Seconds a job's de-duplication set lives after its last write.
SEEN_TTL_S = 90 * 24 * 3600


@dataclass(frozen=True)
class KeyLayout:
    """Builds every key from one prefix (``Settings.key_prefix``)."""

    prefix: str = "leap"

    def job(self, job_key: str) -> str:
        """Hash: field per hardware -> :data:`~features.layout.JOB_FIELD`, plus the attempt counters."""
        return f"{self.prefix}:job:{{{job_key}}}"

    def job_window(self, job_key: str) -> str:
        """Hash: field per hardware -> the newest observations, a packed window (:mod:`features.layout`)."""
        return f"{self.prefix}:job:{{{job_key}}}:win"

    def job_seen(self, job_key: str) -> str:
        """Set of event ids already applied to this job."""
        return f"{self.prefix}:job:{{{job_key}}}:seen"

    def job_outbox(self, job_key: str) -> str:
        """Hash: finish event id -> the paired-ratio observations it yielded (so that a redelivered
        finish sends the same observations again, and the aggregates drop them as duplicates)."""
        return f"{self.prefix}:job:{{{job_key}}}:pairs"

    def lookup_model(self, model_type: str) -> str:
        """Hash: field per hardware -> :data:`~features.layout.LOOKUP_FIELD` of a model type."""
        return f"{self.prefix}:lookup:{{m:{model_type}}}"

    def lookup_family(self, family: str) -> str:
        """Hash: field per hardware -> :data:`~features.layout.LOOKUP_FIELD` of a model family."""
        return f"{self.prefix}:lookup:{{f:{family}}}"

    def config_model(self, model_type: str) -> str:
        """Hash: configuration field -> :data:`~features.layout.LOOKUP_FIELD` of a model type's
        submissions (their parameter count, model-parallel degrees, framework counts:
        :mod:`features.completion`); its window and sorted-view hashes as a lookup's."""
        return f"{self.prefix}:config:{{m:{model_type}}}"

    def config_family(self, family: str) -> str:
        """Hash: as :meth:`config_model`, of a model family's submissions."""
        return f"{self.prefix}:config:{{f:{family}}}"

    def pairs(self, level: str, name: str | None) -> str:
        """Hash: hardware pair field -> packed window of paired-ratio observations at one level
        (``model``: of a model type, ``family``: of a family, ``all``: of every job; ``name`` names
        the model type or family)."""
        if level == "all":
            return f"{self.prefix}:pairs:{{all}}"
        tag = {"model": "m", "family": "f"}[level]
        return f"{self.prefix}:pairs:{{{tag}:{name}}}"

    @staticmethod
    def window_of(key: str) -> str:
        """The window hash that backs an aggregate hash."""
        return f"{key}:win"

    @staticmethod
    def sorted_of(key: str) -> str:
        """Hash beside a lookup aggregate's window hash: field per hardware -> the window's sorted
        view (:data:`~features.layout.SORTED_VIEW`), so that a write need not parse the window."""
        return f"{key}:sorted"

    def job_of(self, key: str) -> str | None:
        """The job whose key (:meth:`job`, :meth:`job_window`, :meth:`job_seen`, :meth:`job_outbox`)
        this is; None for a shared aggregate's key or another prefix's."""
        head = f"{self.prefix}:job:{{"
        if not key.startswith(head):
            return None
        job_key, _, _ = key[len(head):].partition("}")
        return job_key

    def pattern(self) -> str:
        """Glob matching every key of this layout (for scans and clean-up)."""
        return f"{self.prefix}:*"
