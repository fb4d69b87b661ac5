"""Gradient cache (Gao et al. 2021; sentence-transformers' Cached* losses) for any loss on
embeddings of a large batch.

Embed the batch chunk by chunk without keeping activations, take the gradient of the
loss with respect to the embeddings, then re-run each chunk under `jax.vjp` with that
cotangent and sum the parameter gradients. Each chunk's second pass uses the dropout
key of its first pass, so both see the same masks and the gradients equal the uncached
ones; the memory held is one chunk's activations. Per-layer remat composes with it.

Chunks are laid out so that each takes rows from every `data` shard (`to_chunks`):
the re-layout is local to each device, and every chunk runs on every device.

Model state beyond the parameters (BatchNorm's running statistics) is carried from
chunk to chunk, as gradient accumulation over micro-batches would: chunk k's forward
pass starts from the state chunk k - 1 left. Both passes carry it the same way, so the
second pass sees exactly what the first saw (in training mode BatchNorm normalises by
the chunk's own statistics, which are the same in both passes).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

PyTree = Any
EmbedFn = Callable[[PyTree, PyTree, Mapping[str, jax.Array], jax.Array | None],
                   tuple[PyTree, PyTree]]


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
                   model_state: PyTree, inputs: Mapping[str, jax.Array], key: jax.Array | None, *,
                   chunks: int, shards: int, cache: bool) -> tuple[jax.Array, PyTree, PyTree]:
  """loss(embed(params, inputs)) and its gradient in `params`, computed chunk by chunk.

  Args:
    embed: `(params, model_state, chunk_inputs, key) -> (embeddings, model_state)` for one
      chunk: embeddings a pytree of [rows, d] arrays, the state as the forward pass leaves
      it; `key` is the chunk's dropout key or None.
    loss: embeddings of the whole batch -> scalar.
    params: what the gradient is taken in.
    model_state: the model's other state before the step (an empty dict for none).
    inputs: [S * n * r, ...] arrays laid out (shard, chunk, row) (`to_chunks` gives
      chunk k its rows); passed whole when `chunks` is 1.
    key: the step's dropout key, split into one per chunk; None for no dropout.
    chunks: number of chunks n.
    shards: size of the mesh `data` axis.
    cache: two-pass gradient caching; False backpropagates through every chunk at once.
  Returns:
    (scalar loss, gradients shaped like `params`, the model state after every chunk).
  """
  keys = None if key is None else jax.random.split(key, chunks)
  pieces = {k: (v[None] if chunks == 1 else to_chunks(v, chunks, shards)) for k, v in inputs.items()}

  def embed_all(p):
    """(embeddings of the batch, the state after the last chunk)."""
    if chunks == 1:  # one chunk: no loop and no re-layout, XLA sees the plain batch
      return embed(p, model_state, inputs, None if keys is None else keys[0])

    def one(state, xs):
      out, state = embed(p, state, *xs)
      return state, out

    state, out = jax.lax.scan(one, model_state, (pieces, keys))
    return jax.tree.map(lambda x: from_chunks(x, shards), out), state

  if not cache:
    def objective(p):
      embeddings, state = embed_all(p)
      return loss(embeddings), state
    (value, state), grads = jax.value_and_grad(objective, has_aux=True)(params)
    return value, grads, state

  # Pass 1: embeddings only; nothing is differentiated, so no activations are saved.
  embeddings, _ = embed_all(jax.lax.stop_gradient(params))
  value, cotangent = jax.value_and_grad(loss)(embeddings)
  cotangent = jax.tree.map(lambda g: to_chunks(g, chunks, shards), cotangent)

  # Pass 2: one chunk at a time, same dropout keys and states, pull the embedding gradient back.
  def accumulate(carry, xs):
    total, state = carry
    chunk, k, g = xs
    _, vjp, state = jax.vjp(lambda p: embed(p, state, chunk, k), params, has_aux=True)
    (grads,) = vjp(g)
    return (jax.tree.map(jnp.add, total, grads), state), None

  (grads, state), _ = jax.lax.scan(
      accumulate, (jax.tree.map(jnp.zeros_like, params), model_state), (pieces, keys, cotangent))
  return value, grads, state
