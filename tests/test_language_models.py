"""The language-model regressors: row text, the JAX MiniLM against sentence-transformers, and
both models fitting and predicting on a tiny simulated history (the fine-tuned one for a few epochs)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from leap.core.hardware import load_catalogue
from leap.fleet.history import simulate, write_history
from leap.training.alternatives.language import FineTunedMiniLM, FrozenMiniLM, render, sample_rows, short_number
from leap.training.dataset import Examples, build_examples, read_history

#: An interpreter with sentence-transformers, for the reference check when this one has none
#: (the [lm] extra runs MiniLM in JAX and never installs torch).
REFERENCE_PYTHON = "LEAP_MINILM_REFERENCE_PYTHON"

#: Config texts for the equivalence checks: rendered rows, unknown fields, a long text that runs
#: past the tokenizer file's own 128-token cut, an empty one and non-ASCII.
TEXTS = [
    "llama-390m (dense lm), 390M parameters, batch 8, sequence 8192, 16-bit, 8 accelerators (data 8, tensor 1, "
    "pipeline 1), pytorch. candidate H100-SXM (nvidia). ran on A10G at 0.642 samples/s (1 run).",
    "dlrm-50b (recsys), 50B parameters, batch 65.5k, sequence unknown, fp32, 64 accelerators, tensorflow. "
    "candidate TPU-v5p (google). no prior runs.",
    "resnet50 on T4",
    "swin-t (vision vit), 28M parameters, batch 512, sequence 384, 16-bit, 8 accelerators, pytorch. "
    "candidate A100-80GB (nvidia). ran here at 732 samples/s (3 runs).",
    "moe-64x2.8b (family unknown), parameters unknown, batch 1024, sequence 2048, precision unknown, "
    "256 accelerators (data 32, tensor 8), jax. candidate MI300X (amd). no prior runs.",
    "wav2vec2-base (speech), 95M parameters, batch 64, sequence 16k, tf32, 1 accelerator, pytorch. candidate L4 "
    "(nvidia). ran here at 210 samples/s (2 runs); ran on T4 at 95.1 samples/s (12 runs).",
    "vit-g-14 (vision vit), 1.8B parameters, batch 4096, sequence 257, 16-bit, 128 accelerators, pytorch-xla. "
    "candidate TPU-v6e (google). ran on TPU-v5e at 12.3k samples/s (5 runs).",
    "gat-h128 (gnn) " * 40,
    "",
    "unet-c320-d3 (diffusion), fp8, candidate Gaudi3 (intel). Ünïcödé ✓ 中文",
    "Trainium2 (aws) pytorch-neuron llama31-8b 8B params batch 256 seq 8192 fp8 32 accelerators",
    "gpt-31b (dense lm), 31B parameters, batch 2048, sequence 2048, 16-bit, 512 accelerators (data 16, tensor 8, "
    "pipeline 4), pytorch. candidate B200 (nvidia). ran on H200 at 0.0123 samples/s (1 run).",
]
#: Embedding values sentence-transformers 6.3 (torch 2.15, CPU) gave for ``TEXTS[:3]``, dims ``PINNED_DIMS``.
PINNED_DIMS = [0, 1, 2, 100, 200, 383]
PINNED = [
    [-0.045516, -0.014695, -0.086381, 0.039538, 0.04454, -0.03468],
    [-0.091941, -0.030451, -0.001059, -0.046979, 0.038841, -0.017703],
    [-0.039153, 0.020979, 0.025149, 0.000166, 0.069834, -0.0831],
]

_REFERENCE_SCRIPT = """
import json, os, sys
os.environ["HF_HUB_OFFLINE"] = "1"
from sentence_transformers import SentenceTransformer
folder, texts = json.load(sys.stdin)
model = SentenceTransformer(folder, device="cpu")
print(json.dumps(model.encode(texts, convert_to_numpy=True).tolist()))
"""


def _minilm() -> Any:
    """The encoder module, or a skip where the [lm] extra is missing (never on CI, where setup
    installs it: a skip there would hide a broken setup)."""
    try:
        from leap.training.alternatives import minilm

        minilm.model_dir()
    except ImportError as exc:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"the [lm] extra is not installed ({exc}); `bash scripts/setup.sh` installs it")
    return minilm


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Examples:
    folder = tmp_path_factory.mktemp("lm-history")
    write_history(simulate(seed=1, days=2, attempts_per_day=200), folder)
    return build_examples(read_history(folder, with_oracle=False), load_catalogue())


def test_short_numbers() -> None:
    cases = {0.642: "0.642", 17.0: "17", 8192.0: "8192", 12345.0: "12.3k", 65536.0: "65.5k", 390e6: "390M",
             999.96e6: "1B", 1.2e9: "1.2B", math.nan: "unknown"}
    assert {x: short_number(x) for x in cases} == cases


def test_render_says_what_is_known_and_what_is_not(tiny: Examples) -> None:
    texts = render(tiny.rows)
    assert len(texts) == len(tiny)
    i = int(np.flatnonzero(tiny.rows["prior_other_n"] > 0)[0])
    assert f"candidate {tiny.rows['hardware'][i]}" in texts[i]
    assert f"ran on {tiny.rows['prior_hw'][i]} at {short_number(math.exp(tiny.rows['prior_other_log'][i]))}" in texts[i]
    assert "no prior runs" in texts[int(np.flatnonzero(tiny.rows["prior_any_n"] == 0)[0])]
    rows = {c: v[i : i + 1].copy() for c, v in tiny.rows.items()}
    for col in ("log_params", "log_seq", "precision_bits", "data_parallel", "tensor_parallel", "pipeline_parallel"):
        rows[col][:] = np.nan
    rows["family"][:] = rows["framework"][:] = "unknown"
    text = render(rows)[0]
    for said in ("family unknown", "parameters unknown", "sequence unknown", "precision unknown", "framework unknown"):
        assert said in text
    assert "data" not in text and "nan" not in text


def test_embeddings_match_pinned_reference_values() -> None:
    minilm = _minilm()
    emb = minilm.embed(TEXTS[:3])
    np.testing.assert_allclose(emb[:, PINNED_DIMS], PINNED, atol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)


def _reference_python() -> str:
    python = os.environ.get(REFERENCE_PYTHON)
    if python:
        return python
    # Looked up, not imported: importing it would load torch into this test session.
    if importlib.util.find_spec("sentence_transformers") is None:
        pytest.skip("sentence-transformers (torch) is not importable: the [lm] extra runs MiniLM in JAX without "
                    f"it; set {REFERENCE_PYTHON} to an interpreter that has it to run this check")
    return sys.executable


def test_embeddings_equal_sentence_transformers() -> None:
    minilm = _minilm()
    python = _reference_python()
    payload = json.dumps([str(minilm.model_dir()), TEXTS])
    done = subprocess.run([python, "-c", _REFERENCE_SCRIPT], input=payload, capture_output=True, text=True,
                          timeout=300, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    reference = np.array(json.loads(done.stdout.strip().splitlines()[-1]), dtype=np.float32)
    ours = minilm.embed(TEXTS)
    assert ours.shape == reference.shape == (len(TEXTS), 384)
    assert np.abs(ours - reference).max() < 1e-4
    assert (ours * reference).sum(1).min() > 1 - 1e-6


def test_sample_is_capped_and_deterministic() -> None:
    a, b = sample_rows(1000, 100, seed=3), sample_rows(1000, 100, seed=3)
    assert len(a) == 100 and np.array_equal(a, b) and np.all(np.diff(a) > 0)
    assert np.array_equal(sample_rows(50, 100, seed=3), np.arange(50))


def test_frozen_fits_and_predicts(tiny: Examples) -> None:
    _minilm()
    model = FrozenMiniLM(max_rows=150, seed=0)
    assert model.fit(tiny.rows, tiny.y, tiny.job_key) is model
    pred = model.predict(tiny.rows)
    assert pred.shape == tiny.y.shape and np.all(np.isfinite(pred)) and np.all(pred > 0)
    assert model.band_ is not None and model.band_[0] < model.band_[1]
    assert model.head_ is not None and model.head_["w_emb"].shape == (3, 384)  # one head per evidence level


def test_finetuned_chooses_its_learning_rate_and_keeps_its_best_epoch(tiny: Examples) -> None:
    minilm = _minilm()
    model = FineTunedMiniLM(max_rows=96, batch=8, learning_rates=(1e-4, 3e-4), max_epochs=3, patience=1, seed=0)
    model.fit(tiny.rows, tiny.y, tiny.job_key)
    report = model.fit_report_
    assert [run["lr"] for run in report["runs"]] == [1e-4, 3e-4] and report["held_out_rows"] > 0
    for run in report["runs"]:
        # the loss before any step, then one per epoch; stopped at the cap or after `patience` stale epochs
        assert 2 <= len(run["val_loss"]) <= 4 and run["steps"] > 0 and run["seconds"] > 0
        assert all(math.isfinite(x) for x in run["val_loss"] + run["train_loss"])
    best = min(report["runs"], key=lambda r: min(r["val_loss"]))
    assert report["lr"] == best["lr"]
    pretrained = minilm.load_params()
    assert model.encoder_ is not None
    moved = np.abs(np.asarray(model.encoder_["layers"]["q_w"]) - np.asarray(pretrained["layers"]["q_w"])).max()
    assert (moved > 0) == (best["best_epoch"] > 0)  # the kept encoder is the best epoch's
    # The word-embedding matrix stays frozen by design (minilm_train).
    assert np.array_equal(np.asarray(model.encoder_["emb"]["word"]), np.asarray(pretrained["emb"]["word"]))
    pred = model.predict({c: v[:40] for c, v in tiny.rows.items()})
    assert pred.shape == (40,) and np.all(np.isfinite(pred)) and np.all(pred > 0)
    # Offline and torch-free: nothing reached for the hub client or torch.
    assert "torch" not in sys.modules and "huggingface_hub" not in sys.modules


def test_fine_tuning_stops_when_the_validation_loss_does_not_improve(tiny: Examples) -> None:
    minilm = _minilm()
    from leap.training.alternatives.minilm_train import EarlyStopping, finetune_until_stale, fit_heads

    texts = render({c: v[:48] for c, v in tiny.rows.items()})
    emb = minilm.embed(texts).astype(np.float64)
    feats, level, target = np.zeros((48, 1)), np.zeros(48, dtype=np.int64), np.log(tiny.y[:48])
    head = fit_heads(emb, feats, target, level, alpha=10.0)
    data = (*minilm.tokenize(texts[:32]), feats[:32], level[:32], target[:32])
    val = (*minilm.tokenize(texts[32:]), feats[32:], level[32:], target[32:])
    # A learning rate of 0 never improves on the start: stopped after `patience` epochs, start kept.
    _, kept, curve = finetune_until_stale(minilm.load_params(), head, data, val,
                                          EarlyStopping(8, 0.0, 50, 2, 1, 0))
    assert len(curve.val_loss) == 3 and curve.best_epoch == 0 and curve.steps == 8
    assert np.allclose(kept["w_emb"], head["w_emb"], atol=1e-6)


def test_reports_missing_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    minilm = _minilm()
    monkeypatch.setattr(minilm, "WEIGHTS_PACKAGE", "no_such_weights_package")
    with pytest.raises(minilm.MiniLMUnavailable, match=r"setup\.sh"):
        minilm.model_dir()


def test_weights_are_files_of_the_package() -> None:
    folder = _minilm().model_dir()
    assert isinstance(folder, Path) and (folder / "tokenizer.json").is_file()
