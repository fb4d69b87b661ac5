"""A dual encoder: contexts and responses to vectors of one width, scored by their dot product.

ConvFiT's Stage 1 model and the input-response model of Yang et al. (2018): one
`SentenceEncoder` with shared weights encodes both sides; optionally the response
side has its own tower (a copy of the encoder) or a residual feed-forward layer on
top of the shared encoder (`config.model.name = "dual_encoder"`).
"""

from __future__ import annotations

from typing import Callable, Iterable

import jax
import ml_collections
from flax import nnx

from convfit_jax import models
from convfit_jax.models import Built


class _ResidualBlock(nnx.Module):
  """x + W2 gelu(W1 x), W2 zero at the start (the block starts as the identity)."""

  def __init__(self, dim: int, hidden: int, *, rngs: nnx.Rngs):
    self.up = nnx.Linear(dim, hidden, kernel_init=nnx.initializers.xavier_uniform(), rngs=rngs)
    self.down = nnx.Linear(hidden, dim, kernel_init=nnx.initializers.zeros, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    return x + self.down(jax.nn.gelu(self.up(x), approximate=False))


class ResponseFeedForward(nnx.Module):
  """The response-side network: `depth` residual blocks x + W2 gelu(W1 x), [batch, d] ->
  [batch, d] float32 (Yang et al.'s feed-forward on the response side; ConvFiT's FF layer
  is depth 1).

  Each W2 starts at zero, so the network starts as the identity and training starts
  from the encoder's own context-response similarity.
  """

  def __init__(self, dim: int, hidden: int, *, rngs: nnx.Rngs, depth: int = 1):
    if depth < 1:
      raise ValueError(f"model.response_ff_depth={depth}: at least 1")
    self.blocks = nnx.List([_ResidualBlock(dim, hidden, rngs=rngs) for _ in range(depth)])

  def __call__(self, x: jax.Array) -> jax.Array:
    for block in self.blocks:
      x = block(x)
    return x


class DualEncoder(nnx.Module):
  """Contexts and responses to vectors of the same width.

  Args:
    context: the shared encoder (also the response encoder unless `response` is set): a
      `SentenceEncoder`, or any module called as `context(*inputs, dropout_key=..., **named)`
      that returns [n, d] (the DAN).
    response: a separate response tower.
    response_ff: a `ResponseFeedForward` applied to response vectors.
  """

  def __init__(self, context: nnx.Module, *, response: nnx.Module | None = None,
               response_ff: ResponseFeedForward | None = None):
    self.context = context
    self.response = response
    self.response_ff = response_ff

  @property
  def response_tower(self) -> nnx.Module:
    return self.context if self.response is None else self.response

  def encode_contexts(self, *inputs: jax.Array, dropout_key: jax.Array | None = None,
                      **named: jax.Array) -> jax.Array:
    """The context tower's inputs (a `SentenceEncoder`'s: [n, L] int32 ids and mask,
    packed rows with `position_ids` and `slots`) -> [n, d] float32."""
    return self.context(*inputs, dropout_key=dropout_key, **named)

  def encode_responses(self, *inputs: jax.Array, dropout_key: jax.Array | None = None,
                       **named: jax.Array) -> jax.Array:
    """As `encode_contexts`, through the response tower and feed-forward network."""
    return self.apply_response_ff(self.response_tower(*inputs, dropout_key=dropout_key, **named))

  def apply_response_ff(self, x: jax.Array) -> jax.Array:
    return x if self.response_ff is None else self.response_ff(x)


def wrap(context: nnx.Module, m: ml_collections.ConfigDict, *, seed: int) -> DualEncoder:
  """`context` (with a `dim`) as the dual encoder the `model` block's response_tower,
  response_ff, response_ff_hidden (0 = 4 * dim) and response_ff_depth say."""
  response = nnx.clone(context) if m.response_tower else None
  response_ff = (ResponseFeedForward(context.dim, m.response_ff_hidden or 4 * context.dim,
                                     rngs=nnx.Rngs(seed + 1), depth=m.get("response_ff_depth", 1))
                 if m.response_ff else None)
  return DualEncoder(context, response=response, response_ff=response_ff)


def build(m: ml_collections.ConfigDict, *, seed: int,
          train_texts: Callable[[], Iterable[str]] | None = None) -> Built:
  """The dual encoder a `model` block names: the encoder of `m.encoder`'s module
  (`sentence`: a Transformer; `conv_encoder`, ..., whose vocabularies may read
  `train_texts()`) with `wrap`'s fields."""
  built = models.get(m.encoder).build(m, seed=seed, train_texts=train_texts)
  built.model = wrap(built.model, m, seed=seed)
  return built
