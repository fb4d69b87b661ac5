"""Pooling and the heads that sit on the pooled sentence vector."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

POOLING_MODES = ("mean", "cls")


def pool(hidden: jax.Array, mask: jax.Array, mode: str, slots: jax.Array | None = None) -> jax.Array:
  """One vector per sentence: masked mean (sentence-transformers' mean pooling) or the
  sentence's first token ("cls").

  Args:
    hidden: [batch, seq, d] any float dtype.
    mask: [batch, seq] int or bool: 1 on real tokens; for packed rows, the sentence
      number 1, 2, ... of each token (0 on padding).
    mode: one of POOLING_MODES.
    slots: [n, 2] int32 (row, sentence number) of the n sentences to pool from packed
      rows; None: sentence 1 of every row.
  Returns:
    [batch, d] float32, or [n, d] with `slots`.
  """
  if mode not in POOLING_MODES:
    raise ValueError(f"pooling must be one of {POOLING_MODES}, got {mode!r}")
  segments = mask.astype(jnp.int32)
  hidden = hidden.astype(jnp.float32)
  if slots is None:
    member = (segments == 1).astype(jnp.float32)  # [batch, seq]
    tokens = hidden
  else:
    rows, seq = segments.shape
    # Row one-hot times sentence match: a [n, rows * seq] selection matrix, so pooling
    # is one matmul and its gradient needs no scatter.
    row_match = jnp.arange(rows)[None, :, None] == slots[:, 0, None, None]
    member = (row_match & (segments[None] == slots[:, 1, None, None])).astype(jnp.float32)
    member = member.reshape(slots.shape[0], rows * seq)
    tokens = hidden.reshape(rows * seq, -1)
  if mode == "cls":
    first = member * (jnp.cumsum(member, axis=-1) == 1)
    return _select(first, tokens)
  # The clamp matches sentence-transformers (1e-9) and keeps an all-padding row finite.
  return _select(member, tokens) / jnp.maximum(jnp.sum(member, axis=-1, keepdims=True), 1e-9)


def _select(weights: jax.Array, tokens: jax.Array) -> jax.Array:
  """sum_t weights[..., t] tokens[..., t, :]: [b, t] x [b, t, d] or [n, t] x [t, d]."""
  if tokens.ndim == 3:
    return jnp.einsum("bt,btd->bd", weights, tokens)
  return weights @ tokens


def l2_normalize(x: jax.Array, eps: float = 1e-12) -> jax.Array:
  """Rows scaled to unit norm: [..., d] -> [..., d] float32 (torch.nn.functional.normalize's eps).

  The clamp sits under the square root: `jnp.linalg.norm` has a NaN gradient at a zero
  vector, and padding rows are often exactly zero.
  """
  x = x.astype(jnp.float32)
  return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), eps * eps))


class Projection(nnx.Module):
  """ConvFiT's down-projection after pooling: Dense(d_o) then tanh.

  Exported as a sentence-transformers `Dense` module (2_Dense) with a Tanh activation.
  """

  def __init__(self, d_in: int, d_out: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
    self.dense = nnx.Linear(d_in, d_out, kernel_init=nnx.initializers.xavier_uniform(),
                            bias_init=nnx.initializers.zeros, dtype=dtype,
                            param_dtype=jnp.float32, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    """[batch, d_in] -> [batch, d_out] float32."""
    return jnp.tanh(self.dense(x).astype(jnp.float32))


class IntentHead(nnx.Module):
  """A linear intent classifier on the unit sentence vector, trained beside the contrastive
  loss (`train.head_weight`): logits = scale * unit(e) @ kernel + bias.

  On the unit vector, so the head reads the L2-normalised encodings k-NN reads; kernel and
  bias start at zero (every intent equally likely), so the seed does not move it.
  """

  def __init__(self, d: int, num_labels: int, *, scale: float):
    self.kernel = nnx.Param(jnp.zeros((d, num_labels), jnp.float32))
    self.bias = nnx.Param(jnp.zeros((num_labels,), jnp.float32))
    self.scale = scale

  def __call__(self, emb: jax.Array) -> jax.Array:
    """[batch, d] float -> logits [batch, num_labels] float32."""
    return head_logits(l2_normalize(emb), self.kernel[...], self.bias[...], self.scale)


def head_logits(unit, kernel, bias, scale: float):
  """`IntentHead`'s logits from unit encodings: [n, d] x [d, c] -> [n, c] (jax or numpy)."""
  return scale * (unit @ kernel) + bias


class PairClassifier(nnx.Module):
  """The `smax` classifier over [u; v; |u - v|]: Linear(3d, 2).

  Initialised as torch's nn.Linear (uniform in +-1/sqrt(3d) for kernel and bias), which is
  what sentence-transformers' SoftmaxLoss starts from.
  """

  def __init__(self, d: int, *, rngs: nnx.Rngs, num_labels: int = 2):
    bound = 1.0 / math.sqrt(3 * d)
    init = jax.nn.initializers.uniform(2 * bound)
    self.kernel = nnx.Param(init(rngs.params(), (3 * d, num_labels), jnp.float32) - bound)
    self.bias = nnx.Param(init(rngs.params(), (num_labels,), jnp.float32) - bound)

  def __call__(self, u: jax.Array, v: jax.Array) -> jax.Array:
    """[batch, d] x [batch, d] -> logits [batch, num_labels] float32."""
    return pair_logits(u, v, self.kernel[...], self.bias[...])


def pair_logits(u: jax.Array, v: jax.Array, kernel: jax.Array, bias: jax.Array) -> jax.Array:
  """[u; v; |u - v|] @ kernel + bias: logits [batch, num_labels] float32.

  Args:
    u, v: [batch, d] float.
    kernel: [3d, num_labels] float32 (the transpose of torch's Linear.weight).
    bias: [num_labels] float32.
  """
  u = u.astype(jnp.float32)
  v = v.astype(jnp.float32)
  return jnp.concatenate([u, v, jnp.abs(u - v)], axis=-1) @ kernel + bias


class NliClassifier(nnx.Module):
  """The NLI head of Yang et al. (2018) and InferSent: [u; v; |u - v|; u * v] through
  `hidden` ReLU layers to 3 logits (entailment, neutral, contradiction).

  Args:
    d: the sentence vectors' width.
    hidden: the hidden layers' widths (() = a linear classifier).
  """

  def __init__(self, d: int, hidden: tuple[int, ...], *, rngs: nnx.Rngs, num_labels: int = 3):
    widths = (4 * d, *hidden, num_labels)
    self.layers = nnx.List([nnx.Linear(a, b, kernel_init=nnx.initializers.xavier_uniform(), rngs=rngs)
                            for a, b in zip(widths, widths[1:])])

  def __call__(self, u: jax.Array, v: jax.Array) -> jax.Array:
    """[batch, d] premises x [batch, d] hypotheses -> logits [batch, num_labels] float32."""
    u = u.astype(jnp.float32)
    v = v.astype(jnp.float32)
    x = jnp.concatenate([u, v, jnp.abs(u - v), u * v], axis=-1)
    for layer in self.layers[:-1]:
      x = jax.nn.relu(layer(x))
    return self.layers[-1](x)
