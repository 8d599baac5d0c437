"""The Redis online store: idempotent, event-time-ordered updates and batched reads.

Writes: Lua scripts that apply each event atomically (check-and-set, unlike a client-side
read-modify-write), one script call for a whole batch of events (one per hash slot on a Redis
Cluster), in one pipelined round trip, plus a second one for the lookup aggregates and the
paired-ratio observations the job scripts return (:mod:`features.pairs`). Reads: one pipelined round trip per
batch of submissions: an ``HGETALL`` of each submission's job hash, and one of each distinct model
type's and family's lookup hash in the batch (parsed once, shared by the batch's snapshots),
parsed straight into :class:`FeatureSnapshot`; then, for the jobs with a prior, one ``HMGET`` per
pair hash of the pair fields their rows use (a third round trip when a pair is new to this store).

The stored values (field layout, separators, counter names, window packing) are declared in
:mod:`features.layout`: the scripts build them with its generated Lua prelude and the readers
here parse them with its parsers.

Throughput is stored per accelerator (samples/s divided by the attempt's accelerator count),
so attempts of one job or model type at different scales inform each other.

"One round trip" is per Redis node (:mod:`features.redis_batch`): on a Redis Cluster a batch
costs one pipelined round trip on each node its keys live on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from functools import cache, lru_cache
from importlib import resources

import redis
from redis.cluster import RedisCluster

from features.config_keys import Config, config_items, config_of, keys_to_read
from features.keys import JOB_WINDOW, LOOKUP_WINDOW, PAIR_WINDOW, SEEN_TTL_S, KeyLayout
from features.layout import (
    COUNTER_FIELDS,
    COUNTER_PREFIX,
    STARTS,
    counter_field,
    field_name,
    num,
    packable_id,
    parse_job_field,
    parse_lookup_field,
    text,
)
from features.pairs import (
    Observation,
    Wanted,
    finish_coordinates,
    pair_levels,
    parse_window,
    ranked_priors,
    stored_values,
    submission_coordinates,
    summarise_pairs_of,
    unpack_observations,
    wanted_pairs,
)
from features.redis_batch import Batch, Client, Item, LuaScript
from features.snapshot import FeatureSnapshot, LookupStat, PairStat, PriorStat
from leap.core.hardware import Catalogue, load_catalogue
from leap.core.settings import Settings
from streams import metrics
from streams.events import JobFinish, JobStart, Submission

log = logging.getLogger("leap.features")


@cache
def _lua(name: str) -> str:
    """A script with the stored formats' helpers and the shared window helpers prepended.

    The scripts spell no stored format themselves: ``features/lua/formats.lua`` holds the packers
    and parsers generated from the one declaration the Python readers use too
    (:mod:`features.lua_formats`).
    """
    folder = resources.files("features") / "lua"
    return "\n".join((folder / f).read_text() for f in ("formats.lua", "window.lua", f"{name}.lua"))


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
        A ``redis.Redis`` or ``redis.cluster.RedisCluster`` client (``decode_responses=False``).
    layout
        Key layout; its prefix isolates deployments and replays.
    canonicalize
        Maps a hardware name as it appears in events to the catalogue's canonical name, so that
        aliases land in one field (names it does not know come back unchanged).
    """

    def __init__(
        self,
        client: Client,
        layout: KeyLayout | None = None,
        canonicalize: Callable[[str], str] | None = None,
    ) -> None:
        self.client = client
        self.layout = layout or KeyLayout()
        self._hw = cache(canonicalize) if canonicalize else _same
        self._pair_keys: dict[tuple[str, str | None], tuple[tuple[str, str], ...]] = {}
        self._wanted_memo: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[Wanted, frozenset[str]]] = {}
        self._known_pairs: set[str] = set()  # pair fields seen at the all level (_pair_windows)
        self._finish, self._start, self._lookup, self._pair = (
            LuaScript(name, _lua(name)) for name in ("job_finish", "job_start", "lookup", "pair"))

    # ------------------------------------------------------------------ writes

    def apply_finishes(self, events: Sequence[JobFinish]) -> list[int]:
        """Apply finish events; returns 1 per applied event, 0 per duplicate.

        Two pipelined round trips per batch: the job scripts, then the lookup aggregates and the
        paired-ratio observations the job scripts returned (they live in other Redis Cluster
        slots, so no one script can write both). Each trip runs one script call per batch on one
        server, one per hash slot on a cluster (:meth:`Batch.scripts`); each event is applied
        atomically either way, in the batch's order. The aggregates wait for the job scripts'
        verdict: when a script refuses an event (it writes nothing for it, applies the others
        and answers with an error reply), the batch raises before any aggregate is fed, so a
        dead-lettered finish never reaches a lookup or a pair window. A duplicate returns the
        observations its first application recorded and feeds the aggregates again (they drop
        what they hold), so a batch retried after a failure between the two trips, or one by
        one after a refusal, completes them.
        """
        if not events:
            return []
        batch = Batch(self.client)
        sent = [self._sent(ev) for ev in events]
        jobs = self._job_keys(events)
        items: list[Item] = [(jobs[ev.job_key], (eid, t, hw, value, counter_field(ev.outcome)))
                             for ev, (eid, hw, t, value) in zip(events, sent, strict=True)]
        per_event = batch.scripts(self._finish, (JOB_WINDOW, SEEN_TTL_S), items, 2)
        results = per_event(batch.execute())  # raises on a refusal: nothing below runs for this batch
        applied = [int(flag) for flag, _ in results]
        observed = [unpack_observations(text(packed)) for _, packed in results]
        self._add_aggregates(events, sent, observed)
        return applied

    def _sent(self, ev: JobFinish) -> tuple[str, str, str, str]:
        """What a finish's scripts are sent: event id, hardware, event time, per-accelerator
        throughput ('' for none)."""
        value = "" if ev.throughput is None else num(per_accelerator(ev.throughput, ev.num_accelerators))
        return packable_id(ev.event_id), self._hw(ev.hardware), num(ev.event_time), value

    def _job_keys(self, events: Sequence[JobFinish]) -> dict[str, tuple[str, ...]]:
        lay = self.layout
        return {job: (lay.job(job), lay.job_window(job), lay.job_seen(job), lay.job_outbox(job))
                for job in dict.fromkeys(ev.job_key for ev in events)}

    def _add_aggregates(self, events: Sequence[JobFinish], sent: Sequence[tuple[str, str, str, str]],
                        observed: Sequence[list[tuple[str, str]]]) -> None:
        """Feed each accepted finish's throughput to its lookup aggregates and its paired-ratio
        observations to its pair windows at every level, in one round trip."""
        lay, batch = self.layout, Batch(self.client)
        lookups: list[Item] = []
        pairs: list[Item] = []
        for ev, (eid, hw, t, value), obs in zip(events, sent, observed, strict=True):
            if value:
                aggregates = [lay.lookup_model(ev.model_type)]
                if ev.family is not None:
                    aggregates.append(lay.lookup_family(ev.family))
                lookups.extend(((agg, lay.window_of(agg), lay.sorted_of(agg)), (eid, t, hw, value))
                               for agg in aggregates)
            keys = [lay.pairs(level, name) for level, name in pair_levels(ev.model_type, ev.family)] if obs else []
            for field, packed in stored_values(hw, obs, finish_coordinates(ev)):
                pairs.extend(((key,), (field, t, eid, packed)) for key in keys)
        if lookups:
            batch.scripts(self._lookup, (LOOKUP_WINDOW,), lookups, 1)
        if pairs:
            batch.scripts(self._pair, (PAIR_WINDOW,), pairs, 1)
        if len(batch):
            batch.execute()

    def apply_starts(self, events: Sequence[JobStart]) -> list[int]:
        """Apply start events in one round trip; returns 1 per applied event, 0 per duplicate."""
        if not events:
            return []
        batch = Batch(self.client)
        lay = self.layout
        items: list[Item] = [((lay.job(ev.job_key), lay.job_seen(ev.job_key)), (packable_id(ev.event_id),))
                             for ev in events]
        per_event = batch.scripts(self._start, (counter_field(STARTS), SEEN_TTL_S), items, 1)
        return [int(flag) for flag, in per_event(batch.execute())]

    def apply_submissions(self, events: Sequence[Submission]) -> list[int]:
        """Feed the configuration aggregates of each submission's model type and family with what it
        says of the fields a submission may leave out (:func:`features.completion.config_observations`),
        in one round trip; returns per submission how many aggregate fields it entered (0 for a
        duplicate). Idempotent as the lookup aggregates are: the same script keeps them."""
        batch = Batch(self.client)
        items, owner = config_items(self.layout, events)
        entered = [0] * len(events)
        if not items:
            return entered
        per_item = batch.scripts(self._lookup, (LOOKUP_WINDOW,), items, 1)
        for i, (flag,) in zip(owner, per_item(batch.execute()), strict=True):
            entered[i] += int(flag)
        return entered

    # ------------------------------------------------------------------ reads

    def read(self, submissions: Sequence[Submission]) -> list[FeatureSnapshot]:
        """Feature snapshots of a batch of submissions.

        One pipelined round trip for the job hashes and the batch's distinct lookup hashes, and
        a second one (only when some job has a prior) for the paired ratios its rows will use:
        one ``HMGET`` per pair hash of the batch (its model types', families' and the ``all``
        level's), of the fields any of its jobs wants that may exist there (:meth:`_pair_windows`),
        each window parsed once per batch; a third one only when the second shows a pair that this
        store had not seen at the ``all`` level before.
        """
        if not submissions:
            return []
        # A batch shares model types and families: fetch and parse each aggregate once.
        models = list(dict.fromkeys(s.model_type for s in submissions))
        families = list(dict.fromkeys(s.family for s in submissions if s.family is not None))
        batch = Batch(self.client)
        for sub in submissions:
            batch.hgetall(self.layout.job(sub.job_key))
        for model in models:
            batch.hgetall(self.layout.lookup_model(model))
        for family in families:
            batch.hgetall(self.layout.lookup_family(family))
        config_keys = keys_to_read(self.layout, submissions)
        for key in config_keys:
            batch.hgetall(key)
        raw = batch.execute()
        n, m, k = len(submissions), len(models), len(models) + len(families)
        by_model = {name: _parse_lookup(raw[n + i], name) for i, name in enumerate(models)}
        by_family = {name: _parse_lookup(raw[n + m + i], name) for i, name in enumerate(families)}
        configs = {key: _parse_lookup(raw[n + k + i], key) for i, key in enumerate(config_keys)}
        jobs = [_job_fields(raw[i], s.job_key) for i, s in enumerate(submissions)]
        pairs = self._pairs(submissions, [job[0] if job else {} for job in jobs])
        return [_snapshot(job, by_model[s.model_type], by_family.get(s.family, {}) if s.family else {}, stats,
                          config_of(self.layout, s, configs))
                for s, job, stats in zip(submissions, jobs, pairs, strict=True)]

    def _pairs(self, submissions: Sequence[Submission], priors: Sequence[dict[str, PriorStat]]
               ) -> list[dict[str, dict[str, dict[str, PairStat]]]]:
        """Per submission, the paired ratios of each candidate over its row's prior hardware."""
        wanted = [self._wanted(prior, sub.candidates) if prior else _NO_PAIRS
                  for sub, prior in zip(submissions, priors, strict=True)]
        asked: dict[str, set[str]] = {}  # pair hash -> the fields any job of the batch wants
        levels: list[tuple[tuple[str, str], ...]] = []
        for sub, (want, fields) in zip(submissions, wanted, strict=True):
            keys = self._pair_keys_of(sub.model_type, sub.family) if want else ()
            for _, key in keys:
                if key in asked:
                    asked[key] |= fields
                else:
                    asked[key] = set(fields)
            levels.append(keys)
        windows = self._pair_windows(asked)
        # one pass over the batch's windows; a window seen from one configuration is summarised once
        return summarise_pairs_of([(want, {level: windows.get(key, {}) for level, key in keys} if keys else {},
                                    submission_coordinates(sub))
                                   for sub, (want, _), keys in zip(submissions, wanted, levels, strict=True)])

    def _pair_windows(self, asked: dict[str, set[str]]) -> dict[str, dict[str, list[Observation]]]:
        """The asked pair windows (pair hash -> field -> observations), parsed; absent ones left out.

        Every paired-ratio observation is filed at the ``all`` level as well as at its model type's
        and family's (:meth:`_add_aggregates`; a refusal refuses it at every level, since a level
        refuses for its time or for a window that is there), so a field the ``all`` hash lacks is
        absent at the other levels too. The ``all`` hash is asked every wanted field; the other
        levels only the fields known to exist at ``all``: most wanted pairs exist nowhere (a batch
        of 256 wanted ~5,000 fields and found a few). Fields are never removed, so what a reply
        showed stays true (a stale entry, after :meth:`delete_all`, asks for a field that is not
        there). A field the ``all`` reply shows for the first time is asked at the other levels in
        one more round trip.
        """
        all_key = self.layout.pairs("all", None)
        known = self._known_pairs
        first = {key: list(fields if key == all_key else fields & known) for key, fields in asked.items()}
        windows, present = _fetch_windows(self.client, first, all_key)
        new = present - known
        if new:
            if len(known) + len(new) > _MAX_KNOWN_PAIRS:
                known.clear()
            known.update(new)
            more, _ = _fetch_windows(self.client, {key: list(fields & new) for key, fields in asked.items()
                                                   if key != all_key}, all_key)
            for key, found in more.items():
                windows.setdefault(key, {}).update(found)
        return windows

    def _wanted(self, prior: dict[str, PriorStat], candidates: Sequence[str]) -> tuple[Wanted, frozenset[str]]:
        """:func:`wanted_pairs` of the canonical candidates and the pair fields they name, memoised
        by what they depend on: the job's ranked priors and the candidate list (the result is
        shared: nothing changes it)."""
        key = (ranked_priors(prior), tuple(candidates))
        found = self._wanted_memo.get(key)
        if found is None:
            if len(self._wanted_memo) >= 1 << 16:
                self._wanted_memo.clear()
            want = wanted_pairs(prior, [self._hw(c) for c in candidates])
            fields = frozenset(field for pairs in want.values() for _, field, _ in pairs)
            found = self._wanted_memo[key] = (want, fields)
        return found

    def _pair_keys_of(self, model_type: str, family: str | None) -> tuple[tuple[str, str], ...]:
        """``(level, pair hash)`` of every level a submission of this model type and family reads."""
        keys = self._pair_keys.get((model_type, family))
        if keys is None:
            keys = self._pair_keys[(model_type, family)] = tuple(
                (level, self.layout.pairs(level, name)) for level, name in pair_levels(model_type, family))
        return keys

    def delete_all(self) -> int:
        """Delete every key under this layout's prefix (replays into a scratch prefix use it)."""
        deleted = 0
        self._known_pairs.clear()
        batch = Batch(self.client)  # one key per UNLINK: a cluster refuses keys of several slots
        for key in self.client.scan_iter(match=self.layout.pattern(), count=1000):
            batch.unlink(text(key))
            if len(batch) >= 1000:
                deleted += sum(batch.execute())
        if len(batch):
            deleted += sum(batch.execute())
        return deleted


