"""Regression heads on MiniLM embeddings: ridge in closed form, and end-to-end fine-tuning.

A head is linear in ``[embedding, numeric features]``, with one set of weights per evidence
level (:func:`predictor.lgbm.evidence_level`: the job ran on this hardware before / only
elsewhere / never). One head for all rows does badly: the residual of a job that ran here before
is a few per cent, that of a cold start a factor of several, and weights fitted to both move the
first far off (on the tuning history, far below the anchor alone). Per level, each learns the
corrections its rows need.

:func:`fit_heads` fits them by ridge on fixed (frozen) embeddings. :func:`finetune_until_stale`
trains heads and encoder (:mod:`leap.training.alternatives.minilm`) together by Adam on the mean
squared error, epoch by epoch on batches drawn with a seeded generator, until the loss on
held-out rows stops improving, and keeps the best epoch.

The word-embedding matrix stays frozen while fine-tuning. It holds 11.7M of the encoder's 22.7M
parameters, but configuration texts use only a few hundred of its 30,522 rows: its dense
gradient and Adam moments would cost time and ~140 MB on every step for rows that never change.
Position and segment embeddings, their LayerNorm and all six layers are trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from leap.training.alternatives.minilm import Params, encode

Tree = Any
#: Evidence levels, as :data:`predictor.lgbm.EVIDENCE` orders them.
LEVELS = 3
#: Fewest training rows a level's own head is fitted on; below, it shares the all-rows head.
MIN_LEVEL_ROWS = 20


def ridge(x: np.ndarray, y: np.ndarray, alpha: float, scale: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """Ridge regression with an unpenalised intercept, by its normal equations.

    Parameters
    ----------
    x
        ``(n, d)`` features.
    y
        ``(n,)`` target.
    alpha
        L2 penalty on the weights of the scaled columns.
    scale
        Each column's divisor before the penalty applies; default its standard deviation.

    Returns
    -------
    (weights, intercept)
        In the units of ``x``.
    """
    x_mean, y_mean = x.mean(0), float(y.mean())
    scale = x.std(0) if scale is None else np.array(scale, dtype=np.float64)
    scale[scale <= 1e-12] = 1.0  # a constant column: its weight stays 0
    xs = (x - x_mean) / scale
    # d is a few hundred: the d x d system is solved in milliseconds, whatever n is.
    w = np.linalg.solve(xs.T @ xs + alpha * np.eye(x.shape[1]), xs.T @ (y - y_mean)) / scale
    return w, y_mean - float(x_mean @ w)


def embedding_spread(emb: np.ndarray) -> float:
    """RMS spread of the embedding's dimensions over a set of texts (1 if they do not vary)."""
    spread = float(np.sqrt(np.mean(emb.var(0)))) if emb.size else 0.0
    return spread if spread > 0 else 1.0


def fit_heads(emb: np.ndarray, feats: np.ndarray, target: np.ndarray, level: np.ndarray, alpha: float,
              with_embedding: bool = True) -> dict[str, np.ndarray]:
    """One ridge head per evidence level.

    Parameters
    ----------
    emb
        ``(n, 384)`` sentence embeddings.
    feats
        ``(n, k)`` standardised numeric features.
    target
        ``(n,)`` regression target.
    level
        ``(n,)`` evidence level of each row, 0 to :data:`LEVELS` - 1.
    alpha
        Ridge penalty. The embedding is scaled as a whole (by :func:`embedding_spread`), not per
        dimension: per-dimension scaling would give a dimension that barely varies over the
        training texts a large weight, which fine-tuning's small changes to the encoder blow up.
    with_embedding
        False: the heads read the features only (embedding weights 0).

    Returns
    -------
    dict
        ``w_emb`` (levels, 384), ``w_feat`` (levels, k), ``b`` (levels,).
    """
    d = emb.shape[1]
    x = np.hstack([emb, feats]) if with_embedding else feats
    scale = np.concatenate([np.full(d, embedding_spread(emb)), feats.std(0)]) if with_embedding else None
    head = {"w_emb": np.zeros((LEVELS, d)), "w_feat": np.zeros((LEVELS, feats.shape[1])), "b": np.zeros(LEVELS)}
    for k in range(LEVELS):
        rows = level == k
        rows = rows if rows.sum() >= MIN_LEVEL_ROWS else np.ones_like(rows)
        w, b = ridge(x[rows], target[rows], alpha, scale)
        if with_embedding:
            head["w_emb"][k], w = w[:d], w[d:]
        head["w_feat"][k], head["b"][k] = w, b
    return head


