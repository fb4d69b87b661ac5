"""Cosine k-NN intent detection over a pool of labelled encodings, with an out-of-scope option.

The pool is L2-normalised once, queries go in fixed-size batches (the last one padded,
so one compiled program serves every batch), each batch is scored against a chunk of
the pool by one matmul and `jax.lax.top_k` keeps the best k. Pools larger than device
memory go in chunks (`chunk_size`) with a running top-k merge; with a `mesh`, each chunk
is sharded over the `data` axis, every device takes its local top-k and the per-device
lists are all-gathered and merged.

The matmul only shortlists: its rounding depends on the shapes it runs with, so the
best k + 8 rows of each chunk are re-scored by a dot product summed in a fixed order
(`_ordered_dot`). Scores, and so ties, are then bitwise the same in the whole-pool,
chunked and sharded variants.

Tie rules (all deterministic, and the same in every variant):
- Neighbours with equal scores: the lower pool index ranks first. `lax.top_k` puts the
  lower position first among equals, and every merge concatenates candidates in pool
  index order (running list, then the new chunk; devices in shard order), so position
  order is index order.
- `vote="majority"`: the label with the most neighbours wins; among equally frequent
  labels, the higher summed similarity; then the lower label id.
- `vote="weighted"`: the label with the highest summed similarity of its neighbours
  (cosines, so a far neighbour with negative similarity counts against its label); then
  the lower label id.

Every prediction comes with its neighbours (pool indices and scores, best first), so a
caller can show the pool texts and labels that decided it.

A caller that searches one pool many times (a classifier, a server) places it once
(`prepare_pool`): normalising and copying a 1,000-row pool costs more than searching it
for a few queries.
"""

from __future__ import annotations

from functools import partial
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from convfit_jax.sharding import DATA

VOTES = ("majority", "weighted")
_NO_INDEX = np.iinfo(np.int32).max
# Extra matmul candidates per chunk: a true neighbour is missed only if more than this
# many rows score within float32 rounding of it (exact duplicates score identically
# within one matmul, so they never count against it).
_SLACK = 8


class KNNResult(NamedTuple):
  """Predictions and the neighbours behind them (host NumPy arrays).

  predictions: [n] int32 labels (`oos_label` where the OOS threshold rejected).
  indices: [n, k] int32 pool indices of the neighbours, best first.
  scores: [n, k] float32 cosine similarities of those neighbours.
  """
  predictions: np.ndarray
  indices: np.ndarray
  scores: np.ndarray


# jit: outside one, the scan is traced and compiled again on every call (normalize's). Only
# the sum: a jit around normalize's rsqrt and product would fuse them shape by shape.
@jax.jit
def _ordered_dot(a: jax.Array, b: jax.Array) -> jax.Array:
  """sum_t a[..., t] * b[..., t], added in one fixed sequential order: [..., d] -> [...] float32.

  XLA CPU picks a matmul's or a reduction's blocking by the array shapes, so a row can
  come out a few ulps apart in a chunked, sharded or whole-pool run, or at a different
  position in one array, and an exact tie could flip. This sum gives a pair of rows the
  same bits wherever and with whatever shapes it is computed.
  """
  a, b = jnp.broadcast_arrays(a.astype(jnp.float32), b.astype(jnp.float32))

  def add(acc, ab):
    return acc + ab[0] * ab[1], None

  acc, _ = jax.lax.scan(add, jnp.zeros(a.shape[:-1], jnp.float32),
                        (jnp.moveaxis(a, -1, 0), jnp.moveaxis(b, -1, 0)))
  return acc


def normalize(x: jax.Array) -> jax.Array:
  """Unit rows, [n, d] -> [n, d] float32; a zero row stays zero. Bitwise the same for
  equal rows whatever their position or the array's shape: what `heads.l2_normalize` (the
  one used everywhere else) cannot promise, since XLA blocks its sum of squares by shape,
  and the k-NN's exact tie rules need it."""
  x = x.astype(jnp.float32)
  return x * jax.lax.rsqrt(jnp.maximum(_ordered_dot(x, x), 1e-24))[:, None]


