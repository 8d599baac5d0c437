"""In-process feature state with exactly the semantics of the Redis scripts.

Training and backtests replay history in event order through this class to get point-in-time
snapshots (what Redis held when each submission arrived) without a server round trip per event.
``tests/test_store.py::test_scripts_agree_with_the_offline_replay`` applies the same random,
shuffled and duplicated starts and finishes to both and checks their snapshots are equal, so the
Lua scripts and this class cannot silently diverge (``tests/test_rows.py`` checks the rows built
from them are equal too).

Counters are named by :data:`features.layout.COUNTERS`, as the store's readers name them; a
window entry is ``(time, id, value)`` ordered by (time, id), as :data:`features.layout.WINDOW_ENTRY`
and ``window_insert`` in ``features/lua/window.lua`` order it.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from array import array
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from features.completion import config_observations, partial
from features.job_columns import Entry, JobColumns, JobData
from features.keys import JOB_WINDOW, LOOKUP_WINDOW, PAIR_WINDOW
from features.layout import STARTS, packable_id
from features.pairs import (
    Observation,
    Observations,
    PairAsk,
    finish_coordinates,
    observations,
    pair_levels,
    stored_values,
    submission_coordinates,
    summarise_pairs_of,
    unpack_value,
    wanted_pairs,
)
from features.snapshot import FeatureSnapshot, LookupStat, PriorStat
from features.store import per_accelerator
from streams.events import JobFinish, JobStart, Submission


def _median_of_sorted(s: list[float]) -> float:
    """The median of ascending values, as ``median_sorted`` in window.lua takes it."""
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


#: Windows up to this long find an id by scanning their entries instead of keeping a set of them:
#: a job's windows (one per hardware it ran on, a few hundred thousand in a long history) are.
SHORT_WINDOW = 16


def _same_name(name: str) -> str:
    return name


@dataclass(slots=True)
class _Window:
    limit: int
    entries: list[Entry] = field(default_factory=list)
    n: int = 0
    ids: set[str] | None = None  # the entries' ids, for windows longer than SHORT_WINDOW
    values: list[float] = field(default_factory=list)  # the window's values, sorted
    _median: float = float("nan")  # cached: snapshots read far more often than events arrive

    def __post_init__(self) -> None:
        if self.limit > SHORT_WINDOW:
            self.ids = set()

    def _holds(self, eid: str) -> bool:
        return eid in self.ids if self.ids is not None else any(e[1] == eid for e in self.entries)

    def insert(self, entry: Entry, new_id: bool = False) -> tuple[bool, bool]:
        """Insert; returns (inserted, kept) like ``window_insert`` in window.lua.

        ``new_id``: the caller knows no entry holds this id (ids known unique), so the window is
        not searched for it.
        """
        if not new_id and self._holds(entry[1]):
            return False, True
        at = bisect.bisect_right(self.entries, entry)
        self.entries.insert(at, entry)
        bisect.insort(self.values, entry[2])
        if self.ids is not None:
            self.ids.add(entry[1])
        dropped = 0
        while len(self.entries) > self.limit:
            _, old_id, old_value = self.entries.pop(0)
            if self.ids is not None:
                self.ids.discard(old_id)
            del self.values[bisect.bisect_left(self.values, old_value)]
            dropped += 1
        # The only entry with this id is the new one: it survived unless the oldest were cut up to it.
        kept = at >= dropped
        if kept:
            self._median = _median_of_sorted(self.values)
        return True, kept

    def median(self) -> float:
        return self._median

    def extend_newest(self, entries: deque[Entry], count: int) -> None:
        """Add ``count`` entries, each newer than every one before it, of which ``entries`` are
        the newest (at most the limit): every one enters, and the window keeps the newest."""
        self.entries = (self.entries + list(entries))[-self.limit:]
        self.n += count
        self._derive()

    @classmethod
    def of(cls, limit: int, entries: list[Entry], n: int) -> _Window:
        """The window holding ``entries`` (in window order) after ``n`` applied."""
        window = cls(limit, entries, n)
        window._derive()
        return window

    def _derive(self) -> None:
        """The sorted values, ids and median, from the entries."""
        self.values = sorted(e[2] for e in self.entries)
        if self.ids is not None:
            self.ids = {e[1] for e in self.entries}
        self._median = _median_of_sorted(self.values)


@dataclass(slots=True)
class _PairWindow:
    """A pair field's window, ordered by ``(time, id)`` as window.lua orders it: the keys and the
    parsed observations in two parallel lists (a key function in the search cost more than the
    search)."""

    keys: list[tuple[float, str]] = field(default_factory=list)
    values: list[Observation] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)
    _observed: Observations | None = None  # cached with its columns: read far more often than written

    def insert(self, time: float, eid: str, value: Observation) -> None:
        if eid in self.ids:
            return
        self._observed = None
        key = (time, eid)
        at = bisect.bisect_right(self.keys, key)  # after equal keys, as insort did
        self.keys.insert(at, key)
        self.values.insert(at, value)
        self.ids.add(eid)
        while len(self.keys) > PAIR_WINDOW:
            self.ids.discard(self.keys.pop(0)[1])
            del self.values[0]

    def __getstate__(self) -> tuple[list[tuple[float, str]], list[Observation], set[str]]:
        return self.keys, self.values, self.ids  # not the read view: rebuilt by the first read

    def __setstate__(self, state: tuple[list[tuple[float, str]], list[Observation], set[str]]) -> None:
        self.keys, self.values, self.ids = state
        self._observed = None

    def observed(self) -> Observations:
        """The observations in window order (one list, shared by readers until the next insert)."""
        if self._observed is None:
            self._observed = Observations(self.values)
        return self._observed


@dataclass(slots=True)
class _FieldQueue:
    """One configuration field's observations for one aggregate, queued until a partial submission
    reads it (:meth:`OfflineFeatureState.apply_submission`), in as little memory as gives the same
    window: a replay queues every submission of its window, four fields each.

    An observation newer (by time and id) than every one this field has had is appended and kept
    when applied, so of a run of them only the newest :data:`LOOKUP_WINDOW` and their arrival
    times (for the count, and to forget a day exactly) are kept: the ``head``. From the first
    observation that is not the newest on, each is kept whole in ``rest`` and inserted in
    arrival order, as ``lookup.lua`` takes them. The newest ``(time, id)`` outlives a read.
    """

    times: array = field(default_factory=lambda: array("d"))  # the head's arrival times, ascending
    head: deque[Entry] = field(default_factory=lambda: deque(maxlen=LOOKUP_WINDOW))
    rest: list[Entry] | None = None
    newest_time: float = -math.inf
    newest_id: str = ""

    def add(self, time: float, eid: str, value: float, unique_ids: bool) -> None:
        """Queue one observation; ``unique_ids``: no id repeats, so the newest has no duplicate to find."""
        newest = time > self.newest_time or (time == self.newest_time and eid > self.newest_id)
        if newest:
            self.newest_time, self.newest_id = time, eid
        if newest and unique_ids and self.rest is None:
            self.times.append(time)
            self.head.append((time, eid, value))
        elif self.rest is None:
            self.rest = [(time, eid, value)]
        else:
            self.rest.append((time, eid, value))

    def take(self) -> tuple[int, deque[Entry], list[Entry]]:
        """How many head observations there were, the head's newest and the rest; the queue is left empty."""
        taken = len(self.times), self.head, self.rest or []
        self.times, self.head, self.rest = array("d"), deque(maxlen=LOOKUP_WINDOW), None
        return taken

    def drop_before(self, time: float) -> None:
        """Forget the observations before ``time``, as if they had never been queued."""
        del self.times[:bisect.bisect_left(self.times, time)]
        while self.head and self.head[0][0] < time:
            self.head.popleft()
        if self.rest is not None:
            self.rest = [e for e in self.rest if e[0] >= time]


