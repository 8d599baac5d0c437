"""Key layout (every key of one job shares its Redis Cluster hash slot) and the stored values.

The values are declared once in :mod:`features.layout`; these tests pin the bytes live
deployments hold, run the generated Lua helpers in the real Redis against the Python side, and
check that the hand-written scripts spell no format of their own.
"""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import redis

from features import lua_formats
from features.keys import KeyLayout
from features.layout import (
    COMPUTED_NUMBER,
    COUNTER_FIELDS,
    COUNTER_PREFIX,
    COUNTERS,
    JOB_FIELD,
    LOOKUP_FIELD,
    OBSERVATION_SEP,
    PAIR_OBSERVATION,
    PAIR_VALUE,
    RETIRED_FIELDS,
    STARTS,
    WINDOW_ENTRY,
    WINDOW_SEP,
    counter_field,
    num,
    pack_window,
    packable_id,
    parse_job_field,
    parse_lookup_field,
    text,
    unpack_window,
)
from features.snapshot import FeatureSnapshot, LookupStat, PriorStat
from features.store import FeatureStore, parse_snapshot
from leap.core.hardware import load_catalogue
from streams.events import OUTCOMES
from tests.factories import T0, finish, start, submission


def _hash_tag(key: str) -> str:
    match = re.search(r"\{([^}]*)\}", key)
    assert match and match.group(1)
    return match.group(1)


def test_job_keys_share_one_hash_tag() -> None:
    lay = KeyLayout("p")
    keys = [lay.job("job-42"), lay.job_window("job-42"), lay.job_seen("job-42")]
    assert {_hash_tag(k) for k in keys} == {"job-42"}


def test_lookup_window_shares_the_aggregate_tag() -> None:
    lay = KeyLayout("p")
    agg = lay.lookup_model("llama-7b")
    assert _hash_tag(agg) == _hash_tag(lay.window_of(agg)) == "m:llama-7b"
    assert _hash_tag(lay.lookup_family("moe")) == "f:moe"


def test_prefix_isolates_layouts() -> None:
    assert KeyLayout("a").job("j") != KeyLayout("b").job("j")
    assert KeyLayout("a").job("j").startswith("a:") and KeyLayout("a").pattern() == "a:*"


# ---------------------------------------------------------------- stored values (features.layout)

LUA = Path(__file__).resolve().parents[1] / "features" / "lua"


def test_counters_derive_from_the_outcomes_and_match_the_snapshot() -> None:
    assert (STARTS, *OUTCOMES) == COUNTERS
    assert set(COUNTER_FIELDS) == {"_starts", "_completed", "_failed", "_preempted"}  # what live hashes hold
    assert all(counter_field(c).startswith(COUNTER_PREFIX) for c in COUNTERS)
    # FeatureSnapshot.of passes counters by name: they must be exactly its int fields.
    assert tuple(f.name for f in fields(FeatureSnapshot) if f.type == "int") == COUNTERS
    assert not RETIRED_FIELDS & set(COUNTER_FIELDS)


def test_declared_parts_match_the_parsed_types() -> None:
    assert JOB_FIELD.parts == tuple(f.name for f in fields(PriorStat))
    assert LOOKUP_FIELD.parts == tuple(f.name for f in fields(LookupStat))
    seps = {JOB_FIELD.sep, LOOKUP_FIELD.sep, WINDOW_ENTRY.sep, WINDOW_SEP}
    assert all(len(s) == 1 for s in seps) and WINDOW_ENTRY.sep != WINDOW_SEP


def test_python_pack_and_parse_round_trip() -> None:
    packed = JOB_FIELD.pack(3, num(T0 + 0.5), num(0.1), COMPUTED_NUMBER % 0.1)
    assert packed == "3,1790000000.5,0.1,0.10000000000000001"
    assert parse_job_field(packed) == PriorStat(3, T0 + 0.5, 0.1, 0.1)
    assert parse_lookup_field(LOOKUP_FIELD.pack(2, "10.5")) == LookupStat(2, 10.5)
    window = "1790000000.0 e1 100.0;1790000005.0 e3 101.0"
    assert unpack_window(window) == [["1790000000.0", "e1", "100.0"], ["1790000005.0", "e3", "101.0"]]
    assert pack_window(unpack_window(window)) == window and unpack_window(None) == []
    with pytest.raises(ValueError):
        parse_job_field("3,1.0,2.0")


def test_parse_snapshot_skips_retired_and_unknown_counter_fields() -> None:
    legacy = {b"_starts": b"2", b"_failed": b"1", b"_last_start": b"1790000000.0", b"_last_start_id": b"s1",
              b"_last_start_hw": b"L4", b"L4": b"1,1790000000.0,10.0,10"}
    snap = parse_snapshot(legacy, {}, {})
    assert (snap.starts, snap.failed, snap.completed, snap.preempted) == (2, 1, 0, 0)
    assert snap.prior == {"L4": PriorStat(1, T0, 10.0, 10.0)}


def _code(source: str) -> str:
    """Lua source without its comments (none of these scripts has a ``--`` inside a string)."""
    return re.sub(r"--[^\n]*", "", source)


def test_checked_in_formats_are_what_the_declarations_generate() -> None:
    """``features/lua/formats.lua`` is read by the scripts; the declarations are what Python reads with."""
    assert lua_formats.checked_in() == lua_formats.generated(), (
        "features/lua/formats.lua differs from the declarations: run `python -m features.lua_formats`")


