"""Parity of convfit_jax.losses with sentence-transformers 6.3.0, padding, gradients, sharding."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from convfit_jax import losses
from convfit_jax.models import heads
from convfit_jax.sharding import DATA, make_mesh
import sentence_transformers
from sentence_transformers.sentence_transformer import losses as st_losses

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_pinned_sentence_transformers():
  # OnlineContrastiveLoss's hard-pair rule changed across releases; the parity below is to 6.3.0.
  assert sentence_transformers.__version__ == "6.3.0"


class _EmbeddingModel(torch.nn.Module):
  """Stands in for a SentenceTransformer: the 'features' already are the embeddings."""

  device = torch.device("cpu")

  def forward(self, features):
    return {"sentence_embedding": features["emb"]}


def _pairs(seed, b=12, d=8, frac_pos=0.5):
  rng = np.random.default_rng(seed)
  u = rng.normal(size=(b, d)).astype(np.float32)
  v = (u + rng.normal(scale=1.2, size=(b, d))).astype(np.float32)
  labels = (rng.random(b) < frac_pos).astype(np.int32)
  return u, v, labels


def _t(x):
  return torch.tensor(np.asarray(x))


def _st_pair_loss(loss, u, v, labels):
  return float(loss.compute_loss_from_embeddings([_t(u), _t(v)], _t(labels)))


# --- mneg ---------------------------------------------------------------------------------


@pytest.mark.parametrize("symmetric", [False, True])
def test_mneg_matches_sentence_transformers(symmetric):
  rng = np.random.default_rng(0)
  c = rng.normal(size=(10, 16)).astype(np.float32)
  r = (c + rng.normal(size=(10, 16))).astype(np.float32)
  cls = (st_losses.MultipleNegativesSymmetricRankingLoss if symmetric
         else st_losses.MultipleNegativesRankingLoss)
  want = float(cls(model=_EmbeddingModel(), scale=20.0).compute_loss_from_embeddings(
      [_t(c), _t(r)], None))
  got = losses.mneg_loss(c, r, scale=20.0, symmetric=symmetric)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  # All-distinct response ids mask nothing: still the sentence-transformers value.
  got_ids = losses.mneg_loss(c, r, symmetric=symmetric, response_ids=jnp.arange(10))
  np.testing.assert_allclose(got_ids, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("symmetric", [False, True])
def test_mneg_masks_duplicate_responses(symmetric):
  rng = np.random.default_rng(1)
  r = rng.normal(size=(6, 8)).astype(np.float32)
  r[4] = r[1]  # contexts 1 and 4 share one response text
  c = (r + 0.3 * rng.normal(size=(6, 8))).astype(np.float32)
  ids = np.array([0, 1, 2, 3, 1, 5], np.int32)
  plain = losses.mneg_loss(c, r, symmetric=symmetric)
  masked = losses.mneg_loss(c, r, symmetric=symmetric, response_ids=ids)
  # Without masking, rows 1 and 4 see their own response twice: about log 2 each.
  assert float(plain) - float(masked) > 0.1
  # Reference: drop the duplicate column from the rows that own it, by hand.
  s = 20.0 * (c / np.linalg.norm(c, axis=1, keepdims=True)) @ (
      r / np.linalg.norm(r, axis=1, keepdims=True)).T
  s = s.astype(np.float64)
  dup = (ids[:, None] == ids[None, :]) & ~np.eye(6, dtype=bool)
  s_masked = np.where(dup, -np.inf, s)

  def ce(m):
    return np.log(np.exp(m).sum(1)) - np.diag(s)

  want = ce(s_masked)
  if symmetric:
    want = 0.5 * (want + ce(s_masked.T))
  np.testing.assert_allclose(masked, want.mean(), rtol=1e-5, atol=1e-6)


def test_mneg_padding_rows_change_nothing():
  rng = np.random.default_rng(2)
  c = rng.normal(size=(7, 8)).astype(np.float32)
  r = rng.normal(size=(7, 8)).astype(np.float32)
  pad = np.zeros((3, 8), np.float32)
  pad_r = rng.normal(size=(3, 8)).astype(np.float32)  # a non-zero padding candidate must not count
  cp, rp = np.concatenate([c, pad]), np.concatenate([r, pad_r])
  w = np.array([1.0] * 7 + [0.0] * 3, np.float32)
  for symmetric in (False, True):
    f = jax.jit(lambda c_, r_, w_=None: losses.mneg_loss(c_, r_, symmetric=symmetric, weights=w_))
    np.testing.assert_allclose(f(cp, rp, w), f(c, r), rtol=1e-6)
    assert abs(float(f(cp, rp)) - float(f(c, r))) > 1e-3  # unmasked padding would show
    gc, gr = jax.grad(lambda a, b: f(a, b, w), argnums=(0, 1))(cp, rp)
    gc0, gr0 = jax.grad(f, argnums=(0, 1))(c, r)
    np.testing.assert_allclose(gc[:7], gc0, atol=1e-6)
    np.testing.assert_allclose(gr[:7], gr0, atol=1e-6)
    assert np.all(gc[7:] == 0) and np.all(gr[7:] == 0)


def test_mneg_sharded_equals_single_device():
  assert jax.device_count() == 8
  b, d = 16, 8
  rng = np.random.default_rng(3)
  c = rng.normal(size=(b, d)).astype(np.float32)
  r = rng.normal(size=(b, d)).astype(np.float32)
  # The hardest negative of context i is the response of row (i + 8) % 16: on another shard.
  r = np.concatenate([r[:8], r[:8] + 0.05 * rng.normal(size=(8, d)).astype(np.float32)])
  ids = np.arange(b, dtype=np.int32)
  ids[12] = ids[3]
  w = np.ones(b, np.float32)
  w[-1] = 0.0

  def loss(c_, r_, w_, ids_):
    return losses.mneg_loss(c_, r_, symmetric=True, weights=w_, response_ids=ids_)

  want, want_g = jax.value_and_grad(loss, argnums=(0, 1))(c, r, w, ids)
  mesh = make_mesh()
  rows = NamedSharding(mesh, P(DATA))
  args = [jax.device_put(x, rows) for x in (c, r, w, ids)]
  assert len(args[0].sharding.device_set) == 8
  got, got_g = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(*args)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  for g, wg in zip(got_g, want_g):
    np.testing.assert_allclose(g, wg, rtol=1e-5, atol=1e-5)


# --- Stage 2 --------------------------------------------------------------------------------


def _st_smax(u, v, labels, clf):
  loss = st_losses.SoftmaxLoss(_EmbeddingModel(), embedding_dimension=u.shape[1], num_labels=2)
  with torch.no_grad():
    loss.classifier.weight.copy_(_t(np.asarray(clf.kernel[...]).T))
    loss.classifier.bias.copy_(_t(np.asarray(clf.bias[...])))
  with torch.no_grad():
    return float(loss([{"emb": _t(u)}, {"emb": _t(v)}], _t(labels).long()))


@pytest.mark.parametrize("seed", [0, 1])
def test_stage2_losses_match_sentence_transformers(seed):
  u, v, labels = _pairs(seed)
  clf = heads.PairClassifier(u.shape[1], rngs=nnx.Rngs(seed))
  want = {
      "smax": _st_smax(u, v, labels, clf),
      "cos": _st_pair_loss(st_losses.CosineSimilarityLoss(_EmbeddingModel()), u, v,
                           np.where(labels == 1, 0.8, 0.3).astype(np.float32)),
      "ocl": _st_pair_loss(st_losses.OnlineContrastiveLoss(_EmbeddingModel()), u, v, labels),
      "cl": _st_pair_loss(st_losses.ContrastiveLoss(_EmbeddingModel()), u, v, labels),
  }
  for name, fn in losses.STAGE2_LOSSES.items():
    got = fn(u, v, labels, None, params=clf)
    np.testing.assert_allclose(got, want[name], rtol=1e-5, atol=1e-5, err_msg=name)
  # The classifier can also be passed as plain arrays.
  params = {"kernel": clf.kernel[...], "bias": clf.bias[...]}
  np.testing.assert_allclose(losses.smax_loss(u, v, labels, params=params), want["smax"],
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("labels", [[1] * 6, [0] * 6, [1, 1, 0, 0, 2, 0]])
def test_ocl_matches_sentence_transformers_edge_batches(labels):
  # One-class batches use the mean-distance fallback; label 2 is ignored.
  u, v, _ = _pairs(5, b=6)
  labels = np.asarray(labels, np.int32)
  st = st_losses.OnlineContrastiveLoss(_EmbeddingModel())
  with pytest.warns(UserWarning) if (labels > 1).any() else contextlib.nullcontext():
    want = _st_pair_loss(st, u, v, labels)
  np.testing.assert_allclose(losses.ocl_loss(u, v, labels), want, rtol=1e-5, atol=1e-6)


def test_ocl_mean_reduction_is_sum_over_real_pairs():
  u, v, labels = _pairs(6, b=10)
  w = np.array([1.0] * 8 + [0.0] * 2, np.float32)
  total = losses.ocl_loss(u, v, labels, w, reduction="sum")
  mean = losses.ocl_loss(u, v, labels, w, reduction="mean")
  assert float(total) > 0
  np.testing.assert_allclose(mean, total / 8.0, rtol=1e-6)
  with pytest.raises(ValueError):
    losses.ocl_loss(u, v, labels, reduction="max")


@pytest.mark.parametrize("name", sorted(losses.STAGE2_LOSSES))
def test_stage2_padding_rows_change_nothing(name):
  u, v, labels = _pairs(7, b=10)
  clf = heads.PairClassifier(u.shape[1], rngs=nnx.Rngs(0))
  fn = losses.STAGE2_LOSSES[name]
  # Padding rows chosen to move ocl's thresholds if they were counted: a positive pair far
  # apart (raises the max positive distance) and a negative pair that is identical
  # (lowers the min negative distance); plus an all-zero row.
  up = np.concatenate([u, [u[0], u[1]], np.zeros_like(u[:1])])
  vp = np.concatenate([v, [-u[0], u[1]], np.zeros_like(u[:1])])
  lp = np.concatenate([labels, [1, 0, 1]]).astype(np.int32)
  w = np.array([1.0] * 10 + [0.0] * 3, np.float32)

  def f(a, b, lab, w_):
    return fn(a, b, lab, w_, params=clf)

  want, (gu0, gv0) = jax.value_and_grad(f, argnums=(0, 1))(u, v, labels, None)
  got, (gu, gv) = jax.value_and_grad(f, argnums=(0, 1))(up, vp, lp, w)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(gu[:10], gu0, atol=1e-6)
  np.testing.assert_allclose(gv[:10], gv0, atol=1e-6)
  assert np.all(np.isfinite(gu)) and np.all(gu[10:] == 0) and np.all(gv[10:] == 0)
  # The same rows with weight 1 do change the loss, so the test can tell.
  assert abs(float(f(up, vp, lp, np.ones(13, np.float32))) - float(want)) > 1e-4


@pytest.mark.parametrize("name", sorted(losses.STAGE2_LOSSES))
def test_stage2_gradients_finite_for_identical_and_orthogonal(name):
  eye = np.eye(4, dtype=np.float32)
  clf = heads.PairClassifier(4, rngs=nnx.Rngs(0))
  fn = losses.STAGE2_LOSSES[name]
  cases = {"identical": (eye, eye.copy()), "orthogonal": (eye, np.roll(eye, 1, axis=0))}
  for case, (u, v) in cases.items():
    for labels in ([1, 1, 0, 0], [1, 0, 1, 0]):
      grads = jax.grad(lambda a, b: fn(a, b, jnp.asarray(labels), None, params=clf),
                       argnums=(0, 1))(u, v)
      for g in grads:
        assert np.all(np.isfinite(g)), (name, case, labels)


def test_mneg_gradients_finite_for_identical_and_orthogonal():
  eye = np.eye(4, dtype=np.float32)
  for r in (eye, np.roll(eye, 1, axis=0), np.ones((4, 4), np.float32)):
    for symmetric in (False, True):
      grads = jax.grad(lambda a, b: losses.mneg_loss(a, b, symmetric=symmetric),
                       argnums=(0, 1))(eye, r)
      assert all(np.all(np.isfinite(g)) for g in grads)


def test_pair_classifier_is_trainable_with_nnx():
  u, v, labels = _pairs(8, b=16)
  clf = heads.PairClassifier(u.shape[1], rngs=nnx.Rngs(0))
  loss, grads = nnx.value_and_grad(lambda m: losses.smax_loss(u, v, labels, params=m))(clf)
  assert np.isfinite(float(loss))
  assert grads.kernel[...].shape == (3 * u.shape[1], 2)
  assert float(jnp.abs(grads.kernel[...]).sum()) > 0


# --- Stage 2 on label batches: every pair of the batch, supervised contrast -------------------


def _batch(seed, n=12, d=6, num_labels=4):
  rng = np.random.default_rng(seed)
  emb = rng.normal(size=(n, d)).astype(np.float32)
  labels = rng.integers(0, num_labels, size=n).astype(np.int32)
  return emb, labels


def _cos(a, b):
  return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _dense_pair_reference(emb, labels, w, loss, negative_ratio, clf=None, margin=0.5):
  """Every pair i < j by loops: (value of pair, is positive, weight), then the loss's rule."""
  pairs = [(i, j) for i in range(len(emb)) for j in range(i + 1, len(emb)) if w[i] * w[j] > 0]
  pos = [labels[i] == labels[j] for i, j in pairs]
  weight = [float(w[i] * w[j]) for i, j in pairs]
  n_pos = sum(wt for wt, p in zip(weight, pos) if p)
  n_neg = sum(wt for wt, p in zip(weight, pos) if not p)
  if negative_ratio > 0 and n_pos > 0:
    weight = [wt if p else wt * negative_ratio * n_pos / n_neg for wt, p in zip(weight, pos)]
  if loss == "cos":
    terms = [(_cos(emb[i], emb[j]) - (0.8 if p else 0.3)) ** 2 for (i, j), p in zip(pairs, pos)]
  elif loss == "cl":
    terms = [0.5 * ((1 - _cos(emb[i], emb[j])) ** 2 if p else max(0.0, margin - 1 + _cos(emb[i], emb[j])) ** 2)
             for (i, j), p in zip(pairs, pos)]
  elif loss == "smax":
    kernel, bias = np.asarray(clf.kernel[...]), np.asarray(clf.bias[...])
    terms = []
    for (i, j), p in zip(pairs, pos):
      logits = np.concatenate([emb[i], emb[j], np.abs(emb[i] - emb[j])]) @ kernel + bias
      terms.append(float(np.log(np.exp(logits).sum()) - logits[int(p)]))
  else:  # ocl: hard pairs against the thresholds of this batch's pairs
    dist = [1 - _cos(emb[i], emb[j]) for i, j in pairs]
    dp = [x for x, p in zip(dist, pos) if p]
    dn = [x for x, p in zip(dist, pos) if not p]
    terms = []
    for x, p in zip(dist, pos):
      if p:
        terms.append(x ** 2 if x > (min(dn) if dn else np.mean(dp)) else 0.0)
      else:
        terms.append(max(0.0, margin - x) ** 2 if x < (max(dp) if dp else np.mean(dn)) else 0.0)
  return sum(wt * t for wt, t in zip(weight, terms)) / sum(weight)


