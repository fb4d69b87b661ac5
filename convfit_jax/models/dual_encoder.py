"""A dual encoder: contexts and responses to vectors of one width, scored by their dot product.

ConvFiT's Stage 1 model and the input-response model of Yang et al. (2018): one
`SentenceEncoder` with shared weights encodes both sides; optionally the response
side has its own tower (a copy of the encoder) or a residual feed-forward layer on
top of the shared encoder (`config.model.name = "dual_encoder"`).
"""

from __future__ import annotations

import functools

import jax
import ml_collections
import numpy as np
from flax import nnx

from convfit_jax.encoder import Encoder
from convfit_jax.evaluators.response_selection import BiEncoderScorer
from convfit_jax.models import Built, sentence
from convfit_jax.models.heads import l2_normalize
from convfit_jax.models.sentence import SentenceEncoder


class ResponseFeedForward(nnx.Module):
  """Response-side layer: x + W2 gelu(W1 x), [batch, d] -> [batch, d] float32.

  W2 starts at zero, so the layer starts as the identity and training starts from
  the pretrained encoder's own context-response similarity.
  """

  def __init__(self, dim: int, hidden: int, *, rngs: nnx.Rngs):
    self.up = nnx.Linear(dim, hidden, kernel_init=nnx.initializers.xavier_uniform(), rngs=rngs)
    self.down = nnx.Linear(hidden, dim, kernel_init=nnx.initializers.zeros, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    return x + self.down(jax.nn.gelu(self.up(x), approximate=False))


class DualEncoder(nnx.Module):
  """Contexts and responses to vectors of the same width.

  Args:
    context: the shared encoder (also the response encoder unless `response` is set).
    response: a separate response tower.
    response_ff: a `ResponseFeedForward` applied to response vectors.
  """

  def __init__(self, context: SentenceEncoder, *, response: SentenceEncoder | None = None,
               response_ff: ResponseFeedForward | None = None):
    self.context = context
    self.response = response
    self.response_ff = response_ff

  @property
  def response_tower(self) -> SentenceEncoder:
    return self.context if self.response is None else self.response

  def encode_contexts(self, ids: jax.Array, mask: jax.Array, dropout_key: jax.Array | None = None,
                      **packed) -> jax.Array:
    """[n, L] int32 ids and mask -> [n, d] float32; packed rows with `position_ids`
    and `slots` as `SentenceEncoder` takes them."""
    return self.context(ids, mask, dropout_key=dropout_key, **packed)

  def encode_responses(self, ids: jax.Array, mask: jax.Array, dropout_key: jax.Array | None = None,
                       **packed) -> jax.Array:
    """As `encode_contexts`, through the response tower and feed-forward layer."""
    return self.apply_response_ff(self.response_tower(ids, mask, dropout_key=dropout_key, **packed))

  def apply_response_ff(self, x: jax.Array) -> jax.Array:
    return x if self.response_ff is None else self.response_ff(x)


@functools.partial(jax.jit, static_argnums=0)
def _response_ff(graphdef: nnx.GraphDef, state: nnx.State, x: jax.Array) -> jax.Array:
  return nnx.merge(graphdef, state).apply_response_ff(x)


def predictors(model: DualEncoder, built: Built, max_length: int) -> tuple[Encoder, BiEncoderScorer]:
  """What evaluators read from a (host, eval-mode) dual encoder: the context `Encoder` (a
  `TextEncoder`) and a `BiEncoderScorer` of unit context and response vectors, the
  responses through the response tower and feed-forward layer."""
  encoder = lambda tower: Encoder(tower, built.tokenizer, max_length=max_length,
                                  hf_config=built.hf_config)
  contexts, responses = encoder(model.context), encoder(model.response_tower)
  graphdef, state = nnx.split(model)

  def embed_responses(texts, batch_size):
    x = responses.encode(texts, batch_size=batch_size)
    if model.response_ff is not None:
      x = _response_ff(graphdef, state, x)
    return np.asarray(l2_normalize(x))

  return contexts, BiEncoderScorer(
      lambda texts, batch_size: contexts.encode(texts, batch_size=batch_size, normalize=True),
      embed_responses)


def build(m: ml_collections.ConfigDict, *, seed: int) -> Built:
  """The dual encoder a `model` config block names: `sentence.build`'s fields, plus
  response_tower, response_ff and response_ff_hidden (0 = 4 * dim)."""
  built = sentence.build(m, seed=seed)
  context = built.model
  response = nnx.clone(context) if m.response_tower else None
  response_ff = (ResponseFeedForward(context.dim, m.response_ff_hidden or 4 * context.dim,
                                     rngs=nnx.Rngs(seed + 1)) if m.response_ff else None)
  built.model = DualEncoder(context, response=response, response_ff=response_ff)
  return built
