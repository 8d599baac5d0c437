"""The sorted view of a lookup window: derived data stored beside the window, so that a script adds
an observation to a window without parsing it.

Declared here and only here (:mod:`features.layout` declares the window itself);
:func:`lua_sorted_view` generates the Lua helpers, checked in after the layout's ``lua_prelude``
in ``features/lua/formats.lua`` (:mod:`features.lua_formats`), which every script runs with;
``features/lua/lookup.lua`` keeps the views; ``tests/test_store.py`` checks each view against its
window.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from features.layout import WINDOW_ENTRY, WINDOW_SEP, _lua_pattern, _lua_str

#: A lookup window's sorted view, stored beside it (:meth:`features.keys.KeyLayout.sorted_of`):
#: the SHA1 (hex) of the window text it was computed from; then, per entry in window order, its
#: time (a double); per entry in window order, the length of its text (an unsigned 16-bit
#: integer); then the window's values in ascending order (doubles); all little-endian (Lua's
#: ``struct`` in the scripts, Python's here). Derived data: the window text stays the record, byte
#: for byte as before. A script trusts a view only while the window's text still has its SHA1,
#: and then puts an event into the window without parsing it (its place found among the times,
#: the median taken from the sorted values); otherwise it parses the window as before and writes
#: a fresh view.
SORTED_VIEW_SHA_HEX = 40
#: Bytes of a view per window entry: its time, text length and value.
SORTED_VIEW_ENTRY = 8 + 2 + 8


def pack_sorted_view(sha_hex: str, times: Sequence[float], lengths: Sequence[int], values: Sequence[float]) -> bytes:
    """A :data:`SORTED_VIEW_SHA_HEX` view as the scripts write it (``values`` already sorted)."""
    n = len(times)
    return struct.pack(f"<{SORTED_VIEW_SHA_HEX}s{n}d{n}H{n}d", sha_hex.encode(), *times, *lengths, *values)


def _lua_window_text() -> str:
    """Edits of a window's text that need no parse (for a window known to read back as written):
    ``window_has_id(packed, id)``; ``window_put(packed, offset, entry)``: ``entry`` put after the
    first ``offset`` bytes (whole entries and their separators; ``packed`` false when empty);
    ``window_drop_oldest(packed, length)``: the text without its first entry of ``length`` bytes
    (false when none is left), and that entry's value as a number."""
    entry_sep, sep = _lua_str(WINDOW_ENTRY.sep), _lua_str(WINDOW_SEP)
    other = f"[^{_lua_pattern(WINDOW_ENTRY.sep)}]+"
    value = _lua_str("^" + _lua_pattern(WINDOW_ENTRY.sep).join([other] * (len(WINDOW_ENTRY.parts) - 1))
                     + _lua_pattern(WINDOW_ENTRY.sep) + "(.+)$")
    return (f"-- The id is the only part between two entry separators, and no part holds one.\n"
            f"local function window_has_id(packed, id)\n"
            f"  return string.find(packed, {entry_sep} .. id .. {entry_sep}, 1, true) ~= nil\n"
            f"end\n"
            f"local function window_put(packed, offset, entry)\n"
            f"  if not packed then return entry end\n"
            f"  if offset == 0 then return entry .. {sep} .. packed end\n"
            f"  if offset > #packed then return packed .. {sep} .. entry end\n"
            f"  return string.sub(packed, 1, offset) .. entry .. {sep} .. string.sub(packed, offset + 1)\n"
            f"end\n"
            f"local function window_drop_oldest(packed, length)\n"
            f"  local oldest = tonumber(string.match(string.sub(packed, 1, length), {value}))\n"
            f"  if length >= #packed then return false, oldest end\n"
            f"  return string.sub(packed, length + {len(WINDOW_SEP) + 1}), oldest\n"
            f"end\n")


def _lua_view() -> str:
    """``pack_sorted_view(sha_hex, times, lengths, values)`` and ``sorted_view(packed, blob)``: the
    times, entry lengths and sorted values of window text ``packed`` from its stored view ``blob``
    (:data:`SORTED_VIEW_SHA_HEX`), or nil unless the view is well formed and was computed from
    exactly this text."""
    head, size = SORTED_VIEW_SHA_HEX, SORTED_VIEW_ENTRY
    return (f"local VIEW_FORMATS = {{}}\n"
            f"local function view_format(kind, n)\n"
            f"  local key = kind .. n\n"
            f"  local f = VIEW_FORMATS[key]\n"
            f"  if not f then f = '<' .. string.rep(kind, n); VIEW_FORMATS[key] = f end\n"
            f"  return f\n"
            f"end\n"
            f"local function view_part(kind, n, blob, at)\n"
            f"  local part = {{struct.unpack(view_format(kind, n), blob, at)}}\n"
            f"  local after = part[n + 1]\n"
            f"  part[n + 1] = nil  -- struct.unpack's next position\n"
            f"  return part, after\n"
            f"end\n"
            f"local function pack_sorted_view(sha_hex, times, lengths, values)\n"
            f"  local n = #times\n"
            f"  return struct.pack('<c{head}', sha_hex) .. struct.pack(view_format('d', n), unpack(times))\n"
            f"    .. struct.pack(view_format('H', n), unpack(lengths))\n"
            f"    .. struct.pack(view_format('d', n), unpack(values))\n"
            f"end\n"
            f"local function sorted_view(packed, blob)\n"
            f"  if not packed or not blob or #blob < {head} or (#blob - {head}) % {size} ~= 0 then return nil end\n"
            f"  if string.sub(blob, 1, {head}) ~= redis.sha1hex(packed) then return nil end\n"
            f"  local n = (#blob - {head}) / {size}\n"
            f"  local times, at = view_part('d', n, blob, {head + 1})\n"
            f"  local lengths, at2 = view_part('H', n, blob, at)\n"
            f"  local values = view_part('d', n, blob, at2)\n"
            f"  return times, lengths, values\n"
            f"end\n")


def lua_sorted_view() -> str:
    """The Lua helpers of this module: :func:`_lua_window_text` and :func:`_lua_view`."""
    return _lua_window_text() + "\n" + _lua_view()
