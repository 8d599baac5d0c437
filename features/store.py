"""The Redis online store: idempotent, event-time-ordered updates and batched reads.

Writes: one Lua script per event (atomic check-and-set, unlike a client-side read-modify-write),
sent for a whole batch in one pipelined round trip. Reads: one pipelined round trip per batch
of submissions: an ``HGETALL`` of each submission's job hash, and one of each distinct model
type's and family's lookup hash in the batch (parsed once, shared by the batch's snapshots),
parsed straight into :class:`FeatureSnapshot`.

The stored values (field layout, separators, counter names, window packing) are declared in
:mod:`features.layout`: the scripts build them with its generated Lua prelude and the readers
here parse them with its parsers.

Throughput is stored per accelerator (samples/s divided by the attempt's accelerator count),
so attempts of one job or model type at different scales inform each other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache
from importlib import resources

import redis

from core.hardware import Catalogue, load_catalogue
from core.settings import Settings
from features.keys import JOB_WINDOW, LOOKUP_WINDOW, SEEN_TTL_S, KeyLayout
from features.layout import (
    COUNTER_FIELDS,
    COUNTER_PREFIX,
    STARTS,
    counter_field,
    lua_prelude,
    num,
    packable_id,
    parse_job_field,
    parse_lookup_field,
    text,
)
from features.snapshot import FeatureSnapshot, LookupStat, PriorStat
from streams.events import JobFinish, JobStart, Submission


@cache
def _lua(name: str) -> str:
    """A script with the generated value formats and the shared window helpers prepended.

    The scripts spell no stored format themselves: :func:`features.layout.lua_prelude` defines
    the packers and parsers from the one declaration the Python readers use too.
    """
    folder = resources.files("features") / "lua"
    return "\n".join([lua_prelude(), (folder / "window.lua").read_text(), (folder / f"{name}.lua").read_text()])


def _same(name: str) -> str:
    return name


def per_accelerator(throughput: float, num_accelerators: int) -> float:
    """Throughput of one accelerator: what the store keeps, so attempts at different scales compare."""
    return throughput / num_accelerators


class FeatureStore:
    """Online features of jobs and lookup aggregates in Redis.

    Parameters
    ----------
    client
        A ``redis.Redis`` client (``decode_responses=False``).
    layout
        Key layout; its prefix isolates deployments and replays.
    canonicalize
        Maps a hardware name as it appears in events to the catalogue's canonical name, so that
        aliases land in one field (names it does not know come back unchanged).
    """

    def __init__(
        self,
        client: redis.Redis,
        layout: KeyLayout | None = None,
        canonicalize: Callable[[str], str] | None = None,
    ) -> None:
        self.client = client
        self.layout = layout or KeyLayout()
        self._hw = cache(canonicalize) if canonicalize else _same
        self._finish = client.register_script(_lua("job_finish"))
        self._start = client.register_script(_lua("job_start"))
        self._lookup = client.register_script(_lua("lookup"))

    # ------------------------------------------------------------------ writes

    def apply_finishes(self, events: Sequence[JobFinish]) -> list[int]:
        """Apply finish events in one round trip; returns 1 per applied event, 0 per duplicate."""
        if not events:
            return []
        pipe = self.client.pipeline(transaction=False)
        lay = self.layout
        counts: list[int] = []  # pipeline replies per event (its own script, then its aggregates)
        for ev in events:
            eid, hw, t = packable_id(ev.event_id), self._hw(ev.hardware), num(ev.event_time)
            value = "" if ev.throughput is None else num(per_accelerator(ev.throughput, ev.num_accelerators))
            self._finish(
                keys=[lay.job(ev.job_key), lay.job_window(ev.job_key), lay.job_seen(ev.job_key)],
                args=[eid, t, hw, value, counter_field(ev.outcome), JOB_WINDOW, SEEN_TTL_S],
                client=pipe,
            )
            calls = 1
            if value:
                for agg in self._aggregates(ev):
                    self._lookup(keys=[agg, lay.window_of(agg)], args=[eid, t, hw, value, LOOKUP_WINDOW],
                                 client=pipe)
                    calls += 1
            counts.append(calls)
        results = pipe.execute()
        applied, i = [], 0
        for calls in counts:
            applied.append(int(results[i]))
            i += calls
        return applied

    def _aggregates(self, ev: JobFinish) -> list[str]:
        """The lookup aggregates a measured finish feeds: its model type, and its family if known."""
        keys = [self.layout.lookup_model(ev.model_type)]
        if ev.family is not None:
            keys.append(self.layout.lookup_family(ev.family))
        return keys

    def apply_starts(self, events: Sequence[JobStart]) -> list[int]:
        """Apply start events in one round trip; returns 1 per applied event, 0 per duplicate."""
        if not events:
            return []
        pipe = self.client.pipeline(transaction=False)
        starts = counter_field(STARTS)
        for ev in events:
            self._start(
                keys=[self.layout.job(ev.job_key), self.layout.job_seen(ev.job_key)],
                args=[packable_id(ev.event_id), starts, SEEN_TTL_S],
                client=pipe,
            )
        return [int(r) for r in pipe.execute()]

    # ------------------------------------------------------------------ reads

    def read(self, submissions: Sequence[Submission]) -> list[FeatureSnapshot]:
        """Feature snapshots of a batch of submissions, in one pipelined round trip."""
        if not submissions:
            return []
        # A batch shares model types and families: fetch and parse each aggregate once.
        models = list(dict.fromkeys(s.model_type for s in submissions))
        families = list(dict.fromkeys(s.family for s in submissions if s.family is not None))
        pipe = self.client.pipeline(transaction=False)
        for sub in submissions:
            pipe.hgetall(self.layout.job(sub.job_key))
        for model in models:
            pipe.hgetall(self.layout.lookup_model(model))
        for family in families:
            pipe.hgetall(self.layout.lookup_family(family))
        raw = pipe.execute()
        n, m = len(submissions), len(models)
        by_model = {name: _parse_lookup(raw[n + i]) for i, name in enumerate(models)}
        by_family = {name: _parse_lookup(raw[n + m + i]) for i, name in enumerate(families)}
        return [parse_snapshot(raw[i], by_model[s.model_type], by_family.get(s.family, {}) if s.family else {})
                for i, s in enumerate(submissions)]

    def delete_all(self) -> int:
        """Delete every key under this layout's prefix (replays into a scratch prefix use it)."""
        deleted = 0
        batch: list[bytes] = []
        for key in self.client.scan_iter(match=self.layout.pattern(), count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                deleted += int(self.client.unlink(*batch))
                batch.clear()
        if batch:
            deleted += int(self.client.unlink(*batch))
        return deleted


def parse_snapshot(
    job: dict[bytes, bytes], model: dict[str, LookupStat], family: dict[str, LookupStat]
) -> FeatureSnapshot:
    """A snapshot from a job's hash and its (already parsed, shared) lookup aggregates.

    Counter-prefixed fields that are not declared counters are skipped: hashes that older
    versions wrote may still hold the retired ``_last_start*`` fields.
    """
    prior: dict[str, PriorStat] = {}
    counts: dict[str, int] = {}
    for raw_field, raw_value in job.items():
        name, value = text(raw_field), text(raw_value)
        if name.startswith(COUNTER_PREFIX):
            counter = COUNTER_FIELDS.get(name)
            if counter is not None:
                counts[counter] = int(value)
            continue
        prior[name] = parse_job_field(value)
    return FeatureSnapshot.of(prior, model, family, counts)


def _parse_lookup(raw: dict[bytes, bytes]) -> dict[str, LookupStat]:
    return {text(field): parse_lookup_field(text(value)) for field, value in raw.items()}


def redis_client(settings: Settings) -> redis.Redis:
    """A Redis client for ``settings`` (TLS and AUTH come from the ``rediss://user:pass@`` URL)."""
    return redis.Redis.from_url(settings.redis_url, socket_timeout=10, socket_connect_timeout=5,
                                health_check_interval=30)


def open_store(settings: Settings, catalogue: Catalogue | None = None, prefix: str | None = None) -> FeatureStore:
    """The feature store a process uses: its Redis, its key prefix, and catalogue names for hardware."""
    catalogue = catalogue or load_catalogue()
    return FeatureStore(redis_client(settings), KeyLayout(prefix or settings.key_prefix),
                        canonicalize=catalogue.canonical)
