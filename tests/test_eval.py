"""Metrics against scikit-learn, the MLP baseline, and the t-SNE figure."""

from __future__ import annotations

import matplotlib.image as mpimg
import numpy as np
import pytest
from sklearn import metrics as skm

from convfit_jax.evaluators import metrics, mlp, plots


def _predictions(seed=0, n=300, labels=9):
  rng = np.random.default_rng(seed)
  y = rng.integers(0, labels, n)
  pred = np.where(rng.random(n) < 0.6, y, rng.integers(0, labels + 2, n))  # some never-true labels
  return y, pred


@pytest.mark.parametrize("seed", [0, 1])
def test_accuracy_and_macro_f1_match_sklearn(seed):
  y, pred = _predictions(seed)
  assert metrics.accuracy(y, pred) == pytest.approx(skm.accuracy_score(y, pred))
  want = skm.f1_score(y, pred, average="macro", zero_division=0)
  assert metrics.macro_f1(y, pred) == pytest.approx(want, abs=1e-12)
  assert metrics.macro_f1(y, y) == 1.0


def test_confusion_pairs():
  y = np.array([0, 0, 0, 1, 1, 2, 2, 2, 3])
  p = np.array([1, 1, 0, 0, 0, 3, 3, 2, 3])
  assert metrics.confusion_pairs(y, p) == [(0, 1, 2), (1, 0, 2), (2, 3, 2)]
  assert metrics.confusion_pairs(y, p, top=1, label_names=list("abcd")) == [("a", "b", 2)]
  cm = skm.confusion_matrix(y, p)
  for t, q, c in metrics.confusion_pairs(y, p):
    assert cm[t, q] == c
  assert metrics.confusion_pairs(y, y) == []


def test_silhouette_matches_sklearn_cosine():
  rng = np.random.default_rng(0)
  y = np.repeat(np.arange(4), 20)
  x = rng.normal(size=(4, 16))[y] + 0.5 * rng.normal(size=(80, 16))
  want = skm.silhouette_score(x, y, metric="cosine")
  assert metrics.silhouette(x, y) == pytest.approx(want, abs=1e-5)
  assert metrics.silhouette(x, y) > metrics.silhouette(x, rng.permutation(y))
  # Undefined, not an error: one example per label, or one label.
  assert np.isnan(metrics.silhouette(x[:3], np.arange(3))) and np.isnan(metrics.silhouette(x, 0 * y))


def test_response_selection_metrics():
  rng = np.random.default_rng(0)
  scores = rng.normal(size=(50, 100))
  true = rng.integers(0, 100, 50)
  ranks = np.array([1 + np.sum(row > row[t]) for row, t in zip(scores, true)])
  got = metrics.response_selection_metrics(scores, true)
  for k in (1, 3, 10, 50):
    assert got[f"r_at_{k}"] == pytest.approx(np.mean(ranks <= k))
    assert metrics.recall_at_k(scores, true, k) == got[f"r_at_{k}"]
  assert got["mrr"] == pytest.approx(np.mean(1 / ranks))
  assert metrics.mrr(scores, true) == got["mrr"]
  # R@1 is sklearn's top-1 accuracy; ties count against the true response.
  assert got["r_at_1"] == pytest.approx(skm.top_k_accuracy_score(true, scores, k=1,
                                                                  labels=np.arange(100)))
  assert got["dstc7"] == pytest.approx((got["r_at_10"] + got["mrr"]) / 2)
  ten = metrics.response_selection_metrics(scores[:, :10], true % 10)
  ranks10 = np.array([1 + np.sum(row[:10] > row[t % 10]) for row, t in zip(scores, true)])
  assert set(ten) == {"r10_at_1", "r10_at_2", "r10_at_5", "mrr"}
  for k in (1, 2, 5):
    assert ten[f"r10_at_{k}"] == pytest.approx(np.mean(ranks10 <= k))
  flat = np.zeros((3, 100))
  assert metrics.response_selection_metrics(flat, [0, 0, 0])["r_at_1"] == 0.0
  assert metrics.mrr(flat, [0, 0, 0]) == pytest.approx(0.01)


def _blobs(seed, n_per=12, labels=6, d=32):
  rng = np.random.default_rng(seed)
  centers = rng.normal(size=(labels, d))
  y = np.repeat(np.arange(labels), n_per)
  return (centers[y] + 0.8 * rng.normal(size=(len(y), d))).astype(np.float32), y


def test_mlp_learns_and_is_deterministic():
  x, y = _blobs(0)
  xt, yt = _blobs(0, n_per=30)  # same centres, fresh noise
  xt, yt = xt[len(y):], yt[len(y):]
  cfg = mlp.MLPConfig(epochs=40)
  acc = mlp.mlp_accuracy(x, y, xt, yt, 6, config=cfg, seed=0)
  assert acc > 0.9  # chance is 1/6
  a = mlp.train_mlp(x, y, 6, config=cfg, seed=3)
  b = mlp.train_mlp(x, y, 6, config=cfg, seed=3)
  c = mlp.train_mlp(x, y, 6, config=cfg, seed=4)
  for key in a.params:
    np.testing.assert_array_equal(a.params[key], b.params[key])
  assert not np.array_equal(a.params["w1"], c.params["w1"])
  assert a.predict(xt).dtype == np.int32


def test_tsne_png(tmp_path):
  rng = np.random.default_rng(0)
  y = np.repeat(np.arange(15), [3] * 3 + [8] * 12)
  x = rng.normal(size=(15, 20))[y] + 0.3 * rng.normal(size=(len(y), 20))
  assert plots.pick_intents(y).tolist() == list(range(3, 15))  # the 12 most frequent
  path = plots.plot_tsne(x, y, str(tmp_path / "sub" / "tsne.png"), title="test",
                         label_names=[f"intent_{i}" for i in range(15)])
  img = mpimg.imread(path)
  assert img.shape[0] > 400 and img.shape[1] > 400
  # Coloured points, not a blank canvas: many distinct colours.
  assert len(np.unique(img.reshape(-1, img.shape[-1]), axis=0)) > 50


def test_ranks_count_ties_against_the_answer_and_a_miss_scores_nothing():
  scores = np.array([[0.9, 0.5, 0.5], [0.1, 0.2, 0.3]])
  np.testing.assert_array_equal(metrics.ranks(scores, np.array([1, 2])), [3, 1])
  m = metrics.rank_metrics(np.array([1, 3, np.inf]), (1, 10))
  assert m == {"r_at_1": 1 / 3, "r_at_10": 2 / 3, "mrr": pytest.approx((1 + 1 / 3) / 3)}