def parse_job(job: Mapping[bytes, bytes]) -> tuple[dict[str, PriorStat], dict[str, int]]:
    """A job hash's priors (hardware -> :class:`PriorStat`) and attempt counters.

    Counter-prefixed fields that are not declared counters are skipped: hashes that older
    versions wrote may still hold the retired ``_last_start*`` fields. ValueError (a
    UnicodeDecodeError included) when a field does not read as declared.
    """
    prior: dict[str, PriorStat] = {}
    counts: dict[str, int] = {}
    for raw_field, raw_value in job.items():
        name = field_name(raw_field)
        if name.startswith(COUNTER_PREFIX):
            counter = COUNTER_FIELDS.get(name)
            if counter is not None:
                counts[counter] = int(text(raw_value))
            continue
        prior[name] = parse_job_field(raw_value)
    return prior, counts


def parse_snapshot(
    job: Mapping[bytes, bytes], model: dict[str, LookupStat], family: dict[str, LookupStat]
) -> FeatureSnapshot:
    """A snapshot from a job's hash and its (already parsed, shared) lookup aggregates."""
    prior, counts = parse_job(job)
    return FeatureSnapshot.of(prior, model, family, counts)


#: Ranking fallback of a job whose stored hash could not be read (it is ranked as if it had no prior).
UNREADABLE_JOB = "unreadable_job_features"


