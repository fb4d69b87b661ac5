"""Gradient cache (Gao et al. 2021; sentence-transformers' Cached* losses) for any loss on
embeddings of a large batch.

Embed the batch chunk by chunk without keeping activations, take the gradient of the
loss with respect to the embeddings, then re-run each chunk under `jax.vjp` with that
cotangent and sum the parameter gradients. Each chunk's second pass uses the dropout
key of its first pass, so both see the same masks and the gradients equal the uncached
ones; the memory held is one chunk's activations. Per-layer remat composes with it.

Chunks are laid out so that each takes rows from every `data` shard (`to_chunks`):
the re-layout is local to each device, and every chunk runs on every device.
The embedding function must be pure in its parameters: a model that updates state in
its forward pass (BatchNorm statistics) cannot be cached this way.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

PyTree = Any
EmbedFn = Callable[[PyTree, Mapping[str, jax.Array], jax.Array | None], PyTree]


def num_chunks(batch_size: int, chunk_size: int | None, shards: int) -> int:
  """Chunks of `chunk_size` rows (None or >= batch: one); each a multiple of `shards`."""
  c = chunk_size if chunk_size and chunk_size < batch_size else batch_size
  if batch_size % c or c % shards:
    raise ValueError(f"chunk_size {c} must divide the batch {batch_size} and be a multiple of "
                     f"the {shards} data shards")
  return batch_size // c


def to_chunks(x: jax.Array, n: int, shards: int) -> jax.Array:
  """[B, ...] -> [n, B/n, ...] where chunk k takes rows k*c/S.. of every shard's block.

  Rows stay on the device that holds them (a local re-layout), so every chunk is
  spread over all devices instead of chunk k living on a few of them.
  """
  b = x.shape[0]
  x = x.reshape((shards, n, b // (shards * n)) + x.shape[1:])
  return jnp.swapaxes(x, 0, 1).reshape((n, b // n) + x.shape[3:])


def from_chunks(x: jax.Array, shards: int) -> jax.Array:
  """Inverse of `to_chunks`: [n, B/n, ...] -> [B, ...] in the original row order."""
  n, c = x.shape[:2]
  x = x.reshape((n, shards, c // shards) + x.shape[2:])
  return jnp.swapaxes(x, 0, 1).reshape((n * c,) + x.shape[3:])


def loss_and_grads(embed: EmbedFn, loss: Callable[[PyTree], jax.Array], params: PyTree,
                   inputs: Mapping[str, jax.Array], key: jax.Array | None, *, chunks: int,
                   shards: int, cache: bool) -> tuple[jax.Array, PyTree]:
  """loss(embed(params, inputs)) and its gradient in `params`, computed chunk by chunk.

  Args:
    embed: `(params, chunk_inputs, key) -> embeddings` (a pytree of [rows, d] arrays)
      for one chunk; `key` is the chunk's dropout key or None.
    loss: embeddings of the whole batch -> scalar.
    params: what the gradient is taken in.
    inputs: [S * n * r, ...] arrays laid out (shard, chunk, row) (`to_chunks` gives
      chunk k its rows); passed whole when `chunks` is 1.
    key: the step's dropout key, split into one per chunk; None for no dropout.
    chunks: number of chunks n.
    shards: size of the mesh `data` axis.
    cache: two-pass gradient caching; False backpropagates through every chunk at once.
  Returns:
    (scalar loss, gradients shaped like `params`).
  """
  keys = None if key is None else jax.random.split(key, chunks)
  pieces = {k: (v[None] if chunks == 1 else to_chunks(v, chunks, shards)) for k, v in inputs.items()}

  def embed_all(p):
    if chunks == 1:  # one chunk: no loop and no re-layout, XLA sees the plain batch
      return embed(p, inputs, None if keys is None else keys[0])
    out = jax.lax.map(lambda xs: embed(p, *xs), (pieces, keys))
    return jax.tree.map(lambda x: from_chunks(x, shards), out)

  if not cache:
    return jax.value_and_grad(lambda p: loss(embed_all(p)))(params)

  # Pass 1: embeddings only; nothing is differentiated, so no activations are saved.
  value, cotangent = jax.value_and_grad(loss)(embed_all(jax.lax.stop_gradient(params)))
  cotangent = jax.tree.map(lambda g: to_chunks(g, chunks, shards), cotangent)

  # Pass 2: one chunk at a time, same dropout keys, pull the embedding gradient back.
  def accumulate(total, xs):
    chunk, k, g = xs
    _, vjp = jax.vjp(lambda p: embed(p, chunk, k), params)
    (grads,) = vjp(g)
    return jax.tree.map(jnp.add, total, grads), None

  grads, _ = jax.lax.scan(accumulate, jax.tree.map(jnp.zeros_like, params), (pieces, keys, cotangent))
  return value, grads
