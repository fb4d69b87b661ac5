"""A bidirectional LSTM over padded batches, with `torch.nn.LSTM`'s gates and weights.

Both directions run in one `jax.lax.scan`: the backward direction reads each sequence
reversed within its own length (as PyTorch's packed sequences do), stacked with the
forward one on a leading direction axis, so each time step is one batched
[2, batch, hidden] x [2, hidden, 4 hidden] product. The input projection of every step
is one product before the recurrence. Padding follows the valid tokens, so neither
direction sees it; outputs at padded positions are zero.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


def reverse_within_length(x: jax.Array, lengths: jax.Array) -> jax.Array:
  """[batch, time, ...] with each row's first `lengths` steps reversed, padding in place
  (an involution: applying it twice gives `x`)."""
  steps = jnp.arange(x.shape[1])[None, :]
  order = jnp.where(steps < lengths[:, None], lengths[:, None] - 1 - steps, steps)
  return jnp.take_along_axis(x, order.reshape(order.shape + (1,) * (x.ndim - 2)), axis=1)


class BiLSTM(nnx.Module):
  """[batch, time, d_in] -> [batch, time, 2 hidden]: forward then backward outputs.

  Weights per direction (index 0 forward, 1 backward), gates in PyTorch's order (input,
  forget, cell, output): `w_ih` [2, d_in, 4 hidden] and `w_hh` [2, hidden, 4 hidden] are
  PyTorch's weight_ih / weight_hh transposed, `bias` [2, 4 hidden] its b_ih + b_hh.
  """

  def __init__(self, d_in: int, hidden: int, *, rngs: nnx.Rngs):
    # PyTorch's initialisation: every weight and both biases U(-1/sqrt(hidden), 1/sqrt(hidden)).
    bound = hidden ** -0.5
    uniform = lambda shape: jax.random.uniform(rngs.params(), shape, jnp.float32, -bound, bound)
    self.hidden = hidden
    self.w_ih = nnx.Param(uniform((2, d_in, 4 * hidden)))
    self.w_hh = nnx.Param(uniform((2, hidden, 4 * hidden)))
    self.bias = nnx.Param(uniform((2, 4 * hidden)) + uniform((2, 4 * hidden)))

  def __call__(self, x: jax.Array, lengths: jax.Array) -> jax.Array:
    """[batch, time, d_in] float32 inputs, [batch] int32 lengths -> [batch, time, 2 hidden]."""
    both = jnp.stack([x, reverse_within_length(x, lengths)])
    gates_x = jnp.einsum("kbtd,kdg->tkbg", both, self.w_ih[...]) + self.bias[...][:, None, :]
    w_hh = self.w_hh[...]

    def step(carry, gx):
      h, c = carry
      i, f, g, o = jnp.split(gx + jnp.einsum("kbh,khg->kbg", h, w_hh), 4, axis=-1)
      c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
      h = jax.nn.sigmoid(o) * jnp.tanh(c)
      return (h, c), h

    zeros = jnp.zeros((2, x.shape[0], self.hidden), x.dtype)
    _, out = jax.lax.scan(step, (zeros, zeros), gates_x)  # [time, 2, batch, hidden]
    forward = jnp.swapaxes(out[:, 0], 0, 1)
    backward = reverse_within_length(jnp.swapaxes(out[:, 1], 0, 1), lengths)
    valid = jnp.arange(x.shape[1])[None, :, None] < lengths[:, None, None]
    return jnp.where(valid, jnp.concatenate([forward, backward], axis=-1), 0.0)