def _unreadable(kind: str, name: str, exc: ValueError) -> None:
    metrics.UNREADABLE_FEATURES.labels(kind).inc()
    log.warning("unreadable %s features of %r, left out: %s", kind, name[:120], exc)


def _job_fields(job: Mapping[bytes, bytes], job_key: str) -> tuple[dict[str, PriorStat], dict[str, int]] | None:
    """:func:`parse_job`, or None when the job's hash cannot be read: one corrupt job must not fail
    the batch of other jobs it is read with."""
    try:
        return parse_job(job)
    except ValueError as exc:  # UnicodeDecodeError included
        _unreadable("job", job_key, exc)
        return None


def _snapshot(job: tuple[dict[str, PriorStat], dict[str, int]] | None, model: dict[str, LookupStat],
              family: dict[str, LookupStat], pairs: dict[str, dict[str, dict[str, PairStat]]],
              config: Config) -> FeatureSnapshot:
    """A submission's snapshot; without the job's own features, and saying so, when its hash was unreadable."""
    if job is None:
        return FeatureSnapshot(lookup_model=model, lookup_family=family, config_model=config[0],
                               config_family=config[1], fallback=UNREADABLE_JOB)
    return FeatureSnapshot.of(job[0], model, family, job[1], pairs, config)


@lru_cache(maxsize=1 << 16)
def _lookup_stat(value: bytes) -> LookupStat:
    """A lookup field's bytes, parsed: the same aggregates are read batch after batch, and between
    two of their updates their bytes (so their parse: an immutable stat) do not change."""
    return parse_lookup_field(text(value))


