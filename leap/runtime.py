"""Builds the long-lived objects a process needs from :class:`Settings`, in one place."""

from __future__ import annotations

from collections.abc import Callable

import redis

from features.keys import KeyLayout
from features.store import FeatureStore
from leap.hardware import Catalogue, load_catalogue
from leap.settings import Settings


def redis_client(settings: Settings) -> redis.Redis:
    """A Redis client (TLS and AUTH come from the ``rediss://user:pass@`` URL)."""
    return redis.Redis.from_url(settings.redis_url, socket_timeout=10, socket_connect_timeout=5,
                                health_check_interval=30)


def canonicalizer(catalogue: Catalogue) -> Callable[[str], str]:
    """``name -> canonical name`` (names the catalogue lacks come back unchanged)."""

    def canonical(name: str) -> str:
        hw = catalogue.resolve(name)
        return hw.name if hw is not None else name

    return canonical


def feature_store(settings: Settings, catalogue: Catalogue | None = None, prefix: str | None = None) -> FeatureStore:
    catalogue = catalogue or load_catalogue()
    return FeatureStore(
        redis_client(settings),
        KeyLayout(prefix or settings.key_prefix),
        canonicalize=canonicalizer(catalogue),
    )
