"""Regression heads on MiniLM embeddings: ridge in closed form, and end-to-end fine-tuning.

A head is linear in ``[embedding, numeric features]``, with one set of weights per evidence
level (:func:`predictor.lgbm.evidence_level`: the job ran on this hardware before / only
elsewhere / never). One head for all rows does badly: the residual of a job that ran here before
is a few per cent, that of a cold start a factor of several, and weights fitted to both move the
first far off (on the tuning history, acc@10 fell from 0.56 for the anchor alone to 0.13). Per
level, each learns the corrections its rows need.

:func:`fit_heads` fits them by ridge on fixed (frozen) embeddings. :func:`finetune` trains heads
and encoder (:mod:`training.alternatives.minilm`) together by Adam on the mean squared error,
for a fixed number of steps on batches drawn with a seeded generator.

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

from training.alternatives.minilm import Params, encode

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


@dataclass(frozen=True)
class TuneSettings:
    """Fine-tuning settings (see :class:`training.alternatives.language.FineTunedMiniLM`)."""

    steps: int
    batch: int
    lr_encoder: float
    lr_head: float
    seed: int


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


def schedule(step: int, steps: int) -> float:
    """Learning-rate multiplier: linear warm-up over the first tenth of the steps, then linear
    decay to 0 (BERT's schedule).

    Without the warm-up, Adam's first steps move every encoder weight by the full learning rate
    in the sign of a one-batch gradient, before its moment estimates mean anything; under heads
    fitted to the pretrained embedding's fine detail, that moves predictions far off at once.
    """
    warm = max(1, steps // 10)
    if step < warm:
        return (step + 1) / warm
    return max(0.0, (steps - step) / max(1, steps - warm))


def finetune(params: Params, head: dict[str, np.ndarray], ids: np.ndarray, mask: np.ndarray, feats: np.ndarray,
             level: np.ndarray, target: np.ndarray, settings: TuneSettings, emb_scale: float = 1.0,
             ) -> tuple[Params, dict[str, np.ndarray], list[float]]:
    """Train encoder and head end to end on the mean squared error.

    Parameters
    ----------
    params
        Encoder parameters to start from (not modified).
    head
        The starting heads, as :func:`fit_heads` returns them.
    ids, mask
        Tokens of the training texts, all padded to one length (one compiled step).
    feats
        ``(n, k)`` numeric features.
    level
        ``(n,)`` evidence level of each row.
    target
        ``(n,)`` regression target.
    settings
        Steps, batch size, learning rates and the seed of the batch draws.
    emb_scale
        The head reads the embedding times this (e.g. 1 / its spread over the training texts),
        so that a step of ``lr_head`` on its weights moves predictions about as much for the
        embedding (entries ~0.05, differences between texts far smaller) as for the features.

    Returns
    -------
    (params, head, losses)
        Trained encoder parameters and head, and each step's batch loss.
    """
    trainable, word = _split(jax.tree_util.tree_map(jnp.array, params))
    start = {**head, "w_emb": np.asarray(head["w_emb"]) / emb_scale}
    train = {"encoder": trainable, "head": {k: jnp.asarray(v, dtype=jnp.float32) for k, v in start.items()}}
    lr = {"encoder": jax.tree_util.tree_map(lambda _: jnp.float32(settings.lr_encoder), trainable),
          "head": {k: jnp.float32(settings.lr_head) for k in train["head"]}}
    zeros = jax.tree_util.tree_map(jnp.zeros_like, train)
    state = (zeros, jax.tree_util.tree_map(jnp.zeros_like, train), jnp.float32(0.0))
    data = (jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(feats, dtype=jnp.float32),
            jnp.asarray(level, dtype=jnp.int32), jnp.asarray(target, dtype=jnp.float32))
    rng = np.random.default_rng(settings.seed)
    n, size = len(ids), min(settings.batch, len(ids))
    losses: list[float] = []
    order, cursor = rng.permutation(n), 0
    for step in range(settings.steps):
        # Epochs without replacement; one batch shape throughout, so the step compiles once.
        if cursor + size > n:
            order, cursor = rng.permutation(n), 0
        idx = jnp.asarray(order[cursor : cursor + size])
        cursor += size
        rate = jnp.float32(schedule(step, settings.steps))
        train, state, loss = _adam_step_jit(train, state, word, jnp.float32(emb_scale), tuple(a[idx] for a in data),
                                            lr, rate)
        losses.append(float(loss))
    tuned = _join(train["encoder"], word)
    tuned_head = {k: np.asarray(v) for k, v in train["head"].items()}
    tuned_head["w_emb"] = tuned_head["w_emb"] * emb_scale
    return tuned, tuned_head, losses
