"""Each ranked candidate's ``basis``: built from the snapshot the rows were, told by ``leap explain``,
and read back from the rankings topic of a real worker against the features it read."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from features.rows import build_rows
from features.snapshot import FeatureSnapshot, LookupStat, PriorStat
from leap.core.hardware import load_catalogue
from leap.core.settings import Settings
from leap.replay.explain import basis_words, find_ranking, story
from leap.replay.reader import Reader, TopicRange
from leap.replay.timespec import Bound
from leap.services.workers import WorkerProcess
from predictor.basis import candidate_bases
from predictor.models import ESTIMATES
from predictor.ranking import COLD_START
from predictor.service import lookup_fallback
from streams.client import SchedulerClient
from streams.events import Ranking
from streams.topics import RANKINGS
from tests.factories import T0, finish, submission

CAT = load_catalogue()
NAN = float("nan")


def snapshot() -> FeatureSnapshot:
    """A job that ran on A100 (robust 50/s per accelerator) and on H100 (90/s), with L4 medians."""
    return FeatureSnapshot(
        prior={"A100-80GB": PriorStat(3, T0 - 600, 52.0, 50.0), "H100-SXM": PriorStat(1, T0 - 60, 90.0, 90.0)},
        lookup_model={"L4": LookupStat(4, 12.0)},
    )


def test_the_basis_names_the_evidence_the_prior_and_the_ratio_to_it() -> None:
    sub = submission("job", 1, candidates=["H100-SXM", "MI300X", "Quantum-9000"])
    snap = snapshot()
    rows = build_rows(sub, snap, sub.candidates, CAT)
    per_acc = np.array([99.0, 75.0, NAN])
    estimate = np.array(["measured_here", "model", "none"], dtype=object)
    here, elsewhere, unknown = candidate_bases(snap, rows, slice(0, 3), per_acc, estimate, {})
    assert here == {"evidence": "ran_here", "estimate": "measured_here", "prior": "H100-SXM", "ratio": 1.1}
    # elsewhere: the job's most-observed other hardware (A100, three runs, robust 50/s) is the prior
    assert elsewhere == {"evidence": "ran_elsewhere", "estimate": "model", "prior": "A100-80GB", "ratio": 1.5}
    assert unknown == {"evidence": "ran_elsewhere", "estimate": "none", "prior": "A100-80GB", "ratio": None}


def test_a_job_without_history_has_no_prior_and_stand_ins_are_carried_when_given() -> None:
    sub = submission("new", 1, candidates=["L4"])
    rows = build_rows(sub, FeatureSnapshot(), sub.candidates, CAT)
    (basis,) = candidate_bases(FeatureSnapshot(), rows, slice(0, 1), np.array([12.0]),
                               np.array(["lookup"], dtype=object), {"params": "the model type's last params"})
    assert basis == {"evidence": "none", "estimate": "lookup", "stand_ins": {"params": "the model type's last params"}}
    assert "Missing params: the model type's last params stood in." in basis_words(basis, {})


def test_the_ratio_keeps_four_significant_digits() -> None:
    sub = submission("job", 1, candidates=["H100-SXM"])
    snap = snapshot()
    rows = build_rows(sub, snap, sub.candidates, CAT)
    (basis,) = candidate_bases(snap, rows, slice(0, 1), np.array([100.0]), np.array(["model"], dtype=object), {})
    assert basis["ratio"] == 1.111  # 100 / 90


def test_the_story_says_what_won_and_why_then_every_candidate() -> None:
    candidates: list[dict[str, Any]] = [
        {"hardware": "A100-80GB", "predicted_throughput": 400.0, "lower": 300.0, "upper": 520.0, "hourly_cost": 32.0,
         "throughput_per_dollar": 45000.0, "rank": 1, "reason": None,
         "basis": {"evidence": "ran_here", "estimate": "measured_here", "prior": "A100-80GB", "ratio": 1.0}},
        {"hardware": "H100-SXM", "predicted_throughput": 720.0, "lower": 500.0, "upper": 900.0, "hourly_cost": 80.0,
         "throughput_per_dollar": 32400.0, "rank": 2, "reason": None,
         "basis": {"evidence": "ran_elsewhere", "estimate": "paired_ratio", "prior": "A100-80GB", "ratio": 1.8}},
        {"hardware": "Quantum-9000", "predicted_throughput": None, "lower": None, "upper": None, "hourly_cost": None,
         "throughput_per_dollar": None, "rank": None, "reason": "unknown_hardware",
         "basis": {"evidence": "none", "estimate": "none"}},
    ]
    features = FeatureSnapshot(prior={"A100-80GB": PriorStat(2, T0, 52.0, 50.0)}).to_json()
    ranking = Ranking(2, "rank:s", T0 + 5, "job", "att", "s", T0, "lightgbm-7", tuple(candidates), "A100-80GB",
                      features, None, 3.2)
    lines = story(ranking)
    assert lines[1] == "A100-80GB won on samples per dollar: 45,000, 39% ahead of H100-SXM (32,400); its estimate: " \
                       "measured_here."
    assert lines[2].startswith("1. A100-80GB: 400 samples/s (band 300-520), $32.00/h, 45,000 samples per $.")
    assert "1.8 x its 50 samples/s per accelerator on A100-80GB (measured 2026-09-21 " in lines[3]
    assert f"Estimate paired_ratio: {ESTIMATES['paired_ratio']}. The job ran only elsewhere: 1.8 x" in lines[3]
    assert lines[4].startswith("-. Quantum-9000: unranked (unknown_hardware)")
    assert len(lines) == 5


# ---------------------------------------------------------------------------- from a real worker's topic


def _canonical(name: str) -> str:
    hw = CAT.resolve(name)
    return hw.name if hw is not None else name


def assert_basis_matches_features(ranking: Ranking, num_accelerators: int) -> None:
    """Every candidate's basis agrees with the ranking's ``features_used``: evidence from the job's
    priors, the prior among them, the ratio of the served value to its robust throughput."""
    prior, lookups = ranking.features_used["prior"], ranking.features_used["lookup_model"]
    for c in ranking.candidates:
        basis, hw = c["basis"], _canonical(c["hardware"])
        expected = "ran_here" if hw in prior else "ran_elsewhere" if prior else "none"
        assert basis["evidence"] == expected, c
        if expected == "none":
            assert "prior" not in basis and "ratio" not in basis
            continue
        n, _, _, robust = prior[basis["prior"]]
        if expected == "ran_here":
            assert basis["prior"] == hw
        else:  # the most-observed of the job's other hardware
            assert n == max(v[0] for h, v in prior.items() if h != hw)
        served = c["predicted_throughput"] / num_accelerators
        assert basis["ratio"] == pytest.approx(served / robust, rel=1e-3)
        assert basis["estimate"] in ESTIMATES and (basis["estimate"] == "cold_start") == (c["reason"] == COLD_START)
        if basis["estimate"] in ("measured_here", "prior_unchanged"):  # the prior itself is served
            assert basis["ratio"] == 1.0
        if ranking.model_version == lookup_fallback().version:  # the shared topic may announce another model
            # the lookup table serves the model type's median where there is one, else the roofline stands
            # in; a median above the part's peak (the stated size says it cannot run that fast) is cut to it
            if basis["estimate"] == "peak_bound":
                assert hw in lookups and served < lookups[hw][1], c
            else:
                assert basis["estimate"] == ("lookup" if hw in lookups else "cold_start"), c


def _ranking_with_history(client: SchedulerClient, job: str, model_type: str) -> tuple[str, Ranking]:
    """Submit until a ranking of the job shows the finishes the worker applied (they race the submission)."""
    deadline = time.monotonic() + 60
    i = 0
    while time.monotonic() < deadline:
        i += 1
        sub = submission(job, i, model_type=model_type, event_time=T0 + 10_000 + i)
        client.publish(sub)
        client.flush()
        got = client.wait_for([sub.attempt_id], timeout=15).get(sub.attempt_id)
        if got is not None and len(got[0].features_used["prior"]) == 2 and got[0].features_used["lookup_model"]:
            return sub.attempt_id, got[0]
        time.sleep(0.5)
    raise AssertionError(f"no ranking of {job} with its history within 60 s")


@pytest.mark.integration
def test_a_ranking_read_from_the_topic_explains_itself_by_the_features_the_worker_read(
        settings: Settings, worker: WorkerProcess, run_id: str) -> None:
    job, model_type, since = f"{run_id}-basis", f"{run_id}-m", time.time() - 5
    with SchedulerClient(settings) as client:
        # the job ran twice on A100 and once on H100; another job of its type ran on MI300X
        for k, (hw, tput) in enumerate([("A100-80GB", 400.0), ("A100-80GB", 420.0), ("H100-SXM", 800.0)]):
            client.publish_finish(finish(job, f"{run_id}-f{k}", T0 + k * 100, hw, tput, model_type=model_type))
        client.publish_finish(finish(f"{run_id}-other", f"{run_id}-o", T0, "MI300X", 640.0, model_type=model_type))
        client.flush()
        attempt, received = _ranking_with_history(client, job, model_type)

    reader = Reader(settings, [TopicRange(RANKINGS.name, Bound("time", int(since * 1000)), Bound("open"))],
                    progress=False)
    ranking = find_ranking(reader, attempt)
    assert ranking is not None and ranking.event_id == received.event_id, worker.log_tail()
    assert ranking.schema_version == 2
    assert_basis_matches_features(ranking, 8)
    by_hw = {c["hardware"]: c["basis"] for c in ranking.candidates}
    assert by_hw["A100-80GB"]["evidence"] == by_hw["H100-SXM"]["evidence"] == "ran_here"
    assert by_hw["MI300X"]["evidence"] == "ran_elsewhere" and by_hw["MI300X"]["prior"] == "A100-80GB"

    from leap.cli import app

    result = CliRunner().invoke(app, ["explain", attempt, "--from", f"{since:.0f}", "--no-progress"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any(line.startswith(f"Attempt {attempt} of job {job}") for line in lines)
    assert any(" won on samples per dollar" in line for line in lines)
    for hw in ("A100-80GB", "H100-SXM", "MI300X"):
        assert any(line.split(" ", 1)[1].startswith(f"{hw}:") and "samples per $" in line for line in lines), hw
    missing = CliRunner().invoke(app, ["explain", f"{run_id}-nobody", "--from", f"{since:.0f}", "--no-progress"])
    assert missing.exit_code == 1 and "no ranking of attempt" in missing.output

