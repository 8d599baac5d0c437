"""Convert the flattened public Gavel, Lambda and MLPerf tables into LEAP's measurement-table format.

Run from the repository root::

    .venv/bin/python data/measurements/convert.py --source /path/to/shared/data

It rewrites ``data/measurements/gavel.csv``, ``lambda.csv`` and ``mlperf.csv``. The output is
deterministic (sorted rows, fixed float formatting), so a re-run on the same input changes
nothing in git. What is changed relative to the sources is listed in ``README.md`` next to this
file.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated

import typer

HERE = Path(__file__).resolve().parent

#: The measurement-table columns every file has, in order.
BASE_COLUMNS = ("workload", "hardware", "num_accelerators", "global_batch_size", "throughput")

GAVEL_SOURCE_FILE = "scheduler/simulation_throughputs.json"
GAVEL_COLUMNS = (
    *BASE_COLUMNS,
    "family",
    "framework",
    "per_accelerator_batch_size",
    "throughput_unit",
    "job_type",
    "iterations_per_s",
)
LAMBDA_COLUMNS = (
    *BASE_COLUMNS,
    "precision",
    "suite",
    "framework",
    "throughput_unit",
    "system",
    "nvlink",
    "software_stack",
)

#: Lambda labels AWS rows "A100 40GB SXM4 (AWS p4d.24xlarge)"; the instance is a system detail
#: (kept in ``system``), the accelerator is the part before the parenthesis.
_AWS_SUFFIX = re.compile(r"\s*\(AWS [^)]*\)\s*$")


def _num(x: float) -> str:
    """Fixed formatting so that re-runs are byte-identical."""
    return f"{x:.10g}"


def convert_gavel(rows: Iterable[dict[str, str]]) -> list[dict[str, str]]:
    """Gavel iterations/s to samples/s.

    Parameters
    ----------
    rows
        Rows of ``gavel_throughputs.csv``.

    Returns
    -------
    list of dict
        One row per (job type, GPU, GPU count) from ``simulation_throughputs.json``, consolidated
        placement only; configurations that did not run (0.0) dropped.

    Notes
    -----
    Gavel's profiler (``scheduler/scripts/profiling/measure_throughput.py``) adds up the steps/s
    of every worker of a data-parallel job, and each worker runs the job type's command with its
    batch size (e.g. ``main.py -b 64``). So samples/s = iterations/s x batch size, and the global
    batch is batch size x GPUs. A3C and CycleGAN have no batch size in the job type; their
    throughput stays in iterations/s with ``global_batch_size = 1`` (one iteration counted as one
    sample) and ``throughput_unit = iterations/s``. They only run on one GPU and are compared
    only with themselves, so the unit never mixes with samples/s inside a configuration.
    """
    out: list[dict[str, str]] = []
    for r in rows:
        if r["source_file"] != GAVEL_SOURCE_FILE or r["placement"] != "consolidated":
            continue
        its = float(r["throughput_iters_per_s"])
        if its <= 0.0:  # 0.0 = did not run (out of memory)
            continue
        gpus = int(r["num_gpus"])
        if r["batch_size"]:
            per_gpu = int(r["batch_size"])
            tput, unit = its * per_gpu, "samples/s"
        else:
            per_gpu, tput, unit = 1, its, "iterations/s"
        out.append(
            {
                "workload": r["model"],
                "hardware": r["gpu_type"],
                "num_accelerators": str(gpus),
                "global_batch_size": str(per_gpu * gpus),
                "throughput": _num(tput),
                # Gavel's own labels: its task ("image classification", ...) is the closest
                # thing the source has to a model family; every job type is PyTorch.
                "family": r["task"],
                "framework": r["framework"].lower(),
                "per_accelerator_batch_size": str(per_gpu),
                "throughput_unit": unit,
                "job_type": r["job_type"],
                "iterations_per_s": _num(its),
            }
        )
    return out


def convert_lambda(rows: Iterable[dict[str, str]]) -> list[dict[str, str]]:
    """Lambda's long table to the measurement format.

    Parameters
    ----------
    rows
        Rows of ``lambda_pytorch_throughputs.csv``.

    Returns
    -------
    list of dict
        One row per (suite, system, precision, workload) with a measured throughput and a
        known batch size.

    Notes
    -----
    ``workload`` keeps Lambda's name (``resnet50``) and ``suite`` keeps the software-stack
    generation (``v0`` or ``v1_v2_curated``). The evaluator never pairs rows of different suites
    (``suite`` is part of the configuration key) and computes baseline medians per suite, while
    leave-one-workload-out still holds out ``resnet50`` of every suite at once.
    ``throughput`` is Lambda's unit for the workload (``throughput_unit``): images/s and
    sequences/s are samples/s; gnmt and Transformer-XL are tokens/s, tacotron2 mel frames/s and
    waveglow audio samples/s. Units are constant within a workload, so cross-hardware ratios are
    unaffected.
    """
    out: list[dict[str, str]] = []
    for r in rows:
        if not r["throughput"] or float(r["throughput"]) <= 0.0:  # empty = not run / failed
            continue
        if not r["batch_size_total"] or float(r["batch_size_total"]) <= 0:
            # Lambda's bs table has no column for the multi-GPU Quadro RTX 8000 systems and says
            # 0 for six single-GPU rows that do have a throughput. The batch is part of a
            # configuration, so these rows cannot be paired honestly.
            continue
        out.append(
            {
                "workload": r["workload"],
                "hardware": _AWS_SUFFIX.sub("", r["gpu_model"]),
                "num_accelerators": r["num_gpus"],
                "global_batch_size": str(int(float(r["batch_size_total"]))),
                "throughput": _num(float(r["throughput"])),
                "precision": r["precision"],
                "suite": r["suite"],
                "framework": _lambda_framework(r["source_path"]),
                "throughput_unit": r["throughput_unit"].split(" (")[0],
                "system": r["system_name"],
                "nvlink": r["nvlink"].lower(),
                "software_stack": r["software_stack"],
            }
        )
    return out


MLPERF_COLUMNS = (
    *BASE_COLUMNS,
    "suite",
    "throughput_unit",
    "ttt_min_olympic_mean",
    "submitter_global_batch_size",
    "system",
    "availability",
    "source_repo",
    "source_commit",
    "source_dir",
)


def mlperf_scale(rows: Sequence[dict[str, str]]) -> dict[tuple[str, str], int]:
    """The accelerator count kept for each (round, benchmark): the one most hardware types share.

    Ties go to the count with more submissions, then to the smaller count. Only submissions
    with a time to train count.
    """
    types: dict[tuple[str, str], dict[int, set[str]]] = {}
    subs: dict[tuple[str, str], dict[int, int]] = {}
    for r in rows:
        if not r["ttt_min_olympic_mean"]:
            continue
        key, n = (r["version"], r["benchmark"]), int(r["num_accelerators"])
        types.setdefault(key, {}).setdefault(n, set()).add(r["accelerator"])
        subs.setdefault(key, {})[n] = subs.setdefault(key, {}).get(n, 0) + 1
    return {key: max(by_n, key=lambda n: (len(by_n[n]), subs[key][n], -n)) for key, by_n in types.items()}


def convert_mlperf(rows: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    """MLPerf Training time-to-train to trainings per hour, one configuration per round and benchmark.

    Parameters
    ----------
    rows
        Rows of ``mlperf_training_submissions.csv`` (one per round x submitter x system x
        benchmark).

    Returns
    -------
    list of dict
        The submissions with a time to train at the accelerator count of :func:`mlperf_scale`.

    Notes
    -----
    ``throughput`` = 60 / ``ttt_min_olympic_mean``: complete trainings (to the benchmark's target
    quality) per hour for the whole system, so that per accelerator it is throughput / accelerators
    like every other table. The unit of work is one training, so ``global_batch_size`` is 1 and
    the submitter's own batch is kept in ``submitter_global_batch_size`` (it differs across
    submitters and changes how many steps a training takes; a configuration is round + benchmark
    + accelerator count). ``suite`` is the round (``v4.0`` ...): rules and reference code change
    between rounds, so rounds are never paired, as Lambda's suites are not.
    """
    scale = mlperf_scale(rows)
    out: list[dict[str, str]] = []
    for r in rows:
        key = (r["version"], r["benchmark"])
        if not r["ttt_min_olympic_mean"] or int(r["num_accelerators"]) != scale[key]:
            continue
        out.append(
            {
                "workload": r["benchmark"],
                "hardware": r["accelerator"],
                "num_accelerators": r["num_accelerators"],
                "global_batch_size": "1",
                "throughput": _num(60.0 / float(r["ttt_min_olympic_mean"])),
                "suite": f"v{r['version']}",
                "throughput_unit": "trainings/hour",
                "ttt_min_olympic_mean": _num(float(r["ttt_min_olympic_mean"])),
                "submitter_global_batch_size": _batch(r["global_batch_size"]),
                "system": f"{r['submitter']}/{r['system_id']}",
                "availability": r["availability"],
                "source_repo": r["source_repo"],
                "source_commit": r["source_commit"],
                "source_dir": r["source_dir"],
            }
        )
    return out


def _batch(value: str) -> str:
    """A batch size as a whole number, empty where the source has none."""
    return str(int(float(value))) if value else ""


def _lambda_framework(source_path: str) -> str:
    """``pytorch`` for rows of the source's PyTorch benchmark files; empty (unknown) otherwise."""
    return "pytorch" if source_path.startswith("pytorch/") else ""


