"""The simulator's oracle as a backtest reads it, and the submission-time ceiling built from it.

Where a history has the simulator's oracle table, a backtest scores two references no model can
beat:

* ``oracle``: the noise-free expected throughput, which includes the job's own speed factor;
* ``ceiling``: the best a predictor can do *at submission time*: it knows the simulator's law
  exactly (every hardware type's noise-free throughput at the submission's configuration), a
  model type's effect on an architecture once a job of the type finished on that architecture
  before the submission (before: the effect's median, 1), and of the job only what its history
  shows: its measured throughput (noise and all) here, else on its most observed other
  hardware, relative to the law at the configuration it was measured at, times the law here;
  no history: the law. The job's input cap (15% of simulated jobs) is the job's own, like its
  speed factor: applied once a measured attempt of the job ran at it before the submission.
  Knowing an effect or a cap before anything revealed it would credit the ceiling with what no
  predictor can know at submission time (``knows_every_effect``, ``knows_every_cap`` keep the
  earlier rules; histories without ``architecture_effect`` know every effect).

The oracle table has a row per attempt and candidate (millions for a 45-day history), so its
values are kept as float columns over one sorted integer index (:class:`PairTable`) rather than
as dictionaries keyed by ``(attempt_id, hardware)`` tuples: those took about 4 GB for such a
history, in every process a backtest scores nights in, and minutes to pickle for its workers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from features.rows import Rows
from leap.core.hardware import Catalogue, load_catalogue
from leap.training.dataset import Examples, History
from streams.events import Submission

#: The columns of :attr:`OracleTables.pairs`, named after what they hold (see :class:`OracleTables`).
PAIR_COLUMNS = ("throughput", "law", "cap", "architecture_effect")


@dataclass(frozen=True)
class PairTable:
    """Float columns per ``(attempt_id, hardware)`` pair, NaN where a pair has no value.

    Attributes
    ----------
    attempts, hardware
        Name -> integer code; a pair's key is ``attempt code x len(hardware) + hardware code``.
    keys
        The pairs' keys, sorted, each once.
    columns
        Column name -> values, aligned with ``keys``.
    """

    attempts: dict[str, int]
    hardware: dict[str, int]
    keys: np.ndarray
    columns: dict[str, np.ndarray]

    @classmethod
    def from_codes(cls, attempts: Sequence[str], attempt_code: np.ndarray, hardware: Sequence[str],
                   hardware_code: np.ndarray, columns: Mapping[str, np.ndarray]) -> PairTable:
        """Rows given as codes into ``attempts`` and ``hardware``; of rows repeating a pair, the last counts."""
        keys = attempt_code.astype(np.int64) * max(len(hardware), 1) + hardware_code.astype(np.int64)
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
        last = np.append(keys[1:] != keys[:-1], True) if len(keys) else np.zeros(0, dtype=bool)
        return cls({a: i for i, a in enumerate(attempts)}, {h: i for i, h in enumerate(hardware)}, keys[last],
                   {name: np.asarray(v, dtype=np.float64)[order][last] for name, v in columns.items()})

    @classmethod
    def from_arrow(cls, table: pa.Table, columns: Mapping[str, str]) -> PairTable:
        """``columns`` (our name -> the table's column) of an Arrow table with ``attempt_id`` and ``hardware``."""
        a = pc.dictionary_encode(table.column("attempt_id").combine_chunks())
        h = pc.dictionary_encode(table.column("hardware").combine_chunks())
        values = {name: table.column(source).to_numpy().astype(np.float64) for name, source in columns.items()}
        return cls.from_codes(a.dictionary.to_pylist(), a.indices.to_numpy(), h.dictionary.to_pylist(),
                              h.indices.to_numpy(), values)

    @classmethod
    def from_maps(cls, maps: Mapping[str, Mapping[tuple[str, str], float | None]]) -> PairTable:
        """Columns given as ``(attempt_id, hardware) -> value`` maps; a pair missing from one is NaN
        there, an empty map leaves its column out."""
        maps = {name: m for name, m in maps.items() if m}
        pairs = list(dict.fromkeys(key for m in maps.values() for key in m))
        attempts = list(dict.fromkeys(a for a, _ in pairs))
        hardware = list(dict.fromkeys(h for _, h in pairs))
        a_code, h_code = {a: i for i, a in enumerate(attempts)}, {h: i for i, h in enumerate(hardware)}
        values = {name: np.array([np.nan if (v := m.get(p)) is None else v for p in pairs], dtype=np.float64)
                  for name, m in maps.items()}
        return cls.from_codes(attempts, np.array([a_code[a] for a, _ in pairs], dtype=np.int64), hardware,
                              np.array([h_code[h] for _, h in pairs], dtype=np.int64), values)

    def __len__(self) -> int:
        return len(self.keys)

    def positions(self, attempt_id: Iterable[str | None], hardware: Iterable[str]) -> np.ndarray:
        """Per pair, its index into ``keys`` (-1 where the table does not hold it)."""
        a = np.array([self.attempts.get(x, -1) if x is not None else -1 for x in attempt_id], dtype=np.int64)
        h = np.array([self.hardware.get(x, -1) for x in hardware], dtype=np.int64)
        if len(a) != len(h):
            raise ValueError(f"{len(a)} attempts against {len(h)} hardware names")
        if not len(self.keys):
            return np.full(len(a), -1)
        code = a * len(self.hardware) + h
        pos = np.minimum(np.searchsorted(self.keys, code), len(self.keys) - 1)
        return np.where((a >= 0) & (h >= 0) & (self.keys[pos] == code), pos, -1)

    def look(self, column: str, attempt_id: Iterable[str | None], hardware: Iterable[str]) -> np.ndarray:
        """``column`` per pair, NaN where absent (a column the table lacks: all NaN)."""
        pos = self.positions(attempt_id, hardware)
        values = self.columns.get(column)
        if values is None or not len(values):
            return np.full(len(pos), np.nan)
        return np.where(pos >= 0, values[np.maximum(pos, 0)], np.nan)

    def get(self, column: str, attempt_id: str, hardware: str) -> float | None:
        """One pair's value, None where absent or NaN."""
        v = float(self.look(column, [attempt_id], [hardware])[0])
        return None if np.isnan(v) else v


def ceiling_predictions(rows: Rows, attempt_id: np.ndarray, num_accelerators: np.ndarray,
                        tables: OracleTables, knows_every_effect: bool = False,
                        knows_every_cap: bool = False) -> np.ndarray:
    """Per-accelerator predictions of the submission-time ceiling (see the module docstring).

    The job's history is what the rows say it is (``prior_same_*`` on this hardware, else
    ``prior_other_*`` on ``prior_hw``): a measured throughput, whose ratio to the law at the
    configuration it was measured at (the job's latest earlier attempt there) is the job's effect as
    measured. The law at this attempt's configuration times that effect, under the input cap, is
    the ceiling; without history the effect is 1. The law here leaves out the model type's effect
    on the candidate's architecture while no earlier finish revealed it, unless
    ``knows_every_effect`` (the ceiling of earlier versions). The law where the prior was measured
    keeps it: the job's own finish there revealed it. The job's input cap counts once a measured
    attempt of it ran at the cap (:meth:`OracleTables.cap_revealed`), or always: ``knows_every_cap``.
    """
    pairs = tables.pairs
    law = pairs.look("law", attempt_id, rows["hardware"])
    if not knows_every_effect:
        hidden = tables.unrevealed(attempt_id, rows["hardware"])
        law = np.where(hidden, law / pairs.look("architecture_effect", attempt_id, rows["hardware"]), law)
    cap = pairs.look("cap", attempt_id, rows["hardware"])
    if not knows_every_cap:
        cap = np.where(tables.cap_revealed(attempt_id), cap, np.nan)
    same = rows["prior_same_n"] > 0
    where = np.where(same, rows["hardware"], rows["prior_hw"])
    measured = np.exp(np.where(same, rows["prior_same_log"], rows["prior_other_log"]))
    earlier = [tables.earlier_attempt(a, h) for a, h in zip(attempt_id, where, strict=True)]
    law_there = pairs.look("law", earlier, where) / tables.look_accelerators(earlier)
    with np.errstate(divide="ignore", invalid="ignore"):
        effect = np.where(same | (rows["prior_other_n"] > 0), measured / law_there, 1.0)
    # The oracle is min(law x effect, cap); a NaN cap (none) leaves the product as it is.
    return np.asarray(np.fmin(law * effect, cap) / num_accelerators, dtype=np.float64)


@dataclass(frozen=True)
class OracleTables:
    """The simulator's oracle table per ``(attempt_id, hardware)`` (empty without one), and the
    finished attempts of each job.

    Attributes
    ----------
    pairs
        Columns (:data:`PAIR_COLUMNS`): ``throughput``, the whole-job noise-free throughput
        ``min(law x the job's own effects, cap)``; ``law``, the law's whole-job throughput at the
        attempt's configuration (the model type's effect on the architecture included, the job's
        own effects not); ``cap``, the job's input cap (NaN: none); ``architecture_effect``, the
        model type's effect on the part's architecture, a factor of ``law`` (absent for a
        simulator without it: then every effect counts as revealed).
    finished
        ``job_key -> [(finish time, attempt_id, hardware, accelerators)]`` of measured attempts,
        oldest first; ``submitted``: ``attempt_id -> (job_key, submission time)``;
        ``accelerators``: ``attempt_id -> accelerators`` of the measured attempts.
    revealed
        ``(model type, architecture) -> time`` of the first measured finish of a job of the model
        type on a part of the architecture; ``model_type``: ``attempt_id -> model type``;
        ``architecture``: ``hardware -> architecture``.
    """

    pairs: PairTable
    finished: dict[str, list[tuple[float, str, str, int]]] = field(default_factory=dict)
    submitted: dict[str, tuple[str, float]] = field(default_factory=dict)
    accelerators: dict[str, int] = field(default_factory=dict)
    revealed: dict[tuple[str, str], float] = field(default_factory=dict)
    model_type: dict[str, str] = field(default_factory=dict)
    architecture: dict[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, history: History, catalogue: Catalogue | None = None) -> OracleTables:
        """The history's oracle columns; all empty for a history without an oracle table.

        A table of a simulator without job-by-hardware effects (no ``law_throughput`` column) reads
        as law = throughput / job factor; one without ``architecture_effect`` as if every model
        type's effect on every architecture were known from the start.
        """
        if history.oracle is None:
            return cls(PairTable.from_maps({}))
        catalogue = catalogue or load_catalogue()
        o = history.oracle
        sources = {"throughput": "oracle_throughput", "cap": "input_cap", "law": "law_throughput",
                   "architecture_effect": "architecture_effect", "job_factor": "job_factor"}
        pairs = PairTable.from_arrow(o, {k: v for k, v in sources.items() if v in o.column_names})
        if "law" not in pairs.columns:
            pairs.columns["law"] = pairs.columns["throughput"] / pairs.columns["job_factor"]
        pairs.columns.pop("job_factor", None)
        finished: dict[str, list[tuple[float, str, str, int]]] = {}
        f = history.finishes.filter(pc.is_valid(history.finishes.column("throughput")))
        for row in f.select(["job_key", "event_time", "attempt_id", "hardware", "num_accelerators"]).to_pylist():
            finished.setdefault(row["job_key"], []).append(
                (row["event_time"], row["attempt_id"], row["hardware"], row["num_accelerators"]))
        for attempts in finished.values():
            attempts.sort()
        s = history.submissions.select(["attempt_id", "job_key", "event_time", "model_type"]).to_pylist()
        model_type = {r["attempt_id"]: r["model_type"] for r in s}
        architecture = {hw.name: hw.architecture for hw in catalogue.types.values()}
        revealed: dict[tuple[str, str], float] = {}
        for runs in finished.values():
            for at, attempt, hw, _ in runs:
                key = (model_type.get(attempt, ""), architecture.get(hw, hw))
                revealed[key] = min(at, revealed.get(key, at))
        return cls(pairs, finished, {r["attempt_id"]: (r["job_key"], r["event_time"]) for r in s},
                   {a: n for runs in finished.values() for _, a, _, n in runs}, revealed, model_type, architecture)

    @classmethod
    def of(cls, throughput: Mapping[tuple[str, str], float], law: Mapping[tuple[str, str], float],
           cap: Mapping[tuple[str, str], float], architecture_effect: Mapping[tuple[str, str], float] | None = None,
           **rest: Any) -> OracleTables:
        """Tables given as ``(attempt_id, hardware) -> value`` maps (:data:`PAIR_COLUMNS`), the rest as they are."""
        maps = {"throughput": throughput, "law": law, "cap": cap, "architecture_effect": architecture_effect or {}}
        return cls(PairTable.from_maps(maps), **rest)

    @property
    def empty(self) -> bool:
        """No oracle table: the history is not the simulator's."""
        return not len(self.pairs)

    def earlier_attempt(self, attempt_id: str, hardware: str) -> str | None:
        """The job's latest attempt on ``hardware`` that finished before ``attempt_id`` was submitted."""
        job, at = self.submitted.get(attempt_id, ("", 0.0))
        found = None
        for finished, earlier, hw, _ in self.finished.get(job, []):
            if finished >= at:
                break
            if hw == hardware:
                found = earlier
        return found

    def unrevealed(self, attempt_id: np.ndarray, hardware: np.ndarray) -> np.ndarray:
        """Per row: no job of the attempt's model type finished on the hardware's architecture
        before the attempt was submitted (always False without ``architecture_effect``)."""
        if "architecture_effect" not in self.pairs.columns:
            return np.zeros(len(attempt_id), dtype=bool)
        out = np.empty(len(attempt_id), dtype=bool)
        for i, (a, h) in enumerate(zip(attempt_id, hardware, strict=True)):
            first = self.revealed.get((self.model_type.get(a, ""), self.architecture.get(h, h)))
            out[i] = first is None or first >= self.submitted.get(a, ("", 0.0))[1]
        return out

    @cached_property
    def capped(self) -> frozenset[str]:
        """Measured attempts that ran at their job's input cap (min(law x effects, cap) is the cap)."""
        measured = [(a, hw) for runs in self.finished.values() for _, a, hw, _ in runs]
        attempts, hardware = [a for a, _ in measured], [hw for _, hw in measured]
        at_cap = self.pairs.look("throughput", attempts, hardware) >= self.pairs.look("cap", attempts, hardware)
        return frozenset(a for a, hit in zip(attempts, at_cap, strict=True) if hit)

    def cap_revealed(self, attempt_id: np.ndarray) -> np.ndarray:
        """Per row: a measured attempt of the job ran at its input cap before the attempt was submitted."""
        out = np.zeros(len(attempt_id), dtype=bool)
        for i, a in enumerate(attempt_id):
            job, at = self.submitted.get(a, ("", 0.0))
            out[i] = any(done < at and earlier in self.capped for done, earlier, _, _ in self.finished.get(job, []))
        return out

    def look_accelerators(self, attempts: Sequence[str | None]) -> np.ndarray:
        """Accelerators of each attempt (NaN for None)."""
        return np.array([self.accelerators.get(a, np.nan) if a is not None else np.nan for a in attempts],
                        dtype=np.float64)

    def per_accelerator(self, test: Examples) -> np.ndarray:
        """The oracle's per-accelerator throughput of each test example (NaN where it has none)."""
        return self.pairs.look("throughput", test.attempt_id, test.hardware) / test.num_accelerators

    def ceiling(self, rows: Rows, attempt_id: np.ndarray, num_accelerators: np.ndarray,
                knows_every_effect: bool = False, knows_every_cap: bool = False) -> np.ndarray:
        """:func:`ceiling_predictions` with these tables."""
        return ceiling_predictions(rows, attempt_id, num_accelerators, self, knows_every_effect, knows_every_cap)

    def ceiling_picker(self, sub: Submission, rows: Rows) -> np.ndarray:
        """The ceiling for every candidate row of one submission (a :data:`Picker`)."""
        n = len(rows["hardware"])
        return self.ceiling(rows, np.full(n, sub.attempt_id, dtype=object), np.full(n, float(sub.num_accelerators)))
