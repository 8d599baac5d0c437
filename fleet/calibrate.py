"""Compare the simulator's cross-hardware throughput ratios with public measurements.

For every measured workload we build the matching simulator configuration and compute the
noise-free throughput on each measured hardware type. Within a comparable group (same source,
workload, precision, software suite or MLPerf round) every pair of hardware types gives a
measured ratio and a simulated ratio; the error of a pair is ``|log(sim ratio / measured
ratio)|``. The headline figure is the median over all pairs.

Sources (copied under ``data/measurements/``, provenance in the ``*.README.md`` next to them):

* Gavel (OSDI'20): single-GPU iterations/s on K80, P100, V100, fp32.
* Lambda GPU benchmarks: single-GPU samples/s, fp16 and fp32/TF32, V100 to B200.
* MLPerf Training v4.0-v5.1: 8-accelerator systems; per-accelerator speed taken as the inverse of
  accelerator-hours to train (so convergence differences between submissions count as error).
"""

from __future__ import annotations

import csv
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np

from core.hardware import load_catalogue
from fleet.throughput import FRAMEWORKS, JobConfig, expected_throughput, hardware_arrays
from fleet.workloads import model_index
from streams.events import PRECISIONS

DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "measurements"

# source workload -> (simulator model type, input size)
GAVEL = {
    "ResNet-18": ("resnet18-cifar", 32),
    "ResNet-50": ("resnet50", 224),
    "Transformer": ("transformer-base", 64),
    "Recommendation": ("autoencoder-rec", 1),
    "CycleGAN": ("cyclegan", 256),
}
GAVEL_HW = {"K80": "K80", "P100": "P100", "V100": "V100-16GB"}
LAMBDA = {
    "resnet50": ("resnet50", 224),
    "ssd": ("ssd300", 300),
    "maskrcnn": ("maskrcnn-r50", 800),
    "bert_base_squad": ("bert-base", 384),
    "bert_large_squad": ("bert-large", 384),
    "gnmt": ("gnmt", 50),
    "transformerxlbase": ("transformer-xl-base", 192),
    "transformerxllarge": ("transformer-xl-large", 384),
    "tacotron2": ("tacotron2", 800),
    "waveglow": ("waveglow", 16000),
}
LAMBDA_HW = {
    "V100 32GB": "V100-32GB",
    "V100 16GB": "V100-16GB",
    "A100 40GB SXM4": "A100-40GB",
    "A100 80GB SXM4": "A100-80GB",
    "H100 80GB SXM5": "H100-SXM",
    "H100 80GB PCIe": "H100-PCIe",
    "B200 192GB SXM5": "B200",
}
# MLPerf benchmark -> (model type, input size, tensor parallel at 8 accelerators)
MLPERF = {
    "bert": ("bert-large", 512, 1),
    "resnet": ("resnet50", 224, 1),
    "ssd": ("retinanet-r50", 800, 1),
    "retinanet": ("retinanet-r50", 800, 1),
    "stable_diffusion": ("sd2-unet", 512, 1),
    "dlrm_dcnv2": ("dlrm-dcnv2-10b", 26, 1),
    "gnn": ("rgat-h512", 512, 1),
    "rgat": ("rgat-h512", 512, 1),
    "llama2_70b_lora": ("llama2-70b", 4096, 8),
    "llama31_8b": ("llama31-8b", 8192, 1),
}
MLPERF_HW = {
    "NVIDIA H100 SXM": "H100-SXM",
    "NVIDIA H100 PCIe": "H100-PCIe",
    "NVIDIA H200 SXM": "H200",
    "NVIDIA B200": "B200",
    "NVIDIA L40S": "L40S",
    "AMD MI300X": "MI300X",
    "AMD MI325X": "MI325X",
    "Google TPU v5p": "TPU-v5p",
    "Google TPU v6e (Trillium)": "TPU-v6e",
    "Intel Gaudi 2": "Gaudi2",
    "NVIDIA A100 SXM 80GB": "A100-80GB",
}


@dataclass(frozen=True)
class Case:
    """One measured (workload, hardware) point and the simulator configuration matching it."""

    source: str
    group: str
    model: str
    seq: int
    batch: int
    precision: str
    n: int
    tp: int
    hardware: str
    measured: float


def _read(name: str, data_dir: Path) -> list[dict[str, str]]:
    with (data_dir / name).open(newline="") as fh:
        return list(csv.DictReader(fh))


def gavel_cases(data_dir: Path = DATA_DIR) -> list[Case]:
    """Single-GPU Gavel measurements (simulation file, consolidated), fp32."""
    out = []
    for r in _read("gavel_throughputs.csv", data_dir):
        if r["num_gpus"] != "1" or r["placement"] != "consolidated" or "simulation" not in r["source_file"]:
            continue
        if r["model"] not in GAVEL or float(r["throughput_iters_per_s"]) <= 0:
            continue
        model, seq = GAVEL[r["model"]]
        batch = int(float(r["batch_size"] or 1))
        out.append(
            Case(
                "gavel",
                f"gavel/{r['job_type']}",
                model,
                seq,
                batch,
                "fp32",
                1,
                1,
                GAVEL_HW[r["gpu_type"]],
                float(r["throughput_iters_per_s"]) * batch,
            )
        )
    return out


