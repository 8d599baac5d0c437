"""Where the store keeps a model type's and a family's configuration aggregates, and what it sends
them (:mod:`features.completion` says what they are for)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from features.completion import config_observations, partial
from features.keys import KeyLayout
from features.layout import num, packable_id
from features.redis_batch import Item
from features.snapshot import LookupStat
from streams.events import Submission

Config = tuple[dict[str, LookupStat], dict[str, LookupStat]]


def _keys(layout: KeyLayout, sub: Submission) -> list[str]:
    """The configuration hashes of ``sub``'s model type and (if known) family."""
    keys = [layout.config_model(sub.model_type)]
    if sub.family is not None:
        keys.append(layout.config_family(sub.family))
    return keys


def config_items(layout: KeyLayout, events: Sequence[Submission]) -> tuple[list[Item], list[int]]:
    """The ``lookup.lua`` items that feed the submissions' observations to their aggregates (keys:
    the hash, its window and its sorted view; arguments: event id, time, field, value), and the
    index of the submission each item comes from."""
    items: list[Item] = []
    owner: list[int] = []
    for i, sub in enumerate(events):
        eid, t = packable_id(sub.event_id), num(sub.event_time)
        for field, value in config_observations(sub):
            for key in _keys(layout, sub):
                items.append(((key, layout.window_of(key), layout.sorted_of(key)), (eid, t, field, num(value))))
                owner.append(i)
    return items, owner


def keys_to_read(layout: KeyLayout, submissions: Sequence[Submission]) -> list[str]:
    """The configuration hashes a batch reads: those of its partial submissions only, each once."""
    return list(dict.fromkeys(key for sub in submissions if partial(sub) for key in _keys(layout, sub)))


def config_of(layout: KeyLayout, sub: Submission, read: Mapping[str, dict[str, LookupStat]]) -> Config:
    """The (model type, family) aggregates read for ``sub``; empty for a complete submission."""
    if not partial(sub):
        return {}, {}
    family = read.get(layout.config_family(sub.family), {}) if sub.family is not None else {}
    return read.get(layout.config_model(sub.model_type), {}), family
