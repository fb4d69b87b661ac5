"""A bidirectional LSTM over padded batches, with `torch.nn.LSTM`'s gates and weights.

Each direction is a `jax.lax.scan` of its own over time-major inputs, each time step one
[rows, d_in + hidden] x [d_in + hidden, 4 hidden] product of the step's input and the last
state. The backward direction scans the padded batch from its last step (`reverse=True`:
no flipped copies of inputs and outputs, and not a per-row gather, which cost XLA more
than the recurrence itself); its rows then meet their padding first, and a step on
padding keeps the carry unchanged, so each row's backward state starts at its own last
word, as PyTorch's packed sequences do. The input projection
is part of each step's product, not one product over every step before the recurrence:
that product's [time, batch, 4 hidden] output left the cache, and the BiLSTM ran slower on
CPU (docs/benchmarks.md). Outputs at padded positions are zero.

In eval mode (`model.eval()`) the rows are sorted longest first, so at every step of
either direction the rows still on words are a prefix of the batch, and a step computes
only the smallest prefix that holds them (`prefix_sizes`: the batch, then powers of two
down to 8; one `lax.switch` branch each), and nothing once every row is on padding. This is
what PyTorch's packed sequences do, shrinking the batch as rows end; without it a batch of
scored pairs ran every short response as many steps as its longest one, and ESIM reranked
slower than PyTorch in float32 (docs/benchmarks.md). Two scans rather than one over both
directions, so that each shrinks on its own. In train mode every step computes every row:
differentiating through a `lax.cond` in the scan made ESIM's training steps slower than
running them all.

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


def prefix_sizes(batch: int) -> list[int]:
  """The row counts an eval-mode step may compute, largest first: the batch, then the
  powers of two below it down to 8 (64 -> 64, 32, 16, 8; 52 -> 52, 32, 16, 8; 8 -> 8).
  Fewer rows than 8 cost a step about what 8 do, and every size is a `lax.switch` branch
  of its own, compiled into every scan: more of them filled the process's memory maps
  (Linux's 65,530) when a long evaluation compiled scorers for many padded widths."""
  return [batch] + [1 << k for k in reversed(range(3, max(batch - 1, 0).bit_length()))]


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
    self.deterministic = False  # True in eval mode (nnx's `eval()`): steps shrink to the live rows
    self.w_ih = nnx.Param(uniform((2, d_in, 4 * hidden)))
    self.w_hh = nnx.Param(uniform((2, hidden, 4 * hidden)))
    self.bias = nnx.Param(uniform((2, 4 * hidden)) + uniform((2, 4 * hidden)))

  def __call__(self, x: jax.Array, lengths: jax.Array) -> jax.Array:
    """[batch, time, d_in] float32 inputs, [batch] int32 lengths -> [batch, time, 2 hidden]."""
    dt = self.dtype
    w_ih, w_hh, bias = self.w_ih[...].astype(dt), self.w_hh[...].astype(dt), self.bias[...]
    if self.deterministic:
      order = jnp.argsort(-lengths)  # longest first (stable: equal lengths keep their order)
      x, lengths = x[order], lengths[order]
    x = jnp.swapaxes(x, 0, 1).astype(dt)  # [time, batch, d_in]
    valid = jnp.arange(x.shape[0])[:, None] < lengths[None, :]  # [time, batch]
    w = jnp.concatenate([w_ih, w_hh], axis=1)  # [2, d_in + hidden, 4 hidden]
    run = lambda k: _direction(x, valid, w[k], bias[k], self.hidden, self.deterministic,
                               backward=k == 1)
    out = jnp.concatenate([run(0), run(1)], axis=-1)  # [time, batch, 2 hidden]
    out = jnp.swapaxes(jnp.where(valid[..., None], out, 0.0), 0, 1)
    if self.deterministic:
      out = out[jnp.argsort(order)]
    return out


def _direction(x: jax.Array, valid: jax.Array, w: jax.Array, bias: jax.Array, hidden: int,
               live_prefix: bool, backward: bool) -> jax.Array:
  """One direction's recurrence: [time, batch, d_in] inputs (in the compute dtype), [time,
  batch] bool valid, w [d_in + hidden, 4 hidden], bias [4 hidden] -> [time, batch, hidden]
  float32 states. A row on padding keeps its carry. With `live_prefix` the valid rows of
  each step must be a prefix of the batch (rows sorted longest first), and a step computes
  the smallest of `prefix_sizes` that holds them, none when there are none."""
  def cell(h, c, x_t, valid_t):
    xh = jnp.concatenate([x_t, h.astype(w.dtype)], axis=-1)
    gates = jnp.dot(xh, w, preferred_element_type=jnp.float32) + bias
    i, f, g, o = jnp.split(gates, 4, axis=-1)
    c_new = _sigmoid(f) * c + _sigmoid(i) * jnp.tanh(g)
    h_new = _sigmoid(o) * jnp.tanh(c_new)
    keep = valid_t[:, None]
    return jnp.where(keep, h_new, h), jnp.where(keep, c_new, c)

  batch = x.shape[1]
  sizes = prefix_sizes(batch)

  def prefix(size):
    def run(carry, x_t, valid_t):
      h, c = carry
      hs, cs = cell(h[:size], c[:size], x_t[:size], valid_t[:size])
      return h.at[:size].set(hs), c.at[:size].set(cs)
    return run

  branches = [prefix(s) for s in sizes] + [lambda carry, x_t, valid_t: carry]
  sizes_array = jnp.asarray(sizes)

  def step(carry, inputs):
    x_t, valid_t = inputs
    if live_prefix:
      # sizes descend: the last one that still holds the live rows; len(sizes) when none
      live = jnp.sum(valid_t)
      branch = jnp.where(live > 0, jnp.sum(sizes_array >= live) - 1, len(sizes))
      carry = jax.lax.switch(branch, branches, carry, x_t, valid_t)
    else:
      carry = cell(*carry, x_t, valid_t)
    return carry, carry[0]

  zeros = jnp.zeros((batch, hidden), jnp.float32)
  return jax.lax.scan(step, (zeros, zeros), (x, valid), reverse=backward)[1]