@lru_cache(maxsize=1 << 14)
def _pair_window(value: bytes) -> list[Observation]:
    """A pair window's bytes, parsed (memoised like :func:`_lookup_stat`; nothing changes the list)."""
    return parse_window(text(value))


#: Parsed lookup hashes by their stored fields and values: a batch reads ~160 of them, and between
#: two updates of an aggregate its parse does not change. Shared like a batch's snapshots already
#: share one aggregate's dict: nothing writes to it. Only hashes that parsed whole are kept, so an
#: unreadable field is counted (and logged) on every read, as before.
_LOOKUPS: dict[tuple[tuple[bytes, bytes], ...], dict[str, LookupStat]] = {}
_MAX_LOOKUPS = 1 << 14


def _parse_lookup(raw: Mapping[bytes, bytes], name: str) -> dict[str, LookupStat]:
    """A lookup aggregate's fields, parsed; an unreadable field is left out (and counted)."""
    key = tuple(raw.items())
    out = _LOOKUPS.get(key)
    if out is not None:
        return out
    out, whole = {}, True
    for field, value in raw.items():
        try:
            out[field_name(field)] = _lookup_stat(value)
        except ValueError as exc:
            _unreadable("lookup", name, exc)
            whole = False
    if whole:
        if len(_LOOKUPS) >= _MAX_LOOKUPS:
            _LOOKUPS.clear()
        _LOOKUPS[key] = out
    return out


