"""What each ranked candidate's prediction rests on: the ``basis`` of rankings (schema version 2).

Per candidate: the evidence the job's own history holds (``ran_here``, ``ran_elsewhere``,
``none``), which estimate was served (a key of :data:`predictor.models.ESTIMATES`), the job's
measurement it is compared with (the *prior*: on the candidate when the job ran there, else on
the job's most-observed other hardware, the one the rows' transfer columns start from) and the
ratio of the served per-accelerator throughput to the prior's.

The prior is named by its hardware only: its per-accelerator throughput (the robust value) and
the time of its newest measurement are the ranking's ``features_used["prior"][hardware]``, the
snapshot the rows were built from, so they are written once per ranking rather than once per
candidate (the basis may grow a ranking by at most 30 %, ``docs/benchmarks.md``). A candidate
without a prior carries neither ``prior`` nor ``ratio``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from features.rows import Rows
from features.snapshot import FeatureSnapshot

#: Significant digits of ``basis.ratio``: it explains a choice, and full precision would grow every
#: candidate of every ranking by a dozen bytes.
RATIO_DIGITS = 4


def evidence(same_n: float, other_n: float) -> str:
    """``ran_here`` / ``ran_elsewhere`` / ``none`` from a row's ``prior_same_n`` and ``prior_other_n``
    (the evidence levels of :func:`predictor.calibration.evidence_level`)."""
    return "ran_here" if same_n > 0 else "ran_elsewhere" if other_n > 0 else "none"


def candidate_bases(snap: FeatureSnapshot, rows: Rows, span: slice, per_acc: np.ndarray, estimate: np.ndarray,
                    stand_ins: dict[str, str]) -> list[dict[str, Any]]:
    """The basis of each candidate of one submission, in the submission's order.

    Parameters
    ----------
    snap
        The feature snapshot the submission's rows were built from.
    rows
        The batch's rows; ``span`` selects this submission's.
    per_acc, estimate
        The batch's served per-accelerator throughput (NaN: none) and estimate labels.
    stand_ins
        Submission fields that were missing and what stood in for each; carried only when not empty.
    """
    hardware, prior_hw = rows["hardware"][span], rows["prior_hw"][span]
    same_n, other_n = rows["prior_same_n"][span], rows["prior_other_n"][span]
    served, labels = per_acc[span], estimate[span]
    out = []
    for i in range(len(hardware)):
        kind = evidence(same_n[i], other_n[i])
        name = hardware[i] if kind == "ran_here" else prior_hw[i] if kind == "ran_elsewhere" else None
        stat = snap.prior.get(name) if name is not None else None
        basis: dict[str, Any] = {"evidence": kind, "estimate": labels[i]}
        if stat is not None:
            value = float(served[i]) / stat.robust if stat.robust > 0 else math.nan
            basis["prior"] = name
            basis["ratio"] = float(f"{value:.{RATIO_DIGITS}g}") if math.isfinite(value) else None
        if stand_ins:
            basis["stand_ins"] = stand_ins
        out.append(basis)
    return out