def _merge(scores: jax.Array, indices: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """Best k of candidates laid out in pool index order: [b, m] x2 -> [b, k] x2."""
  top, pos = jax.lax.top_k(scores, k)
  return top, jnp.take_along_axis(indices, pos, axis=1)


def _chunk_top_k(q: jax.Array, chunk: jax.Array, valid: jax.Array, offset: jax.Array, k: int):
  """Top-k of one (local) pool chunk: q [b, d], chunk [c, d] -> ([b, k'], [b, k']), k' = min(k, c).

  The matmul shortlists k + _SLACK rows, which are re-scored by `_ordered_dot`.
  """
  approx = jnp.where(valid[None, :], q @ chunk.T, -jnp.inf)
  _, pos = jax.lax.top_k(approx, min(k + _SLACK, chunk.shape[0]))
  # Back in pool index order, so top_k's lower-position-first rule is lower-index-first.
  pos = jnp.sort(pos, axis=1)
  exact = jnp.where(valid[pos], _ordered_dot(q[:, None, :], chunk[pos]), -jnp.inf)
  top, i = jax.lax.top_k(exact, min(k, chunk.shape[0]))
  return top, jnp.take_along_axis(pos, i, axis=1).astype(jnp.int32) + offset


@partial(jax.jit, static_argnames=("k",))
def _step(q, chunk, valid, offset, run_scores, run_indices, *, k):
  top, idx = _chunk_top_k(q, chunk, valid, offset, k)
  # Running list first: it holds only lower pool indices than this chunk.
  return _merge(jnp.concatenate([run_scores, top], 1), jnp.concatenate([run_indices, idx], 1), k)


@partial(jax.jit, static_argnames=("k", "mesh"))
def _sharded_step(q, chunk, valid, offset, run_scores, run_indices, *, k, mesh):
  def local(q, chunk, valid, offset):
    rows = chunk.shape[0]
    top, idx = _chunk_top_k(q, chunk, valid, offset + jax.lax.axis_index(DATA) * rows, k)
    # [devices, b, k'] in shard order, which is pool index order.
    top = jax.lax.all_gather(top, DATA)
    idx = jax.lax.all_gather(idx, DATA)
    b = q.shape[0]
    return (jnp.transpose(top, (1, 0, 2)).reshape(b, -1),
            jnp.transpose(idx, (1, 0, 2)).reshape(b, -1))

  top, idx = jax.shard_map(local, mesh=mesh, in_specs=(P(), P(DATA), P(DATA), P()),
                           out_specs=(P(), P()), check_vma=False)(q, chunk, valid, offset)
  return _merge(jnp.concatenate([run_scores, top], 1), jnp.concatenate([run_indices, idx], 1), k)


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def _power_of_two_at_least(n: int) -> int:
  """The rows a call of n queries is padded to: one compile per size class, not per query
  count (a service sees every count from 1 to its batch limit)."""
  return 1 << max(n - 1, 0).bit_length()


def pool_rows(m: int) -> int:
  """Rows a whole pool of m examples takes on the devices: a multiple of 256, so a pool that
  grows by a few examples (a server's /examples) keeps its compiled shapes."""
  return _round_up(m, 256)


class DevicePool(NamedTuple):
  """A pool normalised and placed on the devices once (`prepare_pool`), for many searches.

  chunks: per chunk, [chunk_rows, d] float32 unit rows (zero past the pool's end), sharded
    over the mesh's `data` axis when there is a mesh; valid: per chunk, [chunk_rows] bool.
  size: the pool's m rows; mesh: what the chunks are sharded over (None: one device).
  """
  chunks: tuple[jax.Array, ...]
  valid: tuple[jax.Array, ...]
  size: int
  mesh: Mesh | None


def prepare_pool(pool, *, chunk_size: int | None = None, mesh: Mesh | None = None) -> DevicePool:
  """`pool` [m, d] float normalised and placed for `search`: in chunks of `chunk_size` rows
  (default the whole pool in a multiple of 256 rows, `pool_rows`), rounded up to a multiple
  of the `data` axis size; each chunk sharded over it when `mesh` is given."""
  pool = _finite(np.asarray(pool, np.float32), "pool")
  if pool.shape[0] == 0:
    raise ValueError("the k-NN pool is empty")
  placed = list(_placed(pool, chunk_size or pool_rows(pool.shape[0]), mesh))
  return DevicePool(tuple(c for c, _ in placed), tuple(v for _, v in placed), pool.shape[0], mesh)


def _placed(pool: np.ndarray, chunk: int, mesh: Mesh | None):
  """(unit rows [chunk, d] float32, valid [chunk] bool) on the devices, one chunk at a time:
  each pool row is normalised once, on its way there."""
  rows = None if mesh is None else NamedSharding(mesh, P(DATA))
  chunk = _round_up(chunk, 1 if mesh is None else mesh.shape[DATA])
  for start in range(0, pool.shape[0], chunk):
    part = np.zeros((chunk, pool.shape[1]), np.float32)
    stop = min(start + chunk, pool.shape[0])
    part[:stop - start] = pool[start:stop]
    valid = jax.device_put(np.arange(chunk) < stop - start, rows)
    yield normalize(jax.device_put(part, rows)), valid


def _finite(x: np.ndarray, name: str) -> np.ndarray:
  if not np.isfinite(x).all():
    bad = np.flatnonzero(~np.isfinite(x).all(axis=1))
    raise ValueError(f"k-NN {name}: {len(bad)} row(s) hold NaN or inf (first: row {bad[0]})")
  return x


def search(queries, pool, *, k: int = 1, batch_size: int = 256, chunk_size: int | None = None,
           mesh: Mesh | None = None) -> tuple[np.ndarray, np.ndarray]:
  """The k most cosine-similar pool rows of every query.

  Args:
    queries: [n, d] float array (host or device).
    pool: [m, d] float array, kept on the host when chunked, so only one chunk at a time
      is on the devices; or a `DevicePool`, which fixes chunks and mesh.
    k: neighbours per query, 1 <= k <= m.
    batch_size: queries per compiled call.
    chunk_size: pool rows per device pass (the whole pool, in a multiple of 256 rows,
      when None); rounded up to a multiple of the `data` axis size.
    mesh: shard each pool chunk over its `data` axis; None runs on the default device.
  Returns:
    scores [n, k] float32 and indices [n, k] int32, best first, ties by lower index.
  """
  queries = _finite(np.asarray(queries, np.float32), "queries")
  if isinstance(pool, DevicePool):
    if chunk_size is not None or mesh is not None:
      raise ValueError("a DevicePool has its chunks and mesh already (prepare_pool)")
    m, mesh, chunks = pool.size, pool.mesh, zip(pool.chunks, pool.valid)
  else:
    pool = _finite(np.asarray(pool, np.float32), "pool")
    m = pool.shape[0]
    # A chunk holds at least k rows.
    chunks = _placed(pool, max(chunk_size or pool_rows(m), k), mesh)
  if not 1 <= k <= m:
    raise ValueError(f"k={k} must be between 1 and the pool size {m}")
  n = queries.shape[0]
  # Fewer queries than a batch run as the smallest power of two that holds them: one
  # query costs a one-row search, not a full batch's, in log2(batch_size) + 1 shapes.
  batch_size = min(batch_size, _power_of_two_at_least(n))
  num_batches = max(1, math.ceil(n / batch_size))
  padded = np.zeros((num_batches * batch_size, queries.shape[1]), np.float32)
  padded[:n] = queries
  if mesh is None:
    replicated = None
    step = partial(_step, k=k)
  else:
    replicated = NamedSharding(mesh, P())
    step = partial(_sharded_step, k=k, mesh=mesh)
  q_batches = [normalize(jax.device_put(padded[i * batch_size:(i + 1) * batch_size], replicated))
               for i in range(num_batches)]
  # Host arrays: built on the device they would cost a dispatch each.
  run = [(np.full((batch_size, k), -np.inf, np.float32),
          np.full((batch_size, k), _NO_INDEX, np.int32))] * num_batches
  start = 0
  for part, valid in chunks:
    run = [step(q, part, valid, np.int32(start), *state) for q, state in zip(q_batches, run)]
    start += part.shape[0]
  scores = np.concatenate([np.asarray(s) for s, _ in run])[:n]
  indices = np.concatenate([np.asarray(i) for _, i in run])[:n]
  return scores, indices


@partial(jax.jit, static_argnames=("vote",))
def _vote(labels: jax.Array, scores: jax.Array, vote: str) -> jax.Array:
  same = labels[:, :, None] == labels[:, None, :]  # [n, k, k]
  summed = jnp.sum(jnp.where(same, scores[:, None, :], 0.0), axis=-1)
  if vote == "majority":
    count = jnp.sum(same, axis=-1)
    cand = count == jnp.max(count, axis=-1, keepdims=True)
  else:
    cand = jnp.ones_like(same[..., 0])
  # Neighbours of one label sum the same terms in the same order, so their sums are equal.
  best = jnp.max(jnp.where(cand, summed, -jnp.inf), axis=-1, keepdims=True)
  cand = cand & (summed == best)
  return jnp.min(jnp.where(cand, labels, _NO_INDEX), axis=-1).astype(jnp.int32)


def vote_labels(neighbor_labels, scores, vote: str = "majority") -> np.ndarray:
  """The label each query's neighbours elect (tie rules in the module docstring).

  Args:
    neighbor_labels: [n, k] int labels of the neighbours.
    scores: [n, k] float32 their similarities.
    vote: "majority" or "weighted".
  Returns:
    [n] int32.
  """
  if vote not in VOTES:
    raise ValueError(f"vote must be one of {VOTES}, got {vote!r}")
  labels = np.asarray(neighbor_labels, np.int32)
  scores = np.asarray(scores, np.float32)
  n = labels.shape[0]
  pad = ((0, _power_of_two_at_least(n) - n), (0, 0))
  return np.asarray(_vote(np.pad(labels, pad), np.pad(scores, pad), vote))[:n]


def apply_oos_threshold(predictions, top1_scores, threshold: float, oos_label: int) -> np.ndarray:
  """`oos_label` where the nearest neighbour's similarity is below `threshold`: [n] int32."""
  return np.where(np.asarray(top1_scores) < threshold, oos_label,
                  np.asarray(predictions)).astype(np.int32)


def knn_predict(queries, pool, pool_labels, *, k: int = 1, vote: str = "majority",
                batch_size: int = 256, chunk_size: int | None = None, mesh: Mesh | None = None,
                oos_threshold: float | None = None, oos_label: int | None = None) -> KNNResult:
  """k-NN intent prediction by cosine similarity.

  Args:
    queries: [n, d] float encodings to classify.
    pool: [m, d] float encodings of the labelled examples, or a `DevicePool` of them.
    pool_labels: [m] int labels of the pool.
    k, batch_size, chunk_size, mesh: as in `search`.
    vote: "majority" or "weighted", used when k > 1.
    oos_threshold: when given, a query whose nearest neighbour has similarity below it
      is predicted `oos_label`.
  Returns:
    KNNResult.
  """
  if (oos_threshold is None) != (oos_label is None):
    raise ValueError("oos_threshold and oos_label go together")
  pool_labels = np.asarray(pool_labels, np.int32)
  scores, indices = search(queries, pool, k=k, batch_size=batch_size, chunk_size=chunk_size,
                           mesh=mesh)
  predictions = vote_labels(pool_labels[indices], scores, vote)
  if oos_threshold is not None:
    predictions = apply_oos_threshold(predictions, scores[:, 0], oos_threshold, oos_label)
  return KNNResult(predictions, indices, scores)


def prototypes(pool, pool_labels) -> tuple[np.ndarray, np.ndarray]:
  """Each intent's prototype: the L2-normalised mean of its pool rows' unit encodings.

  Args:
    pool: [m, d] float encodings; pool_labels: [m] int.
  Returns:
    ([c, d] float32 prototypes, [c] int32 their labels) for the c labels the pool has; a
    1-NN search over them (`knn_predict`) is nearest-prototype classification.
  """
  pool = _finite(np.asarray(pool, np.float32), "pool")
  unit = pool / np.maximum(np.linalg.norm(pool, axis=1, keepdims=True), 1e-12)
  labels, inverse = np.unique(np.asarray(pool_labels), return_inverse=True)
  sums = np.zeros((len(labels), pool.shape[1]), np.float32)
  np.add.at(sums, inverse.reshape(-1), unit)
  return sums / np.maximum(np.linalg.norm(sums, axis=1, keepdims=True), 1e-12), labels.astype(np.int32)


def explain(result: KNNResult, i: int, pool_texts, pool_labels, label_names=None
            ) -> list[tuple[str, int | str, float]]:
  """The neighbours behind prediction i: (pool text, label or label name, similarity), best first."""
  out = []
  for j, s in zip(result.indices[i], result.scores[i]):
    label = int(pool_labels[j])
    out.append((pool_texts[j], label if label_names is None else label_names[label], float(s)))
  return out


def oos_metrics(predictions, labels, oos_label: int) -> dict[str, float]:
  """In-scope accuracy (over in-scope queries; a rejection counts as an error), OOS
  recall (share of out-of-scope queries predicted `oos_label`) and OOS precision (share of
  the queries predicted `oos_label` that are out of scope; 0 when none is)."""
  predictions, labels = np.asarray(predictions), np.asarray(labels)
  in_scope = labels != oos_label
  if not in_scope.any() or in_scope.all():
    raise ValueError("need both in-scope and out-of-scope queries")
  rejected = predictions == oos_label
  return {"in_scope_accuracy": float(np.mean(predictions[in_scope] == labels[in_scope])),
          "oos_recall": float(np.mean(rejected[~in_scope])),
          "oos_precision": float(np.mean(~in_scope[rejected])) if rejected.any() else 0.0}


def choose_oos_threshold(top1_scores, predictions, labels, oos_label: int) -> float:
  """The similarity threshold that maximises in-scope accuracy + OOS recall on validation data.

  The objective weighs the two rates equally (their sum), whatever the share of OOS
  queries. Candidates are -inf (reject nothing), the midpoints between consecutive
  distinct top-1 scores, and +inf (reject everything); among equally good ones the lowest
  wins, which rejects the fewest queries.

  Args:
    top1_scores: [n] float, similarity of each validation query's nearest neighbour.
    predictions: [n] int, the k-NN predictions before thresholding.
    labels: [n] int, true labels, `oos_label` for out-of-scope queries.
  Returns:
    the threshold, for `apply_oos_threshold` / `knn_predict(oos_threshold=...)`.
  """
  s = np.asarray(top1_scores, np.float64)
  predictions, labels = np.asarray(predictions), np.asarray(labels)
  in_scope = labels != oos_label
  if not in_scope.any() or in_scope.all():
    raise ValueError("need both in-scope and out-of-scope validation queries")
  order = np.argsort(s, kind="stable")
  s, predictions, labels, in_scope = s[order], predictions[order], labels[order], in_scope[order]
  # Rejecting the i lowest-scoring queries loses the in-scope hits among them and wins
  # the out-of-scope queries among them that were not already predicted oos.
  lost = np.concatenate([[0], np.cumsum(in_scope & (predictions == labels))])
  won = np.concatenate([[0], np.cumsum(~in_scope & (predictions != oos_label))])
  hits = np.sum(in_scope & (predictions == labels))
  caught = np.sum(~in_scope & (predictions == oos_label))
  objective = (hits - lost) / in_scope.sum() + (caught + won) / (~in_scope).sum()
  # Only cuts between distinct scores are thresholds: 0, the change points, and n.
  cuts = np.concatenate([[0], np.flatnonzero(np.diff(s) > 0) + 1, [len(s)]])
  best = cuts[np.argmax(objective[cuts])]
  if best == 0:
    return -math.inf
  if best == len(s):
    return math.inf
  return float((s[best - 1] + s[best]) / 2)
