"""The ``leap alternatives`` report as rows, a Markdown table and a PNG chart.

One row per (dataset, model): the simulator backtest (means over the nights) and each public
table under each protocol. On the simulator the accuracy figures cover every test attempt; on a
public table they cover the attempts whose job ran on other hardware before (the measurement
runner's primary figures, :data:`leap.training.measurements.runner.PRIMARY`), with every attempt's
acc@10 in the JSON. ``fit s`` is one fit: a night's on the simulator, a fold's on a table.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: Report columns: (header, key in a row, digits).
COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("acc@10", "acc@10", 3), ("acc@20", "acc@20", 3), ("MAPE", "mape", 3), ("top-1", "top1", 3),
    ("regret", "regret", 3), ("band", "band_coverage", 2), ("fit s", "fit_s", 2),
    ("µs/row", "predict_us_per_row", 1),
)


def report_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """``{"dataset", "model", figures...}`` for every dataset and model of a result, in order."""
    rows: list[dict[str, Any]] = []
    sim = result.get("simulator")
    if sim:
        label = f"simulator ({sim['days']} nightly retrains)"
        rows += [{"dataset": label, "model": name, **figures} for name, figures in sim["mean"].items()]
    for stem, table in result.get("tables", {}).items():
        for protocol, block in table["protocols"].items():
            folds = max(1, int(block.get("folds", 1)))
            for name, s in block["models"].items():
                figures = {key: s.get(key) for _, key, _ in COLUMNS}
                figures["fit_s"] = s["fit_s"] / folds if s.get("fit_s") is not None else None
                figures["acc@10_all"] = s.get("all", {}).get("acc@10")
                rows.append({"dataset": f"{stem} {protocol}", "model": name, **figures})
    return rows


def merge(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One result from several saved ``leap alternatives`` results of the same seed.

    Runs of different models on the same tables (e.g. the cheap models in one invocation, the
    language models in others) become one report. Their folds must be the same: each table's
    rows, jobs and seed, and each protocol's fold count and rows per evidence level must be equal;
    simulator backtests must share the history, nights, window and seed (the ranked sample may
    differ: each model keeps its own ``pick_sample``). A (dataset, model) may come from one result
    only. Run seconds are summed.

    Raises
    ------
    ValueError
        No results, different seeds, other nights or history, different folds or a model twice.
    """
    if not results:
        raise ValueError("nothing to merge: give one or more results")
    seeds = {r.get("seed") for r in results}
    if len(seeds) != 1:
        raise ValueError(f"results of different seeds cannot be merged: {sorted(map(str, seeds))}")
    simulators = [r["simulator"] for r in results if r.get("simulator")]
    out: dict[str, Any] = {"models": [], "seed": results[0].get("seed"),
                           "simulator": copy.deepcopy(simulators[0]) if simulators else None, "tables": {}}
    for simulator in simulators[1:]:
        merge_simulator(out["simulator"], simulator)
    tuned = [r["tuning"] for r in results if r.get("tuning")]
    if tuned:
        out["tuning"] = copy.deepcopy(tuned[0])  # the search that chose the tuned models' settings
    for result in results:
        out["models"] += [m for m in result.get("models", []) if m not in out["models"]]
        for stem, table in result.get("tables", {}).items():
            if stem not in out["tables"]:
                out["tables"][stem] = copy.deepcopy(table)
                continue
            merge_table(stem, out["tables"][stem], table)
    return out


