"""The fitted constants of the throughput law, and where they are stored.

What part of a datasheet a training step reaches is not a spec: old parts lack tuned kernels,
big ones are hard to fill, other vendors' stacks trail NVIDIA's. The law
(:mod:`leap.fleet.throughput`) therefore reaches each part's peak FLOP/s and memory bandwidth through
power laws and a per-architecture efficiency, all fitted to the public measurements
(:func:`leap.fleet.fit.fit_law`):

* achieved rates ``peak_ref x (peak / peak_ref) ^ peak_exponent`` and the same for bandwidth:
  speed grows slower than the spec sheet (the exponents are fitted, below 1);
* ``part_log_eff[h]``: the log efficiency of part ``h`` on the whole device time: a straight
  line in the log of its architecture's peak (interpolated between architectures), plus a
  deviation for each architecture that measurements cover (shrunk towards the line), plus a
  smaller one for each measured part (power limits: an H100 PCIe reaches less of its datasheet
  than an H100 SXM); parts no measurement covers get the line and their architecture's deviation;
* ``overlap_norm``: matrix and memory time combine as their p-norm (1 would add them);
* ``dispatch_scale``: multiplies the host's per-operator dispatch cost;
* ``occupancy_tau_s``: seconds at peak that one layer's kernels on one micro-batch need to
  fill a part to 63 % (the batch-size efficiency curve: big parts need big kernels).

The values used by the simulator are fitted on every measurement and stored in
``leap/fleet/data/law.json`` (``leap fleet calibrate --write`` refits and rewrites it);
``leap fleet calibrate`` refits them without each held-out group to score the law out of sample.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

LAW_PATH = Path(__file__).resolve().parent / "data" / "law.json"


@dataclass(frozen=True)
class LawParams:
    """Fitted constants of the law (see the module docstring); defaults are the unfitted law."""

    part_log_eff: dict[str, float] = field(default_factory=dict)
    peak_exponent: float = 1.0
    bw_exponent: float = 1.0
    overlap_norm: float = 2.0
    dispatch_scale: float = 1.0
    occupancy_tau_s: float = 20e-6

    def part_efficiency(self, names: tuple[str, ...]) -> list[float]:
        """Log efficiency of each part in the given order (0 where not fitted)."""
        return [self.part_log_eff.get(h, 0.0) for h in names]


@lru_cache(maxsize=1)
def fitted_law() -> LawParams:
    """The law fitted on every public measurement (the unfitted law before the first fit)."""
    if not LAW_PATH.exists():
        return LawParams()
    doc = json.loads(LAW_PATH.read_text())
    return LawParams(**doc["params"])


def write_law(law: LawParams, note: dict[str, object]) -> Path:
    """Store ``law`` as the simulator's law, with ``note`` saying how it was fitted."""
    params = asdict(law)
    params["part_log_eff"] = {k: round(v, 4) for k, v in sorted(law.part_log_eff.items())}
    for key in ("peak_exponent", "bw_exponent", "overlap_norm", "dispatch_scale"):
        params[key] = round(params[key], 4)
    params["occupancy_tau_s"] = float(f"{law.occupancy_tau_s:.4g}")
    LAW_PATH.parent.mkdir(parents=True, exist_ok=True)
    LAW_PATH.write_text(json.dumps({"note": note, "params": params}, indent=2) + "\n")
    fitted_law.cache_clear()
    return LAW_PATH
