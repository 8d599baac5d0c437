"""``leap explain ATTEMPT_ID``: one ranking's story, read back from the rankings topic.

The ranking is found by scanning the topic (read-committed, as every replay reads; the key is
the job, not the attempt, so every partition is read); a message whose bytes do not hold the
attempt id is skipped without being decoded. The newest ranking of the attempt (by
``event_time``) is told: which candidate won and on what, then per candidate the evidence behind
its prediction, the estimate served, the prior it started from and the ratio applied, its band
and its price. The words for the estimates are :data:`predictor.models.ESTIMATES`.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import orjson

from features.snapshot import FeatureSnapshot, PriorStat
from leap.replay.decode import try_decode
from leap.replay.reader import Reader
from predictor.models import ESTIMATES
from streams.events import EventError, Ranking

#: What each ``basis.evidence`` says about the job's history, for people.
EVIDENCE_WORDS = {"ran_here": "the job ran on this hardware before", "ran_elsewhere": "the job ran only elsewhere",
                  "none": "the job never ran"}


def find_ranking(reader: Reader, attempt_id: str) -> Ranking | None:
    """The newest ranking of ``attempt_id`` in the reader's range (None: none there); undecodable
    rankings of it are counted in ``reader.tally``."""
    needle = orjson.dumps({"attempt_id": attempt_id})[1:-1]  # '"attempt_id":"<id>"' as orjson writes it
    found: Ranking | None = None
    for msg in reader:
        raw = msg.value()
        if raw is None or needle not in raw:
            continue
        ev = try_decode(msg, Ranking)
        if isinstance(ev, EventError):
            reader.tally.add_bad(msg, ev.reason, ev.message)
        elif isinstance(ev, Ranking) and ev.attempt_id == attempt_id and (found is None
                                                                         or ev.event_time >= found.event_time):
            found = ev
    return found


def _utc(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.3g}"


def basis_words(basis: dict[str, Any] | None, priors: dict[str, PriorStat]) -> str:
    """A candidate's basis as one plain sentence; ``priors`` are the job's measurements the
    ranking read (its ``features_used``), where the prior's throughput and time are."""
    if not basis:
        return "no basis recorded (a ranking of schema version 1)."
    estimate = basis.get("estimate") or "none"
    words = [f"Estimate {estimate}: {ESTIMATES.get(estimate, 'not in this version of the vocabulary')}. "
             f"{str(EVIDENCE_WORDS.get(basis.get('evidence') or '', basis.get('evidence'))).capitalize()}"]
    prior, ratio = basis.get("prior"), basis.get("ratio")
    if prior:
        stat = priors.get(prior)
        of = f"its {_num(stat.robust)} samples/s per accelerator on {prior} (measured {_utc(stat.last_time)})" \
            if stat is not None else f"its measurement on {prior}"
        words.append(f"{ratio:.3g} x {of}" if ratio is not None else f"no estimate against {of}")
    text = ": ".join(words) + "."
    for field, stood_in in (basis.get("stand_ins") or {}).items():
        text += f" Missing {field}: {stood_in} stood in."
    return text


def _candidate_line(c: dict[str, Any], priors: dict[str, PriorStat]) -> str:
    place = f"{c['rank']}." if c.get("rank") is not None else "-."
    if c.get("predicted_throughput") is None or c.get("rank") is None:
        head = f"{place} {c['hardware']}: unranked ({c.get('reason') or 'no estimate'})"
        return head + (f"; {basis_words(c.get('basis'), priors)}" if c.get("basis") else ".")
    band = f"band {_num(c.get('lower'))}-{_num(c.get('upper'))}"
    return (f"{place} {c['hardware']}: {_num(c['predicted_throughput'])} samples/s ({band}), "
            f"${c['hourly_cost']:,.2f}/h, {_num(c['throughput_per_dollar'])} samples per $"
            + (f" [{c['reason']}]" if c.get("reason") else "") + f". {basis_words(c.get('basis'), priors)}")


def story(ranking: Ranking) -> list[str]:
    """The ranking in a few plain lines: what was ranked, what won and why, then every candidate."""
    r = ranking
    lines = [f"Attempt {r.attempt_id} of job {r.job_key}: ranked {_utc(r.event_time)} by model {r.model_version}, "
             f"{len(r.candidates)} candidate(s), in {r.latency_ms:.1f} ms"
             + (f"; fallback: {r.fallback}" if r.fallback else "") + "."]
    ranked = sorted((c for c in r.candidates if c.get("rank") is not None), key=lambda c: c["rank"])
    if not ranked:
        lines.append("Nothing could be ranked: no candidate had both a price and an estimate.")
    else:
        best = ranked[0]
        why = f"{best['hardware']} won on samples per dollar: {_num(best['throughput_per_dollar'])}"
        if len(ranked) > 1:
            second = ranked[1]
            ahead = best["throughput_per_dollar"] / second["throughput_per_dollar"] - 1.0
            why += f", {ahead:.0%} ahead of {second['hardware']} ({_num(second['throughput_per_dollar'])})"
        basis = best.get("basis") or {}
        lines.append(why + (f"; its estimate: {basis['estimate']}." if basis.get("estimate") else "."))
    try:
        priors = FeatureSnapshot.from_json(r.features_used).prior
    except (KeyError, TypeError, ValueError, IndexError):  # a ranking whose features_used is not a snapshot
        priors = {}
    lines += [_candidate_line(c, priors) for c in [*ranked, *(c for c in r.candidates if c.get("rank") is None)]]
    return lines