@pytest.mark.parametrize("negative_ratio", [0.0, 6.0])
@pytest.mark.parametrize("name", ["ocl", "cos", "cl", "smax"])
def test_dense_pair_losses_match_loop_reference(name, negative_ratio):
  clf = heads.PairClassifier(6, rngs=nnx.Rngs(0))
  for seed in (0, 1):
    emb, labels = _batch(seed)
    w = np.ones(len(emb), np.float32)
    w[-2:] = [0.0, 0.5]  # a padding row and a half-weight row
    got = losses.DENSE_LOSSES[name](emb, labels, w, params=clf, negative_ratio=negative_ratio)
    want = _dense_pair_reference(emb, labels, w, name, negative_ratio, clf)
    np.testing.assert_allclose(float(got), want, rtol=1e-5, atol=1e-6)


def _supcon_reference(emb, labels, w, scale, denominator):
  n = len(emb)
  s = [[scale * _cos(emb[i], emb[j]) for j in range(n)] for i in range(n)]
  total, weight = 0.0, 0.0
  for i in range(n):
    if w[i] == 0:
      continue
    positives = [p for p in range(n) if p != i and w[p] > 0 and labels[p] == labels[i]]
    if not positives:
      continue
    terms = []
    for p in positives:
      if denominator == "all":
        cands = [a for a in range(n) if a != i and w[a] > 0]
      else:
        cands = [p] + [a for a in range(n) if w[a] > 0 and labels[a] != labels[i]]
      terms.append(-(s[i][p] - np.log(sum(np.exp(s[i][a]) for a in cands))))
    total += w[i] * np.mean(terms)
    weight += w[i]
  return total / weight