def merge_simulator(into: dict[str, Any], sim: dict[str, Any]) -> None:
    """Add ``sim``'s models to ``into`` (a backtest of the same history and nights)."""
    for key in ("data_hash", "days", "window_days", "seed"):
        if into.get(key) != sim.get(key):
            raise ValueError(f"simulator: {key} differ ({into.get(key)} against {sim.get(key)}): not the same nights")
    shape = [(d["day"], d["train_rows"], d["test_rows"]) for d in into["per_day"]]
    if shape != [(d["day"], d["train_rows"], d["test_rows"]) for d in sim["per_day"]]:
        raise ValueError("simulator: the nights' days or rows differ: not the same nights")
    twice = sorted(set(into["mean"]) & set(sim["mean"]))
    if twice:
        raise ValueError(f"simulator: {', '.join(twice)} in more than one result")
    had, names = list(into["mean"]), list(sim["mean"])
    into["models"] = list(into["models"]) + names
    into["mean"].update(copy.deepcopy(sim["mean"]))
    for level, figures in sim["by_evidence"].items():
        into["by_evidence"][level].update({n: figures[n] for n in names})
    for day, other in zip(into["per_day"], sim["per_day"], strict=True):
        day.update({n: dict(other[n]) for n in names})
        if day.get("candidate_rows") != other.get("candidate_rows"):
            # Ranked samples differ: each model keeps the count of rows its top-1 and regret cover
            # (a result merged before already keeps it per model).
            for side, models in ((day, had), (other, names)):
                if "candidate_rows" in side:
                    for name in models:
                        day[name]["candidate_rows"] = side["candidate_rows"]
            day.pop("candidate_rows", None)
        for level, figures in other["by_evidence"].items():
            day["by_evidence"][level].update({n: figures[n] for n in names})


def merge_table(stem: str, into: dict[str, Any], table: dict[str, Any]) -> None:
    """Add ``table``'s models to ``into`` (the same table's earlier result), checking the folds agree."""
    for key in ("rows", "jobs", "seed"):
        if into.get(key) != table.get(key):
            raise ValueError(f"{stem}: {key} differ ({into.get(key)} against {table.get(key)}): not the same folds")
    into["models"] = list(into.get("models", [])) + [m for m in table.get("models", []) if m not in into["models"]]
    into["seconds"] = (into.get("seconds") or 0.0) + (table.get("seconds") or 0.0)
    for protocol, block in table["protocols"].items():
        if protocol not in into["protocols"]:
            into["protocols"][protocol] = copy.deepcopy(block)
            continue
        have = into["protocols"][protocol]
        for key in ("folds", "rows"):
            if have.get(key) != block.get(key):
                raise ValueError(f"{stem} {protocol}: {key} differ ({have.get(key)} against {block.get(key)})")
        twice = sorted(set(have["models"]) & set(block["models"]))
        if twice:
            raise ValueError(f"{stem} {protocol}: {', '.join(twice)} in more than one result")
        have["seconds"] = (have.get("seconds") or 0.0) + (block.get("seconds") or 0.0)
        have["models"].update(copy.deepcopy(block["models"]))