def test_lua_sources_spell_no_stored_format() -> None:
    """The hand-written scripts build and parse values only through formats.lua's helpers."""
    forbidden = {JOB_FIELD.sep, LOOKUP_FIELD.sep, WINDOW_ENTRY.sep, WINDOW_SEP, COUNTER_PREFIX,
                 PAIR_OBSERVATION.sep, PAIR_VALUE.sep, OBSERVATION_SEP}
    sources = sorted(p for p in LUA.glob("*.lua") if p.name != lua_formats.FILE_NAME)
    assert {p.name for p in sources} == {"window.lua", "job_finish.lua", "job_start.lua", "lookup.lua", "pair.lua"}
    for path in sources:
        code = _code(path.read_text())
        literals = re.findall(r"'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\"", code)
        for literal in ("".join(pair) for pair in literals):
            assert not forbidden & set(literal), f"{path.name} spells a format in {literal!r}"
        for construct in ("..", "string.format", "string.match", "gmatch", "table.concat", "last_start"):
            assert construct not in code, f"{path.name} builds a value by hand ({construct})"


@pytest.mark.integration
def test_formats_lua_agrees_with_the_declaration(rds: redis.Redis) -> None:
    """Run the checked-in Lua helpers in the real Redis and compare with the Python side."""

    def lua(body: str, *args: str) -> Any:
        return rds.eval(lua_formats.checked_in() + "\n" + body, 0, *args)

    parts = ("7", num(T0 + 0.25), num(12.5), COMPUTED_NUMBER % (1 / 3))
    assert text(lua("return pack_job_field(ARGV[1], ARGV[2], ARGV[3], ARGV[4])", *parts)) == JOB_FIELD.pack(*parts)
    # n is a Lua number when the scripts pack it: it must print as the integer Python parses.
    assert text(lua("return pack_job_field(tonumber(ARGV[1]), 'a', 'b', 'c')", "7")) == JOB_FIELD.pack(7, "a", "b", "c")
    lookup = lua("return pack_lookup_field(tonumber(ARGV[1]), ARGV[2])", "12", "3.5")
    assert text(lookup) == LOOKUP_FIELD.pack(12, "3.5")
    assert lua("return count_of(ARGV[1])", JOB_FIELD.pack(*parts)) == 7
    assert lua("return count_of(ARGV[1])", LOOKUP_FIELD.pack(12, "3.5")) == 12
    assert lua("return count_of(false)") == 0  # HGET of an absent field
    assert text(lua("return format_number(tonumber(ARGV[1]))", "0.1")) == COMPUTED_NUMBER % 0.1
    window = pack_window([(num(T0), "e1", num(0.1)), (num(T0 + 1), packable_id("odd id;x"), num(2.0))])
    assert text(lua("return pack_window(unpack_window(ARGV[1]))", window)) == window
    second = "local e = unpack_window(ARGV[1])[2]; return {e." + ", e.".join(WINDOW_ENTRY.parts) + "}"
    assert [text(v) for v in lua(second, window)] == unpack_window(window)[1]


@pytest.mark.integration
def test_scripts_write_the_declared_bytes(rds: redis.Redis, run_id: str) -> None:
    """Live deployments read these bytes: pin them literally, then parse them with the declaration."""
    store = FeatureStore(rds, KeyLayout(f"keys-{run_id}"), canonicalize=load_catalogue().canonical)
    lay = store.layout
    try:
        store.apply_finishes([
            finish("j", "e1", T0, "H100-SXM", 800.0),
            finish("j", "e2", T0 + 10.5, "H100-SXM", 1000.0),
            finish("j", "e3", T0 + 5, "H100-SXM", 808.0),
            finish("j", "e4", T0 + 20, "L4", 0.8),
            finish("j", "e5", T0 + 30, "MI300X", None, outcome="failed"),
            finish("j", "e6", T0 + 40, "A100-80GB", 80.0, outcome="preempted"),
            finish("j", "e7", T0 + 50, "A100-80GB", 88.0),
        ])
        store.apply_starts([start("j", "s1", T0 - 60, "H100-SXM"), start("j", "s2", T0 - 30, "L4")])
        job = rds.hgetall(lay.job("j"))
        assert job == {
            b"H100-SXM": b"3,1790000010.5,125.0,101",
            b"L4": b"1,1790000020.0,0.1,0.10000000000000001",
            b"A100-80GB": b"2,1790000050.0,11.0,10.5",
            b"_completed": b"5", b"_failed": b"1", b"_preempted": b"1", b"_starts": b"2",
        }
        window = rds.hget(lay.job_window("j"), "H100-SXM")
        assert window == b"1790000000.0 e1 100.0;1790000005.0 e3 101.0;1790000010.5 e2 125.0"
        assert rds.hgetall(lay.lookup_model("llama-7b"))[b"H100-SXM"] == b"3,101"
        # The same bytes, read through the declaration.
        assert parse_job_field(text(job[b"H100-SXM"])) == PriorStat(3, T0 + 10.5, 125.0, 101.0)
        assert [e[1] for e in unpack_window(text(window))] == ["e1", "e3", "e2"]
        snap = store.read([submission("j", 1)])[0]
        assert (snap.starts, snap.completed, snap.failed, snap.preempted) == (2, 5, 1, 1)
        lookup = {text(k): text(v) for k, v in rds.hgetall(lay.lookup_model("llama-7b")).items()}
        assert snap.lookup_model == {hw: parse_lookup_field(v) for hw, v in lookup.items()}
    finally:
        store.delete_all()


def test_a_jobs_keys_name_their_job_and_no_other_key_does() -> None:
    lay = KeyLayout("p")
    for key in (lay.job("j-1"), lay.job_window("j-1"), lay.job_seen("j-1"), lay.job_outbox("j-1")):
        assert lay.job_of(key) == "j-1"
    assert lay.job_of(lay.lookup_model("j-1")) is None and lay.job_of(KeyLayout("q").job("j-1")) is None
