"""Key layout: every key of one job shares its Redis Cluster hash slot."""

from __future__ import annotations

import re

from features.keys import KeyLayout


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