def cell(x: Any, digits: int) -> str:
    """A figure as text, ``-`` where there is none (no rankings, a missing timing)."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.{digits}f}"


def markdown(result: dict[str, Any]) -> str:
    """The report as Markdown: one table per dataset, models as rows."""
    lines = ["# Alternative models", "",
             "Every model on identical rows and splits (`leap alternatives`). Simulator: means over the "
             "nightly retrains, every test attempt. Public tables: attempts whose job ran on other hardware "
             "before (the measurement runner's primary figures). `fit s`: one fit (a night, a fold); "
             "`µs/row`: prediction time per row in batches. Top-1 and regret: throughput per dollar over "
             "each attempt's priced candidates (- where there are no rankings). `band`: share of measured "
             "throughputs inside the model's 80 % band (- for a model without one).", ""]
    by_dataset: dict[str, list[dict[str, Any]]] = {}
    for row in report_rows(result):
        by_dataset.setdefault(row["dataset"], []).append(row)
    for dataset, rows in by_dataset.items():
        lines += [f"## {dataset}", "", "| model | " + " | ".join(h for h, _, _ in COLUMNS) + " |",
                  "|---|" + "---:|" * len(COLUMNS)]
        lines += ["| " + " | ".join([row["model"], *(cell(row.get(k), d) for _, k, d in COLUMNS)]) + " |"
                  for row in rows]
        lines += [*_sample_note(rows), ""]
    return "\n".join(lines + _settings_lines(result))


def _settings_lines(result: dict[str, Any]) -> list[str]:
    """Which settings each tuned family got, per dataset, and what they were chosen on."""
    tuning = result.get("tuning") or {}
    lines: list[str] = []
    if tuning.get("rotation"):
        lines += ["## Settings chosen (tables)", "",
                  f"{tuning['draws']} settings per family (the first its defaults); each table's chosen on the "
                  "other tables, by mean acc@10 over both protocols (`chosen on` / `defaults on`: that mean).", "",
                  "| table | model | settings ({} = defaults) | chosen on | defaults on |", "|---|---|---|---:|---:|"]
        for stem, families in tuning["rotation"].items():
            for family, c in families.items():
                lines.append(f"| {stem} | {family} | `{_setting_text(c['settings'])}` | {c['chosen_on_acc10']:.3f} "
                             f"| {c['defaults_on_acc10']:.3f} |")
        lines.append("")
    sim = tuning.get("simulator")
    if sim:
        nights = f"{sim['days']} night{'s' if sim['days'] != 1 else ''}"
        lines += ["## Settings chosen (simulator)", "",
                  f"{sim['draws']} settings per family on {sim['history']}, {nights}, by mean acc@10.", "",
                  "| model | settings ({} = defaults) | acc@10 | defaults |", "|---|---|---:|---:|"]
        lines += [f"| {f} | `{_setting_text(c['settings'])}` | {c['acc10']:.3f} | {c['defaults_acc10']:.3f} |"
                  for f, c in sim["chosen"].items()]
        lines.append("")
    return lines


def _setting_text(setting: dict[str, Any]) -> str:
    return "{}" if not setting else ", ".join(f"{k}={v}" for k, v in setting.items())


def _sample_note(rows: list[dict[str, Any]]) -> list[str]:
    """A line saying which simulator models ranked how many submissions a day, when that differs."""
    by_sample: dict[int, list[str]] = {}
    for row in rows:
        if row.get("pick_sample") is not None:
            by_sample.setdefault(int(row["pick_sample"]), []).append(row["model"])
    if len(by_sample) < 2:
        return []
    parts = [f"{', '.join(models)}: {n:,}" for n, models in sorted(by_sample.items(), reverse=True)]
    return ["", f"Top-1 and regret over submissions ranked in full a day ({'; '.join(parts)})."]


def plot(result: dict[str, Any], path: Path) -> Path:
    """A PNG of acc@10 per model (bars) per dataset (groups)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report_rows(result)
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    models = list(dict.fromkeys(r["model"] for r in rows))
    value = {(r["dataset"], r["model"]): r.get("acc@10") for r in rows}
    width = 0.8 / max(1, len(models))
    fig, ax = plt.subplots(figsize=(max(8.0, 1.1 * len(datasets) * max(1, len(models)) * 0.25 + 3), 5))
    cmap = plt.get_cmap("tab20")
    for j, model in enumerate(models):
        xs = [i + (j - (len(models) - 1) / 2) * width for i in range(len(datasets))]
        ys = [value.get((d, model)) for d in datasets]
        bars = [(x, float(y)) for x, y in zip(xs, ys, strict=True) if y is not None and math.isfinite(y)]
        ax.bar([x for x, _ in bars], [y for _, y in bars], width, label=model, color=cmap(j % 20))
        for x in sorted(set(xs) - {x for x, _ in bars}):
            # A model not run on a dataset gets no bar (a zero would read as measured and wrong).
            ax.text(x, 0.01, "not run", rotation=90, fontsize=5, ha="center", va="bottom", color="0.4")
    ax.set_xticks(range(len(datasets)))
    ax.set_xticklabels([d.replace(" ", "\n", 1) for d in datasets], fontsize=8)
    ax.set_ylabel("acc@10 (share within 10% of measured)")
    ax.set_ylim(0, 1)
    seed = f" (seed {result['seed']})" if result.get("seed") is not None else ""
    ax.set_title(f"Alternative models: acc@10 per dataset{seed}")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
