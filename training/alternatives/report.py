"""The ``leap alternatives`` report as rows, a Markdown table and a PNG chart.

One row per (dataset, model): the simulator backtest (means over the nights) and each public
table under each protocol. On the simulator the accuracy figures cover every test attempt; on a
public table they cover the attempts whose job ran on other hardware before (the measurement
runner's primary figures, :data:`training.measurements.runner.PRIMARY`), with every attempt's
acc@10 in the JSON. ``fit s`` is one fit: a night's on the simulator, a fold's on a table.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

#: Report columns: (header, key in a row, digits).
COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("acc@10", "acc@10", 3), ("acc@20", "acc@20", 3), ("MAPE", "mape", 3), ("top-1", "top1", 3),
    ("regret", "regret", 3), ("fit s", "fit_s", 2), ("µs/row", "predict_us_per_row", 1),
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
             "each attempt's priced candidates (- where there are no rankings).", ""]
    by_dataset: dict[str, list[dict[str, Any]]] = {}
    for row in report_rows(result):
        by_dataset.setdefault(row["dataset"], []).append(row)
    for dataset, rows in by_dataset.items():
        lines += [f"## {dataset}", "", "| model | " + " | ".join(h for h, _, _ in COLUMNS) + " |",
                  "|---|" + "---:|" * len(COLUMNS)]
        lines += ["| " + " | ".join([row["model"], *(cell(row.get(k), d) for _, k, d in COLUMNS)]) + " |"
                  for row in rows]
        lines.append("")
    return "\n".join(lines)


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
        ax.bar(xs, [y if y is not None and math.isfinite(y) else 0.0 for y in ys], width, label=model,
               color=cmap(j % 20))
    ax.set_xticks(range(len(datasets)))
    ax.set_xticklabels([d.replace(" ", "\n", 1) for d in datasets], fontsize=8)
    ax.set_ylabel("acc@10 (share within 10% of measured)")
    ax.set_ylim(0, 1)
    ax.set_title("Alternative models: acc@10 per dataset")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
