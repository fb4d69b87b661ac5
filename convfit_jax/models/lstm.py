"""A bidirectional LSTM over padded batches, with `torch.nn.LSTM`'s gates and weights.

Both directions run in one `jax.lax.scan` over time-major inputs, so each time step is
one batched [2, batch, d_in + hidden] x [2, d_in + hidden, 4 hidden] product of the step's
input and the last state. The backward direction reads the whole padded sequence
reversed (a flip, not a per-row gather, which cost XLA more than the recurrence itself);
its rows then meet their padding first, and a step on padding keeps the carry
unchanged, so each row's backward state starts at its own last word, as PyTorch's packed
sequences do. The input projection is part of each step's
product, not one product over every step before the recurrence: that product's [time,
batch, 4 hidden] output left the cache, and the BiLSTM ran slower on CPU
(docs/benchmarks.md). Outputs at padded positions are zero.

In a bfloat16 compute dtype the products take bfloat16 inputs and accumulate in float32;
gates, cell and hidden states stay float32 (on CPUs with AMX, ESIM then reranks faster
than PyTorch's float32 reference: docs/benchmarks.md).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


def _sigmoid(x: jax.Array) -> jax.Array:
  # The same function through tanh: XLA's CPU logistic (an exp and a division) made the
  # gates' elementwise work of a step slower.
  return 0.5 * jnp.tanh(0.5 * x) + 0.5


class BiLSTM(nnx.Module):
  """[batch, time, d_in] -> [batch, time, 2 hidden]: forward then backward outputs.

  Weights per direction (index 0 forward, 1 backward), gates in PyTorch's order (input,
  forget, cell, output): `w_ih` [2, d_in, 4 hidden] and `w_hh` [2, hidden, 4 hidden] are
  PyTorch's weight_ih / weight_hh transposed, `bias` [2, 4 hidden] its b_ih + b_hh.
  """

  def __init__(self, d_in: int, hidden: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
    # PyTorch's initialisation: every weight and both biases U(-1/sqrt(hidden), 1/sqrt(hidden)).
    bound = hidden ** -0.5
    uniform = lambda shape: jax.random.uniform(rngs.params(), shape, jnp.float32, -bound, bound)
    self.hidden = hidden
    self.dtype = dtype
    self.w_ih = nnx.Param(uniform((2, d_in, 4 * hidden)))
    self.w_hh = nnx.Param(uniform((2, hidden, 4 * hidden)))
    self.bias = nnx.Param(uniform((2, 4 * hidden)) + uniform((2, 4 * hidden)))

  def __call__(self, x: jax.Array, lengths: jax.Array) -> jax.Array:
    """[batch, time, d_in] float32 inputs, [batch] int32 lengths -> [batch, time, 2 hidden]."""
    dt = self.dtype
    w_ih, w_hh, bias = self.w_ih[...].astype(dt), self.w_hh[...].astype(dt), self.bias[...]
    x = jnp.swapaxes(x, 0, 1).astype(dt)  # [time, batch, d_in]
    valid = jnp.arange(x.shape[0])[:, None] < lengths[None, :]  # [time, batch]
    w = jnp.concatenate([w_ih, w_hh], axis=1)  # [2, d_in + hidden, 4 hidden]

    def step(carry, inputs):
      h, c = carry
      x_f, x_b, valid_f, valid_b = inputs
      xh = jnp.concatenate([jnp.stack([x_f, x_b]), h.astype(dt)], axis=-1)
      gates = jnp.einsum("kbh,khg->kbg", xh, w, preferred_element_type=jnp.float32) + bias[:, None]
      i, f, g, o = jnp.split(gates, 4, axis=-1)
      c_new = _sigmoid(f) * c + _sigmoid(i) * jnp.tanh(g)
      h_new = _sigmoid(o) * jnp.tanh(c_new)
      keep = jnp.stack([valid_f, valid_b])[..., None]
      h, c = jnp.where(keep, h_new, h), jnp.where(keep, c_new, c)
      return (h, c), (h[0], h[1])

    zeros = jnp.zeros((2, x.shape[1], self.hidden), jnp.float32)
    _, (forward, backward) = jax.lax.scan(step, (zeros, zeros),
                                          (x, x[::-1], valid, valid[::-1]))
    out = jnp.concatenate([forward, backward[::-1]], axis=-1)  # [time, batch, 2 hidden]
    return jnp.swapaxes(jnp.where(valid[..., None], out, 0.0), 0, 1)
