"""PNG plots of a backtest's result (:func:`leap.training.backtest.backtest`): accuracy per day,
predicted against measured, accuracy by hardware and by family."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from leap.training.backtest import METHODS


def plot_report(result: dict[str, Any], folder: Path) -> list[Path]:
    """PNG plots: accuracy per day, and the per-day table as a chart of acc@10 gaps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    per_day = result["per_day"]
    days = [r["day"][5:] for r in per_day]
    names = [n for n in METHODS if n in per_day[0]]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for n in names:
        ax.plot(days, [r[n]["acc@10"] for r in per_day], marker="o", ms=3, label=n)
    ax.set_ylabel("acc@10 (share within 10% of measured)")
    ax.set_ylim(0, 1)
    ax.set_title(f"Backtest: {result['days']} nightly retrains")
    ax.legend()
    ax.tick_params(axis="x", labelrotation=60, labelsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    paths = [folder / "accuracy_per_day.png"]
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    sample = result.get("lightgbm_sample")
    if sample and sample["pred"]:
        pred, actual = np.array(sample["pred"]), np.array(sample["actual"])
        ok = np.isfinite(pred) & (pred > 0)
        fig, ax = plt.subplots(figsize=(5.5, 5.5))
        ax.loglog(actual[ok], pred[ok], ".", ms=2, alpha=0.4)
        lo, hi = float(actual[ok].min()), float(actual[ok].max())
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="exact")
        ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="grey", alpha=0.25, label="±10%")
        ax.set_xlabel("measured samples/s per accelerator")
        ax.set_ylabel("LightGBM predicted")
        ax.set_title("Predicted against measured (sample)")
        ax.legend()
        fig.tight_layout()
        paths.append(folder / "predicted_vs_actual.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)

    for key in ("hardware", "family"):
        table = result.get(f"lightgbm_by_{key}")
        if not table:
            continue
        names = sorted(table, key=lambda k: table[k]["acc@10"])
        fig, ax = plt.subplots(figsize=(7, 0.28 * len(names) + 1.2))
        ax.barh(names, [table[k]["acc@10"] for k in names], color="#4878a8")
        ax.set_xlim(0, 1)
        ax.set_xlabel("LightGBM acc@10 over all backtest days")
        ax.set_title(f"Accuracy by {key}")
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        paths.append(folder / f"accuracy_by_{key}.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths
