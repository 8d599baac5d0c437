"""What the online store's values look like: declared once, here.

:mod:`features.keys` names the keys; this module declares the text stored under them. A job
hash holds one :data:`JOB_FIELD` per hardware type plus :data:`COUNTER_PREFIX`-named attempt
counters; a lookup hash holds one :data:`LOOKUP_FIELD` per hardware type; a window hash holds
one packed window (:data:`WINDOW_ENTRY` joined by :data:`WINDOW_SEP`) per hardware type.

Everything else derives from these declarations:

- the Lua scripts build and parse values only through the helpers :func:`lua_prelude`
  generates, checked in as ``features/lua/formats.lua`` (:mod:`features.lua_formats`), which
  :func:`features.store._lua` prepends to every script;
- :func:`parse_job_field`, :func:`parse_lookup_field` and :data:`COUNTER_FIELDS` are what
  :func:`features.store.parse_snapshot` reads with; :class:`features.offline.OfflineFeatureState`
  counts with :data:`COUNTERS`; :mod:`leap.replay.rebuild` compares with :func:`unpack_window`.

The bytes are a contract with live deployments and with replays of their history:
``tests/test_keys.py`` pins them and checks the scripts against these declarations.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from features.snapshot import LookupStat, PriorStat
from leap.core.keyspace import RESERVED_PREFIX
from streams.events import OUTCOMES


@dataclass(frozen=True)
class Packed:
    """A value stored as named text parts joined by one separator.

    Parameters
    ----------
    name
        Names the generated Lua packer, ``pack_<name>``.
    parts
        The parts in stored order; also the packer's parameter names, so Lua identifiers.
    sep
        Separator between parts; it never occurs inside a part.
    """

    name: str
    parts: tuple[str, ...]
    sep: str

    def pack(self, *values: object) -> str:
        """The stored text of ``values`` (one per part, in order)."""
        if len(values) != len(self.parts):
            raise ValueError(f"{self.name} has {len(self.parts)} parts, got {len(values)} values")
        return self.sep.join(str(v) for v in values)

    def unpack(self, text: str) -> list[str]:
        """The parts of stored ``text``, in order; ValueError when it has another shape."""
        parts = text.split(self.sep)
        if len(parts) != len(self.parts):
            raise ValueError(f"{self.name} has {len(self.parts)} parts: {text!r}")
        return parts


#: A job hash's field per hardware type: observations ever applied, the newest one's event time
#: and per-accelerator throughput (as the writer sent them), and the median of the job window.
JOB_FIELD = Packed("job_field", ("n", "last_time", "last", "robust"), ",")
#: A lookup hash's field per hardware type: observations that entered the window, and its median.
LOOKUP_FIELD = Packed("lookup_field", ("n", "median"), ",")
#: One observation in a window; a window is its entries ordered by (time, id), oldest first.
WINDOW_ENTRY = Packed("window_entry", ("time", "id", "value"), " ")
#: Separator between the entries of a packed window.
WINDOW_SEP = ";"
#: Numbers a script computes (medians): 17 significant digits read back as the same double.
#: Numbers the writer sends (times, throughputs) are stored exactly as :func:`num` spelled them.
COMPUTED_NUMBER = "%.17g"

#: One paired-ratio observation a finish yields: the job's other hardware and log(this / there).
PAIR_OBSERVATION = Packed("pair_observation", ("hardware", "log_ratio"), ",")
#: Separator between a finish's observations in the job's outbox.
OBSERVATION_SEP = ";"
#: A paired-ratio window entry's value: the log ratio and the configuration it was measured at
#: (empty text for what is unknown).
PAIR_VALUE = Packed("pair_value", ("log_ratio", "log_batch_per_accelerator", "log_accelerators", "precision_bits"),
                    ",")
#: Characters a hardware name must not hold to join a pair: the separators of the pair field and
#: of the outbox (spaces are fine: a name never enters a window entry).
NOT_IN_PAIR_NAMES = "|,;\t\r\n"
#: Longest hardware name that joins a pair.
MAX_PAIR_NAME = 64

#: Job-hash fields that are attempt counters start with this; hardware names never do (the
#: contracts refuse them: the marker is defined below both, in :mod:`leap.core.keyspace`).
COUNTER_PREFIX = RESERVED_PREFIX
#: Counter of applied job starts; the outcome counters are named after :data:`OUTCOMES`.
STARTS = "starts"
#: Every attempt counter, in :class:`~features.snapshot.FeatureSnapshot`'s field order.
COUNTERS: tuple[str, ...] = (STARTS, *OUTCOMES)


def counter_field(counter: str) -> str:
    """The job-hash field of a counter (``"failed"`` -> ``"_failed"``)."""
    return COUNTER_PREFIX + counter


#: Job-hash field -> counter name.
COUNTER_FIELDS: Mapping[str, str] = {counter_field(c): c for c in COUNTERS}
#: Counter-prefixed fields that earlier versions wrote and nothing read (the newest start).
#: Live hashes may still hold them until they expire; readers and comparisons skip them.
RETIRED_FIELDS = frozenset({"_last_start", "_last_start_id", "_last_start_hw"})

# An event id goes into a window entry verbatim only if it cannot break the packing.
_SAFE_ID = re.compile(rf"^[^\s{re.escape(WINDOW_ENTRY.sep + WINDOW_SEP)}]{{1,128}}$")


def packable_id(event_id: str) -> str:
    """An event id safe to embed in a packed window (a hash of it when it holds a separator)."""
    if _SAFE_ID.match(event_id):
        return event_id
    return "h" + hashlib.sha1(event_id.encode()).hexdigest()


def pairable(hardware: str) -> bool:
    """Whether a hardware name can be part of a pair (a name holding a separator is left out)."""
    return 0 < len(hardware) <= MAX_PAIR_NAME and not any(ch in NOT_IN_PAIR_NAMES for ch in hardware)


def num(value: float) -> str:
    """Exact text of a float (shortest repr that round-trips), as the writer sends and scripts store it."""
    return repr(float(value))


def text(value: bytes | str) -> str:
    """A hash field or value as text (clients may or may not decode responses)."""
    return value.decode() if isinstance(value, bytes) else value


# ---------------------------------------------------------------- Python readers


_JOB_FIELD_SEP = JOB_FIELD.sep.encode()


def parse_job_field(value: str | bytes) -> PriorStat:
    """A job's :data:`JOB_FIELD` for one hardware type (as text, or as the bytes Redis sent:
    ``int`` and ``float`` read ASCII bytes as they read text, and refuse what is not)."""
    parts = value.split(JOB_FIELD.sep) if isinstance(value, str) else value.split(_JOB_FIELD_SEP)
    if len(parts) != len(JOB_FIELD.parts):
        raise ValueError(f"{JOB_FIELD.name} has {len(JOB_FIELD.parts)} parts: {value!r}")
    n, last_time, last, robust = parts
    return PriorStat(int(n), float(last_time), float(last), float(robust))


@lru_cache(maxsize=4096)
def field_name(raw: bytes | str) -> str:
    """A hash field's name as text; a batch's reads meet the same few hardware names again and again."""
    return text(raw)


def parse_lookup_field(value: str) -> LookupStat:
    """A lookup aggregate's :data:`LOOKUP_FIELD` for one hardware type."""
    n, median = LOOKUP_FIELD.unpack(value)
    return LookupStat(int(n), float(median))


