"""Stand-ins for the configuration fields a submission may leave out.

The contract lets a scheduler leave out ``params``, ``framework`` and the parallel layout
(``data_parallel``, ``tensor_parallel``, ``pipeline_parallel``); the model was fitted on rows that
have them, and without them its predictions carry almost no hardware signal. :func:`complete`
puts in what can be derived, and says what stood in:

- ``params``: the median of the model type's earlier submissions that said it, else of its
  family's (a configuration aggregate in the store, :func:`config_observations`);
- the layout: the fields given are kept; a missing tensor or pipeline degree is the model type's
  (else the family's) median when it fits the accelerator count, else 1; ``data_parallel`` is what
  is left of the accelerator count (all of it when nothing else is known);
- ``framework``: the one the model type's (else the family's) earlier submissions used most, else
  :data:`DEFAULT_FRAMEWORK`.

The configuration aggregates are lookup-style hashes (:data:`features.layout.LOOKUP_FIELD` per
field: count and windowed median) fed by the submissions that carry the fields; a framework is
counted in a field of its own (``framework=NAME``, value 1) whose count is how often it was used.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from features.snapshot import LookupStat
from streams.events import Submission

#: Optional fields a scheduler may leave out, as a backtest names them (``layout`` is all three).
OPTIONAL_FIELDS: tuple[str, ...] = ("params", "framework", "layout")
LAYOUT_FIELDS: tuple[str, ...] = ("data_parallel", "tensor_parallel", "pipeline_parallel")
#: Configuration aggregate fields with a median.
PARAMS, TENSOR, PIPELINE = "params", "tensor_parallel", "pipeline_parallel"
#: Prefix of a configuration aggregate field that counts one framework.
FRAMEWORK_PREFIX = "framework="
#: Framework of a submission whose model type and family never said one: the most common one in
#: practice (the model needs a known category; an unseen one lands on an arbitrary side of a split).
DEFAULT_FRAMEWORK = "pytorch"

Config = Mapping[str, LookupStat]


def partial(sub: Submission) -> bool:
    """Whether ``sub`` leaves out any field :func:`complete` stands in for."""
    return (sub.params is None or sub.framework is None or sub.data_parallel is None
            or sub.tensor_parallel is None or sub.pipeline_parallel is None)


def config_observations(sub: Submission) -> list[tuple[str, float]]:
    """``(aggregate field, value)`` a submission brings to its model type's and family's
    configuration aggregates: what it says of the fields that may be left out."""
    out: list[tuple[str, float]] = []
    if sub.params is not None and sub.params > 0:
        out.append((PARAMS, float(sub.params)))
    if sub.tensor_parallel is not None:
        out.append((TENSOR, float(sub.tensor_parallel)))
    if sub.pipeline_parallel is not None:
        out.append((PIPELINE, float(sub.pipeline_parallel)))
    if sub.framework is not None:
        out.append((FRAMEWORK_PREFIX + sub.framework, 1.0))
    return out


def drop_field(sub: Submission, name: str) -> Submission:
    """``sub`` without one of :data:`OPTIONAL_FIELDS` (``layout``: all three degrees)."""
    if name == "layout":
        return replace(sub, data_parallel=None, tensor_parallel=None, pipeline_parallel=None)
    if name == "params":
        return replace(sub, params=None)
    if name == "framework":
        return replace(sub, framework=None)
    raise ValueError(f"cannot drop {name!r}: choose one of {', '.join(OPTIONAL_FIELDS)}")


def _median(field: str, model: Config, family: Config) -> tuple[float, str] | None:
    """The model type's median of ``field``, else the family's, and where it came from."""
    for level, table in (("model type", model), ("family", family)):
        stat = table.get(field)
        if stat is not None and stat.n > 0 and math.isfinite(stat.median) and stat.median > 0:
            return stat.median, f"median of {stat.n} earlier submissions of the {level}"
    return None


def _framework(model: Config, family: Config) -> tuple[str, str]:
    for level, table in (("model type", model), ("family", family)):
        used = {f[len(FRAMEWORK_PREFIX):]: s.n for f, s in table.items() if f.startswith(FRAMEWORK_PREFIX)}
        if used:
            # most used; ties to the first name in order, so that both stores pick alike
            name = min(used, key=lambda k: (-used[k], k))
            return name, f"used by {used[name]} of {sum(used.values())} earlier submissions of the {level}"
    return DEFAULT_FRAMEWORK, "default: no earlier submission of the model type or family said one"


def _degree(field: str, room: int, model: Config, family: Config) -> tuple[int, str]:
    """A missing tensor or pipeline degree: the history's median if it divides ``room`` (the
    accelerators not yet spoken for), else 1 (no model parallelism of that kind)."""
    found = _median(field, model, family)
    if found is None:
        return 1, "no earlier submission of the model type or family said it"
    degree = max(1, round(found[0]))
    if room % degree:
        return 1, f"the history's {degree} does not divide {room} accelerators"
    return degree, found[1]


def _layout(sub: Submission, model: Config, family: Config) -> tuple[dict[str, int | None], dict[str, str]]:
    """The layout's missing degrees and why: model-parallel ones first, then data parallelism is
    what is left of the accelerators; None (and ``unknown``) where no degree fits."""
    n = sub.num_accelerators
    layout: dict[str, int | None] = {f: getattr(sub, f) for f in LAYOUT_FIELDS}
    why: dict[str, str] = {}
    for field in (TENSOR, PIPELINE):
        if layout[field] is None:
            known = math.prod(v for v in layout.values() if v is not None)
            room = n // known if n % known == 0 else 1
            layout[field], why[field] = _degree(field, room, model, family)
    if layout["data_parallel"] is None:
        model_parallel = math.prod(v for f, v in layout.items() if f != "data_parallel" and v is not None)
        if n % model_parallel == 0:
            layout["data_parallel"] = n // model_parallel
            why["data_parallel"] = "num_accelerators / (tensor x pipeline)"
    if None in layout.values() or math.prod(v for v in layout.values() if v is not None) != n:
        # the given fields and the history fit no layout: nothing stands in for the missing degrees
        return {f: None for f in why}, {f: "unknown (no layout fits the given fields and num_accelerators)"
                                         for f in LAYOUT_FIELDS if getattr(sub, f) is None}
    return layout, {f: f"{layout[f]} ({w})" for f, w in why.items()}


def complete(sub: Submission, model: Config, family: Config) -> tuple[Submission, dict[str, str]]:
    """``sub`` with stand-ins for the optional fields it leaves out, and what stood in.

    Parameters
    ----------
    sub
        The submission as sent.
    model, family
        The configuration aggregates of its model type and family (field -> count and median).

    Returns
    -------
    The completed submission (``sub`` itself when it leaves nothing out) and, per field stood in
    for, a short text: the value and where it came from (``unknown (...)`` when nothing could).
    """
    if not partial(sub):
        return sub, {}
    changes: dict[str, object] = {}
    stand_ins: dict[str, str] = {}
    if sub.params is None:
        found = _median(PARAMS, model, family)
        if found is None:
            stand_ins[PARAMS] = "unknown (no earlier submission of the model type or family said it)"
        else:
            changes[PARAMS] = found[0]
            stand_ins[PARAMS] = f"{found[0]:.4g} ({found[1]})"
    if sub.framework is None:
        framework, reason = _framework(model, family)
        changes["framework"] = framework
        stand_ins["framework"] = f"{framework} ({reason})"
    if any(getattr(sub, f) is None for f in LAYOUT_FIELDS):
        layout, reasons = _layout(sub, model, family)
        changes.update({f: v for f, v in layout.items() if getattr(sub, f) is None and v is not None})
        stand_ins.update(reasons)
    return replace(sub, **changes), stand_ins  # type: ignore[arg-type]