def head_output(head: dict[str, Any], emb: Any, feats: Any, level: Any) -> Any:
    """Each row's head output: its level's weights applied (numpy or jax arrays alike)."""
    return (emb * head["w_emb"][level]).sum(-1) + (feats * head["w_feat"][level]).sum(-1) + head["b"][level]


def _split(params: Params) -> tuple[Tree, jax.Array]:
    """Trainable encoder parameters, and the frozen word-embedding matrix."""
    emb = {k: v for k, v in params["emb"].items() if k != "word"}
    return {"emb": emb, "layers": params["layers"]}, params["emb"]["word"]


def _join(trainable: Tree, word: jax.Array) -> Params:
    return {"emb": {**trainable["emb"], "word": word}, "layers": trainable["layers"]}


def _loss(train: Tree, word: jax.Array, scale: jax.Array, ids: jax.Array, mask: jax.Array, feats: jax.Array,
          level: jax.Array, target: jax.Array) -> jax.Array:
    emb = encode(_join(train["encoder"], word), ids, mask) * scale
    return jnp.mean(jnp.square(head_output(train["head"], emb, feats, level) - target))


def _adam_step(train: Tree, state: Tree, word: jax.Array, scale: jax.Array, batch: tuple[jax.Array, ...],
               lr: Tree, rate: jax.Array) -> tuple[Tree, Tree, jax.Array]:
    """One Adam step (betas 0.9 / 0.999) with a learning rate per leaf, times ``rate``."""
    loss, grad = jax.value_and_grad(_loss)(train, word, scale, *batch)
    m, v, t = state
    t = t + 1
    m = jax.tree_util.tree_map(lambda a, g: 0.9 * a + 0.1 * g, m, grad)
    v = jax.tree_util.tree_map(lambda a, g: 0.999 * a + 0.001 * g * g, v, grad)
    # Bias correction: the moments start at zero, which would shrink the first steps.
    c1, c2 = 1.0 - 0.9**t, 1.0 - 0.999**t
    train = jax.tree_util.tree_map(
        lambda p, a, b, r: p - rate * r * (a / c1) / (jnp.sqrt(b / c2) + 1e-8), train, m, v, lr)
    return train, (m, v, t), loss


# Parameters and Adam's state are donated: XLA updates them in place instead of copying ~90 MB.
_adam_step_jit = jax.jit(_adam_step, donate_argnums=(0, 1))


@dataclass(frozen=True)
class EarlyStopping:
    """Fine-tuning until the validation loss stops improving (see :func:`finetune_until_stale`).

    Attributes
    ----------
    batch
        Rows per Adam step.
    lr
        Adam learning rate of encoder and heads (after a linear warm-up over ``warmup`` steps).
    max_epochs
        Passes over the training rows at most.
    patience
        Epochs without a new best validation loss before stopping.
    warmup
        Steps of linear warm-up (at most one epoch's).
    seed
        Seed of the batch draws.
    """

    batch: int
    lr: float
    max_epochs: int
    patience: int
    warmup: int
    seed: int


@dataclass
class Curve:
    """What one fine-tuning run did: validation loss after each epoch (index 0: before any
    step), the steps it took, the best epoch and its wall time."""

    lr: float
    val_loss: list[float]
    train_loss: list[float]
    steps: int
    best_epoch: int
    seconds: float


def _val_loss(params: Params, head: dict[str, Any], scale: float, val: tuple[np.ndarray, ...]) -> float:
    """Mean squared error of the target on the validation rows (forward passes only)."""
    from leap.training.alternatives.minilm import _encode_jit

    ids, mask, feats, level, target = val
    total = 0.0
    for start in range(0, len(ids), 64):
        sl = slice(start, start + 64)
        n = len(ids[sl])
        rows = max(8, 1 << (n - 1).bit_length())  # a few padded shapes, each compiled once
        emb = np.asarray(_encode_jit(params, np.pad(ids[sl], ((0, rows - n), (0, 0))),
                                     np.pad(mask[sl], ((0, rows - n), (0, 0))))[:n]) * scale
        out = head_output({k: np.asarray(v) for k, v in head.items()}, emb, feats[sl], level[sl])
        total += float(np.sum(np.square(out - target[sl])))
    return total / max(1, len(ids))


