"""The recursive convolutional encoder and decoder of seed 003 (after Zhang & LeCun's BRCA).

A sentence of at most 2^K tokens is placed in a row of 2^K positions (`place`:
*balanced*, the paper's Figure 2, or from the left), embedded, and encoded by

    prefix group (N kernel-3 convs, once) -> [recursive group (N convs) -> max-pool(2)] x R

so R recursions leave 2^(K - R) positions of d channels. The recursive group's
weights are shared by every application (or not: `shared=False`, the paper's
"static" model), but each application has its own BatchNorm statistics: the shared
convs see differently distributed inputs at each depth. The decoder mirrors it: R
applications of [a conv to 2d channels -> `expand` (twice the positions, d channels)
-> N - 1 convs], the first two convs bypassed by the input stacked with itself, then
a postfix group of N convs. Convs come in residual blocks of two (conv, BatchNorm,
ReLU, conv, BatchNorm, + input, ReLU); there are no linear layers after the recursion.

Layout: [batch, positions, channels] float32 throughout.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

PADDINGS = ("balanced", "right")


def ceil_log2(lengths: jax.Array) -> jax.Array:
  """[n] int32 ceil(log2 n) of token counts n >= 1: the recursions that bring a sentence
  padded to the next power of two down to one position."""
  lengths = jnp.maximum(jnp.asarray(lengths, jnp.int32), 1)
  k = jnp.ceil(jnp.log2(lengths.astype(jnp.float32))).astype(jnp.int32)
  # float log2 is exact at powers of two; guard the rounding of any other length
  return k + (jnp.left_shift(1, k) < lengths)


def balanced_positions(lengths: jax.Array, length: int, width: int) -> jax.Array:
  """Where each token of a sentence goes in a row of `width` = 2^K (the paper's Figure 2).

  A sentence of n tokens is padded to P = 2^ceil(log2 n) and the remaining
  `width - P` padding is spread evenly between its tokens: token i goes to i * width / P.
  Each max-pool then halves the gaps, so after log2(width / P) recursions the sentence
  sits right-padded in P positions whatever `width` is.

  Args:
    lengths: [n] int32 tokens per sentence, each in 1..width.
    length: L, the token slots per input row.
  Returns:
    [n, L] int32 positions in 0..width-1 (slots past a sentence's length: past its last token).
  """
  stride = width // jnp.left_shift(1, ceil_log2(lengths))
  return jnp.arange(length, dtype=jnp.int32)[None, :] * stride[:, None]


def place(ids: jax.Array, lengths: jax.Array, width: int, padding: str, pad_id: int) -> jax.Array:
  """Right-padded rows of token ids placed in rows of `width` positions.

  Args:
    ids: [n, L] int32, the first `lengths[i]` of row i real, L <= width.
    lengths: [n] int32.
    width: 2^K.
    padding: "balanced" (`balanced_positions`) or "right" (tokens first, padding after).
    pad_id: the id of an empty position.
  Returns:
    [n, width] int32.
  """
  if padding not in PADDINGS:
    raise ValueError(f"padding={padding!r}; one of {PADDINGS}")
  n, length = ids.shape
  if length > width:
    raise ValueError(f"rows of {length} tokens do not fit {width} positions")
  positions = (balanced_positions(lengths, length, width) if padding == "balanced"
               else jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (n, length)))
  real = jnp.arange(length)[None, :] < lengths[:, None]
  positions = jnp.where(real, positions, width)  # out of range: dropped
  rows = jnp.broadcast_to(jnp.arange(n)[:, None], (n, length))
  return jnp.full((n, width), pad_id, jnp.int32).at[rows, positions].set(ids, mode="drop")


def pool(x: jax.Array) -> jax.Array:
  """Max-pool(2) over positions: [n, 2L, d] -> [n, L, d]."""
  n, length, d = x.shape
  return x.reshape(n, length // 2, 2, d).max(axis=2)


def expand(x: jax.Array) -> jax.Array:
  """BRCA's expand: [n, L, 2d] -> [n, 2L, d]; position 2l takes channels :d of l, 2l + 1
  channels d: (the shape `pool` undoes)."""
  n, length, d2 = x.shape
  return x.reshape(n, length, 2, d2 // 2).reshape(n, 2 * length, d2 // 2)


def _conv(d_in: int, d_out: int, rngs: nnx.Rngs) -> nnx.Conv:
  # No bias: BatchNorm follows every conv and its shift does the bias's work.
  return nnx.Conv(d_in, d_out, kernel_size=3, padding="SAME", use_bias=False,
                  kernel_init=nnx.initializers.kaiming_normal(), rngs=rngs)


def _norms(d: int, count: int, momentum: float, rngs: nnx.Rngs, zero: bool = False) -> nnx.List:
  init = nnx.initializers.zeros_init() if zero else nnx.initializers.ones_init()
  return nnx.List([nnx.BatchNorm(d, momentum=momentum, scale_init=init, rngs=rngs)
                   for _ in range(count)])


def _masked(x: jax.Array, mask: jax.Array | None) -> jax.Array:
  return x if mask is None else x * mask


class ResidualBlock(nnx.Module):
  """conv -> BN -> ReLU -> conv -> BN, + input, ReLU; one pair of BatchNorms per application.

  Args:
    d: channels.
    applications: how many places use the block (BatchNorm statistics for each).
    momentum: BatchNorm's running-average momentum.
    zero_init: the last BatchNorm's scale starts at 0, so the block starts as the identity
      (Goyal et al. 2017): a deep stack then starts at its input's scale, not growing with depth.
  """

  def __init__(self, d: int, applications: int, *, momentum: float, rngs: nnx.Rngs,
               zero_init: bool = False):
    self.conv1, self.conv2 = _conv(d, d, rngs), _conv(d, d, rngs)
    self.norm1 = _norms(d, applications, momentum, rngs)
    self.norm2 = _norms(d, applications, momentum, rngs, zero_init)

  def __call__(self, x: jax.Array, application: int, mask: jax.Array | None = None) -> jax.Array:
    """[n, L, d] -> [n, L, d]; `mask` [n, L, 1] float32 (1 inside each sentence's window)
    zeroes what lies outside and keeps it out of the batch statistics."""
    bn_mask = None if mask is None else mask > 0
    h = jax.nn.relu(self.norm1[application](self.conv1(x), mask=bn_mask))
    h = self.norm2[application](self.conv2(_masked(h, mask)), mask=bn_mask)
    return _masked(jax.nn.relu(x + h), mask)


class ExpandBlock(nnx.Module):
  """The decoder's first block: conv to 2d -> BN -> ReLU -> `expand` -> conv -> BN, + the
  input stacked with itself and expanded (each position twice), ReLU."""

  def __init__(self, d: int, applications: int, *, momentum: float, rngs: nnx.Rngs,
               zero_init: bool = False):
    self.conv1, self.conv2 = _conv(d, 2 * d, rngs), _conv(d, d, rngs)
    self.norm1 = _norms(2 * d, applications, momentum, rngs)
    self.norm2 = _norms(d, applications, momentum, rngs, zero_init)

  def __call__(self, x: jax.Array, application: int, mask: jax.Array | None = None) -> jax.Array:
    """[n, L, d] -> [n, 2L, d]."""
    del mask
    h = expand(jax.nn.relu(self.norm1[application](self.conv1(x))))
    h = self.norm2[application](self.conv2(h))
    return jax.nn.relu(expand(jnp.concatenate([x, x], axis=-1)) + h)


class Group(nnx.Module):
  """A group of blocks applied `applications` times: with the same weights and separate
  BatchNorms (`shared`), or with weights of its own each time (the static model).

  Args:
    d: channels.
    layers: N convs (even); `expand_first` makes the first two an `ExpandBlock`.
    norm_per_application: False: shared weights share their BatchNorms too (one set of
      statistics for every depth: the ablation of the paper's per-recursion statistics).
    zero_init: blocks start as the identity (`ResidualBlock`).
  """

  def __init__(self, d: int, layers: int, applications: int, *, shared: bool, momentum: float,
               rngs: nnx.Rngs, expand_first: bool = False, norm_per_application: bool = True,
               zero_init: bool = False):
    if layers < 2 or layers % 2:
      raise ValueError(f"model.layers={layers}: an even number >= 2 (residual blocks of two)")
    self.shared = shared
    self.norm_sets = applications if shared and norm_per_application else 1
    weight_sets = 1 if shared else applications

    def blocks():
      kinds = [ExpandBlock if expand_first and b == 0 else ResidualBlock for b in range(layers // 2)]
      return nnx.List([k(d, self.norm_sets, momentum=momentum, rngs=rngs, zero_init=zero_init)
                       for k in kinds])

    self.sets = nnx.List([blocks() for _ in range(weight_sets)])

  def __call__(self, x: jax.Array, application: int, mask: jax.Array | None = None) -> jax.Array:
    blocks = self.sets[0 if self.shared else application]
    norm = application if self.norm_sets > 1 else 0
    for block in blocks:
      x = block(x, norm, mask)
    return x


class RecursiveEncoder(nnx.Module):
  """prefix group, then `recursions` x (recursive group, max-pool(2)).

  Args:
    d: channels (the embedding width).
    layers: N convs per group.
    recursions: R.
    shared: one set of recursive weights (the paper's model) or R (static).
    momentum: BatchNorm's.
    norm_per_recursion: BatchNorm statistics per recursion (the paper's); False: one set.
    zero_init: blocks start as the identity (`ResidualBlock`).
  """

  def __init__(self, d: int, layers: int, recursions: int, *, shared: bool = True,
               momentum: float = 0.9, norm_per_recursion: bool = True, zero_init: bool = False,
               rngs: nnx.Rngs):
    self.recursions = recursions
    kw = dict(momentum=momentum, rngs=rngs, zero_init=zero_init)
    self.prefix = Group(d, layers, 1, shared=True, **kw)
    self.recursive = Group(d, layers, recursions, shared=shared,
                           norm_per_application=norm_per_recursion, **kw)

  def __call__(self, x: jax.Array, depth: jax.Array | None = None) -> jax.Array:
    """Encodes embedded rows.

    Args:
      x: [n, W, d] float32, W = 2^K >= 2^recursions.
      depth: None: every row runs all recursions. [n] int32 in 1..recursions: row i is a
        sentence right-padded to 2^depth[i] positions (variable length): only that window
        is computed (zero outside, out of the BatchNorm statistics) and its vector is
        read after depth[i] recursions.
    Returns:
      [n, W / 2^recursions, d] float32, or [n, d] with `depth`.
    """
    if depth is None:
      x = self.prefix(x, 0)
      for j in range(self.recursions):
        x = pool(self.recursive(x, j))
      return x
    width = x.shape[1]
    window = jnp.left_shift(1, depth)  # [n] positions of each sentence's window
    # A finished sentence keeps one position in play, so no recursion's statistics are
    # ever of an empty set; its vector was read when it finished.
    mask = lambda w, size: (jnp.arange(size)[None, :] < w[:, None]).astype(x.dtype)[..., None]
    x = self.prefix(_masked(x, mask(window, width)), 0, mask(window, width))
    out = jnp.zeros((x.shape[0], x.shape[2]), x.dtype)
    # A row of 2^k positions holds sentences of depth <= k: the deeper recursions have nothing.
    for j in range(min(self.recursions, width.bit_length() - 1)):
      size = width >> j
      x = pool(self.recursive(x, j, mask(jnp.maximum(window >> j, 1), size)))
      out = jnp.where((depth == j + 1)[:, None], x[:, 0], out)
    return out


class RecursiveDecoder(nnx.Module):
  """`recursions` x (expand group), then the postfix group: [n, L, d] -> [n, L * 2^R, d]."""

  def __init__(self, d: int, layers: int, recursions: int, *, shared: bool = True,
               momentum: float = 0.9, norm_per_recursion: bool = True, rngs: nnx.Rngs):
    self.recursions = recursions
    self.recursive = Group(d, layers, recursions, shared=shared, momentum=momentum, rngs=rngs,
                           expand_first=True, norm_per_application=norm_per_recursion)
    self.postfix = Group(d, layers, 1, shared=True, momentum=momentum, rngs=rngs)

  def __call__(self, z: jax.Array) -> jax.Array:
    for j in range(self.recursions):
      z = self.recursive(z, j)
    return self.postfix(z, 0)


def log2_positions(positions: int, field: str) -> int:
  """K for `positions` = 2^K (the config `field` named in the error otherwise)."""
  k = int(np.log2(positions)) if positions > 0 else -1
  if positions <= 0 or 1 << k != positions:
    raise ValueError(f"{field}={positions}: a power of two")
  return k

