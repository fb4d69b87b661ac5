"""ESIM for response selection (Chen & Wang 2019, after Chen et al. 2017's ESIM for NLI).

Context and response are word sequences (`data.words`; the context's turns joined by
`__eou__`, cut from the left). Both go through one input-encoding BiLSTM; each context
token is aligned softly with the response tokens and vice versa (e = a b^T, padding
masked); local matching [a; a~; a - a~; a * a~] goes through a ReLU projection (computed
in parts, `matching_weights`) and a composition BiLSTM; mean and max pooling of both sides
feed an MLP with one tanh hidden layer and a 2-way softmax (not a match / a match). A
candidate's score is the logit difference, log p(match) - log p(no match).

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


def alignment_weights(a: jax.Array, b: jax.Array, a_mask: jax.Array, b_mask: jax.Array
                      ) -> tuple[jax.Array, jax.Array]:
  """ESIM's soft alignment e = a b^T, padding masked: [n, La, d] and [n, Lb, d] with bool
  masks [n, La], [n, Lb] -> ([n, La, Lb] weights of b's tokens for each a token (rows sum
  to 1), [n, La, Lb] weights of a's tokens for each b token (columns sum to 1)). The dual
  vectors are a~ = to_b b and b~ = to_a^T a."""
  e = jnp.einsum("nid,njd->nij", a, b)
  return masked_softmax(e, b_mask[:, None, :], axis=2), masked_softmax(e, a_mask[:, :, None], axis=1)


def matching_weights(kernel: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The projection of the local matching [x; x~; x - x~; x * x~] ([8 hidden, hidden]
  `kernel`, four [2 hidden, hidden] blocks K1..K4) as x W_self + x~ W_aligned + (x * x~)
  W_product: returns (K1 + K3, K2 - K3, K4).

  The same map without the [n, L, 8 hidden] concatenation: a context's a W_self is
  computed once for all its candidates, a~ W_aligned as to_b (b W_aligned) over the
  response's few tokens, and only (a * a~) W_product over every pair's context tokens, a
  quarter of the concatenation's product.
  """
  k1, k2, k3, k4 = jnp.split(kernel, 4)
  return k1 + k3, k2 - k3, k4


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
    # Applied in parts through `matching_weights`, not called; its kernel keeps the
    # paper's [8 hidden, hidden] layout, so earlier checkpoints load unchanged.
    self.projection = linear(8 * c.hidden, c.hidden)
    self.composition = BiLSTM(c.hidden, c.hidden, rngs=rngs, dtype=dt)
    self.hidden = linear(8 * c.hidden, c.hidden)
    self.out = nnx.Linear(c.hidden, 2, rngs=rngs)

  def __call__(self, context_ids: jax.Array, context_lengths: jax.Array, response_ids: jax.Array,
               response_lengths: jax.Array, context_index: jax.Array | None = None,
               dropout_key: jax.Array | None = None) -> jax.Array:
    """[n, Lc] / [n, Lr] int32 ids (0 = padding) and [n] int32 lengths -> [n, 2] logits.

    `context_index` [n] int32, where given: the context inputs are [m, Lc] / [m] distinct
    contexts and pair i reads row `context_index[i]`, so a context scored with many
    candidates goes through the input encoding once (`PairInputs.shared_contexts`).
    `dropout_key` (training) drops MLP inputs and hidden units at `config.dropout`.
    """
    dt = jnp.dtype(self.config.dtype)
    mm = lambda x, w: jnp.matmul(x.astype(dt), w.astype(dt), preferred_element_type=jnp.float32)
    w_self, w_aligned, w_product = matching_weights(self.projection.kernel[...])
    bias = self.projection.bias[...]
    table = self.embeddings[...]
    a = self.encoder(table[context_ids], context_lengths)  # [m or n, Lc, 2 hidden]
    a_self = mm(a, w_self)
    if context_index is not None:
      a, a_self = a[context_index], a_self[context_index]
      context_lengths = context_lengths[context_index]
    c_mask = jnp.arange(context_ids.shape[1])[None, :] < context_lengths[:, None]
    r_mask = jnp.arange(response_ids.shape[1])[None, :] < response_lengths[:, None]
    b = self.encoder(table[response_ids], response_lengths)
    to_b, to_a = alignment_weights(a, b, c_mask, r_mask)
    a_tilde = jnp.einsum("nij,njd->nid", to_b, b)
    b_tilde = jnp.einsum("nij,nid->njd", to_a, a)
    a_aligned = jnp.einsum("nij,njd->nid", to_b, mm(b, w_aligned))  # = mm(a_tilde, w_aligned)
    ma = jax.nn.relu(a_self + a_aligned + mm(a * a_tilde, w_product) + bias)
    mb = jax.nn.relu(mm(b, w_self) + mm(b_tilde, w_aligned) + mm(b * b_tilde, w_product) + bias)
    va = self.composition(ma, context_lengths)
    vb = self.composition(mb, response_lengths)
    v = jnp.concatenate([mean_max_pool(va, c_mask), mean_max_pool(vb, r_mask)], axis=-1)
    k1, k2 = (None, None) if dropout_key is None else jax.random.split(dropout_key)
    h = jnp.tanh(self.hidden(dropout(v, self.config.dropout, k1)))
    return self.out(dropout(h, self.config.dropout, k2))


build, load, pair_inputs, export = word_models.reranker_functions(Esim)