def _start(params: Params, head: dict[str, np.ndarray], rate: float, emb_scale: float
           ) -> tuple[Tree, Tree, jax.Array, Tree]:
    """Trainable parameters (encoder less its word embeddings, and heads), Adam's zero state, the
    frozen word embeddings and the learning rate of every trainable leaf."""
    trainable, word = _split(jax.tree_util.tree_map(jnp.array, params))
    start = {**head, "w_emb": np.asarray(head["w_emb"]) / emb_scale}
    train = {"encoder": trainable, "head": {k: jnp.asarray(v, dtype=jnp.float32) for k, v in start.items()}}
    lr = {"encoder": jax.tree_util.tree_map(lambda _: jnp.float32(rate), trainable),
          "head": {k: jnp.float32(rate) for k in train["head"]}}
    state = (jax.tree_util.tree_map(jnp.zeros_like, train), jax.tree_util.tree_map(jnp.zeros_like, train),
             jnp.float32(0.0))
    return train, state, word, lr


def _epoch(model: tuple[Tree, Tree, jax.Array, Tree], arrays: tuple[jax.Array, ...], order: np.ndarray, size: int,
           step: int, warmup: int, emb_scale: float) -> tuple[Tree, Tree, list[float]]:
    """One pass of Adam steps over ``order`` in batches of ``size`` (one batch shape: the step
    compiles once); returns the parameters, Adam's state and each step's batch loss."""
    train, state, word, lr = model
    losses: list[float] = []
    for first in range(0, len(order), size):
        rate = jnp.float32(min(1.0, (step + len(losses) + 1) / max(1, warmup)))
        idx = jnp.asarray(order[first : first + size])
        train, state, loss = _adam_step_jit(train, state, word, jnp.float32(emb_scale),
                                            tuple(a[idx] for a in arrays), lr, rate)
        losses.append(float(loss))
    return train, state, losses


def finetune_until_stale(params: Params, head: dict[str, np.ndarray], data: tuple[np.ndarray, ...],
                         val: tuple[np.ndarray, ...], settings: EarlyStopping, emb_scale: float = 1.0,
                         ) -> tuple[Params, dict[str, np.ndarray], Curve]:
    """Train encoder and heads end to end, epoch by epoch, keeping the epoch of least validation loss.

    After each pass the validation loss is measured; training stops after ``patience`` epochs
    without a new best (or ``max_epochs``); the best epoch's parameters (or the start's) are kept.

    Parameters
    ----------
    params, head
        Encoder parameters and heads (:func:`fit_heads`) to start from (not modified).
    data, val
        ``(ids, mask, feats, level, target)`` of the training and the validation rows (each
        padded to one token length).
    settings
        Batch, learning rate, epochs, patience, warm-up, seed.
    emb_scale
        The head reads the embedding times this (1 / its spread over the training texts), so
        that a step on its weights moves predictions as much for the embedding as the features.

    Returns
    -------
    (params, head, curve)
    """
    import time

    t0 = time.perf_counter()
    train, state, word, lr = _start(params, head, settings.lr, emb_scale)
    arrays = (jnp.asarray(data[0]), jnp.asarray(data[1]), jnp.asarray(data[2], dtype=jnp.float32),
              jnp.asarray(data[3], dtype=jnp.int32), jnp.asarray(data[4], dtype=jnp.float32))

    def snapshot(tr: Tree) -> tuple[Params, dict[str, np.ndarray]]:
        # Copies: the step donates its input buffers, so a kept reference would be overwritten.
        enc = jax.tree_util.tree_map(lambda a: jnp.array(a, copy=True), _join(tr["encoder"], word))
        return enc, {k: np.array(v) for k, v in tr["head"].items()}

    best_params, best_head = snapshot(train)
    val_losses = [_val_loss(best_params, best_head, emb_scale, val)]
    train_losses: list[float] = []
    best_epoch, stale, step = 0, 0, 0
    rng = np.random.default_rng(settings.seed)
    n, size = len(data[0]), min(settings.batch, len(data[0]))
    for epoch in range(1, settings.max_epochs + 1):
        train, state, losses = _epoch((train, state, word, lr), arrays, rng.permutation(n)[: n - n % size], size,
                                      step, settings.warmup, emb_scale)
        step += len(losses)
        train_losses.append(float(np.mean(losses)))
        params_now, head_now = snapshot(train)
        val_losses.append(_val_loss(params_now, head_now, emb_scale, val))
        if val_losses[-1] < min(val_losses[:-1]):
            best_params, best_head, best_epoch, stale = params_now, head_now, epoch, 0
        else:
            stale += 1
            if stale >= settings.patience:
                break
    best_head["w_emb"] = best_head["w_emb"] * emb_scale
    curve = Curve(settings.lr, [round(v, 6) for v in val_losses], [round(v, 6) for v in train_losses], step,
                  best_epoch, round(time.perf_counter() - t0, 2))
    return best_params, best_head, curve