@dataclass(slots=True)
class _Job:
    seen: set[str] | None = None  # ids applied; made on first use, never when ids are known unique
    windows: dict[str, _Window] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # by counter name

    def data(self) -> JobData:
        return dict(self.counters), tuple(self.seen) if self.seen is not None else None, \
            [(hw, w.n, w.entries) for hw, w in self.windows.items()]

    @classmethod
    def of(cls, data: JobData) -> _Job:
        counters, seen, windows = data
        return cls(set(seen) if seen is not None else None,
                   {hw: _Window.of(JOB_WINDOW, entries, n) for hw, n, entries in windows},
                   defaultdict(int, counters))


class OfflineFeatureState:
    """Feature state held in memory; :meth:`snapshot` equals what the online store would read."""

    def __init__(self, canonicalize: Callable[[str], str] | None = None, unique_ids: bool = False,
                 unseen_types: frozenset[str] = frozenset()) -> None:
        """``unique_ids``: the caller guarantees no start or finish id repeats (a de-duplicated archive
        whose starts and finishes share no id), so no per-job set of applied ids is kept: the
        scripts' de-duplication would never fire, and the sets were ~0.3 GB of a 60-day replay.

        ``unseen_types``: model types whose events feed only their own jobs' state, no shared
        aggregate (lookups, paired ratios, configurations), so that their rows read what the fleet
        would hold had it never run them: how the served model sees a new model type at training
        time (:func:`leap.training.new_types.with_unseen_type_rows`). Empty for the twin proper."""
        self._hw = canonicalize or _same_name
        self._unique_ids = unique_ids
        self._unseen = unseen_types
        self.jobs: dict[str, _Job] = {}  # the jobs held as objects; the rest, if any, as columns:
        self._job_columns: JobColumns | None = None  # (a resumed checkpoint's, until an event touches one)
        self.models: dict[str, dict[str, _Window]] = defaultdict(dict)
        self.families: dict[str, dict[str, _Window]] = defaultdict(dict)
        self.pairs: dict[tuple[str, str | None], dict[str, _PairWindow]] = defaultdict(dict)
        # configuration aggregates of model types and families (features.completion), as lookups
        self.config_models: dict[str, dict[str, _Window]] = defaultdict(dict)
        self.config_families: dict[str, dict[str, _Window]] = defaultdict(dict)
        self._config_queue: dict[tuple[int, str], dict[str, _FieldQueue]] = defaultdict(dict)
        # Snapshots are immutable, so a model type's lookup dict is shared until it changes; then
        # the next read copies it with only the changed hardware's entries made again (a model
        # type's finishes change one entry each, and rebuilding all of them was an eighth of the
        # training rows' time).
        self._lookup_cache: dict[tuple[int, str], dict[str, LookupStat]] = {}
        self._lookup_stale: dict[tuple[int, str], set[str]] = {}

    def __getstate__(self) -> dict[str, object]:
        """Pickled without its name resolution (a catalogue's method holds a lock): the loader
        gives it back with :meth:`resolve_with`; its jobs as columns (:mod:`features.job_columns`)."""
        state = {k: v for k, v in self.__dict__.items() if k != "_hw"}
        state["jobs"] = {}
        state["_job_columns"] = JobColumns.of(((k, job.data()) for k, job in self.jobs.items()), self._job_columns)
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._hw = _same_name

    def resolve_with(self, canonicalize: Callable[[str], str]) -> OfflineFeatureState:
        """This state, resolving hardware names with ``canonicalize`` (after unpickling)."""
        self._hw = canonicalize
        return self

    def drop_config_before(self, time: float) -> bool:
        """Forget the configuration observations of submissions before ``time``, as if they had
        never been applied; False (and nothing changed) when a partial submission's read applied
        them already: a window keeps no trace of what it dropped, so it cannot be undone."""
        if any(self.config_models.values()) or any(self.config_families.values()):
            return False
        for queues in self._config_queue.values():
            for queue in queues.values():
                queue.drop_before(time)
        return True

    def _job(self, key: str) -> _Job:
        """Job ``key``'s state, made when it has none."""
        job = self._known_job(key)
        if job is None:
            job = self.jobs[key] = _Job()
        return job

    def _known_job(self, key: str) -> _Job | None:
        """Job ``key``'s state, turned into objects if it was held as columns; None when it has none."""
        job = self.jobs.get(key)
        if job is None and self._job_columns is not None and (data := self._job_columns.take(key)) is not None:
            job = self.jobs[key] = _Job.of(data)
        return job

    def apply_finish(self, ev: JobFinish) -> bool:
        """Apply a finish as ``job_finish.lua`` and ``lookup.lua`` do; False for a duplicate."""
        job = self._job(ev.job_key)
        eid = packable_id(ev.event_id)
        if not self._first_time(job, eid):
            return False
        job.counters[ev.outcome] += 1  # outcome counters are named after the outcomes
        if ev.throughput is None:
            return True
        hw = self._hw(ev.hardware)
        entry = (ev.event_time, eid, per_accelerator(ev.throughput, ev.num_accelerators))
        unseen = ev.model_type in self._unseen
        if not unseen:
            self._add_pairs(ev, eid, hw, job, entry[2])
        win = job.windows.setdefault(hw, _Window(JOB_WINDOW))
        win.insert(entry, self._unique_ids)
        win.n += 1
        if unseen:
            return True
        for kind, table, name in ((0, self.models, ev.model_type), (1, self.families, ev.family)):
            if name is None:  # a finish of unknown family feeds no family aggregate
                continue
            agg = table[name].setdefault(hw, _Window(LOOKUP_WINDOW))
            inserted, kept = agg.insert(entry, self._unique_ids)
            if inserted and kept:
                agg.n += 1
                self._lookup_stale.setdefault((kind, name), set()).add(hw)
        return True

    def _add_pairs(self, ev: JobFinish, eid: str, hw: str, job: _Job, value: float) -> None:
        """The paired-ratio observations of a finish, as ``job_finish.lua`` and ``pair.lua`` add them."""
        observed = observations(_priors(job), hw, value)
        if not observed:
            return
        levels = pair_levels(ev.model_type, ev.family)
        for pair, stored in stored_values(hw, observed, finish_coordinates(ev)):
            parsed = unpack_value(stored)
            for level in levels:
                self.pairs[level].setdefault(pair, _PairWindow()).insert(ev.event_time, eid, parsed)

    def apply_submission(self, sub: Submission) -> None:
        """Feed the configuration aggregates as :meth:`features.store.FeatureStore.apply_submissions`
        does (``lookup.lua``: a window per field, a duplicate found there or older than every kept
        entry changes nothing).

        Queued, and applied in arrival order when a partial submission's snapshot first reads the
        aggregate (:meth:`_config`): the same inserts in the same order, only later, so a replay of
        complete submissions (all of training) never pays for windows nothing reads. A queue keeps
        what the windows will hold, not every observation (:class:`_FieldQueue`).
        """
        observed = config_observations(sub) if sub.model_type not in self._unseen else None
        if not observed:
            return
        time, eid, unique = sub.event_time, packable_id(sub.event_id), self._unique_ids
        for kind, name in ((2, sub.model_type), (3, sub.family)):
            if name is None:
                continue
            queues = self._config_queue[(kind, name)]
            for name_of_field, value in observed:
                queue = queues.get(name_of_field)
                if queue is None:
                    queue = queues[name_of_field] = _FieldQueue()
                queue.add(time, eid, value, unique)

    def _apply_config_queue(self, kind: int, table: dict[str, dict[str, _Window]], name: str) -> None:
        queues = self._config_queue.get((kind, name))
        if not queues:
            return
        windows = table[name]
        for name_of_field, queue in queues.items():
            if not queue.times and not queue.rest:  # nothing since the last read, or all forgotten
                continue
            count, head, rest = queue.take()
            agg = windows.setdefault(name_of_field, _Window(LOOKUP_WINDOW))
            if count:
                agg.extend_newest(head, count)
                self._lookup_stale.setdefault((kind, name), set()).add(name_of_field)
            for entry in rest:
                inserted, kept = agg.insert(entry)
                if inserted and kept:
                    agg.n += 1
                    self._lookup_stale.setdefault((kind, name), set()).add(name_of_field)

    def apply_start(self, ev: JobStart) -> bool:
        """Count a start as ``job_start.lua`` does; False for a duplicate."""
        job = self._job(ev.job_key)
        if not self._first_time(job, packable_id(ev.event_id)):
            return False
        job.counters[STARTS] += 1
        return True

    def _first_time(self, job: _Job, eid: str) -> bool:
        """Whether ``eid`` is new to ``job`` (and now recorded), as the job scripts' seen set decides."""
        if self._unique_ids:
            return True
        if job.seen is None:
            job.seen = set()
        if eid in job.seen:
            return False
        job.seen.add(eid)
        return True

    def _lookups(self, kind: int, table: dict[str, dict[str, _Window]], name: str) -> dict[str, LookupStat]:
        key = (kind, name)
        cached = self._lookup_cache.get(key)
        stale = self._lookup_stale.pop(key, None)
        if cached is None:
            windows = table.get(name, {})
            cached = {hw: LookupStat(w.n, w.median()) for hw, w in windows.items() if w.entries}
            self._lookup_cache[key] = cached
        elif stale:
            windows = table[name]
            fresh = dict(cached)
            for hw in stale:
                fresh[hw] = LookupStat(windows[hw].n, windows[hw].median())
            if len(fresh) != len(cached):  # a new hardware type: in the windows' order, as made from scratch
                fresh = {hw: fresh[hw] for hw in windows if hw in fresh}
            cached = self._lookup_cache[key] = fresh
        return cached

    def snapshot(self, sub: Submission, candidates: Sequence[str] | None = None,
                 job_source: OfflineFeatureState | None = None) -> FeatureSnapshot:
        """What :meth:`features.store.FeatureStore.read` would return for ``sub`` now.

        Parameters
        ----------
        sub
            The submission.
        candidates
            The candidates whose rows will be built (default all of ``sub``'s): paired ratios are
            summarised only for these, as summarising is the costly part of a snapshot.
        job_source
            Take the job's own features (priors, counters) from this state instead, keeping the
            cross-job aggregates (lookup medians, paired ratios) of this one: an evaluation that
            must not let a held-out job see other held-out jobs replays each into its own state.
        """
        return with_pairs(*self.unpaired_snapshot(sub, candidates, job_source))

    def unpaired_snapshot(self, sub: Submission, candidates: Sequence[str] | None = None,
                          job_source: OfflineFeatureState | None = None) -> tuple[FeatureSnapshot, PairAsk]:
        """:meth:`snapshot` without its paired ratios, and what summarises them (:func:`with_pairs`):
        a replay building many rows summarises a batch of snapshots' windows in one pass. The
        windows asked are those of now: a window read is never changed (an insert makes a new one)."""
        job = (job_source or self)._known_job(sub.job_key)
        prior = _priors(job) if job is not None else {}
        want = wanted_pairs(prior, [self._hw(c) for c in (sub.candidates if candidates is None else candidates)])
        levels = pair_levels(sub.model_type, sub.family) if want else []
        fields = {field for pairs in want.values() for _, field, _ in pairs}
        windows = {level: {f: w.observed() for f in fields if (w := self.pairs.get((level, name), {}).get(f))}
                   for level, name in levels}
        snap = FeatureSnapshot.of(
            prior,
            self._lookups(0, self.models, sub.model_type),
            self._lookups(1, self.families, sub.family) if sub.family is not None else {},
            job.counters if job is not None else {},
            None,
            self._config(sub),
        )
        return snap, (want, windows, submission_coordinates(sub))

    def _config(self, sub: Submission) -> tuple[dict[str, LookupStat], dict[str, LookupStat]]:
        """The configuration aggregates the store reads for ``sub`` (only for a partial one)."""
        if not partial(sub):
            return {}, {}
        self._apply_config_queue(2, self.config_models, sub.model_type)
        if sub.family is None:
            return self._lookups(2, self.config_models, sub.model_type), {}
        self._apply_config_queue(3, self.config_families, sub.family)
        return (self._lookups(2, self.config_models, sub.model_type),
                self._lookups(3, self.config_families, sub.family))


def with_pairs(snap: FeatureSnapshot, ask: PairAsk) -> FeatureSnapshot:
    """``snap`` with the paired ratios ``ask`` summarises (:meth:`OfflineFeatureState.unpaired_snapshot`)."""
    return all_with_pairs([snap], [ask])[0]


def all_with_pairs(snaps: Sequence[FeatureSnapshot], asks: Sequence[PairAsk | None]) -> list[FeatureSnapshot]:
    """:func:`with_pairs` of each (a snapshot without an ask as it is), every window summarised in
    one pass."""
    found = iter(summarise_pairs_of([ask for ask in asks if ask is not None]))
    return [snap if ask is None or not (pairs := next(found)) else dataclasses.replace(snap, pairs=pairs)
            for snap, ask in zip(snaps, asks, strict=True)]


def _priors(job: _Job) -> dict[str, PriorStat]:
    """A job's prior throughput per hardware, as the store's job hash holds it."""
    out = {}
    for hw, win in job.windows.items():
        newest = win.entries[-1]
        out[hw] = PriorStat(win.n, newest[0], newest[2], win.median())
    return out