def lambda_cases(data_dir: Path = DATA_DIR) -> list[Case]:
    """Single-GPU Lambda measurements; fp32 rows run TF32 where the GPU has it."""
    out = []
    for r in _read("lambda_pytorch_throughputs.csv", data_dir):
        hw = LAMBDA_HW.get(r["gpu_model"])
        if r["num_gpus"] != "1" or hw is None or r["workload"] not in LAMBDA or not r["throughput"]:
            continue
        model, seq = LAMBDA[r["workload"]]
        out.append(
            Case(
                "lambda",
                f"lambda/{r['suite']}/{r['workload']}/{r['precision']}",
                model,
                seq,
                int(float(r["batch_size_total"] or 1)),
                "fp16" if r["precision"] == "fp16" else "tf32",
                1,
                1,
                hw,
                float(r["throughput"]),
            )
        )
    return out


def mlperf_cases(data_dir: Path = DATA_DIR) -> list[Case]:
    """8-accelerator MLPerf systems: median inverse accelerator-hours per (round, benchmark, type)."""
    points: dict[tuple[str, str, str], list[tuple[float, int]]] = defaultdict(list)
    for r in _read("mlperf_training_submissions.csv", data_dir):
        hw = MLPERF_HW.get(r["accelerator"])
        if r["num_accelerators"] != "8" or hw is None or r["benchmark"] not in MLPERF:
            continue
        if not r["accelerator_hours_olympic"]:
            continue
        gbs = int(float(r["global_batch_size"])) if r["global_batch_size"] else 8
        points[(r["version"], r["benchmark"], hw)].append((1.0 / float(r["accelerator_hours_olympic"]), gbs))
    out = []
    for (version, bench, hw), vals in sorted(points.items()):
        model, seq, tp = MLPERF[bench]
        speed = statistics.median(v for v, _ in vals)
        gbs = int(statistics.median(g for _, g in vals))
        out.append(
            Case(
                "mlperf", f"mlperf/{version}/{bench}", model, seq, max(gbs, 8 // tp), "bf16", 8, tp, hw, speed
            )
        )
    return out


def simulate_cases(cases: list[Case]) -> np.ndarray:
    """Noise-free simulator throughput of each case on its own hardware (framework: pytorch; TPU: jax)."""
    hw = hardware_arrays()
    idx = model_index()
    cat = load_catalogue()
    n = np.array([c.n for c in cases], dtype=np.float64)
    tp = np.array([c.tp for c in cases], dtype=np.float64)
    fw = [FRAMEWORKS.index("jax" if cat.types[c.hardware].vendor == "google" else "pytorch") for c in cases]
    cfg = JobConfig(
        model=np.array([idx[c.model] for c in cases], dtype=np.int64),
        batch=np.array([c.batch for c in cases], dtype=np.float64),
        seq=np.array([c.seq for c in cases], dtype=np.float64),
        precision=np.array([PRECISIONS.index(c.precision) for c in cases], dtype=np.int64),
        n=n,
        dp=n / tp,
        tp=tp,
        pp=np.ones(len(cases)),
        framework=np.array(fw, dtype=np.int64),
    )
    tput = expected_throughput(cfg, hw)
    cols = np.array([hw.names.index(c.hardware) for c in cases])
    return np.asarray(tput[np.arange(len(cases)), cols], dtype=np.float64)


def pair_errors(cases: list[Case], sim: np.ndarray) -> list[dict[str, Any]]:
    """Every within-group hardware pair with measured and simulated log-ratios."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, c in enumerate(cases):
        groups[c.group].append(i)
    out = []
    for group, members in groups.items():
        # several rows of one hardware in a group (e.g. batch variants) are separate groups already
        for a, b in combinations(members, 2):
            ca, cb = cases[a], cases[b]
            if ca.hardware == cb.hardware:
                continue
            measured = math.log(ca.measured / cb.measured)
            simulated = math.log(sim[a] / sim[b])
            out.append(
                {
                    "group": group,
                    "source": ca.source,
                    "pair": f"{ca.hardware}/{cb.hardware}",
                    "measured_log_ratio": measured,
                    "simulated_log_ratio": simulated,
                    "abs_error": abs(simulated - measured),
                }
            )
    return out


def calibrate(data_dir: Path = DATA_DIR) -> dict[str, Any]:
    """Run the comparison and summarise it.

    Returns
    -------
    dict
        ``median_abs_log_ratio_error`` (all pairs), per-source medians, the share of pairs within
        20 %, pair counts, and the ten worst groups.
    """
    cases = gavel_cases(data_dir) + lambda_cases(data_dir) + mlperf_cases(data_dir)
    sim = simulate_cases(cases)
    pairs = pair_errors(cases, sim)

    def summary(ps: list[dict[str, Any]]) -> dict[str, Any]:
        errs = [p["abs_error"] for p in ps]
        return {
            "pairs": len(ps),
            "median_abs_log_ratio_error": round(statistics.median(errs), 4),
            "within_20pct": round(sum(e <= math.log(1.2) for e in errs) / len(errs), 3),
        }

    by_source = {s: summary([p for p in pairs if p["source"] == s]) for s in ("gavel", "lambda", "mlperf")}
    by_group: dict[str, list[float]] = defaultdict(list)
    for p in pairs:
        by_group[p["group"]].append(p["abs_error"])
    worst = sorted(((statistics.median(v), g) for g, v in by_group.items()), reverse=True)[:10]
    return {
        **summary(pairs),
        "cases": len(cases),
        "by_source": by_source,
        "worst_groups": [{"group": g, "median_abs_log_ratio_error": round(e, 3)} for e, g in worst],
    }