def _sort_key(r: Mapping[str, str]) -> tuple[str, str, str, int, int, str, str]:
    return (
        r.get("suite", ""),
        r["workload"],
        r.get("precision", ""),
        int(r["num_accelerators"]),
        int(r["global_batch_size"]),
        r["hardware"],
        r.get("system", ""),
    )


def write_table(path: Path, rows: list[dict[str, str]], columns: Sequence[str]) -> None:
    """Write ``rows`` sorted, with ``columns`` in order and Unix line endings."""
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns), lineterminator="\n")
        w.writeheader()
        w.writerows(sorted(rows, key=_sort_key))


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def main(
    source: Annotated[Path, typer.Option(help="Folder with the flattened Gavel, Lambda and MLPerf CSVs")],
    out: Annotated[Path, typer.Option(help="Output folder")] = HERE,
) -> None:
    """Rewrite gavel.csv, lambda.csv and mlperf.csv from the flattened public tables."""
    gavel = convert_gavel(_read(source / "gavel_throughputs.csv"))
    lam = convert_lambda(_read(source / "lambda_pytorch_throughputs.csv"))
    mlperf = convert_mlperf(_read(source / "mlperf_training_submissions.csv"))
    write_table(out / "gavel.csv", gavel, GAVEL_COLUMNS)
    write_table(out / "lambda.csv", lam, LAMBDA_COLUMNS)
    write_table(out / "mlperf.csv", mlperf, MLPERF_COLUMNS)
    typer.echo(f"gavel.csv: {len(gavel)} rows; lambda.csv: {len(lam)} rows; mlperf.csv: {len(mlperf)} rows")


if __name__ == "__main__":
    typer.run(main)