def unpack_window(packed: str | None) -> list[list[str]]:
    """The entries of a packed window, each its :data:`WINDOW_ENTRY` parts (empty when absent)."""
    if not packed:
        return []
    return [WINDOW_ENTRY.unpack(entry) for entry in packed.split(WINDOW_SEP)]


def pack_window(entries: Iterable[Sequence[Any]]) -> str:
    """Inverse of :func:`unpack_window` (entries already in window order)."""
    return WINDOW_SEP.join(WINDOW_ENTRY.pack(*entry) for entry in entries)


# ---------------------------------------------------------------- Lua


_LUA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LUA_KEYWORDS = frozenset({
    "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in", "local", "nil", "not",
    "or", "repeat", "return", "then", "true", "until", "while",
})
_LUA_MAGIC = frozenset("^$()%.[]*+-?")


def _lua_str(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace("'", "\\'")
    for char, escape in (("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t")):
        escaped = escaped.replace(char, escape)
    return "'" + escaped + "'"


def _lua_pattern(value: str) -> str:
    """``value`` as literal characters of a Lua pattern (inside or outside a set)."""
    return "".join("%" + ch if ch in _LUA_MAGIC else ch for ch in value)


def _lua_names(packed: Packed) -> tuple[str, ...]:
    for name in (packed.name, *packed.parts):
        if not _LUA_NAME.match(name) or name in _LUA_KEYWORDS:
            raise ValueError(f"{packed.name}: {name!r} is not a Lua identifier")
    return packed.parts


def _lua_concat(packed: Packed, exprs: Sequence[str]) -> str:
    return f" .. {_lua_str(packed.sep)} .. ".join(exprs)


def _lua_packer(packed: Packed) -> str:
    params = _lua_names(packed)
    return (f"local function pack_{packed.name}({', '.join(params)})\n"
            f"  return {_lua_concat(packed, params)}\n"
            f"end\n")


def _lua_count_of() -> str:
    """``count_of(field)``: the ``n`` of a job or lookup field, 0 when the field is absent."""
    where = {(p.parts.index("n"), p.sep) for p in (JOB_FIELD, LOOKUP_FIELD)}
    if len(where) != 1:  # one helper serves both fields only while n sits at one place in both
        raise ValueError("n must be at the same position, with the same separator, in every field")
    ((index, sep),) = where
    other = f"[^{_lua_pattern(sep)}]"
    pattern = "^" + f"{other}*{_lua_pattern(sep)}" * index + f"({other}+)"
    return (f"local function count_of(field)\n"
            f"  if not field then return 0 end\n"
            f"  return tonumber(string.match(field, {_lua_str(pattern)}))\n"
            f"end\n")


def _lua_window() -> str:
    """``unpack_window(packed)`` and ``pack_window(entries)``; entries are tables keyed by part name."""
    parts = _lua_names(WINDOW_ENTRY)
    token = f"([^{_lua_pattern(WINDOW_ENTRY.sep + WINDOW_SEP)}]+)"
    pattern = _lua_pattern(WINDOW_ENTRY.sep).join([token] * len(parts))
    fields = ", ".join(f"{p} = {p}" for p in parts)
    entry = _lua_concat(WINDOW_ENTRY, [f"e.{p}" for p in parts])
    return (f"local function unpack_window(packed)\n"
            f"  local entries = {{}}\n"
            f"  if not packed then return entries end\n"
            f"  for {', '.join(parts)} in string.gmatch(packed, {_lua_str(pattern)}) do\n"
            f"    entries[#entries + 1] = {{{fields}}}\n"
            f"  end\n"
            f"  return entries\n"
            f"end\n"
            f"local function pack_window(entries)\n"
            f"  local packed = {{}}\n"
            f"  for i, e in ipairs(entries) do packed[i] = {entry} end\n"
            f"  return table.concat(packed, {_lua_str(WINDOW_SEP)})\n"
            f"end\n")


def _lua_parsed_window() -> str:
    """The parsed form the scripts work on: ``parse_window(packed, numeric)`` and ``pack_parsed(w)``.

    A parsed window is a table of parallel arrays (``text``: each entry's stored text, one array
    per part, ``t``/``v``: time and value as numbers, ``false`` for a value that is not one), and
    ``unsorted`` when its entries are not in :data:`WINDOW_ENTRY` order: no table per entry, and
    the stored text is the entries' texts joined, so an entry is spelled once when it is added,
    never again.
    """
    parts = _lua_names(WINDOW_ENTRY)
    token = f"([^{_lua_pattern(WINDOW_ENTRY.sep + WINDOW_SEP)}]+)"
    pattern = _lua_pattern(WINDOW_ENTRY.sep).join([token] * len(parts))
    if parts[0] != "time" or parts[1] != "id" or parts[-1] != "value" or len(WINDOW_SEP) != 1:
        raise ValueError("parse_window expects (time, id, value) entries and a one-character separator")
    arrays = ", ".join(["texts", *(f"{p}s" for p in parts), "ts", "vs"])
    tiled = _lua_str("()(" + pattern + ")()")  # each entry with its text, start and end
    appends = "\n".join(f"    {p}s[n] = {p}" for p in parts)
    window = ", ".join(["text = texts", *(f"{p} = {p}s" for p in parts), "t = ts", "v = vs"])
    return (f"-- A parsed window, and whether the text read back as written: entries that tile the text\n"
            f"-- exactly, one separator between two, a number for every time (and value, if numeric).\n"
            f"local function parse_window(packed, numeric)\n"
            f"  local {arrays} = {', '.join(['{}'] * (len(parts) + 3))}\n"
            f"  local w = {{{window}}}\n"
            f"  if not packed then return w, true end\n"
            f"  local ok, n, after = true, 0, 1\n"
            f"  local sep, byte, number = {ord(WINDOW_SEP)}, string.byte, tonumber\n"
            f"  for at, text, {', '.join(parts)}, stop in string.gmatch(packed, {tiled}) do\n"
            f"    local next_byte = byte(packed, stop)\n"
            f"    if at ~= after or (next_byte ~= nil and next_byte ~= sep) then ok = false end\n"
            f"    after = stop + 1\n"
            f"    n = n + 1\n"
            f"    texts[n] = text\n"
            f"{appends}\n"
            f"    local t, v = number(time), number(value) or false\n"
            f"    ts[n], vs[n] = t, v\n"
            f"    if t == nil or (numeric and not v) then\n"
            f"      ok = false\n"
            f"    elseif n > 1 and ts[n - 1] and (t < ts[n - 1] or (t == ts[n - 1] and id < ids[n - 1])) then\n"
            f"      w.unsorted = true  -- not in window order: (time, id), oldest first\n"
            f"    end\n"
            f"  end\n"
            f"  if after ~= #packed + (n > 0 and 2 or 1) then ok = false end\n"
            f"  return w, ok\n"
            f"end\n"
            f"local function pack_parsed(w)\n"
            f"  return table.concat(w.text, {_lua_str(WINDOW_SEP)})\n"
            f"end\n")


def _lua_unpacker(packed: Packed) -> str:
    """``unpack_<name>(text)``: a table of the parts by name (parts are never empty here)."""
    params = _lua_names(packed)
    token = f"([^{_lua_pattern(packed.sep)}]+)"
    fields = ", ".join(f"{p} = parts[{i + 1}]" for i, p in enumerate(params))
    return (f"local function unpack_{packed.name}(text)\n"
            f"  local parts = {{}}\n"
            f"  for part in string.gmatch(text, {_lua_str(token)}) do parts[#parts + 1] = part end\n"
            f"  return {{{fields}}}\n"
            f"end\n")


def _lua_pairs() -> str:
    """``pack_observations(list)``, ``is_counter(field)`` and ``pairable(name)``."""
    return (f"local function pack_observations(observed)\n"
            f"  return table.concat(observed, {_lua_str(OBSERVATION_SEP)})\n"
            f"end\n"
            f"local function is_counter(field)\n"
            f"  return string.sub(field, 1, {len(COUNTER_PREFIX)}) == {_lua_str(COUNTER_PREFIX)}\n"
            f"end\n"
            f"local function pairable(name)\n"
            f"  return #name > 0 and #name <= {MAX_PAIR_NAME} and "
            f"string.find(name, {_lua_str('[' + _lua_pattern(NOT_IN_PAIR_NAMES) + ']')}) == nil\n"
            f"end\n")


#: First word of the error reply of a script that refused its event; it wrote nothing.
REJECTED = "LEAP_REJECTED"


def _lua_checker(packed: Packed) -> str:
    """``check_<name>(key, field)``: refuse unless the stored value is absent or reads back as
    written (every part a number, packing the parts gives the same text); returns the value
    (nil when absent), so that a script reads it once."""
    params = _lua_names(packed)
    numbers = " or ".join(f"tonumber(p.{x}) == nil" for x in params)
    repacked = f"pack_{packed.name}({', '.join('p.' + x for x in params)})"
    return (f"local function check_{packed.name}(key, field)\n"
            f"  local v = redis.call('HGET', key, field)\n"
            f"  if not v then return end\n"
            f"  local p = unpack_{packed.name}(v)\n"
            f"  if {numbers} or {repacked} ~= v then reject(key, field, 'holds an unreadable value:', v) end\n"
            f"  return v\n"
            f"end\n")


_LUA_CHECKS = """\
local function check_number(what, text)
  local v = tonumber(text)
  if v == nil or v ~= v or v == math.huge or v == -math.huge then
    reject(what, 'is not a finite number:', tostring(text))
  end
  return v
end
local function check_positive(what, text)
  local v = check_number(what, text)
  if v <= 0 then reject(what, 'is not positive:', text) end
  return v
end
local function check_name(hardware)
  if is_counter(hardware) then reject('hardware', hardware, 'starts with the counter marker') end
end
local function check_counter_name(field)
  if not is_counter(field) then reject('counter field', field, 'lacks the counter marker') end
end
local function check_counter(key, field)
  local v = redis.call('HGET', key, field)
  if v and not string.match(v, '^%-?%d+$') then reject(key, field, 'holds', v, 'not a count') end
end
local function check_window_text(key, field, packed, numeric)
  local w, ok = parse_window(packed or nil, numeric)
  if not ok then reject(key, field, 'holds an unreadable window') end
  return w
end
local function check_window(key, field, numeric)
  return check_window_text(key, field, redis.call('HGET', key, field), numeric)
end
"""


def _lua_checks() -> str:
    """The checks a script runs before it writes anything (so that a refusal leaves no trace).

    ``reject(...)`` raises the error reply (:data:`REJECTED` and its words); the others refuse
    what a write would misread or fail on halfway: a number that is not finite, a hardware name
    with the counter marker, a counter that is not an integer, a stored field or window that does
    not read back as written. ``check_window`` returns the window's entries (empty when absent),
    so that a script parses a window once.
    """
    reject = ("local function reject(...)\n"
              f"  error({{err = {_lua_str(REJECTED)} .. ' ' .. table.concat({{...}}, ' ')}})\n"
              "end\n")
    return reject + _LUA_CHECKS + _lua_checker(JOB_FIELD) + _lua_checker(LOOKUP_FIELD)


def lua_prelude() -> str:
    """Lua helpers generated from the declarations above (checked in as ``features/lua/formats.lua``,
    which every script is run with prepended).

    Defines ``pack_job_field(n, last_time, last, robust)``, ``pack_lookup_field(n, median)``,
    ``pack_window_entry(time, id, value)``, ``count_of(field)``, ``format_number(x)``
    (:data:`COMPUTED_NUMBER`), ``unpack_window(packed)``, ``pack_window(entries)``,
    ``parse_window(packed, numeric)``, ``pack_parsed(w)``, ``unpack_job_field(text)``, ``pack_pair_observation(hardware,
    log_ratio)``, ``pack_observations(list)``, ``is_counter(field)``, ``pairable(name)``, and the checks
    of :func:`_lua_checks` (``reject``, ``check_number``, ``check_name``, ``check_counter``,
    ``check_positive``, ``check_counter_name``, ``check_job_field``, ``check_lookup_field``,
    ``check_window``, ``check_window_text``). The lookup windows' sorted views have helpers of
    their own, built on these (:func:`features.sorted_view.lua_sorted_view`). Counter fields are
    not here: the writer passes them as arguments.
    """
    return "\n".join([
        _lua_packer(JOB_FIELD),
        _lua_packer(LOOKUP_FIELD),
        _lua_packer(WINDOW_ENTRY),
        _lua_count_of(),
        f"local function format_number(x)\n  return string.format({_lua_str(COMPUTED_NUMBER)}, x)\nend\n",
        _lua_window(),
        _lua_parsed_window(),
        _lua_unpacker(JOB_FIELD),
        _lua_unpacker(LOOKUP_FIELD),
        _lua_packer(PAIR_OBSERVATION),
        _lua_pairs(),
        _lua_checks(),
    ])