#: Most pair fields a store remembers as present at the ``all`` level (at most one per hardware pair).
_MAX_KNOWN_PAIRS = 1 << 16
#: What a job without priors wants: no pairs.
_NO_PAIRS: tuple[Wanted, frozenset[str]] = ({}, frozenset())


def _fetch_windows(client: Client, asked: Mapping[str, Sequence[str]], key_present: str
                   ) -> tuple[dict[str, dict[str, list[Observation]]], set[str]]:
    """One ``HMGET`` per pair hash of its asked fields, in one round trip per node (none when
    nothing is asked): the windows parsed, and the fields of ``key_present`` that hold any value
    (an unreadable window is present, though left out of the parsed ones)."""
    asked = {key: fields for key, fields in asked.items() if fields}
    windows: dict[str, dict[str, list[Observation]]] = {}
    present: set[str] = set()
    if not asked:
        return windows, present
    batch = Batch(client)
    for key, fields in asked.items():
        batch.hmget(key, fields)
    for (key, fields), reply in zip(asked.items(), batch.execute(), strict=True):
        windows[key] = _parse_windows(fields, reply, key)
        if key == key_present:
            present = {field for field, value in zip(fields, reply, strict=True) if value is not None}
    return windows, present


def _parse_windows(fields: Sequence[str], values: Sequence[bytes | None], key: str) -> dict[str, list[Observation]]:
    """Pair windows as read by ``HMGET``, parsed; an absent or unreadable one is left out."""
    out = {}
    for field, value in zip(fields, values, strict=True):
        if value is None:
            continue
        try:
            out[field] = _pair_window(value)
        except ValueError as exc:
            _unreadable("pairs", f"{key}:{field}", exc)
    return out


def redis_client(settings: Settings) -> Client:
    """A Redis client for ``settings`` (TLS and AUTH come from the ``rediss://user:pass@`` URL, the
    CA from ``LEAP_REDIS_CA_FILE``).

    With ``settings.redis_cluster`` the URL names any one node of a Redis Cluster; the client
    discovers the others and the slot map from it.
    """
    tls = settings.redis_options()
    if settings.redis_cluster:
        return RedisCluster.from_url(settings.redis_url, socket_timeout=10, socket_connect_timeout=5, **tls)
    return redis.Redis.from_url(settings.redis_url, socket_timeout=10, socket_connect_timeout=5,
                                health_check_interval=30, **tls)


def open_store(settings: Settings, catalogue: Catalogue | None = None, prefix: str | None = None) -> FeatureStore:
    """The feature store a process uses: its Redis, its key prefix, and catalogue names for hardware."""
    catalogue = catalogue or load_catalogue()
    return FeatureStore(redis_client(settings), KeyLayout(prefix or settings.key_prefix),
                        canonicalize=catalogue.canonical)
