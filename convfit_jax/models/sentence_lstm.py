"""The sentence-encoding baseline of Chen & Wang (2019): a Siamese BiLSTM with multi-head
self-attention pooling, and an MLP classifier on the pair of sentence vectors.

Context and response go, separately, through one BiLSTM over their words; Lin et al.'s
(2017) structured self-attention pools each into `heads` weighted sums of its states,
A = softmax(W_2 tanh(W_1 H^T)) over the valid positions, the heads concatenated
([n, heads * 2 hidden]). The classifier reads [u; v; |u - v|; u * v] through two ReLU
layers with a shortcut around the second and a 2-way softmax (not a match / a match).
Unlike ESIM no token of one side ever sees the other: the vectors are computed once per
text, which is what makes the model usable for retrieval from a large pool.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from convfit_jax.models import word_models
from convfit_jax.models.esim import masked_softmax
from convfit_jax.models.lstm import BiLSTM
from convfit_jax.models.transformer import dropout


@dataclasses.dataclass(frozen=True)
class SentenceLstmConfig:
  """Sizes: the paper's BiLSTM of 300 (400 with 4 heads on DSTC7 subtask 2)."""
  vocab_size: int
  embed_dim: int = 300
  hidden: int = 300  # BiLSTM state per direction and the MLP's layers
  heads: int = 4  # self-attention pooling heads
  attention_dim: int = 300  # W_1's width
  dropout: float = 0.0  # on the MLP's input and hidden layers during training
  freeze_embeddings: bool = False
  dtype: str = "float32"  # the BiLSTM's product dtype, as `EsimConfig.dtype`


class SentenceLstm(nnx.Module):
  """(context, response) word ids -> [n, 2] float32 logits, through one vector per side."""
  Config = SentenceLstmConfig

  def __init__(self, config: SentenceLstmConfig, *, rngs: nnx.Rngs,
               embeddings: np.ndarray | None = None):
    c = config
    self.config = c
    self.embeddings = word_models.embedding_table(c.vocab_size, c.embed_dim, rngs=rngs,
                                                  frozen=c.freeze_embeddings, embeddings=embeddings)
    self.encoder = BiLSTM(c.embed_dim, c.hidden, rngs=rngs, dtype=jnp.dtype(c.dtype))
    self.attention_in = nnx.Linear(2 * c.hidden, c.attention_dim, use_bias=False, rngs=rngs)
    self.attention_out = nnx.Linear(c.attention_dim, c.heads, use_bias=False, rngs=rngs)
    width = c.heads * 2 * c.hidden
    self.hidden1 = nnx.Linear(4 * width, c.hidden, rngs=rngs)
    self.hidden2 = nnx.Linear(c.hidden, c.hidden, rngs=rngs)
    self.out = nnx.Linear(c.hidden, 2, rngs=rngs)

  def encode(self, ids: jax.Array, lengths: jax.Array) -> jax.Array:
    """[n, L] int32 word ids and [n] int32 lengths -> [n, heads * 2 hidden] float32."""
    h = self.encoder(self.embeddings[...][ids], lengths)  # [n, L, 2 hidden]
    mask = jnp.arange(ids.shape[1])[None, :, None] < lengths[:, None, None]
    a = masked_softmax(self.attention_out(jnp.tanh(self.attention_in(h))), mask, axis=1)
    return jnp.einsum("nlr,nld->nrd", a, h).reshape(ids.shape[0], -1)

  def __call__(self, context_ids: jax.Array, context_lengths: jax.Array, response_ids: jax.Array,
               response_lengths: jax.Array, context_index: jax.Array | None = None,
               dropout_key: jax.Array | None = None) -> jax.Array:
    """As `Esim.__call__`: [n, 2] logits (`context_index`: pair i reads distinct context
    row `context_index[i]`); `dropout_key` drops MLP inputs and hidden units."""
    u = self.encode(context_ids, context_lengths)
    if context_index is not None:
      u = u[context_index]
    v = self.encode(response_ids, response_lengths)
    x = jnp.concatenate([u, v, jnp.abs(u - v), u * v], axis=-1)
    keys = [None] * 3 if dropout_key is None else list(jax.random.split(dropout_key, 3))
    h1 = jax.nn.relu(self.hidden1(dropout(x, self.config.dropout, keys[0])))
    h2 = jax.nn.relu(self.hidden2(dropout(h1, self.config.dropout, keys[1]))) + h1
    return self.out(dropout(h2, self.config.dropout, keys[2]))


build, load, pair_inputs, export = word_models.reranker_functions(SentenceLstm)
