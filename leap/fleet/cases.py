"""The public measurements as simulator configurations: one :class:`Case` per measured point.

Sources (copied under ``data/measurements/``, provenance in the ``*.README.md`` next to them):

* Gavel (OSDI'20): single-GPU iterations/s on K80, P100, V100, fp32 (ResNet-18 CIFAR,
  ResNet-50, Transformer, autoencoder recommender, CycleGAN; A3C and the LSTM LM have no
  counterpart). Gavel's "V100" is the 16 GB part: the catalogue's alias says so, with the reason.
* Lambda GPU benchmarks: single-GPU samples/s, fp16 and fp32 (TF32 where the GPU has it), V100
  to B200, ten DeepLearningExamples workloads.
* MLPerf Training v4.0-v5.1: 8-accelerator systems; per-accelerator speed taken as the inverse of
  accelerator-hours to train (median over systems of a type in a round), so convergence
  differences between submissions count as error. Llama-2-70B LoRA is the ``llama2-70b-lora``
  model type (frozen base weights).

A *group* holds the cases that are comparable with each other (same source, workload,
precision, and Lambda suite or MLPerf round); a *unit* is a source's workload, the block that
the calibration holds out and weighs as one.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from leap.core.hardware import load_catalogue
from leap.fleet.arrays import FRAMEWORKS, JobConfig, hardware_arrays
from leap.fleet.law import LawParams
from leap.fleet.throughput import expected_throughput
from leap.fleet.workloads import model_index
from streams.events import PRECISIONS

DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "measurements"

# source workload -> (simulator model type, input size)
GAVEL = {
    "ResNet-18": ("resnet18-cifar", 32),
    "ResNet-50": ("resnet50", 224),
    "Transformer": ("transformer-base", 64),
    "Recommendation": ("autoencoder-rec", 1),
    "CycleGAN": ("cyclegan", 256),
}
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
    "llama2_70b_lora": ("llama2-70b-lora", 4096, 8),
    "llama31_8b": ("llama31-8b", 8192, 1),
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

    @property
    def unit(self) -> str:
        """The source's workload (``mlperf/bert-large``): held out and weighed as one block."""
        return f"{self.source}/{self.model}"


def _read(name: str, data_dir: Path) -> list[dict[str, str]]:
    with (data_dir / name).open(newline="") as fh:
        return list(csv.DictReader(fh))


def _catalogue_name(source_name: str) -> str | None:
    """The catalogue's name for a source's hardware spelling (its aliases: one map for every
    source), or None for hardware the catalogue lacks (those measurements are not cases)."""
    hw = load_catalogue().resolve(source_name)
    return hw.name if hw is not None else None


def gavel_cases(data_dir: Path = DATA_DIR) -> list[Case]:
    """Single-GPU Gavel measurements (simulation file, consolidated), fp32."""
    out = []
    for r in _read("gavel_throughputs.csv", data_dir):
        if r["num_gpus"] != "1" or r["placement"] != "consolidated" or "simulation" not in r["source_file"]:
            continue
        hw = _catalogue_name(r["gpu_type"])
        if r["model"] not in GAVEL or hw is None or float(r["throughput_iters_per_s"]) <= 0:
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
                hw,
                float(r["throughput_iters_per_s"]) * batch,
            )
        )
    return out


def lambda_cases(data_dir: Path = DATA_DIR) -> list[Case]:
    """Single-GPU Lambda measurements; fp32 rows run TF32 where the GPU has it."""
    out = []
    for r in _read("lambda_pytorch_throughputs.csv", data_dir):
        hw = _catalogue_name(r["gpu_model"])
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
        hw = _catalogue_name(r["accelerator"])
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


def case_configs(cases: list[Case]) -> tuple[JobConfig, np.ndarray]:
    """The simulator configuration of each case (framework: pytorch; TPU: jax) and its hardware column."""
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
    return cfg, np.array([hw.names.index(c.hardware) for c in cases])


def simulate_configs(cfg: JobConfig, cols: np.ndarray, law: LawParams | None = None) -> np.ndarray:
    """Noise-free throughput of the law for each configuration on hardware column ``cols``."""
    tput = expected_throughput(cfg, hardware_arrays(), law)
    return np.asarray(tput[np.arange(len(cols)), cols], dtype=np.float64)


def simulate_cases(cases: list[Case], law: LawParams | None = None) -> np.ndarray:
    """Noise-free throughput of the law for each case on its own hardware."""
    return simulate_configs(*case_configs(cases), law)


def all_cases(data_dir: Path = DATA_DIR) -> list[Case]:
    """Every measured case of the three sources, in source order."""
    return gavel_cases(data_dir) + lambda_cases(data_dir) + mlperf_cases(data_dir)


def spec_logs(cases: list[Case]) -> tuple[np.ndarray, np.ndarray]:
    """Log datasheet peak at each case's precision (TF32/fp32 rate for fp32 jobs) and log bandwidth.

    What the naive comparators of the calibration read: ``peak``, ``bandwidth`` and
    ``sqrt_peak_bandwidth`` predict a log ratio as the difference of these (or of their mean).
    """
    cat = load_catalogue()
    peak, bw = [], []
    for c in cases:
        hw = cat.types[c.hardware]
        fp32 = c.precision in ("fp32", "tf32")
        peak.append(math.log((hw.peak_fp32_tflops or hw.peak_tflops / 8) if fp32 else hw.peak_tflops))
        bw.append(math.log(hw.memory_bw_gbps))
    return np.array(peak), np.array(bw)