@pytest.mark.parametrize("denominator", ["all", "negatives"])
def test_supcon_matches_loop_reference(denominator):
  for seed in (0, 1, 2):
    emb, labels = _batch(seed, n=10, num_labels=3)
    labels[0] = 7  # an intent alone in the batch: a negative to the others, never an anchor
    w = np.ones(len(emb), np.float32)
    w[3] = 0.0
    for scale in (1.0, 20.0):
      got = losses.supcon_loss(emb, labels, w, scale=scale, denominator=denominator)
      want = _supcon_reference(emb.astype(np.float64), labels, w, scale, denominator)
      np.testing.assert_allclose(float(got), want, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="denominator"):
    losses.supcon_loss(emb, labels, denominator="some")


@pytest.mark.parametrize("name", sorted(losses.DENSE_LOSSES))
def test_dense_padding_rows_change_nothing(name):
  clf = heads.PairClassifier(6, rngs=nnx.Rngs(0))
  emb, labels = _batch(5, n=10)
  # Padding rows that would move every threshold if counted: copies of real rows under
  # their own and under other labels, and an all-zero row.
  pad = np.concatenate([emb[:2], -emb[2:3], np.zeros((1, 6), np.float32)])
  pad_labels = np.array([labels[0], (labels[1] + 1) % 4, labels[2], labels[3]], np.int32)
  ep, lp = np.concatenate([emb, pad]), np.concatenate([labels, pad_labels])
  w = np.array([1.0] * 10 + [0.0] * 4, np.float32)
  fn = lambda e, lab, w_: losses.DENSE_LOSSES[name](e, lab, w_, params=clf)
  want, g0 = jax.value_and_grad(fn)(emb, labels, None)
  got, g = jax.value_and_grad(fn)(ep, lp, w)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(g[:10], g0, atol=1e-6)
  assert np.all(np.isfinite(g)) and np.all(g[10:] == 0)
  assert abs(float(fn(ep, lp, np.ones(14, np.float32))) - float(want)) > 1e-4


