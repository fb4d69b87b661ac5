"""convfit_jax.knn against a NumPy brute force: ties, votes, chunks, 8-device sharding, OOS."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from convfit_jax.evaluators import knn
from convfit_jax.sharding import make_mesh


def _brute_force(queries, pool, k):
  """float64 cosine scores; order by score descending, then lower pool index."""
  q, p = np.asarray(queries, np.float64), np.asarray(pool, np.float64)
  q = q / np.sqrt(np.sum(q * q, axis=1, keepdims=True))
  p = p / np.sqrt(np.sum(p * p, axis=1, keepdims=True))
  # Not a BLAS matmul: its rounding depends on the column's position, so equal pool rows
  # could score differently; a per-pair sum treats every pair alike.
  s = np.sum(q[:, None, :] * p[None, :, :], axis=-1)
  idx = np.stack([np.lexsort((np.arange(len(p)), -row))[:k] for row in s])
  return np.take_along_axis(s, idx, 1), idx


def _brute_vote(labels, scores, vote):
  out = []
  for lab, sc in zip(labels, scores):
    best = None
    for c in sorted(set(lab.tolist())):
      count = int(np.sum(lab == c))
      total = float(np.sum(sc[lab == c]))
      key = (count, total, -c) if vote == "majority" else (total, -c)
      if best is None or key > best[0]:
        best = (key, c)
    out.append(best[1])
  return np.array(out, np.int32)


def _random_data(seed, n=70, m=300, d=24):
  rng = np.random.default_rng(seed)
  pool = rng.normal(size=(m, d)).astype(np.float32)
  pool[150] = pool[3]          # exact duplicates: tie must go to the lower index
  pool[299] = pool[3]
  pool[40] = 2.0 * pool[7]     # same direction, different norm: a cosine tie too
  queries = rng.normal(size=(n, d)).astype(np.float32)
  queries[:10] = pool[[3, 7, 150, 40, 299, 3, 7, 11, 12, 13]] + 0.01 * rng.normal(
      size=(10, d)).astype(np.float32)
  labels = rng.integers(0, 9, size=m).astype(np.int32)
  return queries, pool, labels


def _tie_heavy_data(seed, n=50, m=200, d=12):
  """Rows with four +-1 entries: unit vectors of entries +-0.5, so every cosine is an
  exact multiple of 1/16 in float32 and ties are everywhere."""
  rng = np.random.default_rng(seed)

  def rows(count):
    x = np.zeros((count, d), np.float32)
    for r in x:
      r[rng.choice(d, 4, replace=False)] = rng.choice([-1.0, 1.0], 4)
    return x

  return rows(n), rows(m), rng.integers(0, 5, size=m).astype(np.int32)


def _assert_well_separated(queries, pool, k):
  # Distinct float64 scores around the top k must differ by far more than float32 error,
  # so any disagreement is a real bug and not rounding.
  s, _ = _brute_force(queries, pool, k + 1)
  gaps = np.abs(np.diff(s, axis=1))
  assert np.all((gaps == 0) | (gaps > 1e-5))


def test_top_k_breaks_ties_by_lower_index():
  _, idx = jax.lax.top_k(jnp.array([[1.0, 3.0, 3.0, 2.0, 3.0, 3.0]]), 3)
  assert idx.tolist() == [[1, 2, 4]]


@pytest.mark.parametrize("k", [1, 3, 7])
def test_search_matches_brute_force_with_ties(k):
  queries, pool, _ = _random_data(0)
  _assert_well_separated(queries, pool, k)
  scores, idx = knn.search(queries, pool, k=k, batch_size=32)
  want_s, want_i = _brute_force(queries, pool, k)
  np.testing.assert_array_equal(idx, want_i)
  np.testing.assert_allclose(scores, want_s, atol=1e-6)
  assert idx.shape == (70, k) and idx.dtype == np.int32 and scores.dtype == np.float32
  # The query near pool[3] finds the copies 3, 150, 299 in index order.
  if k >= 3:
    assert idx[0, :3].tolist() == [3, 150, 299]


@pytest.mark.parametrize("k", [1, 5])
def test_search_exact_ties_everywhere(k):
  queries, pool, _ = _tie_heavy_data(1)
  scores, idx = knn.search(queries, pool, k=k, batch_size=16)
  want_s, want_i = _brute_force(queries, pool, k)
  np.testing.assert_array_equal(idx, want_i)
  np.testing.assert_array_equal(scores, want_s.astype(np.float32))
  # Ties really are present at the top.
  assert np.sum(want_s[:, 0] == _brute_force(queries, pool, k + 1)[0][:, 1]) > 10


@pytest.mark.parametrize("vote", ["majority", "weighted"])
@pytest.mark.parametrize("data", [_random_data, _tie_heavy_data])
def test_votes_match_brute_force(vote, data):
  queries, pool, labels = data(2)
  for k in (1, 4, 6):
    result = knn.knn_predict(queries, pool, labels, k=k, vote=vote, batch_size=32)
    want_s, want_i = _brute_force(queries, pool, k)
    np.testing.assert_array_equal(result.indices, want_i)
    np.testing.assert_array_equal(result.predictions, _brute_vote(labels[want_i], want_s, vote))


def test_votes_compile_once_per_power_of_two_rows():
  rng = np.random.default_rng(0)
  before = knn._vote._cache_size()  # pylint: disable=protected-access
  for n in range(33, 65):  # one size class: 64 rows
    labels = rng.integers(0, 5, (n, 3))
    scores = rng.random((n, 3)).astype(np.float32)
    np.testing.assert_array_equal(knn.vote_labels(labels, scores),
                                  _brute_vote(labels, scores, "majority"))
  assert knn._vote._cache_size() <= before + 1  # pylint: disable=protected-access


def test_search_compiles_per_power_of_two_queries_and_pool_block():
  rng = np.random.default_rng(1)
  pool = rng.normal(size=(300, 8)).astype(np.float32)
  before = knn._step._cache_size()  # pylint: disable=protected-access
  for n, m in ((9, 290), (16, 297), (12, 300)):  # 16 queries, a pool of 512 rows
    q = rng.normal(size=(n, 8)).astype(np.float32)
    scores, indices = knn.search(q, pool[:m], k=3)
    ref_scores, ref_indices = _brute_force(q, pool[:m], 3)
    np.testing.assert_array_equal(indices, ref_indices)
    np.testing.assert_allclose(scores, ref_scores, atol=1e-5)
  assert knn._step._cache_size() <= before + 1  # pylint: disable=protected-access
  assert knn.pool_rows(256) == 256 and knn.pool_rows(257) == 512


def test_vote_tie_rules():
  labels = np.array([[4, 2, 2, 4], [4, 2, 2, 4], [5, 1, 1, 5], [3, 3, 0, 0]])
  scores = np.array([[0.9, 0.8, 0.8, 0.6], [0.9, 0.8, 0.8, 0.8], [0.5, 0.5, 0.5, 0.5],
                     [0.9, -0.5, 0.3, 0.2]], np.float32)
  # Two labels with two votes each: higher summed similarity, then lower label id.
  np.testing.assert_array_equal(knn.vote_labels(labels, scores, "majority"), [2, 4, 1, 0])
  np.testing.assert_array_equal(knn.vote_labels(labels, scores, "weighted"), [2, 4, 1, 0])
  with pytest.raises(ValueError):
    knn.vote_labels(labels, scores, "plurality")


@pytest.mark.parametrize("data", [_random_data, _tie_heavy_data])
def test_chunked_and_sharded_agree_exactly(data):
  assert jax.device_count() == 8
  queries, pool, labels = data(3)
  mesh = make_mesh()
  want = knn.knn_predict(queries, pool, labels, k=5, batch_size=32)
  variants = {
      "chunked": dict(chunk_size=37),
      "chunk of one row per step": dict(chunk_size=5),
      "sharded": dict(mesh=mesh),
      "sharded and chunked": dict(mesh=mesh, chunk_size=50),
  }
  variants = {**variants, "whole": {}}
  for name, kw in variants.items():
    # The same pool placed once (a classifier's, a server's) gives the same bits.
    for placed in (False, True):
      where = knn.prepare_pool(pool, **kw) if placed else pool
      got = knn.knn_predict(queries, where, labels, k=5, batch_size=32, **({} if placed else kw))
      msg = f"{name}, {'placed once' if placed else 'placed per call'}"
      np.testing.assert_array_equal(got.indices, want.indices, err_msg=msg)
      np.testing.assert_array_equal(got.scores, want.scores, err_msg=msg)
      np.testing.assert_array_equal(got.predictions, want.predictions, err_msg=msg)


def test_sharded_step_gathers_across_devices():
  mesh = make_mesh()
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  pool = jax.device_put(np.zeros((64, 24), np.float32), rows)
  assert len(pool.sharding.device_set) == 8
  compiled = knn._sharded_step.lower(
      jnp.zeros((8, 24)), pool, jnp.ones((64,), bool), jnp.int32(0), jnp.zeros((8, 2)),
      jnp.zeros((8, 2), jnp.int32), k=2, mesh=mesh).compile()
  assert "all-gather" in compiled.as_text()


def test_search_rejects_bad_k():
  with pytest.raises(ValueError):
    knn.search(np.ones((2, 3)), np.ones((4, 3)), k=5)
  with pytest.raises(ValueError, match="k=5 must be between 1 and the pool size 4"):
    knn.search(np.ones((2, 3)), knn.prepare_pool(np.ones((4, 3))), k=5)


def test_a_placed_pool_keeps_its_chunks_and_refuses_bad_rows():
  placed = knn.prepare_pool(np.ones((4, 3)))
  assert placed.size == 4 and [c.shape for c in placed.chunks] == [(256, 3)]
  with pytest.raises(ValueError, match="has its chunks and mesh already"):
    knn.search(np.ones((2, 3)), placed, chunk_size=2)
  with pytest.raises(ValueError, match="pool: 1 row"):
    knn.prepare_pool(np.array([[1.0, np.nan, 0.0]]))
  with pytest.raises(ValueError, match="empty"):
    knn.prepare_pool(np.zeros((0, 3)))


def test_oos_threshold_and_metrics():
  oos = 9
  # Sorted by top-1 score: 0.2 oos, 0.3 hit, 0.4 oos, 0.65 oos, 0.7 miss, 0.8 hit, 0.9 hit.
  top1 = np.array([0.9, 0.8, 0.7, 0.3, 0.4, 0.2, 0.65])
  preds = np.array([1, 2, 5, 3, 1, 2, 3])
  labels = np.array([1, 2, 3, 3, oos, oos, oos])
  t = knn.choose_oos_threshold(top1, preds, labels, oos)
  # Rejecting the four lowest gives 2/4 + 3/3, as does also rejecting the 0.7 miss; the
  # lower threshold wins the tie. Every other cut is worse.
  assert t == pytest.approx(0.675)
  out = knn.apply_oos_threshold(preds, top1, t, oos)
  assert out.tolist() == [1, 2, 5, oos, oos, oos, oos]
  m = knn.oos_metrics(out, labels, oos)
  # Four rejected, three of them out of scope.
  assert m == {"in_scope_accuracy": 0.5, "oos_recall": 1.0, "oos_precision": 0.75}
  for cut in [-np.inf, 0.25, 0.35, 0.5, 0.75, 0.85, np.inf]:
    alt = knn.oos_metrics(knn.apply_oos_threshold(preds, top1, cut, oos), labels, oos)
    assert alt["in_scope_accuracy"] + alt["oos_recall"] < 1.5 or cut == 0.75
  # Below the threshold the answer is oos; at or above it, the k-NN label.
  assert knn.apply_oos_threshold([4, 4], [0.55, 0.5499], 0.55, oos).tolist() == [4, oos]
  # Nothing to gain from rejecting: the threshold rejects nothing.
  assert knn.choose_oos_threshold([0.5, 0.6], [1, oos], [1, oos], oos) == -np.inf
  with pytest.raises(ValueError):
    knn.oos_metrics(preds, np.ones(7), oos)


def test_knn_predict_with_oos_threshold():
  queries, pool, labels = _random_data(5)
  plain = knn.knn_predict(queries, pool, labels, k=3)
  t = float(np.median(plain.scores[:, 0]))
  got = knn.knn_predict(queries, pool, labels, k=3, oos_threshold=t, oos_label=99)
  low = plain.scores[:, 0] < t
  assert 0 < low.sum() < len(low)
  np.testing.assert_array_equal(got.predictions[low], 99)
  np.testing.assert_array_equal(got.predictions[~low], plain.predictions[~low])
  with pytest.raises(ValueError):
    knn.knn_predict(queries, pool, labels, oos_threshold=t)


def test_explain_lists_neighbours():
  pool = np.eye(3, dtype=np.float32)
  result = knn.knn_predict(np.array([[1.0, 0.5, 0.0]], np.float32), pool, [0, 1, 2], k=2)
  got = knn.explain(result, 0, ["a", "b", "c"], [0, 1, 2], label_names=["x", "y", "z"])
  assert [(t, l) for t, l, _ in got] == [("a", "x"), ("b", "y")]
  assert got[0][2] == pytest.approx(1 / np.sqrt(1.25), abs=1e-6)


def test_prototypes_are_unit_means_of_unit_rows_and_classify_by_the_nearest():
  pool = np.array([[3.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, -2.0]], np.float32)
  labels = np.array([4, 4, 1, 1])
  centres, centre_labels = knn.prototypes(pool, labels)
  assert centre_labels.tolist() == [1, 4] and centre_labels.dtype == np.int32
  mean_1 = np.array([1 / np.sqrt(2), 1 / np.sqrt(2) - 1]) / 2
  np.testing.assert_allclose(centres[0], mean_1 / np.linalg.norm(mean_1), rtol=1e-6)
  np.testing.assert_allclose(centres[1], [1 / np.sqrt(2), 1 / np.sqrt(2)], rtol=1e-6)
  # [0, 0.9] is nearest a pool row of intent 4 and nearest intent 4's mean; [0.2, -1] intent 1's.
  queries = np.array([[0.0, 0.9], [0.2, -1.0]], np.float32)
  assert knn.knn_predict(queries, centres, centre_labels).predictions.tolist() == [4, 1]
