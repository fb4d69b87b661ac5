"""ESIM for response selection (Chen & Wang 2019, after Chen et al. 2017's ESIM for NLI).

Context and response are word sequences (`data.words`; the context's turns joined by
`__eou__`, cut from the left). Both go through one input-encoding BiLSTM; each context
token is aligned softly with the response tokens and vice versa (e = a b^T, padding
masked); local matching [a; a~; a - a~; a * a~] goes through a ReLU projection and a
composition BiLSTM; mean and max pooling of both sides feed an MLP with one tanh hidden
layer and a 2-way softmax (not a match / a match). A candidate's score is the logit
difference, log p(match) - log p(no match).

Word embeddings start from a vectors file (GloVe) or at random, fine-tuned or frozen
(`word_models`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from convfit_jax.models import word_models
from convfit_jax.models.lstm import BiLSTM
from convfit_jax.models.transformer import dropout

_MASKED = -1e9  # softmax logit of a padded position (finite: a row of padding stays NaN-free)


@dataclasses.dataclass(frozen=True)
class EsimConfig:
  """Sizes. `hidden` is the paper's 300 for both BiLSTMs, the projection and the MLP."""
  vocab_size: int
  embed_dim: int = 300
  hidden: int = 300
  dropout: float = 0.0  # on the MLP's input and hidden layer during training
  freeze_embeddings: bool = False
  # Compute dtype of the matrix products: "bfloat16" multiplies in bfloat16 and
  # accumulates in float32 (states, softmax and pooling stay float32); parameters are float32.
  dtype: str = "float32"


def masked_softmax(scores: jax.Array, mask: jax.Array, axis: int) -> jax.Array:
  """softmax of `scores` along `axis` over the positions `mask` keeps (bool, broadcast)."""
  return jax.nn.softmax(jnp.where(mask, scores, _MASKED), axis=axis)


def soft_align(a: jax.Array, b: jax.Array, a_mask: jax.Array, b_mask: jax.Array
               ) -> tuple[jax.Array, jax.Array]:
  """ESIM's dual vectors: [n, La, d] and [n, Lb, d] with bool masks [n, La], [n, Lb] ->
  (a~ [n, La, d], each a token's attention-weighted response tokens; b~ [n, Lb, d])."""
  e = jnp.einsum("nid,njd->nij", a, b)
  a_tilde = jnp.einsum("nij,njd->nid", masked_softmax(e, b_mask[:, None, :], axis=2), b)
  b_tilde = jnp.einsum("nij,nid->njd", masked_softmax(e, a_mask[:, :, None], axis=1), a)
  return a_tilde, b_tilde


def local_matching(x: jax.Array, x_tilde: jax.Array) -> jax.Array:
  """[x; x~; x - x~; x * x~] along the last axis: [n, L, d] -> [n, L, 4 d]."""
  return jnp.concatenate([x, x_tilde, x - x_tilde, x * x_tilde], axis=-1)


def mean_max_pool(x: jax.Array, mask: jax.Array) -> jax.Array:
  """[n, L, d] float32 with [n, L] bool mask -> [n, 2 d]: mean and max over valid positions."""
  m = mask[:, :, None]
  mean = jnp.sum(jnp.where(m, x, 0.0), axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1)
  return jnp.concatenate([mean, jnp.max(jnp.where(m, x, -jnp.inf), axis=1)], axis=-1)


class Esim(nnx.Module):
  """(context, response) word ids -> [n, 2] float32 logits."""
  Config = EsimConfig

  def __init__(self, config: EsimConfig, *, rngs: nnx.Rngs, embeddings: np.ndarray | None = None):
    c = config
    self.config = c
    self.embeddings = word_models.embedding_table(c.vocab_size, c.embed_dim, rngs=rngs,
                                                  frozen=c.freeze_embeddings, embeddings=embeddings)
    dt = jnp.dtype(c.dtype)
    linear = lambda d_in, d_out: nnx.Linear(d_in, d_out, dtype=dt,
                                            preferred_element_type=jnp.float32, rngs=rngs)
    self.encoder = BiLSTM(c.embed_dim, c.hidden, rngs=rngs, dtype=dt)
    self.projection = linear(8 * c.hidden, c.hidden)
    self.composition = BiLSTM(c.hidden, c.hidden, rngs=rngs, dtype=dt)
    self.hidden = linear(8 * c.hidden, c.hidden)
    self.out = nnx.Linear(c.hidden, 2, rngs=rngs)

  def __call__(self, context_ids: jax.Array, context_lengths: jax.Array, response_ids: jax.Array,
               response_lengths: jax.Array, dropout_key: jax.Array | None = None) -> jax.Array:
    """[n, Lc] / [n, Lr] int32 ids (0 = padding) and [n] int32 lengths -> [n, 2] logits.

    `dropout_key` (training) drops MLP inputs and hidden units at `config.dropout`.
    """
    table = self.embeddings[...]
    c_mask = jnp.arange(context_ids.shape[1])[None, :] < context_lengths[:, None]
    r_mask = jnp.arange(response_ids.shape[1])[None, :] < response_lengths[:, None]
    a = self.encoder(table[context_ids], context_lengths)
    b = self.encoder(table[response_ids], response_lengths)
    a_tilde, b_tilde = soft_align(a, b, c_mask, r_mask)
    project = lambda x: jax.nn.relu(self.projection(x))
    va = self.composition(project(local_matching(a, a_tilde)), context_lengths)
    vb = self.composition(project(local_matching(b, b_tilde)), response_lengths)
    v = jnp.concatenate([mean_max_pool(va, c_mask), mean_max_pool(vb, r_mask)], axis=-1)
    k1, k2 = (None, None) if dropout_key is None else jax.random.split(dropout_key)
    h = jnp.tanh(self.hidden(dropout(v, self.config.dropout, k1)))
    return self.out(dropout(h, self.config.dropout, k2))


build, load, pair_inputs, export = word_models.reranker_functions(Esim)