@pytest.mark.parametrize("name", sorted(losses.DENSE_LOSSES))
def test_dense_sharded_equals_single_device(name):
  assert jax.device_count() == 8
  clf = heads.PairClassifier(6, rngs=nnx.Rngs(0))
  emb, labels = _batch(8, n=16)
  # Each row's positives and hardest negatives sit on other shards.
  labels = (np.arange(16) % 5).astype(np.int32)
  w = np.ones(16, np.float32)
  w[-1] = 0.0
  fn = lambda e, lab, w_: losses.DENSE_LOSSES[name](e, lab, w_, params=clf)
  want, want_g = jax.value_and_grad(fn)(emb, labels, w)
  rows = NamedSharding(make_mesh(), P(DATA))
  args = [jax.device_put(x, rows) for x in (emb, labels, w)]
  assert len(args[0].sharding.device_set) == 8
  got, got_g = jax.jit(jax.value_and_grad(fn))(*args)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got_g, want_g, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(losses.DENSE_LOSSES))
def test_dense_gradients_finite_for_identical_and_orthogonal(name):
  clf = heads.PairClassifier(4, rngs=nnx.Rngs(0))
  eye = np.eye(4, dtype=np.float32)
  for emb in (np.concatenate([eye, eye]), np.ones((8, 4), np.float32)):
    for labels in ([0, 0, 1, 1, 2, 2, 3, 3], [0] * 8, list(range(8))):
      g = jax.grad(lambda e: losses.DENSE_LOSSES[name](e, jnp.asarray(labels, jnp.int32),
                                                       params=clf))(emb)
      assert np.all(np.isfinite(g)), (name, labels)
